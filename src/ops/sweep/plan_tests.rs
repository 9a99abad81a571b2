//! Tests of [`super::plan`].

use super::*;
use crate::backend::REWRITE_AT;
use crate::model::save::parse_dump;

/// [`super::plan`] of the table the dump names.
fn plan(backend: Backend, table: &Dump, family: Family, claims: &Claims) -> TablePlan {
    let name = table.name.parse().expect("a table natledger writes");
    super::plan(backend, name, table, family, claims)
}

const JUMP_PRE: &str = "-A PREROUTING -m addrtype --dst-type LOCAL -m comment --comment natledger -j NATLEDGER-HOSTPORTS";
const JUMP_POST: &str = "-A POSTROUTING -m comment --comment natledger -j NATLEDGER-MASQ";

fn dnat(id: &str, port: u16) -> String {
    format!(
        "-A NATLEDGER-HOSTPORTS -p tcp -m tcp --dport {port} -m comment --comment natledger:{id} \
         -j DNAT --to-destination 10.77.0.2:80"
    )
}

fn table(lines: &[String]) -> Dump {
    let text = format!(
        "*nat\n:PREROUTING ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:DOCKER - [0:0]\n\
         :NATLEDGER-HOSTPORTS - [0:0]\n:NATLEDGER-MASQ - [0:0]\n:NATLEDGERISH - [0:0]\n{}\nCOMMIT\n",
        lines.join("\n")
    );
    parse_dump(&text).unwrap().remove(0)
}

fn claims(kept: &[&str], dead: &[&str], all: bool) -> Claims {
    Claims {
        kept: kept.iter().map(|s| s.to_string()).collect(),
        dead: dead.iter().map(|s| s.to_string()).collect(),
        all,
        ..Claims::default()
    }
}

fn rendered(plan: &TablePlan) -> Vec<String> {
    plan.batch.render().lines().map(String::from).collect()
}

/// Foreign rules that look like natledger's: same port and target in another chain, our
/// tag in another chain, our chain name as a substring, a similar comment in our chain.
fn look_alikes() -> Vec<String> {
    vec![
        "-A DOCKER -p tcp -m tcp --dport 8080 -m comment --comment natledger:dead -j DNAT --to-destination 10.77.0.2:80".into(),
        "-A NATLEDGERISH -p tcp -m tcp --dport 8080 -m comment --comment natledger:dead -j DNAT --to-destination 10.77.0.2:80".into(),
        "-A PREROUTING -m comment --comment natledger-ish -j NATLEDGERISH".into(),
    ]
}

#[test]
fn dead_and_orphan_rules_go_live_and_foreign_ones_stay() {
    let mut lines = vec![JUMP_PRE.to_string(), JUMP_POST.to_string()];
    lines.extend([dnat("live", 8081), dnat("dead", 8080), dnat("lost", 8082)]);
    lines.extend(look_alikes());
    let plan = plan(
        Backend::IptablesNft,
        &table(&lines),
        Family::Ipv4,
        &claims(&["live"], &["dead"], false),
    );
    assert_eq!(
        rendered(&plan),
        [
            "*nat".to_string(),
            format!("-D{}", &dnat("dead", 8080)[2..]),
            format!("-D{}", &dnat("lost", 8082)[2..]),
            "COMMIT".into()
        ]
    );
    let reasons: Vec<_> = plan
        .rules
        .iter()
        .map(|r| (r.reason, r.container.as_deref()))
        .collect();
    assert_eq!(
        reasons,
        [
            (Reason::DeadContainer, Some("dead")),
            (Reason::Orphan, Some("lost"))
        ]
    );
    assert!(plan.chains.is_empty() && plan.blocked.is_empty());
    // The two jumps and the live DNAT stay; the look-alikes are not natledger's.
    assert_eq!(plan.owned_after, 3);
}

#[test]
fn nothing_to_do_is_an_empty_batch() {
    let lines = vec![JUMP_PRE.to_string(), JUMP_POST.to_string(), dnat("live", 1)];
    let plan = plan(
        Backend::IptablesNft,
        &table(&lines),
        Family::Ipv4,
        &claims(&["live"], &[], false),
    );
    assert!(plan.batch.is_empty());
}

#[test]
fn all_removes_rules_jumps_and_chains_but_no_look_alike() {
    let mut lines = vec![JUMP_PRE.to_string(), JUMP_POST.to_string(), dnat("live", 1)];
    lines.extend(look_alikes());
    let plan = plan(
        Backend::IptablesNft,
        &table(&lines),
        Family::Ipv4,
        &claims(&["live"], &[], true),
    );
    assert_eq!(
        rendered(&plan),
        [
            "*nat".to_string(),
            "-F NATLEDGER-HOSTPORTS".into(),
            format!("-D{}", &JUMP_PRE[2..]),
            format!("-D{}", &JUMP_POST[2..]),
            "-X NATLEDGER-HOSTPORTS".into(),
            "-X NATLEDGER-MASQ".into(),
            "COMMIT".into()
        ]
    );
    assert!(plan.rules.iter().all(|r| r.reason == Reason::Uninstall));
    assert_eq!(plan.chains, ["NATLEDGER-HOSTPORTS", "NATLEDGER-MASQ"]);
}

/// The guard's chain is an IPv4 chain: one in an IPv6 filter table (not natledger's
/// writing; a hand-made or foreign tool's copy) is another version's, stale, and goes
/// with its jump, while the IPv4 one stays.
#[test]
fn an_ipv6_guard_chain_is_stale() {
    let text = "*filter\n:INPUT ACCEPT [0:0]\n:NATLEDGER-INPUT - [0:0]\n\
                -A INPUT -m comment --comment natledger -j NATLEDGER-INPUT\n\
                -A NATLEDGER-INPUT -d ::1/128 ! -i lo -m conntrack ! --ctstate DNAT -m \
                comment --comment natledger -j DROP\nCOMMIT\n";
    let t = parse_dump(text).unwrap().remove(0);
    let v6 = plan(
        Backend::IptablesNft,
        &t,
        Family::Ipv6,
        &claims(&[], &[], false),
    );
    assert_eq!(v6.chains, ["NATLEDGER-INPUT"]);
    let text = rendered(&v6).join("\n");
    assert!(text.contains("-D INPUT -m comment --comment natledger -j NATLEDGER-INPUT"));
    assert!(text.contains("-X NATLEDGER-INPUT"), "{text}");
    let v4 = plan(
        Backend::IptablesNft,
        &t,
        Family::Ipv4,
        &claims(&[], &[], false),
    );
    assert!(v4.batch.is_empty() && v4.chains.is_empty());
}

#[test]
fn the_localhost_guard_stays_until_all() {
    let text = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n\
                :NATLEDGER-FORWARD - [0:0]\n:NATLEDGER-INPUT - [0:0]\n\
                -A INPUT -m comment --comment natledger -j NATLEDGER-INPUT\n\
                -A FORWARD -m comment --comment natledger -j NATLEDGER-FORWARD\n\
                -A NATLEDGER-INPUT -d 127.0.0.0/8 ! -i lo -m conntrack ! --ctstate \
                DNAT -m comment --comment natledger -j DROP\n\
                -A NATLEDGER-FORWARD -m conntrack --ctstate DNAT --ctproto 6 --ctreplsrc \
                10.77.0.2 --ctorigdstport 80 --ctreplsrcport 80 -m comment --comment \
                natledger:dead -j ACCEPT\nCOMMIT\n";
    let t = parse_dump(text).unwrap().remove(0);
    let kept = plan(
        Backend::IptablesNft,
        &t,
        Family::Ipv4,
        &claims(&[], &["dead"], false),
    );
    assert_eq!(
        rendered(&kept)[1..rendered(&kept).len() - 1],
        [
            "-D NATLEDGER-FORWARD -m conntrack --ctstate DNAT --ctproto 6 --ctreplsrc 10.77.0.2 \
          --ctorigdstport 80 --ctreplsrcport 80 -m comment --comment natledger:dead -j ACCEPT"
        ]
    );
    assert!(kept.chains.is_empty() && kept.blocked.is_empty());
    let all = plan(
        Backend::IptablesNft,
        &t,
        Family::Ipv4,
        &claims(&[], &[], true),
    );
    let text = rendered(&all).join("\n");
    assert!(text.contains("-D INPUT -m comment --comment natledger -j NATLEDGER-INPUT"));
    assert!(text.contains("-F NATLEDGER-INPUT") && text.contains("-X NATLEDGER-INPUT"));
    assert_eq!(all.chains, ["NATLEDGER-FORWARD", "NATLEDGER-INPUT"]);
}

#[test]
fn a_foreign_rule_in_or_into_a_chain_keeps_it() {
    let lines = vec![
        JUMP_PRE.to_string(),
        JUMP_POST.to_string(),
        "-A NATLEDGER-MASQ -s 10.0.0.0/8 -j MASQUERADE".into(),
        "-A DOCKER -j NATLEDGER-HOSTPORTS".into(),
    ];
    let plan = plan(
        Backend::IptablesNft,
        &table(&lines),
        Family::Ipv4,
        &claims(&[], &[], true),
    );
    assert!(plan.chains.is_empty(), "{:?}", plan.chains);
    assert_eq!(plan.blocked.len(), 2, "{:?}", plan.blocked);
    assert!(plan.blocked[0].contains("-A DOCKER -j NATLEDGER-HOSTPORTS"));
    assert!(plan.blocked[1].contains("-A NATLEDGER-MASQ -s 10.0.0.0/8"));
    let text = rendered(&plan).join("\n");
    assert!(!text.contains("-X ") && !text.contains("-F "), "{text}");
    assert!(
        !text.contains("MASQUERADE") && !text.contains("DOCKER"),
        "{text}"
    );
    assert_eq!(plan.rules.len(), 2, "our two jumps still go");
}

#[test]
fn stale_chains_of_another_version_and_duplicate_jumps_go() {
    let mut t = table(&[
        JUMP_PRE.to_string(),
        JUMP_PRE.to_string(),
        JUMP_POST.to_string(),
        "-A OUTPUT -m comment --comment natledger -j NATLEDGER-OLD".into(),
        "-A NATLEDGER-OLD -p udp -m comment --comment natledger:gone -j DNAT --to-destination 10.1.1.1".into(),
    ]);
    t.chains.push(("NATLEDGER-OLD".into(), "-".into()));
    let plan = plan(
        Backend::IptablesNft,
        &t,
        Family::Ipv4,
        &claims(&[], &[], false),
    );
    let reasons: Vec<Reason> = plan.rules.iter().map(|r| r.reason).collect();
    assert_eq!(
        reasons,
        [Reason::Orphan, Reason::StaleChain, Reason::DuplicateJump]
    );
    assert_eq!(plan.chains, ["NATLEDGER-OLD"]);
    // One PREROUTING jump (put back) and the POSTROUTING jump.
    assert_eq!(plan.owned_after, 2);
    let text = rendered(&plan);
    assert_eq!(text[1], "-F NATLEDGER-OLD");
    // Both copies go and one comes back at the top.
    let pre: Vec<&String> = text.iter().filter(|l| l.contains(" PREROUTING ")).collect();
    assert_eq!(pre.len(), 3, "{text:?}");
    assert!(pre[0].starts_with("-D") && pre[1].starts_with("-D"));
    assert!(pre[2].starts_with("-I PREROUTING 1 "));
    assert_eq!(text[text.len() - 2], "-X NATLEDGER-OLD");
}

#[test]
fn a_chain_another_kept_rule_jumps_to_stays() {
    let mut t = table(&[
        "-A NATLEDGER-HOSTPORTS -m comment --comment natledger -j NATLEDGER-OLD".into(),
        dnat("gone", 1),
    ]);
    t.chains.push(("NATLEDGER-OLD".into(), "-".into()));
    let plan = plan(
        Backend::IptablesNft,
        &t,
        Family::Ipv4,
        &claims(&[], &[], false),
    );
    assert!(plan.chains.is_empty(), "{:?}", plan.chains);
    assert_eq!(
        rendered(&plan),
        [
            "*nat".to_string(),
            format!("-D{}", &dnat("gone", 1)[2..]),
            "COMMIT".into()
        ]
    );
}

#[test]
fn a_chain_holding_a_foreign_rule_is_never_rewritten() {
    let mut lines: Vec<String> = (0..REWRITE_AT as u16)
        .map(|p| dnat("dead", 1000 + p))
        .collect();
    lines.push("-A NATLEDGER-HOSTPORTS -d 10.0.0.0/8 -p tcp -j RETURN".into());
    let plan = plan(
        Backend::IptablesNft,
        &table(&lines),
        Family::Ipv4,
        &claims(&[], &["dead"], false),
    );
    let text = rendered(&plan);
    assert!(!text.iter().any(|l| l.starts_with("-F")), "{text:?}");
    assert_eq!(text.len(), REWRITE_AT + 2);
}

#[test]
fn a_live_container_keeps_a_stale_chain() {
    let mut t = table(&[
        "-A OUTPUT -m comment --comment natledger -j NATLEDGER-OLD".into(),
        "-A NATLEDGER-OLD -p udp -m comment --comment natledger:old -j DNAT --to-destination 10.1.1.1".into(),
    ]);
    t.chains.push(("NATLEDGER-OLD".into(), "-".into()));
    let plan = plan(
        Backend::IptablesNft,
        &t,
        Family::Ipv4,
        &claims(&["old"], &[], false),
    );
    assert!(plan.batch.is_empty());
}

#[test]
fn a_mostly_dead_chain_is_rewritten_in_order() {
    let mut lines: Vec<String> = (0..REWRITE_AT as u16)
        .map(|p| dnat("dead", 1000 + p))
        .collect();
    lines.insert(10, dnat("live", 1));
    lines.push(dnat("live", 2));
    let plan = plan(
        Backend::IptablesNft,
        &table(&lines),
        Family::Ipv4,
        &claims(&["live"], &["dead"], false),
    );
    let text = rendered(&plan);
    assert_eq!(
        text,
        [
            "*nat".to_string(),
            "-F NATLEDGER-HOSTPORTS".into(),
            dnat("live", 1),
            dnat("live", 2),
            "COMMIT".into()
        ]
    );
    assert_eq!(plan.rules.len(), REWRITE_AT);
}

#[test]
fn a_ledger_that_records_nothing_keeps_unrecorded_rules_but_not_dead_ones() {
    let mut lines = vec![JUMP_PRE.to_string()];
    lines.extend([dnat("live", 8081), dnat("dead", 8080), dnat("lost", 8082)]);
    let t = table(&lines);
    let mut keeping = claims(&["live"], &["dead"], false);
    keeping.keep_unrecorded = true;
    let p = plan(Backend::IptablesNft, &t, Family::Ipv4, &keeping);
    assert_eq!(
        rendered(&p)[1..rendered(&p).len() - 1],
        [format!("-D{}", &dnat("dead", 8080)[2..])]
    );
    assert_eq!(p.unrecorded_kept, 1);
    // Nothing recorded at all, not the boot: every tagged rule stays, chains and jumps too.
    let mut none = claims(&[], &[], false);
    none.keep_unrecorded = true;
    let p = plan(Backend::IptablesNft, &t, Family::Ipv4, &none);
    assert!(p.batch.is_empty() && p.rules.is_empty() && p.chains.is_empty());
    assert_eq!(p.unrecorded_kept, 3);
    // The boot (or a ledger with manifests): orphans go, as they always did.
    let p = plan(
        Backend::IptablesNft,
        &t,
        Family::Ipv4,
        &claims(&[], &[], false),
    );
    assert_eq!(p.rules.len(), 3);
    assert_eq!(p.unrecorded_kept, 0);
    // --all takes everything whatever is kept.
    let mut all = claims(&[], &[], true);
    all.keep_unrecorded = true;
    assert!(
        plan(Backend::IptablesNft, &t, Family::Ipv4, &all)
            .rules
            .len()
            >= 3
    );
}
