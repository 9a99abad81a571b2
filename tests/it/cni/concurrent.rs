//! Concurrent CNI calls, as a runtime starting and stopping many pods makes them: every call a
//! process of its own (the binary with `CNI_*` and the config on stdin), many at once.
//! ADDs on distinct host ports all forward; two ADDs asking the same host port with
//! `portConflict: "refuse"`: one wins, the other gets a CNI error naming the holder and leaves
//! nothing behind (without it both win: `held.rs`); DELs, a DEL twice at
//! once and DELs racing a re-ADD of the same attachment end with full `*-save` dumps equal to
//! those before (`nft list ruleset` included) and no manifest. All three backends.

use std::process::Output;
use std::sync::Barrier;
use std::time::Duration;

use crate::common::*;
use serde_json::Value;

const T: Duration = Duration::from_secs(3);
const ATTACHMENTS: u8 = 16;
const FIRST_PORT: u16 = 9000;

fn id(i: u8) -> String {
    format!("k{i:02}")
}

/// What any successful call may say on stderr, as (start, end) of a line: the first ADD
/// behind the bridge enables route_localnet there (the one that finds it unset says so).
const EXPECTED_STDERR: &[(&str, &str)] = &[("natledger: set route_localnet=1 on br0", "")];
/// What an ADD of an attachment that is already there may say too: its earlier rules are
/// replaced.
const READD_STDERR: (&str, &str) = (
    "natledger: removed ",
    "(an earlier create of the same container)",
);

/// A CNI call that succeeded: exit 0, nothing on stderr but the expected lines.
fn assert_clean(out: &Output, what: &str) {
    assert_clean_but(out, what, &[]);
}

fn assert_clean_but(out: &Output, what: &str, also: &[(&str, &str)]) {
    assert_ok(out, what);
    let said = stderr(out);
    let unexpected: Vec<&str> = said
        .lines()
        .filter(|l| {
            !EXPECTED_STDERR
                .iter()
                .chain(also)
                .any(|(start, end)| l.starts_with(start) && l.ends_with(end))
        })
        .collect();
    assert!(unexpected.is_empty(), "{what}: unexpected stderr: {said}");
}

/// Run `calls` each on a thread of its own, all released at once; their outputs in order.
fn at_once<'a>(calls: Vec<Box<dyn FnOnce() -> Output + Send + 'a>>) -> Vec<Output> {
    let barrier = Barrier::new(calls.len());
    std::thread::scope(|s| {
        let handles: Vec<_> = calls
            .into_iter()
            .map(|call| {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    call()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn del(node: &Node, id: &str, c: &Container, port: u16) -> Output {
    let netns = format!("/run/netns/{}", c.ns);
    cni_call(
        node,
        "DEL",
        id,
        Some(&netns),
        &cni_config(node, "testnet", c, port),
    )
}

/// 16 ADDs at once on distinct host ports (each prints `prevResult`, TCP from outside reaches
/// each), then 16 DELs at once, two twice at once and two racing a re-ADD: dumps as before, no
/// manifest, no stray stderr.
#[test]
fn concurrent_adds_and_dels_forward_then_restore_the_tables() {
    both(|backend| {
        let mut node = Node::new(backend);
        let cs: Vec<Container> = (0..ATTACHMENTS)
            .map(|i| node.topo.add_container(i + 2))
            .collect();
        let _servers: Vec<_> = cs
            .iter()
            .map(|c| serve_tcp(&c.ns, c.sock_v4(80), &c.ns))
            .collect();
        node.warm_up();
        let before = node.dump();
        let port = |i: u8| FIRST_PORT + u16::from(i);

        // 16 ADDs at once, distinct host ports.
        let node_ref = &node;
        let adds = at_once(
            cs.iter()
                .enumerate()
                .map(|(i, c)| {
                    let i = i as u8;
                    Box::new(move || cni_add(node_ref, "testnet", &id(i), c, port(i)))
                        as Box<dyn FnOnce() -> Output + Send>
                })
                .collect(),
        );
        for (i, out) in adds.iter().enumerate() {
            assert_clean(out, &format!("{backend:?} ADD {}", id(i as u8)));
            let result: Value = serde_json::from_slice(&out.stdout).unwrap();
            let netns = format!("/run/netns/{}", cs[i].ns);
            assert_eq!(
                result,
                cni_prev_result(&cs[i], &netns),
                "ADD prints prevResult"
            );
        }
        assert_eq!(node.manifests().len(), usize::from(ATTACHMENTS));
        let ext = node.topo.ext().to_string();
        for (i, c) in cs.iter().enumerate() {
            assert_eq!(
                tcp_request(&ext, sock(NODE_V4, port(i as u8)), T)
                    .ok()
                    .as_deref(),
                Some(c.ns.as_str()),
                "{backend:?} port {} after the concurrent ADDs",
                port(i as u8)
            );
        }

        // DELs at once: two attachments DELed twice at once, two DELed while the same
        // attachment is ADDed again, the rest once.
        let mut calls: Vec<Box<dyn FnOnce() -> Output + Send>> = Vec::new();
        let mut what = Vec::new();
        for (i, c) in cs.iter().enumerate() {
            let i = i as u8;
            let times = if i < 2 { 2 } else { 1 };
            for _ in 0..times {
                calls.push(Box::new(move || del(node_ref, &id(i), c, port(i))));
                what.push(format!("DEL {}", id(i)));
            }
            if (2..4).contains(&i) {
                calls.push(Box::new(move || {
                    cni_add(node_ref, "testnet", &id(i), c, port(i))
                }));
                what.push(format!("ADD {} racing its DEL", id(i)));
            }
        }
        for (out, what) in at_once(calls).iter().zip(&what) {
            let also: &[(&str, &str)] = if what.contains("racing") {
                &[READD_STDERR]
            } else {
                &[]
            };
            assert_clean_but(out, &format!("{backend:?} {what}"), also);
        }
        // Whichever of ADD and DEL came last, the attachment is either whole or gone: a
        // re-ADD left it forwarding; the runtime's DEL then removes it.
        for i in 2..4u8 {
            let c = &cs[usize::from(i)];
            if node.manifest_exists(&format!("{}+eth0", id(i))) {
                assert_eq!(
                    tcp_request(&ext, sock(NODE_V4, port(i)), T).ok().as_deref(),
                    Some(c.ns.as_str()),
                    "{backend:?} {} re-ADDed after its DEL",
                    id(i)
                );
            }
            assert_clean(&del(&node, &id(i), c, port(i)), "final DEL");
        }
        assert_eq!(node.manifests(), Vec::<String>::new(), "{backend:?}");
        assert_eq!(node.dump(), before, "{backend:?}: dumps after the DELs");
    });
}

/// ADD of `cid` forwarding 9100 to `c`, with `portConflict: "refuse"`.
fn refusing_add(node: &Node, cid: &str, c: &Container) -> Output {
    let mut config = cni_config(node, "testnet", c, 9100);
    config["portConflict"] = serde_json::json!("refuse");
    let netns = format!("/run/netns/{}", c.ns);
    cni_call(node, "ADD", cid, Some(&netns), &config)
}

/// Two ADDs of different attachments asking one host port with `portConflict: "refuse"`
/// (three rounds): one wins and forwards, the other's CNI error names the holder and the port, it leaves no rule and no
/// manifest, and its DEL changes nothing.
#[test]
fn two_adds_asking_the_same_host_port_one_wins_the_other_leaves_nothing() {
    both(|backend| {
        let mut node = Node::new(backend);
        let a = node.topo.add_container(2);
        let b = node.topo.add_container(3);
        let _servers = [&a, &b].map(|c| serve_tcp(&c.ns, c.sock_v4(80), &c.ns));
        node.warm_up();
        let before = node.dump();
        let node_ref = &node;
        for round in 0..3 {
            let outs = at_once(vec![
                Box::new(|| refusing_add(node_ref, "ra", &a)),
                Box::new(|| refusing_add(node_ref, "rb", &b)),
            ]);
            let won: Vec<usize> = (0..2).filter(|&i| outs[i].status.success()).collect();
            assert_eq!(won.len(), 1, "{backend:?} round {round}: exactly one wins");
            let (winner, loser) = if won[0] == 0 {
                (("ra", &a), ("rb", &b))
            } else {
                (("rb", &b), ("ra", &a))
            };
            assert_clean(&outs[won[0]], "winning ADD");
            let lost = &outs[1 - won[0]];
            let error: Value = serde_json::from_slice(&lost.stdout)
                .unwrap_or_else(|e| panic!("no error object ({e}): {}", stderr(lost)));
            let said = format!("{} {}", error["msg"], error["details"]);
            assert!(
                said.contains(&format!("{}+eth0", winner.0)) && said.contains("9100"),
                "{backend:?}: the error names the holder and the port: {error:#}"
            );
            assert!(!node.manifest_exists(&format!("{}+eth0", loser.0)));
            let dump = node.dump();
            assert!(
                !dump.contains(&format!("natledger:{}+eth0", loser.0)),
                "{backend:?}: no rule of the loser:\n{dump}"
            );
            assert_eq!(
                tcp_request(node.topo.ext(), sock(NODE_V4, 9100), T)
                    .ok()
                    .as_deref(),
                Some(winner.1.ns.as_str()),
                "{backend:?}: the winner forwards"
            );
            // The runtime DELs the failed attachment: the winner's rules stay.
            assert_clean(&del(&node, loser.0, loser.1, 9100), "loser's DEL");
            assert_eq!(
                node.dump(),
                dump,
                "{backend:?}: the loser's DEL changes nothing"
            );
            assert_clean(&del(&node, winner.0, winner.1, 9100), "winner's DEL");
            assert_eq!(node.manifests(), Vec::<String>::new());
            assert_eq!(node.dump(), before, "{backend:?} round {round}");
        }
    });
}
