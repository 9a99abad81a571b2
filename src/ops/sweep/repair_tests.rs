use super::*;
use crate::model::save::{Batch, parse_dump};
use crate::ops::sweep::order::{Ranked, rank};
use crate::ops::sweep::{Claims, plan};
use crate::state::ledger::{Ledger, RuleRecord, tests::sample};

const JUMP_PRE: &str = "-A PREROUTING -m addrtype --dst-type LOCAL -m comment --comment natledger -j NATLEDGER-HOSTPORTS";
const JUMP_OUT: &str =
    "-A OUTPUT -m addrtype --dst-type LOCAL -m comment --comment natledger -j NATLEDGER-HOSTPORTS";
const JUMP_POST: &str = "-A POSTROUTING -m comment --comment natledger -j NATLEDGER-MASQ";

fn dnat_args(id: &str, port: u16) -> String {
    format!(
        "-p tcp -m tcp --dport {port} -m comment --comment natledger:{id} -j DNAT \
         --to-destination 10.77.0.2:80"
    )
}

fn dnat(id: &str, port: u16) -> String {
    format!("-A NATLEDGER-HOSTPORTS {}", dnat_args(id, port))
}

/// A live container's manifest recording one DNAT per port, in that order.
fn manifest(id: &str, ports: &[u16]) -> Manifest {
    let mut m = sample();
    m.container_id = id.parse().unwrap();
    m.rules = ports
        .iter()
        .map(|p| {
            RuleRecord::parse(
                Backend::IptablesNft,
                Family::Ipv4,
                "nat",
                "NATLEDGER-HOSTPORTS",
                dnat_args(id, *p)
                    .split_whitespace()
                    .map(String::from)
                    .collect(),
            )
        })
        .collect();
    m
}

fn nat(lines: &[String]) -> Dump {
    let chains = if lines.is_empty() {
        ""
    } else {
        ":NATLEDGER-HOSTPORTS - [0:0]\n:NATLEDGER-MASQ - [0:0]\n"
    };
    let text = format!(
        "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n\
         {chains}{}\nCOMMIT\n",
        lines.join("\n")
    );
    parse_dump(&text).unwrap().remove(0)
}

fn shared() -> Vec<String> {
    [JUMP_PRE, JUMP_OUT, JUMP_POST]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// The sweep's plan for `kept` and the repair after it, as one rendered batch.
fn planned(dump: &Dump, live: &[&Manifest]) -> (Vec<String>, Repair) {
    planned_ranked(dump, &Ranked::unstacked(live.to_vec()))
}

/// [`planned`] for manifests ranked with their stacks.
fn planned_ranked(dump: &Dump, ranked: &Ranked) -> (Vec<String>, Repair) {
    let live = &ranked.manifests;
    let claims = Claims {
        kept: live.iter().map(|m| m.container_id.to_string()).collect(),
        ..Claims::default()
    };
    let swept = plan(
        Backend::IptablesNft,
        Table::Nat,
        dump,
        Family::Ipv4,
        &claims,
    );
    let caps = Backend::IptablesNft.driver().capabilities();
    let repair = repair(
        Backend::IptablesNft,
        caps,
        Family::Ipv4,
        Table::Nat,
        dump,
        &swept.rules,
        ranked,
    );
    let mut batch: Batch = swept.batch;
    batch.ops.extend(repair.ops.clone());
    let lines = batch
        .render()
        .lines()
        .filter(|l| !matches!(*l, "*nat" | "COMMIT"))
        .map(String::from)
        .collect();
    (lines, repair)
}

/// A table wiped whole (a restore without natledger, `nft flush ruleset`): the chains, the
/// jumps, then every DNAT in natledger's order, the newest manifest's first.
#[test]
fn a_wiped_table_gets_chains_jumps_and_rules_newest_first() {
    let (old, new) = (manifest("old", &[8080]), manifest("new", &[8080, 9090]));
    let (lines, repair) = planned(&nat(&[]), &[&new, &old]);
    assert_eq!(
        lines,
        [
            ":NATLEDGER-HOSTPORTS - [0:0]",
            ":NATLEDGER-MASQ - [0:0]",
            "-I PREROUTING 1 -m addrtype --dst-type LOCAL -m comment --comment natledger -j NATLEDGER-HOSTPORTS",
            "-I OUTPUT 1 -m addrtype --dst-type LOCAL -m comment --comment natledger -j NATLEDGER-HOSTPORTS",
            "-I POSTROUTING 1 -m comment --comment natledger -j NATLEDGER-MASQ",
            &dnat("new", 8080),
            &dnat("new", 9090),
            &dnat("old", 8080),
        ]
    );
    let owners: Vec<Option<&str>> = repair
        .rules
        .iter()
        .map(|r| r.container.as_ref().map(ContainerId::as_str))
        .collect();
    assert_eq!(
        owners,
        [None, None, None, Some("new"), Some("new"), Some("old")]
    );
}

/// One DNAT deleted between others: it goes back between them, after the newer container's
/// and before the older's; nothing else is written.
#[test]
fn a_deleted_dnat_goes_back_in_its_place() {
    let (a, b, c) = (
        manifest("a", &[8080]),
        manifest("b", &[8080]),
        manifest("c", &[8080]),
    );
    let mut lines = shared();
    lines.extend([dnat("c", 8080), dnat("a", 8080)]);
    let (ops, repair) = planned(&nat(&lines), &[&c, &b, &a]);
    assert_eq!(
        ops,
        [format!("-I NATLEDGER-HOSTPORTS 2 {}", dnat_args("b", 8080))]
    );
    assert_eq!(repair.rules.len(), 1);
    // The newest missing: at the top.
    let (ops, _) = planned(&nat(&lines), &[&b, &c, &a]);
    assert_eq!(
        ops,
        [format!("-I NATLEDGER-HOSTPORTS 1 {}", dnat_args("b", 8080))]
    );
}

/// Nothing missing: no operation, not even for a foreign rule in natledger's chain.
#[test]
fn a_complete_table_needs_nothing() {
    let a = manifest("a", &[8080, 8081]);
    let mut lines = shared();
    lines.extend([
        dnat("a", 8080),
        "-A NATLEDGER-HOSTPORTS -p tcp -m tcp --dport 7 -j ACCEPT".to_string(),
        dnat("a", 8081),
    ]);
    let (ops, repair) = planned(&nat(&lines), &[&a]);
    assert!(ops.is_empty(), "{ops:?}");
    assert!(repair.rules.is_empty());
}

/// A dead container's rule goes (the sweep's plan) and is never put back; the live one's
/// place is counted in the chain the sweep leaves.
#[test]
fn dead_containers_rules_go_and_positions_count_without_them() {
    let (live, newer) = (manifest("live", &[8080]), manifest("newer", &[8081]));
    let mut lines = shared();
    lines.extend([dnat("dead", 8080), dnat("newer", 8081)]);
    let (ops, repair) = planned(&nat(&lines), &[&newer, &live]);
    assert_eq!(
        ops,
        [
            format!("-D NATLEDGER-HOSTPORTS {}", dnat_args("dead", 8080)),
            format!("-A NATLEDGER-HOSTPORTS {}", dnat_args("live", 8080)),
        ]
    );
    assert_eq!(
        repair.rules[0].container.as_ref().map(ContainerId::as_str),
        Some("live")
    );
}

/// Records natledger would not write (kept as text), or that name another owner or chain,
/// are never written; a manifest with nothing of this backend and family writes nothing.
#[test]
fn only_the_containers_own_typed_rules_are_written() {
    let mut odd = manifest("odd", &[]);
    for (chain, args) in [
        ("NATLEDGER-HOSTPORTS", dnat_args("someone-else", 8080)),
        ("PREROUTING", dnat_args("odd", 8080)),
        ("NATLEDGER-HOSTPORTS", "-j MARK --set-mark 1".to_string()),
    ] {
        odd.rules.push(RuleRecord::parse(
            Backend::IptablesNft,
            Family::Ipv4,
            "nat",
            chain,
            args.split_whitespace().map(String::from).collect(),
        ));
    }
    let (ops, fix) = planned(&nat(&[]), &[&odd]);
    // Only the chains and jumps the backend and family need.
    assert!(fix.rules.iter().all(|r| r.container.is_none()), "{ops:?}");
    assert_eq!(ops.len(), 5, "{ops:?}");
    // Another backend's or family's records are not this table's.
    let v6 = manifest("v6", &[8080]);
    let caps = Backend::IptablesLegacy.driver().capabilities();
    let other = repair(
        Backend::IptablesLegacy,
        caps,
        Family::Ipv4,
        Table::Nat,
        &nat(&[]),
        &[],
        &Ranked::unstacked(vec![&v6]),
    );
    assert!(other.ops.is_empty());
}

/// Through the operation: a live container's rules wiped by a restore without natledger's
/// (a foreign rule kept), a dead container's DNAT left: one transaction per table, filter
/// before nat, puts back exactly the live container's rules and chains and removes the dead
/// one's.
#[test]
fn a_sweep_with_repair_puts_back_the_live_and_removes_the_dead() {
    use crate::backend::Driver;
    use crate::ops::testing::{Call, FakeDriver, fake_context, fake_host, input};
    let dir = tempfile::tempdir().unwrap();
    let host = fake_host();
    let nft = FakeDriver::new(Backend::IptablesNft);
    let drivers: [&dyn Driver; 1] = [&nft];
    let ctx = fake_context(Ledger::new(dir.path()), &nft, &drivers, &host);
    crate::ops::create_runtime(&ctx, &input(dir.path())).unwrap();
    let live = ctx.ledger.load(&"c1".parse().unwrap()).unwrap().unwrap();
    let mut dead = manifest("dead", &[9000]);
    dead.pid = Some(1);
    ctx.ledger.lock().unwrap().store(&dead).unwrap();

    let foreign = "-A PREROUTING -p tcp -m tcp --dport 22 -j ACCEPT";
    let dump = format!(
        "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n\
         *nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
         :POSTROUTING ACCEPT [0:0]\n:NATLEDGER-HOSTPORTS - [0:0]\n{foreign}\n{}\nCOMMIT\n",
        dnat("dead", 9000)
    );
    nft.load(Family::Ipv4, &dump);
    nft.take_calls();
    let opts = crate::ops::SweepOptions {
        repair: true,
        ..Default::default()
    };
    let report = crate::ops::sweep(&ctx, &opts).unwrap();
    let applied: Vec<Call> = (nft.take_calls().into_iter())
        .filter(|c| matches!(c, Call::ApplyPlan(..)))
        .collect();
    let plan = |table: &str| Call::ApplyPlan(Family::Ipv4, table.to_string());
    assert_eq!(applied, [plan("filter"), plan("nat")]);
    let filter = nft.chains(Family::Ipv4, "filter");
    assert!(
        filter.iter().any(|c| c == "NATLEDGER-FORWARD"),
        "{filter:?}"
    );
    let nat = nft.lines(Family::Ipv4, "nat");
    assert!(!nat.contains(&dnat("dead", 9000)), "{nat:#?}");
    assert!(nat.iter().any(|l| l == foreign), "{nat:#?}");
    // Every record of the live container, and nothing of the dead one, is put back.
    let restored: Vec<&Restored> = report
        .tables
        .iter()
        .flat_map(|t| &t.rules_restored)
        .collect();
    let own = restored
        .iter()
        .filter(|r| r.container.as_ref().map(ContainerId::as_str) == Some("c1"));
    assert_eq!(own.count(), live.rules.len());
    assert!(
        restored
            .iter()
            .all(|r| r.container.as_ref().map(ContainerId::as_str) != Some("dead"))
    );
    for record in &live.rules {
        let line = format!("-A {} {}", record.chain, record.args().join(" "));
        let table = nft.lines(record.family, record.table_name());
        assert!(table.contains(&line), "{line}");
    }
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert!(!ctx.ledger.has_manifest(&"dead".parse().unwrap()));
}

/// Missing rules between present ones, at the top and at the end: each goes in at its final
/// place, in chain order, so the chain ends in natledger's order.
#[test]
fn missing_rules_interleaved_with_present_ones_land_in_order() {
    let ids = ["x", "a", "b", "c", "d", "e", "f"];
    let live: Vec<Manifest> = ids
        .iter()
        .zip(9000..)
        .map(|(id, port)| manifest(id, &[port]))
        .collect();
    let refs: Vec<&Manifest> = live.iter().collect();
    let mut lines = shared();
    lines.extend([dnat("a", 9001), dnat("c", 9003), dnat("e", 9005)]);
    let (ops, _) = planned(&nat(&lines), &refs);
    assert_eq!(
        ops,
        [
            format!("-I NATLEDGER-HOSTPORTS 1 {}", dnat_args("x", 9000)),
            format!("-I NATLEDGER-HOSTPORTS 3 {}", dnat_args("b", 9002)),
            format!("-I NATLEDGER-HOSTPORTS 5 {}", dnat_args("d", 9004)),
            format!("-A NATLEDGER-HOSTPORTS {}", dnat_args("f", 9006)),
        ]
    );
}

/// A stack (c in front of a, both on 8080) whose older manifest was rewritten after the
/// newer, and an unrelated container y rewritten last, created first (at the bottom).
fn stacked_c_on_a() -> (Manifest, Manifest, Manifest) {
    let mut c = manifest("c", &[8080]);
    c.stacked_on = vec!["a".parse().unwrap()];
    (manifest("y", &[9000]), manifest("a", &[8080]), c)
}

fn ranked<'m>(y: &'m Manifest, a: &'m Manifest, c: &'m Manifest) -> Ranked<'m> {
    use std::time::{Duration, SystemTime};
    let t = |s| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
    let stacks = [(c.container_id.clone(), c.stacked_on.clone())].into();
    rank(&[(t(50), y), (t(40), a), (t(30), c)], &stacks)
}

/// After a wipe the stack goes back in its order, though the older's file is newer.
#[test]
fn a_wiped_stack_goes_back_newer_first_whatever_the_files_times() {
    let (y, a, c) = stacked_c_on_a();
    let (lines, _) = planned_ranked(&nat(&[]), &ranked(&y, &a, &c));
    let dnats: Vec<&String> = lines.iter().filter(|l| l.contains("DNAT")).collect();
    assert_eq!(
        dnats,
        [&dnat("y", 9000), &dnat("c", 8080), &dnat("a", 8080)]
    );
}

/// One DNAT of a stack deleted, the other still there: the newer's goes back in front of the
/// older's, though the rule before it in the ranking (y's) is behind the older's; the older's
/// goes back behind the newer's.
#[test]
fn a_stacks_missing_dnat_lands_on_its_side_of_the_present_one() {
    let (y, a, c) = stacked_c_on_a();
    let ranked = ranked(&y, &a, &c);
    let mut lines = shared();
    lines.extend([dnat("a", 8080), dnat("y", 9000)]);
    let (ops, _) = planned_ranked(&nat(&lines), &ranked);
    assert_eq!(
        ops,
        [format!("-I NATLEDGER-HOSTPORTS 1 {}", dnat_args("c", 8080))]
    );
    let mut lines = shared();
    lines.extend([dnat("c", 8080), dnat("y", 9000)]);
    let (ops, _) = planned_ranked(&nat(&lines), &ranked);
    assert_eq!(
        ops,
        [format!("-I NATLEDGER-HOSTPORTS 2 {}", dnat_args("a", 8080))]
    );
}
