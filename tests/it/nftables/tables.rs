//! natledger's own nftables tables over their life (issue 15), with real TCP and UDP traffic
//! and full before/after dumps:
//!
//! - poststop removes exactly the container's recorded rules; rules an operator adds by hand
//!   into natledger's table stay through it, but one carrying the container's tag goes with
//!   the next poststop (no manifest left: the tag is the guide); then poststop is idempotent; `sweep` removes what the ownership
//!   rule (a `NATLEDGER-` chain and the comment `natledger:<id>` of no live container) makes
//!   natledger's, and `sweep --all` everything natledger wrote, keeping a chain that holds a
//!   rule natledger did not write and saying so; once that rule is gone, `sweep --all` leaves
//!   `nft list ruleset` exactly as before natledger (the tables deleted);
//! - the localhost guard in the `INPUT` base chain (priority filter - 10): the 127.0.0.1 →
//!   container path works (TCP, UDP, a UDP client that keeps sending) while a neighbour on the
//!   bridge sending to the node's 127.0.0.1 is dropped; without the guard it gets through
//!   (so the test proves something), and the next create puts the guard back.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use crate::common::*;

const T: Duration = Duration::from_secs(3);
const LOCALHOST: Ipv4Addr = Ipv4Addr::LOCALHOST;
const PORTS: (&str, &str) = ("io.natledger.ports", "8080:80,8080:80/udp");

/// What a TCP connection and a UDP request from `ns` to `dst` get back.
fn ask(ns: &str, dst: SocketAddr) -> (Option<String>, Option<String>) {
    (tcp_request(ns, dst, T).ok(), udp_request(ns, dst, T).ok())
}

fn served(name: &str) -> (Option<String>, Option<String>) {
    (Some(format!("{name} tcp")), Some(format!("{name} udp")))
}

/// TCP and UDP servers on port 80 of both of the container's addresses.
fn serve(c: &Container, name: &str) -> Vec<Server> {
    let mut servers = Vec::new();
    for addr in [c.sock_v4(80), c.sock_v6(80)] {
        servers.push(serve_tcp(&c.ns, addr, &format!("{name} tcp")));
        servers.push(serve_udp(&c.ns, addr, &format!("{name} udp")));
    }
    servers
}

fn nft(node: &Node, args: &[&str]) -> String {
    let out = run_in(node.topo.node(), "nft", args, None);
    assert_ok(&out, &format!("nft {args:?}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The handle of the rule of `chain` in `ip natledger` whose text contains `text`.
fn handle_of(node: &Node, chain: &str, text: &str) -> String {
    let listed = nft(node, &["-a", "list", "chain", "ip", "natledger", chain]);
    listed
        .lines()
        .find(|l| l.contains(text) && l.contains("# handle "))
        .and_then(|l| l.rsplit("# handle ").next())
        .unwrap_or_else(|| panic!("no rule with {text:?} in {chain}:\n{listed}"))
        .trim()
        .to_string()
}

fn output(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

const TAGGED: &str = "tcp dport 9999 drop comment \"natledger:c1\"";
const UNTAGGED: &str = "tcp dport 9998 drop";

#[test]
fn poststop_and_sweep_delete_only_what_natledger_wrote() {
    let mut node = Node::new(Backend::OwnNftables);
    let c = node.topo.add_container(2);
    let _servers = serve(&c, "c1");
    let pid = node.topo.spawn_sleeper(&c.ns);
    let pristine = node.dump();
    let ext = node.topo.ext().to_string();

    node.create("c1", Some(pid), &[PORTS]);
    assert_eq!(ask(&ext, sock(NODE_V4, 8080)), served("c1"));
    assert_eq!(ask(&ext, sock(NODE_V6, 8080)), served("c1"));
    // An operator's rules in natledger's chain: one carrying c1's tag, one without a comment.
    let add = ["add", "rule", "ip", "natledger", "NATLEDGER-HOSTPORTS"];
    let tagged = [
        "tcp",
        "dport",
        "9999",
        "drop",
        "comment",
        "\"natledger:c1\"",
    ];
    nft(&node, &[&add[..], &tagged[..]].concat());
    nft(
        &node,
        &[&add[..], &["tcp", "dport", "9998", "drop"]].concat(),
    );

    // poststop removes c1's rules (its manifest's), not the rules added by hand.
    assert_ok(&node.poststop("c1"), "poststop");
    let stopped = node.dump();
    assert_eq!(
        nft_chain_rules(&stopped, Family::V4, "NATLEDGER-HOSTPORTS"),
        [TAGGED, UNTAGGED],
        "{stopped}"
    );
    assert!(nft_chain_rules(&stopped, Family::V6, "NATLEDGER-HOSTPORTS").is_empty());
    assert!(nft_chain_rules(&stopped, Family::V4, "NATLEDGER-MASQ").is_empty());
    assert_eq!(ask(&ext, sock(NODE_V4, 8080)), (None, None));
    assert_eq!(ask(&ext, sock(NODE_V6, 8080)), (None, None));
    // A second poststop has no manifest to go by: the tag is its guide (as for a container
    // whose manifest was lost), so it deletes every rule of a NATLEDGER- chain tagged
    // natledger:c1 that parses as a natledger rule, the operator's tagged drop included
    // (`ops::remove::container::remove_table`); the untagged rule stays.
    assert_ok(&node.poststop("c1"), "second poststop");
    let again = node.dump();
    assert_eq!(
        nft_chain_rules(&again, Family::V4, "NATLEDGER-HOSTPORTS"),
        [UNTAGGED],
        "{again}"
    );
    // From then on poststop is idempotent: nothing changes.
    assert_ok(&node.poststop("c1"), "third poststop");
    assert_eq!(node.dump(), again, "a third poststop changed the tables");

    // sweep: ownership is the chain prefix plus the comment (README "sweep"), as in the
    // iptables backends: a rule tagged natledger:c1 in NATLEDGER-HOSTPORTS (put back here as
    // a restored ruleset would) of no live container is an orphan; the rule without
    // natledger's comment is not natledger's.
    // With no manifest left, only the boot's sweep takes it (`sweep --boot`).
    nft(&node, &[&add[..], &tagged[..]].concat());
    let swept = node.sweep(&["--boot"]);
    assert_ok(&swept, "sweep");
    let text = output(&swept);
    assert!(
        text.contains("removed (orphan)") && text.contains("--dport 9999"),
        "{text}"
    );
    let after_sweep = node.dump();
    assert_eq!(
        nft_chain_rules(&after_sweep, Family::V4, "NATLEDGER-HOSTPORTS"),
        [UNTAGGED],
        "{after_sweep}"
    );

    // sweep --all: everything natledger wrote goes, except the chain that holds the
    // operator's rule, and it says so (exit 1).
    let all = node.sweep(&["--all"]);
    let text = output(&all);
    assert!(!all.status.success(), "{text}");
    assert!(
        text.contains("chain NATLEDGER-HOSTPORTS stays") && text.contains("--dport 9998"),
        "{text}"
    );
    let kept = node.dump();
    let native = native_ruleset(node.topo.node());
    assert_eq!(
        nft_chain_rules(&kept, Family::V4, "NATLEDGER-HOSTPORTS"),
        [UNTAGGED],
        "{kept}"
    );
    assert!(
        !native.contains("comment \"natledger") && !native.contains("table ip6 natledger"),
        "sweep --all left a rule of natledger's:\n{native}"
    );
    eprintln!("after sweep --all with an operator's rule in NATLEDGER-HOSTPORTS:\n{native}");

    // The operator removes their rule: now `sweep --all` leaves no trace at all.
    let h = handle_of(&node, "NATLEDGER-HOSTPORTS", "dport 9998");
    nft(
        &node,
        &[
            "delete",
            "rule",
            "ip",
            "natledger",
            "NATLEDGER-HOSTPORTS",
            "handle",
            &h,
        ],
    );
    assert_ok(&node.sweep(&["--all"]), "sweep --all");
    assert_eq!(node.dump(), pristine, "sweep --all");
    assert!(!nft(&node, &["list", "tables"]).contains("natledger"));
}

/// Take the guard away: the INPUT base chain's jump to NATLEDGER-INPUT.
fn unguard(node: &Node) {
    let h = handle_of(node, "INPUT", "jump NATLEDGER-INPUT");
    nft(
        node,
        &["delete", "rule", "ip", "natledger", "INPUT", "handle", &h],
    );
}

fn localhost_path_works(node: &Node, what: &str) {
    let host = node.topo.node();
    assert_eq!(
        ask(host, sock(LOCALHOST, 8080)),
        served("c2"),
        "{what}: 127.0.0.1:8080"
    );
}

#[test]
fn the_guard_drops_a_neighbours_packets_to_localhost_and_the_localhost_path_works() {
    let mut node = Node::new(Backend::OwnNftables);
    let c = node.topo.add_container(2);
    let attacker = node.topo.add_container(3).ns;
    let host = node.topo.node().to_string();
    let _servers = serve(&c, "c2");
    let pid = node.topo.spawn_sleeper(&c.ns);
    let secrets = Secrets::bind(&host);
    arm(&attacker);
    let pristine = node.dump();
    assert_eq!(route_localnet(&host, "br0"), "0");
    assert_eq!(secrets.attack(&attacker, "before"), (false, false));

    node.create("c2", Some(pid), &[PORTS]);
    assert_eq!(route_localnet(&host, "br0"), "1");
    let dump = node.dump();
    assert_eq!(
        nft_chain_rules(&dump, Family::V4, "NATLEDGER-INPUT"),
        [
            "ip daddr 127.0.0.0/8 iifname != \"lo\" ct status ! dnat drop comment \"natledger\"",
            "ip daddr 127.0.0.0/8 iifname != \"lo\" ct state invalid,untracked drop comment \"natledger\""
        ],
        "{dump}"
    );
    assert_eq!(
        nft_chain_rules(&dump, Family::V4, "INPUT"),
        ["jump NATLEDGER-INPUT comment \"natledger\""],
        "{dump}"
    );
    assert!(
        dump.contains("type filter hook input priority filter - 10; policy accept;"),
        "{dump}"
    );
    assert_eq!(
        secrets.attack(&attacker, "guarded"),
        (false, false),
        "with route_localnet=1 a neighbour reaches the node's localhost (UDP, TCP)"
    );
    localhost_path_works(&node, "guarded");
    let client = UdpClient::start(&host, sock(LOCALHOST, 40123), sock(LOCALHOST, 8080));
    assert!(
        client.wait_for("c2 udp", Instant::now(), T).is_some(),
        "the UDP client gets no reply through the guard"
    );

    unguard(&node);
    assert_eq!(
        secrets.attack(&attacker, "unguarded"),
        (true, true),
        "without the guard the neighbour must reach localhost (or this test proves nothing)"
    );
    // The next create puts the guard back.
    let d = node.topo.add_container(4);
    let d_pid = node.topo.spawn_sleeper(&d.ns);
    node.create("c4", Some(d_pid), &[("io.natledger.ports", "8081:81")]);
    assert_eq!(
        secrets.attack(&attacker, "upgraded"),
        (false, false),
        "the next create does not put the guard back:\n{}",
        node.dump()
    );
    assert!(
        client.wait_for("c2 udp", Instant::now(), T).is_some(),
        "the UDP client stopped getting replies"
    );
    client.stop();
    localhost_path_works(&node, "upgraded");

    // Kept by poststop and sweep; removed by sweep --all.
    assert_ok(&node.poststop("c2"), "poststop c2");
    assert_ok(&node.poststop("c4"), "poststop c4");
    assert_ok(&node.sweep(&[]), "sweep");
    let dump = node.dump();
    assert_eq!(
        nft_chain_rules(&dump, Family::V4, "INPUT"),
        ["jump NATLEDGER-INPUT comment \"natledger\""],
        "{dump}"
    );
    assert_eq!(secrets.attack(&attacker, "stopped"), (false, false));
    assert_ok(&node.sweep(&["--all"]), "sweep --all");
    assert_eq!(node.dump(), pristine, "sweep --all");
}
