//! nft poststop of a container with thousands of rules stays on the native path: one
//! nf_tables batch, no process. It used to ask for an acknowledgement per deleted rule, one
//! datagram each, and from a few hundred rules they overflowed the socket's receive buffer
//! (ENOBUFS): the poststop fell back to `iptables-nft-restore` after a 5 s wait. From a few
//! thousand the batch itself was larger than the socket's send buffer (EMSGSIZE).

use crate::common::*;

#[test]
fn a_poststop_of_thousands_of_rules_is_one_batch_and_no_process() {
    let node = Node::new(Backend::IptablesNft);
    node.warm_up();
    let before = node.dump();
    // 400 mappings (1,600 rules: ENOBUFS before) and 1,024 (4,096 rules, the most one
    // container may have: a batch past the default send buffer, EMSGSIZE before).
    for n in [400usize, 1024] {
        let ports: Vec<String> = (0..n).map(|i| format!("{}:80", 20000 + i)).collect();
        let id = format!("big{n}");
        let ip = ("io.natledger.ip", "10.77.0.2");
        node.create(&id, None, &[("io.natledger.ports", &ports.join(",")), ip]);
        let tag = format!("natledger:{id}\"");
        let count = |dump: &str| dump.lines().filter(|l| l.contains(&tag)).count();
        assert_eq!(count(&node.dump()), 4 * n, "{id}'s rules after create");

        let bundle = node.dir.path().join("bundles").join(&id);
        let out = node.hook_env("poststop", &id, None, &bundle, &[("NATLEDGER_TRACE", "1")]);
        assert_ok(&out, &format!("poststop {id}"));
        let err = stderr(&out);
        let execs: Vec<&str> = err.lines().filter(|l| l.contains(": exec ")).collect();
        assert!(execs.is_empty(), "{id}: poststop started processes:\n{err}");
        assert!(!err.contains("warning"), "{id}:\n{err}");
        assert_eq!(node.dump(), before, "{id}: the tables are as before");
    }
}

/// A delete batch naming a rule someone else deleted between natledger's dump and its batch
/// fails whole and at once: the middle deletion's error (it asked for no acknowledgement)
/// is answered before the last deletion's acknowledgement, so the caller learns it did not
/// delete (and falls back) without waiting for the 5 s answer timeout, and nothing of the
/// batch is deleted. Also when the vanished rule is the last one (the one that asks), the
/// first one, and when so many vanished that their errors overflow the receive buffer.
#[test]
fn a_batch_naming_a_vanished_rule_fails_whole_and_promptly() {
    use natledger::kernel::netlink::Socket;
    use natledger::kernel::nftables::Session;
    use std::time::{Duration, Instant};

    let topo = Topology::new();
    let ns = topo.node().to_string();
    // (rules in the chain, indexes of the rules deleted by "someone else" first)
    let cases: [(usize, Vec<usize>); 4] = [
        (5, vec![2]),
        (5, vec![4]),
        (5, vec![0]),
        (3000, (0..2999).collect()),
    ];
    for (n, vanish) in cases {
        let mut text = String::from("*nat\n:VICTIMS - [0:0]\n");
        for i in 0..n {
            text += &format!(
                "-A VICTIMS -p tcp -m tcp --dport {} -m comment --comment v -j ACCEPT\n",
                1 + i
            );
        }
        text += "COMMIT\n";
        load_rules(&ns, Backend::IptablesNft, Family::V4, &text);
        let (outcome, took, left) = in_netns(&ns, || {
            let f = natledger::model::family::Family::Ipv4;
            let mut sock = Socket::netfilter().unwrap();
            let mut session = Session::new(&mut sock);
            let handles: Vec<u64> = session
                .rules(f, "nat", "VICTIMS")
                .unwrap()
                .iter()
                .map(|r| r.handle)
                .collect();
            assert_eq!(handles.len(), n);
            // Someone else, on a socket of their own.
            let mut other = Socket::netfilter().unwrap();
            let gone: Vec<(&str, &str, u64)> = vanish
                .iter()
                .map(|&i| ("nat", "VICTIMS", handles[i]))
                .collect();
            Session::new(&mut other).delete(f, &gone).unwrap();
            let victims: Vec<(&str, &str, u64)> =
                handles.iter().map(|&h| ("nat", "VICTIMS", h)).collect();
            let start = Instant::now();
            let outcome = session.delete(f, &victims);
            let took = start.elapsed();
            let left = session.rules(f, "nat", "VICTIMS").unwrap().len();
            (outcome.map_err(|e| e.to_string()), took, left)
        });
        let what = format!("{n} rules, {} vanished", vanish.len());
        let err = outcome.expect_err(&format!("{what}: the batch reported success"));
        assert!(
            took < Duration::from_secs(1),
            "{what}: took {took:?}: {err}"
        );
        assert_eq!(left, n - vanish.len(), "{what}: not all-or-nothing ({err})");
        // The next batch on a fresh socket works (nothing left half-done).
        load_rules(
            &ns,
            Backend::IptablesNft,
            Family::V4,
            "*nat\n-F VICTIMS\nCOMMIT\n",
        );
        eprintln!("{what}: {err} in {took:?}");
    }
}
