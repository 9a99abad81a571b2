use super::*;
use crate::model::save::parse_dump;

const GUARD: &str = ":NATLEDGER-INPUT - [0:0]\n\
    -A INPUT -m comment --comment natledger -j NATLEDGER-INPUT\n\
    -A NATLEDGER-INPUT -d 127.0.0.0/8 ! -i lo -m conntrack ! --ctstate DNAT -m comment \
    --comment natledger -j DROP\n";

/// kube-proxy's filter INPUT (iptables mode, v1.29), its localnet rule included.
const KUBE: &str = ":KUBE-EXTERNAL-SERVICES - [0:0]\n:KUBE-FIREWALL - [0:0]\n\
    -A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes \
    externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES\n\
    -A INPUT -j KUBE-FIREWALL\n\
    -A KUBE-EXTERNAL-SERVICES -d 10.0.0.5/32 -p tcp -m comment --comment \"default/web \
    has no endpoints\" -m addrtype --dst-type LOCAL -m tcp --dport 30080 -j REJECT\n\
    -A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment \"block \
    incoming localnet connections\" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT \
    -j DROP\n";

fn set(backend: Backend, body: &str) -> Ruleset {
    let text = format!("*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n{body}COMMIT\n");
    Ruleset {
        backend,
        family: Family::Ipv4,
        source: "test".into(),
        tables: parse_dump(&text).unwrap(),
    }
}

fn open(ifaces: &[&str]) -> RouteLocalnet {
    RouteLocalnet {
        all: false,
        interfaces: ifaces.iter().map(|s| s.to_string()).collect(),
    }
}

fn check(sets: &[Ruleset], open: &RouteLocalnet) -> Vec<Finding> {
    let sets: Vec<&Ruleset> = sets.iter().collect();
    exposures(&sets, open, Backend::IptablesNft, &|i| {
        (i == "br0").then(|| "likely natledger".into())
    })
}

#[test]
fn without_a_guard_neighbours_reach_localhost() {
    let found = check(&[set(Backend::IptablesNft, "")], &open(&["br0", "veth1"]));
    assert_eq!(found.len(), 1, "{found:#?}");
    let f = &found[0];
    assert_eq!(
        (f.severity, f.kind),
        (Severity::Error, Kind::LocalhostExposed)
    );
    assert!(
        f.summary.starts_with("Neighbours on br0, veth1 can reach"),
        "{}",
        f.summary
    );
    assert!(f.summary.ends_with("There is no guard."), "{}", f.summary);
    let fix = f.fix.as_deref().unwrap();
    assert!(
        fix.contains(
            "iptables-nft -t filter -I INPUT -d 127.0.0.0/8 ! -i lo -m conntrack ! \
             --ctstate DNAT -j DROP"
        ),
        "{fix}"
    );
    assert!(
        fix.contains("sysctl -w net.ipv4.conf.br0.route_localnet=0"),
        "{fix}"
    );
    assert!(
        fix.contains("sysctl -w net.ipv4.conf.veth1.route_localnet=0"),
        "{fix}"
    );
    assert!(
        f.evidence.contains(&"br0: likely natledger".to_string()),
        "{f:#?}"
    );
    // Nothing open: nothing to say, whatever the rules.
    assert!(check(&[set(Backend::IptablesNft, "")], &open(&[])).is_empty());
    // An IPv6 ruleset has no say (route_localnet is IPv4's).
    let mut v6 = set(Backend::IptablesNft, GUARD);
    v6.family = Family::Ipv6;
    assert_eq!(check(&[v6], &open(&["br0"])).len(), 1);
}

#[test]
fn natledgers_guard_closes_it_in_either_backend() {
    assert!(check(&[set(Backend::IptablesNft, GUARD)], &open(&["br0"])).is_empty());
    // The kernel runs both: the guard in one is enough.
    let sets = [
        set(Backend::IptablesLegacy, GUARD),
        set(Backend::IptablesNft, ""),
    ];
    assert!(check(&sets, &open(&["br0"])).is_empty());
    // A DROP policy closes it too.
    let mut closed = set(Backend::IptablesNft, "");
    closed.tables[0].chains[0].1 = "DROP".into();
    assert_eq!(closed.tables[0].chains[0].0, "INPUT");
    assert!(check(&[closed], &open(&["br0"])).is_empty());
}

/// natledger's own nftables table, read as a ruleset of its own: its guard closes it, even
/// with another owner's accept at the top of iptables-nft's INPUT (a drop in any base chain
/// is final), and the fix never names a tool for it.
#[test]
fn natledgers_nftables_guard_closes_it() {
    let accept = "-A INPUT -i br0 -j ACCEPT\n";
    let sets = [
        set(Backend::IptablesNft, accept),
        set(Backend::OwnNftables, GUARD),
    ];
    assert!(check(&sets, &open(&["br0"])).is_empty());
    let found = check(
        &[set(Backend::IptablesNft, ""), set(Backend::OwnNftables, "")],
        &open(&["br0"]),
    );
    let fix = found[0].fix.as_deref().unwrap_or_default();
    assert!(!fix.contains("iptables-nftables"), "{fix}");
}

#[test]
fn an_accept_above_the_guard_is_named() {
    // As `iptables -I INPUT -i br0 -j ACCEPT` leaves it: above natledger's jump.
    let body = format!("-A INPUT -i br0 -j ACCEPT\n{GUARD}");
    let found = check(
        &[set(Backend::IptablesLegacy, &body)],
        &open(&["br0", "br1"]),
    );
    assert_eq!(found.len(), 1, "{found:#?}");
    let f = &found[0];
    assert_eq!(f.severity, Severity::Error);
    assert!(
        f.summary.starts_with("Neighbours on br0 can reach"),
        "{}",
        f.summary
    );
    assert!(
        f.summary.contains(
            "natledger's guard is in place in legacy but the rule `-A INPUT -i br0 -j \
             ACCEPT` accepts these packets before filter INPUT jumps to NATLEDGER-INPUT."
        ),
        "{}",
        f.summary
    );
    assert_eq!(
        (f.rules[0].chain.as_str(), f.rules[0].position),
        ("INPUT", 1)
    );
    let fix = f.fix.as_deref().unwrap();
    assert!(
        fix.contains(
            "iptables-legacy -t filter -D INPUT -i br0 -j ACCEPT\n\
             iptables-legacy -t filter -A INPUT -i br0 -j ACCEPT"
        ),
        "{fix}"
    );
    // In the other backend it does not help: the guard of one drops.
    let sets = [
        set(Backend::IptablesLegacy, &body),
        set(Backend::IptablesNft, GUARD),
    ];
    assert!(check(&sets, &open(&["br0"])).is_empty());
}

#[test]
fn kube_proxys_guard_lets_a_forged_loopback_source_pass() {
    let found = check(&[set(Backend::IptablesNft, KUBE)], &open(&["cni0"]));
    assert_eq!(found.len(), 1, "{found:#?}");
    let f = &found[0];
    assert_eq!(f.severity, Severity::Warning);
    assert!(
        f.summary.contains("forged 127.0.0.0/8 source"),
        "{}",
        f.summary
    );
    assert_eq!(f.rules[0].chain, "KUBE-FIREWALL");
    // With natledger's guard too: closed.
    let both = format!("{KUBE}{GUARD}");
    assert!(check(&[set(Backend::IptablesNft, &both)], &open(&["cni0"])).is_empty());
}

#[test]
fn what_cannot_be_decided_is_a_warning_and_all_names_every_interface() {
    let body = format!("-A INPUT -m mark --mark 0x1 -j ACCEPT\n{GUARD}");
    let all = RouteLocalnet {
        all: true,
        interfaces: vec!["br0".into(), "eth0".into()],
    };
    let found = check(&[set(Backend::IptablesNft, &body)], &all);
    assert_eq!(found.len(), 1, "{found:#?}");
    let f = &found[0];
    assert_eq!(f.severity, Severity::Warning);
    assert!(
        f.summary.contains(
            "neighbours on every interface (net.ipv4.conf.all.route_localnet is 1) \
             address to 127.0.0.1"
        ),
        "{}",
        f.summary
    );
    assert!(f.rules[0].line.contains("--mark 0x1"));
    let fix = f.fix.as_deref().unwrap();
    assert!(
        fix.contains("sysctl -w net.ipv4.conf.all.route_localnet=0"),
        "{fix}"
    );
}
