//! Crash safety of CNI ADD and DEL through the libcni-style driver (bridge, host-local,
//! natledger), on every backend: natledger SIGKILLed (`NATLEDGER_FAULT`) at every fault point
//! ADD and DEL pass (`create:*`, and DEL's `poststop:locked` / `poststop:deleted`: DEL goes
//! poststop's way, so it needs no point of its own).
//!
//! - `an_add_killed_at_any_step_is_undone_by_the_runtimes_del`: the driver reports the plugin
//!   killed (a manifest left from the write-ahead on); the runtime's DEL of the whole conflist
//!   (no cached result, as after a failed ADD) alone leaves the full dumps equal to those
//!   after a clean ADD and DEL (only the shared chains and jumps), the foreign iptables and
//!   nftables rules loaded before byte for byte in them; a `natledger sweep` after changes
//!   nothing, no manifest is left, and the next ADD on the same port carries TCP from the
//!   `ext` namespace.
//! - `a_del_killed_at_any_step_is_finished_by_the_next_del`: ADD, DEL killed (the cache
//!   stays), DEL again (the cached result as `prevResult`): the same.

use std::time::Duration;

use natledger::fault;
use serde_json::json;

use crate::common::*;

const T: Duration = Duration::from_secs(3);

/// Another owner's rules beside natledger's, in the iptables backend's tables (and
/// `NFT_LOOK_ALIKES`, whose DNAT of 8080 keeps these tests on 8090).
const FOREIGN: &str = "*nat\n:FOREIGN - [0:0]\n\
    -A PREROUTING -m addrtype --dst-type LOCAL -j FOREIGN\n\
    -A FOREIGN -p tcp -m tcp --dport 9999 -m comment --comment other:c1 -j DNAT --to-destination 10.79.1.250:80\n\
    -A POSTROUTING -s 10.79.1.0/24 -m comment --comment other -j MASQUERADE\n\
    COMMIT\n";

/// A node with foreign rules loaded, a sandbox answering TCP on port 80, and the dumps after
/// a clean ADD and DEL (natledger's shared chains and jumps in place).
struct Crashes<'n> {
    node: &'n Node,
    pod: String,
    net: Conflist<'n>,
    /// The dumps with only the foreign rules, before natledger ran.
    foreign: String,
    baseline: String,
}

const PORTS: [PortMap; 1] = [PortMap {
    host_port: 8090,
    container_port: 80,
    protocol: "tcp",
    host_ip: None,
}];

impl<'n> Crashes<'n> {
    fn new(node: &'n Node, pod: String) -> Crashes<'n> {
        let ns = node.topo.node();
        let iptables = if node.backend.is_iptables() {
            node.backend
        } else {
            Backend::IptablesNft
        };
        load_rules(ns, iptables, Family::V4, FOREIGN);
        load_nft(ns, NFT_LOOK_ALIKES);
        let net = Conflist::bridge(node, "crashnet", 1).with_plugin("natledger", json!({}));
        let crashes = Crashes {
            node,
            pod,
            net,
            foreign: node.dump(),
            baseline: String::new(),
        };
        crashes.add_answers("clean");
        crashes.del("clean");
        let baseline = node.dump();
        assert!(baseline.contains("other:c1"), "{baseline}");
        assert!(baseline.contains("table inet natledger"), "{baseline}");
        Crashes {
            baseline,
            ..crashes
        }
    }

    fn with_fault(&self, point: &str) -> Conflist<'n> {
        self.net.clone().with_env("natledger", fault::ENV, point)
    }

    fn del(&self, id: &str) {
        let backend = self.node.backend;
        self.net
            .del(id, &self.pod, &PORTS)
            .unwrap_or_else(|e| panic!("{backend:?} DEL {id}: {e}"));
    }

    /// ADD `id` cleanly; its port answers from `ext`.
    fn add_answers(&self, id: &str) {
        let backend = self.node.backend;
        self.net
            .add(id, &self.pod, &PORTS)
            .unwrap_or_else(|e| panic!("{backend:?} ADD {id}: {e}"));
        let ext = self.node.topo.ext();
        let tcp = tcp_request(ext, sock(NODE_V4, 8090), T);
        assert_eq!(
            tcp.as_deref().ok(),
            Some("pod"),
            "{backend:?} {id}: {tcp:?}\n{}",
            self.node.dump()
        );
    }

    /// After a kill at `point` and the runtime's repair: sweep, then nothing of the killed
    /// call's left, and the port works for the next attachment.
    fn assert_repaired(&self, point: &str, id: &str) {
        let backend = self.node.backend;
        let dump = self.node.dump();
        let gone: Vec<&str> = (self.foreign.lines())
            .filter(|l| !dump.lines().any(|d| d == *l))
            .collect();
        assert!(
            gone.is_empty(),
            "{backend:?} {point}: foreign lines changed: {gone:?}"
        );
        assert_ok(
            &self.node.sweep(&[]),
            &format!("{backend:?} sweep after {point}"),
        );
        assert_eq!(
            self.node.dump(),
            self.baseline,
            "{backend:?}: after a kill at {point}"
        );
        assert!(
            self.node.manifests().is_empty(),
            "{backend:?} {point}: {:?}",
            self.node.manifests()
        );
        assert_eq!(self.net.cached(id), None, "{backend:?} {point}: cache");
        let next = format!("{id}-next");
        self.add_answers(&next);
        self.del(&next);
        assert_eq!(self.node.dump(), self.baseline, "{backend:?} {point}: next");
    }
}

fn killed_natledger(result: Result<impl std::fmt::Debug, CniFailure>, what: &str) {
    match result {
        Err(e) if e.plugin == "natledger" && e.killed() => {}
        other => panic!("{what}: natledger should have been killed: {other:?}"),
    }
}

#[test]
fn an_add_killed_at_any_step_is_undone_by_the_runtimes_del() {
    both(|backend| {
        let mut node = Node::new(backend);
        let pod = node.topo.add_sandbox(2);
        let _server = serve_tcp(&pod, sock([0, 0, 0, 0], 80), "pod");
        let crashes = Crashes::new(&node, pod);
        let points = fault::POINTS.iter().filter(|p| p.starts_with("create:"));
        for (i, point) in points.enumerate() {
            let id = format!("add{i}");
            let add = crashes.with_fault(point).add(&id, &crashes.pod, &PORTS);
            killed_natledger(add, &format!("{backend:?} ADD at {point}"));
            assert_eq!(crashes.net.cached(&id), None, "a failed ADD caches nothing");
            // From the write-ahead on, the manifest names what may be in the tables.
            let written_ahead = *point != fault::CREATE_CLAIMS_RELEASED;
            assert_eq!(
                node.manifest_exists(&format!("{id}+{IFNAME}")),
                written_ahead,
                "{backend:?} {point}"
            );
            crashes.del(&id);
            assert_eq!(
                node.dump(),
                crashes.baseline,
                "{backend:?} {point}: DEL alone"
            );
            crashes.assert_repaired(point, &id);
        }
    });
}

#[test]
fn a_del_killed_at_any_step_is_finished_by_the_next_del() {
    both(|backend| {
        let mut node = Node::new(backend);
        let pod = node.topo.add_sandbox(2);
        let _server = serve_tcp(&pod, sock([0, 0, 0, 0], 80), "pod");
        let crashes = Crashes::new(&node, pod);
        let points = fault::POINTS.iter().filter(|p| p.starts_with("poststop:"));
        for (i, point) in points.enumerate() {
            let id = format!("del{i}");
            crashes.add_answers(&id);
            let del = crashes.with_fault(point).del(&id, &crashes.pod, &PORTS);
            killed_natledger(del, &format!("{backend:?} DEL at {point}"));
            assert!(
                crashes.net.cached(&id).is_some(),
                "a failed DEL keeps the cache"
            );
            crashes.del(&id);
            assert_eq!(
                node.dump(),
                crashes.baseline,
                "{backend:?} {point}: DEL alone"
            );
            crashes.assert_repaired(point, &id);
        }
    });
}
