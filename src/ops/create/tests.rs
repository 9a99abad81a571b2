use super::*;
use crate::exec::Invocation;
use crate::ledger::Ledger;
use crate::ops::testing::*;

fn stdin_of(inv: &Invocation) -> String {
    String::from_utf8(inv.stdin.clone().unwrap()).unwrap()
}

#[test]
fn with_the_shared_chains_present_create_is_one_restore() {
    let dir = tempfile::tempdir().unwrap();
    let script = Script::new(vec![ok("")]);
    let ctx = Context::new(
        Ledger::new(dir.path()),
        crate::backend::Backend::Nft,
        &script,
    );
    let created = create_runtime(&ctx, &input(dir.path())).unwrap();
    assert_eq!(created, Created::Installed { rules: 4 });
    let calls = script.calls.borrow();
    assert_eq!(calls.len(), 1);
    assert!(calls[0].program.ends_with("iptables-nft-restore"));
    let batch = stdin_of(&calls[0]);
    // Filter first: the accept is in force before the DNAT.
    let (filter, nat) = batch.split_once("*nat").unwrap();
    assert!(filter.starts_with("*filter\n"));
    assert!(filter.contains("-C FORWARD -m comment --comment natledger -j NATLEDGER-FORWARD"));
    assert!(filter.contains("-A NATLEDGER-FORWARD -m conntrack --ctstate DNAT --ctproto 6"));
    assert!(nat.contains("-C PREROUTING -m addrtype --dst-type LOCAL"));
    assert!(nat.contains("-I NATLEDGER-HOSTPORTS 1 -p tcp"));
    let manifest = ctx.ledger.load(&"c1".parse().unwrap()).unwrap().unwrap();
    assert_eq!(manifest.phase, Phase::Installed);
    assert_eq!(manifest.rules.len(), 4);
    assert_eq!(manifest.rules[0].table, "filter");
}

#[test]
fn without_them_create_reads_and_creates_only_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let dump = "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n\
                :NATLEDGER-MASQ - [0:0]\n\
                -A POSTROUTING -m comment --comment natledger -j NATLEDGER-MASQ\nCOMMIT\n";
    // Docker's FORWARD: natledger's jump goes after DOCKER-USER, the isolation jump and the
    // rest.
    let filter = "*filter\n:FORWARD DROP [0:0]\n:DOCKER-USER - [0:0]\n\
                  :DOCKER-ISOLATION-STAGE-1 - [0:0]\n:DOCKER - [0:0]\n\
                  -A FORWARD -j DOCKER-USER\n-A FORWARD -j DOCKER-ISOLATION-STAGE-1\n\
                  -A FORWARD -o docker0 -j DOCKER\nCOMMIT\n";
    let script = Script::new(vec![fail(), ok(filter), ok(""), ok(dump), ok("")]);
    let ctx = Context::new(
        Ledger::new(dir.path()),
        crate::backend::Backend::Nft,
        &script,
    );
    create_runtime(&ctx, &input(dir.path())).unwrap();
    let calls = script.calls.borrow();
    assert_eq!(calls.len(), 5);
    assert_eq!(calls[1].args, ["-t", "filter"]);
    let batch = stdin_of(&calls[2]);
    assert!(batch.contains(":NATLEDGER-FORWARD - [0:0]"));
    assert!(batch.contains("-A FORWARD -m comment --comment natledger -j NATLEDGER-FORWARD"));
    assert_eq!(calls[3].args, ["-t", "nat"]);
    let batch = stdin_of(&calls[4]);
    assert!(batch.contains(":NATLEDGER-HOSTPORTS - [0:0]"));
    assert!(
        !batch.contains(":NATLEDGER-MASQ"),
        "an existing chain is never redeclared"
    );
    assert!(batch.contains("-I PREROUTING 1"));
    assert!(batch.contains("-I OUTPUT 1"));
    assert!(
        !batch.contains("-I POSTROUTING"),
        "an existing jump is not duplicated"
    );
}

#[test]
fn a_failed_install_leaves_no_manifest() {
    let dir = tempfile::tempdir().unwrap();
    // The fast transaction fails, then reading the tables fails (the filter table only
    // costs its accept, the nat table the start): nothing was applied, so the rollback
    // starts no process and only drops the manifest.
    let script = Script::new(vec![fail(), fail(), fail()]);
    let ctx = Context::new(
        Ledger::new(dir.path()),
        crate::backend::Backend::Nft,
        &script,
    );
    let err = create_runtime(&ctx, &input(dir.path())).unwrap_err();
    assert!(
        err.to_string().contains("iptables-nft-save -t nat failed"),
        "{err}"
    );
    assert!(!ctx.ledger.has_manifest(&"c1".parse().unwrap()));
    assert_eq!(script.calls.borrow().len(), 3);
}

#[test]
fn a_filter_table_that_cannot_be_written_costs_only_the_accept() {
    let dir = tempfile::tempdir().unwrap();
    let nat =
        "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\nCOMMIT\n";
    let script = Script::new(vec![fail(), fail(), ok(nat), ok("")]);
    let ctx = Context::new(
        Ledger::new(dir.path()),
        crate::backend::Backend::Nft,
        &script,
    );
    let created = create_runtime(&ctx, &input(dir.path())).unwrap();
    assert_eq!(created, Created::Installed { rules: 3 });
    let manifest = ctx.ledger.load(&"c1".parse().unwrap()).unwrap().unwrap();
    assert!(
        manifest.rules.iter().all(|r| r.table == "nat"),
        "{manifest:?}"
    );
    assert_eq!(manifest.phase, Phase::Installed);
}

#[test]
fn no_annotation_runs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let script = Script::new(vec![]);
    let ctx = Context::new(
        Ledger::new(dir.path()),
        crate::backend::Backend::Nft,
        &script,
    );
    let mut plain = input(dir.path());
    plain.annotations.clear();
    assert_eq!(create_runtime(&ctx, &plain).unwrap(), Created::Skipped);
    assert!(script.calls.borrow().is_empty());
    assert!(!dir.path().join("containers").exists());
}

#[test]
fn tags_name_the_container() {
    assert_eq!(crate::layout::tag(&"abc".parse().unwrap()), "natledger:abc");
}
