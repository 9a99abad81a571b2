//! nft poststop of a container with thousands of rules stays on the native path: one
//! nf_tables batch, no process. It used to ask for an acknowledgement per deleted rule, one
//! datagram each, and from a few hundred rules they overflowed the socket's receive buffer
//! (ENOBUFS): the poststop fell back to `iptables-nft-restore` after a 5 s wait. From a few
//! thousand the batch itself was larger than the socket's send buffer (EMSGSIZE).

mod common;

use common::*;

#[test]
fn a_poststop_of_thousands_of_rules_is_one_batch_and_no_process() {
    let node = Node::new(Backend::Nft);
    node.warm_up();
    let before = node.dump();
    // 400 mappings (1,600 rules: ENOBUFS before) and 4,000 (16,000: EMSGSIZE before).
    for n in [400usize, 4000] {
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
