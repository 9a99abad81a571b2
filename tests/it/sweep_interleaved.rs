//! Removal at scale stays exact (issue 22, item 3): sweep and poststop delete natledger's
//! rules by handle in one nf_tables batch (iptables-nft) or by an index of the read
//! (natledger's own nftables tables), flushing a chain whose every rule goes, and every
//! such batch is valid only at the generation it was read at.
//! - `interleaved_live_and_dead_containers_lose_exactly_the_dead_rules`: live and dead
//!   containers created alternately (their rules interleaved in every chain), look-alikes of
//!   other owners loaded; sweep removes exactly the dead ones' lines from the full dumps, on
//!   iptables-nft without starting a restore (netlink, by handle), the live container still
//!   answers TCP and UDP, and once the others stop the dumps are as before; all three
//!   backends.
//! - `an_nft_deletion_read_before_someone_else_wrote_deletes_nothing`: a flush of
//!   natledger's chain planned from a read, then another owner's rule appended to that
//!   chain: the batch is refused whole (ERESTART), the foreign rule and the container's rules
//!   stay; poststop then removes exactly the container's rules and the foreign one stays
//!   byte-identical; iptables-nft.
//! - `an_nftables_deletion_read_before_someone_else_wrote_deletes_nothing`: the same on
//!   natledger's own table, through `plan_own`/`commit_own`.

use std::time::Duration;

use crate::common::*;

const T: Duration = Duration::from_secs(3);

const LOOK_ALIKES: &str = "*nat\n:DOCKER - [0:0]\n\
    -A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER\n\
    -A DOCKER -p tcp -m tcp --dport 8080 -m comment --comment natledger:dead0 -j DNAT --to-destination 10.77.0.2:80\n\
    COMMIT\n";

/// The dump without the lines of these containers' rules.
fn without(dump: &str, ids: &[String]) -> String {
    dump.lines()
        .filter(|l| {
            !ids.iter().any(|id| {
                let tag = format!("natledger:{id}");
                // Only natledger's own chains hold its rules; the look-alike in DOCKER stays.
                l.contains(&tag) && !l.contains("DOCKER")
            })
        })
        .map(|l| format!("{l}\n"))
        .collect()
}

#[test]
fn interleaved_live_and_dead_containers_lose_exactly_the_dead_rules() {
    both(|backend| {
        let mut node = Node::new(backend);
        let c = node.topo.add_container(2);
        let _servers = [
            serve_tcp(&c.ns, c.sock_v4(80), "live tcp"),
            serve_udp(&c.ns, c.sock_v4(80), "live udp"),
        ];
        let iptables = if backend.is_iptables() {
            backend
        } else {
            Backend::IptablesNft
        };
        load_rules(node.topo.node(), iptables, Family::V4, LOOK_ALIKES);
        load_nft(node.topo.node(), NFT_LOOK_ALIKES);
        node.warm_up();
        let live_pid = node.topo.spawn_sleeper(&c.ns);
        let out = node.create(
            "live",
            Some(live_pid),
            &[("io.natledger.ports", "8080:80,8080:80/udp")],
        );
        assert_ok(&out, "create live");
        let with_live = node.dump();

        // Alternately a container that will die and one that lives, so that the dead ones'
        // rules sit between live ones in every chain.
        let node_ns = node.topo.node().to_string();
        let (mut dead, mut kept) = (Vec::new(), Vec::new());
        for i in 0..8u16 {
            let id = if i % 2 == 0 {
                format!("dead{}", i / 2)
            } else {
                format!("keep{}", i / 2)
            };
            let pid = node.topo.spawn_sleeper(&node_ns);
            let spec = format!("{}:90,{}:91/udp", 9100 + 2 * i, 9101 + 2 * i);
            let bundle = node.bundle(
                &id,
                &[
                    ("io.natledger.ports", spec.as_str()),
                    ("io.natledger.ip", "10.77.0.9,fd77::9"),
                ],
            );
            let out = node.hook("create-runtime", &id, Some(pid), &bundle);
            assert_ok(&out, &format!("create {id}"));
            if i % 2 == 0 {
                dead.push((id, pid));
            } else {
                kept.push((id, pid));
            }
        }
        for (_, pid) in &dead {
            kill_pid(*pid);
        }
        let before = node.dump();
        let dead_ids: Vec<String> = dead.iter().map(|(id, _)| id.clone()).collect();
        let expected = without(&before, &dead_ids);
        assert_ne!(
            expected, before,
            "{backend:?}: the dead containers have rules"
        );

        let out = node.natledger(&["sweep"], "", &[("NATLEDGER_TRACE", "1")]);
        assert_ok(&out, "sweep");
        let trace = stderr(&out);
        assert_eq!(
            node.dump(),
            expected,
            "{backend:?}: exactly the dead containers' rules go:\n{trace}"
        );
        if backend == Backend::IptablesNft {
            // Deleted by handle over netlink: no iptables-nft-restore, whose `-D` compares
            // each rule with the whole chain.
            assert!(trace.contains("netlink: deleted"), "{trace}");
            assert!(!trace.contains("-restore"), "{trace}");
        }
        for (id, _) in &dead {
            assert!(!node.manifest_exists(id), "{backend:?}: {id}'s manifest");
        }
        for (id, _) in &kept {
            assert!(node.manifest_exists(id), "{backend:?}: {id}'s manifest");
        }
        let ext = node.topo.ext();
        let to = sock(NODE_V4, 8080);
        let tcp = tcp_request(ext, to, T);
        assert_eq!(
            tcp.as_deref().ok(),
            Some("live tcp"),
            "{backend:?}: {tcp:?}"
        );
        let udp = udp_request(ext, to, T);
        assert_eq!(
            udp.as_deref().ok(),
            Some("live udp"),
            "{backend:?}: {udp:?}"
        );

        // A second sweep finds nothing to do; once the others stop, the dumps are as before.
        let out = node.sweep(&[]);
        assert_ok(&out, "second sweep");
        assert_eq!(node.dump(), expected, "{backend:?}: the second sweep");
        for (id, pid) in &kept {
            kill_pid(*pid);
            assert_ok(&node.poststop(id), &format!("poststop {id}"));
        }
        assert_eq!(node.dump(), with_live, "{backend:?}: back to the live one");
        kill_pid(live_pid);
    });
}

/// An appended rule of another owner in natledger's DNAT chain, as iptables-nft writes it.
const FOREIGN_IN_CHAIN: &str = "-p tcp -m tcp --dport 7777 -j DNAT --to-destination 10.1.1.1:80";

#[test]
fn an_nft_deletion_read_before_someone_else_wrote_deletes_nothing() {
    use natledger::kernel::netlink::Socket;
    use natledger::kernel::nftables::Session;
    use natledger::kernel::nftables::handles::{Victims, is_stale};

    let node = Node::new(Backend::IptablesNft);
    node.warm_up();
    let before = node.dump();
    let ns = node.topo.node().to_string();
    let ip = ("io.natledger.ip", "10.77.0.2");
    let out = node.create("c1", None, &[("io.natledger.ports", "8080:80,8081:81"), ip]);
    assert_ok(&out, "create c1");
    let with_c1 = node.dump();
    let foreign_line = format!("-A NATLEDGER-HOSTPORTS {FOREIGN_IN_CHAIN}");

    let (whole, outcome) = in_netns(&ns, || {
        let f = natledger::model::family::Family::Ipv4;
        let mut sock = Socket::netfilter().unwrap();
        let mut session = Session::new(&mut sock);
        let generation = session.generation().unwrap();
        let read = session.rules(f, "nat", "NATLEDGER-HOSTPORTS").unwrap();
        let victims = Victims::pick("nat", "NATLEDGER-HOSTPORTS", &read, |r| {
            r.comment.as_deref() == Some("natledger:c1")
        });
        // Someone else, between the read and the commit.
        let out = run_in(
            &ns,
            "iptables-nft",
            &["-t", "nat", "-A", "NATLEDGER-HOSTPORTS"]
                .into_iter()
                .chain(FOREIGN_IN_CHAIN.split(' '))
                .collect::<Vec<_>>(),
            None,
        );
        assert_ok(&out, "iptables-nft -A");
        let outcome = session.delete_at(f, generation, std::slice::from_ref(&victims));
        (
            victims.whole,
            outcome.map_err(|e| (is_stale(&e), e.to_string())),
        )
    });
    assert!(
        whole,
        "the read showed only c1's rules: a flush was planned"
    );
    assert!(
        matches!(outcome, Err((true, _))),
        "the stale batch was not refused: {outcome:?}"
    );
    let after = node.dump();
    assert!(after.contains(&foreign_line), "{after}");
    assert_eq!(
        after.replace(&format!("{foreign_line}\n"), ""),
        with_c1,
        "nothing of c1's went either"
    );

    let out = node.poststop("c1");
    assert_ok(&out, "poststop c1");
    let after = node.dump();
    assert!(
        after.contains(&foreign_line),
        "the foreign rule went:\n{after}"
    );
    assert_eq!(after.replace(&format!("{foreign_line}\n"), ""), before);
}

#[test]
fn an_nftables_deletion_read_before_someone_else_wrote_deletes_nothing() {
    use natledger::kernel::netlink::Socket;
    use natledger::kernel::nftables::Session;
    use natledger::model::save::{Batch, Op};

    let node = Node::new(Backend::OwnNftables);
    node.warm_up();
    let before = node.dump();
    let ns = node.topo.node().to_string();
    let ip = ("io.natledger.ip", "10.77.0.2");
    let out = node.create("c1", None, &[("io.natledger.ports", "8080:80,8081:81"), ip]);
    assert_ok(&out, "create c1");
    let with_c1 = node.dump();
    let manifest = node.manifest("c1");
    let foreign = "tcp dport 7777 dnat to 10.1.1.1:80 comment \"theirs\"";

    let (first, second) = in_netns(&ns, || {
        let f = natledger::model::family::Family::Ipv4;
        let mut sock = Socket::netfilter().unwrap();
        let mut session = Session::new(&mut sock);
        // c1's recorded IPv4 nat rules: every rule of its chains (a flush).
        let mut batch = Batch::new("nat");
        for r in manifest["rules"].as_array().unwrap() {
            if r["family"] == "ipv4" && r["table"] == "nat" {
                let args = r["rule"].as_array().unwrap();
                batch.ops.push(Op::Delete(
                    r["chain"].as_str().unwrap().to_string(),
                    args.iter()
                        .map(|a| a.as_str().unwrap().to_string())
                        .collect(),
                ));
            }
        }
        let batches = [batch];
        let planned = session.plan_own(f, &batches).unwrap();
        let add = format!("add rule ip natledger NATLEDGER-HOSTPORTS {foreign}\n");
        let out = run_in(&ns, "nft", &["-f", "-"], Some(add.as_bytes()));
        assert_ok(&out, "nft add rule");
        let first = session
            .commit_own(&planned)
            .map(|_| ())
            .map_err(|e| e.to_string());
        let second = session.plan_own(f, &batches).map(|_| ());
        (first, second.map_err(|e| e.to_string()))
    });
    assert!(first.is_err(), "the stale plan was committed: {first:?}");
    assert!(second.is_ok(), "{second:?}");
    let after = node.dump();
    assert!(after.contains(foreign), "the foreign rule went:\n{after}");
    let without_foreign = |dump: &str| -> String {
        dump.lines()
            .filter(|l| !l.contains("comment \"theirs\""))
            .map(|l| format!("{l}\n"))
            .collect()
    };
    assert_eq!(
        without_foreign(&after),
        with_c1,
        "nothing of c1's went either"
    );

    let out = node.poststop("c1");
    assert_ok(&out, "poststop c1");
    let after = node.dump();
    assert!(after.contains(foreign), "the foreign rule went:\n{after}");
    assert_eq!(without_foreign(&after), before);
}
