//! doctor on `*-save -c` dumps: taken with real `iptables-legacy-save -c` and
//! `iptables-nft-save -c` in a test namespace after real traffic, read with their counters,
//! and the counters given as evidence of a shadow.

use std::time::Duration;

use crate::common::*;

const T: Duration = Duration::from_secs(3);

/// Two hand-written DNATs of port 9090: the first to a container that answers "first", the
/// second (shadowed) to another. After three connections, `*-save -c` shows the first rule
/// counting and the second at 0: doctor reads the dump (exit 2, not 3) and says so.
#[test]
fn counted_dumps_are_read_and_their_counters_are_evidence() {
    // `*-save -c` dumps of foreign iptables rules: the iptables backends only.
    iptables_both(|backend| {
        let mut node = Node::new(backend);
        let host = node.topo.node().to_string();
        let ext = node.topo.ext().to_string();
        let c2 = node.topo.add_container(2);
        let c3 = node.topo.add_container(3);
        let _servers = [
            serve_tcp(&c2.ns, c2.sock_v4(80), "first"),
            serve_tcp(&c3.ns, c3.sock_v4(80), "second"),
        ];
        let rules = "*nat\n\
            -A PREROUTING -p tcp -m tcp --dport 9090 -j DNAT --to-destination 10.77.0.2:80\n\
            -A PREROUTING -p tcp -m tcp --dport 9090 -j DNAT --to-destination 10.77.0.3:80\n\
            COMMIT\n";
        load_rules(&host, backend, Family::V4, rules);
        for _ in 0..3 {
            assert_eq!(
                tcp_request(&ext, sock(NODE_V4, 9090), T).ok().as_deref(),
                Some("first")
            );
        }
        let prog = format!("{}-save", iptables_tool(backend, Family::V4));
        let out = run_in(&host, &prog, &["-c"], None);
        assert!(out.status.success(), "{prog} -c");
        let dump = String::from_utf8(out.stdout).unwrap();
        let counted: Vec<&str> = dump
            .lines()
            .filter(|l| l.contains("--dport 9090"))
            .collect();
        assert_eq!(counted.len(), 2, "{dump}");
        assert!(counted[0].starts_with("[3:"), "{dump}");
        assert!(counted[1].starts_with("[0:0] -A PREROUTING"), "{dump}");

        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), &dump).unwrap();
        let arg = format!("{}:{}", backend.name(), file.path().display());
        let d = doctor_json(&["--from", &arg]);
        assert_eq!(d.code, 2, "{backend:?}\n{dump}\n{}", d.show());
        let f = d.of_kind("shadowed");
        assert_eq!(f.len(), 1, "{}", d.show());
        let at = |i: usize| line_of(f[0], i);
        assert!(
            at(0).ends_with("10.77.0.2:80") && at(1).ends_with("10.77.0.3:80"),
            "{}",
            d.show()
        );
        // The line as an operator would paste it: no counters.
        assert!(at(0).starts_with("-A PREROUTING "), "{}", d.show());
        assert_eq!(
            text(f[0], "evidence"),
            "counters: nat rule 1 of PREROUTING has matched 3 packets while rule 2 of \
             PREROUTING has matched none",
            "{}",
            d.show()
        );
    });
}
