//! podman end to end with natledger as a chained CNI plugin: Debian 12's podman 4.3 uses CNI,
//! so `podman run -p` reaches the plugin chain as `runtimeConfig.portMappings`. The conflist is
//! bridge + host-local + natledger, natledger installed into a test-private CNI plugin
//! directory as a link named `natledger` (as scripts/install.sh does). Everything runs in the
//! test's node namespace with podman's storage, run root, locks and network configuration
//! under a temporary directory. The same scenario with CNI `portmap` in natledger's place is
//! the control, in the same test.
//!
//! The bridge plugin runs with `ipMasq: false` (it then writes no iptables rule), so full
//! `*-save` dumps before and after compare natledger's (or portmap's) rules only.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use crate::common::*;

const NETWORK: &str = "natledger-cni";
const PORT: u16 = 6667;
const T: Duration = Duration::from_secs(10);

/// The port-mapping plugin after bridge in the conflist.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mapper {
    Natledger,
    Portmap,
}

/// podman whose conflist is bridge (no ipMasq) + `mapper`, plugins from a test-private
/// directory holding the `natledger` link; no hook.
fn chained_podman(node: &Node, mapper: Mapper) -> Podman {
    // The README's migration: portmap's entry with `type` changed, capabilities kept;
    // natledger's own keys name the test's state directory and backend.
    let mapper_conf = match mapper {
        Mapper::Portmap => {
            serde_json::json!({"type": "portmap", "capabilities": {"portMappings": true}})
        }
        Mapper::Natledger => serde_json::json!({
            "type": "natledger", "capabilities": {"portMappings": true},
            "stateDir": node.state_dir(), "backend": node.backend.name(),
        }),
    };
    Podman::new(
        node,
        PodmanConfig {
            network: NETWORK,
            bridge: "nlt-cni0",
            subnet: "10.90.0.0/24",
            gateway: "10.90.0.1",
            cni_version: "1.0.0",
            ip_masq: false,
            chain: vec![mapper_conf],
            plugin_dir: PluginDir::Private,
            hook: false,
        },
    )
}

/// `podman run -d -p PORT:80` of busybox httpd; returns the container id.
fn start(podman: &mut Podman, name: &str) -> String {
    podman.start(name, &["-p", &format!("{PORT}:80")])
}

/// The three client paths: the node's 127.0.0.1, the node's address, the external client.
fn paths(node: &Node) -> [(&'static str, &str, std::net::SocketAddr); 3] {
    [
        (
            "node 127.0.0.1",
            node.topo.node(),
            sock(Ipv4Addr::LOCALHOST, PORT),
        ),
        ("node address", node.topo.node(), sock(NODE_V4, PORT)),
        ("external client", node.topo.ext(), sock(NODE_V4, PORT)),
    ]
}

fn assert_answers(node: &Node, what: &str) {
    for (path, ns, dst) in paths(node) {
        if let Err(e) = http_wait(ns, dst, INDEX_HTML, T) {
            panic!("{what}, {path}: {e}\n{}", node.dump());
        }
    }
}

/// The netns path recorded in attachment `ledger_id`'s manifest.
fn netns_of(node: &Node, ledger_id: &str) -> String {
    let path = node.manifest(ledger_id)["cni"]["netns_path"]
        .as_str()
        .unwrap_or_else(|| panic!("{ledger_id}: no netns path"))
        .to_string();
    assert!(
        path.starts_with("/run/netns/") || path.starts_with("/var/run/netns/"),
        "{ledger_id}: podman's netns at {path}"
    );
    path
}

/// Removes podman's named network namespace at `path` (`ip netns del`: unmount and unlink),
/// after its container was killed: the namespace is gone.
fn drop_netns(path: &str) {
    let name = std::path::Path::new(path)
        .file_name()
        .unwrap()
        .to_str()
        .unwrap();
    let out = std::process::Command::new("ip")
        .args(["netns", "del", name])
        .output()
        .unwrap();
    assert!(out.status.success(), "ip netns del {name}: {}", show(&out));
    assert!(!std::path::Path::new(path).exists(), "{path} still exists");
}

fn answers(ns: &str, dst: std::net::SocketAddr) -> bool {
    http_get(ns, dst, Duration::from_secs(1)).is_ok()
}

/// The DNAT rules of [`PORT`] in a dump, with their destination.
fn port_dnats(dump: &str) -> Vec<String> {
    dnats(dump, PORT).into_iter().map(str::to_string).collect()
}

fn lines_with<'d>(dump: &'d str, needle: &str) -> Vec<&'d str> {
    dump.lines().filter(|l| l.contains(needle)).collect()
}

/// natledger in the chain, for one backend: `podman run -p` answers on all three paths through
/// natledger's rules (and only natledger's: no portmap chain); `podman rm -f` restores the full
/// dumps and leaves no manifest; a container killed with its conmon (no DEL) loses the port to
/// the next container on it; removing the dead one afterwards (DEL with podman's cached
/// result) leaves the live one's rules alone.
fn natledger_scenario(backend: Backend) {
    let started = Instant::now();
    let what = format!("podman + natledger CNI, {backend:?}");
    let node = Node::new(backend);
    node.warm_up();
    let mut podman = chained_podman(&node, Mapper::Natledger);
    podman.import_image(&node);
    let before = node.dump();

    let t = Instant::now();
    let web = start(&mut podman, "web");
    let run_time = t.elapsed();
    let ledger_id = format!("{web}+eth0");
    let ip = podman.ip(&web);
    assert!(ip.starts_with("10.90.0."), "{what}: address {ip:?}");
    let dump = node.dump();
    assert_forward(&dump, backend, &ledger_id, PORT, &format!("{ip}:80"));
    assert!(
        lines_with(&dump, "CNI-").is_empty(),
        "{what}: CNI chains (portmap's) in the dump:\n{dump}"
    );
    assert_eq!(
        node.manifests(),
        vec![format!("{ledger_id}.json")],
        "{what}"
    );
    let cni = &node.manifest(&ledger_id)["cni"];
    assert_eq!(cni["container_id"], web.as_str(), "{what}: {cni}");
    assert_eq!(cni["ifname"], "eth0", "{what}: {cni}");
    assert_eq!(cni["network"], NETWORK, "{what}: {cni}");
    let netns_path = cni["netns_path"].as_str().expect("netns path").to_string();
    assert!(
        std::path::Path::new(&netns_path).exists(),
        "{what}: netns path {netns_path}"
    );
    assert_answers(&node, &what);

    let t = Instant::now();
    podman.rm(&web);
    let rm_time = t.elapsed();
    let gone = poll(T, || node.manifests().is_empty() && node.dump() == before);
    assert!(
        gone,
        "{what}: after podman rm -f: manifests {:?}",
        node.manifests()
    );
    assert_eq!(node.dump(), before, "{what}: full dumps after podman rm -f");
    for (path, ns, dst) in paths(&node) {
        assert!(
            !answers(ns, dst),
            "{what}, {path}: answers after podman rm -f"
        );
    }

    // Killed with its conmon: no DEL runs, the manifest and rules stay while its network
    // namespace does (podman's bind mount pins it: alive, for all natledger can tell).
    let dead = start(&mut podman, "dead");
    let dead_id = format!("{dead}+eth0");
    let dead_ip = podman.ip(&dead);
    assert_answers(&node, &format!("{what}, first container"));
    let dead_netns = netns_of(&node, &dead_id);
    podman.kill_with_conmon(&dead);
    assert!(
        node.manifest_exists(&dead_id),
        "{what}: the killed container's manifest went without DEL"
    );
    let stale = port_dnats(&node.dump());
    assert!(
        stale.len() == 1 && stale[0].contains(&dead_ip),
        "{what}: the killed container's DNAT stays: {stale:#?}"
    );
    // Its namespace goes (as at a reboot, or an uninstall that killed podman's cleanup):
    // positive evidence that the attachment is dead.
    drop_netns(&dead_netns);

    // The next container on the same host port wins: the dead holder's rules and manifest go,
    // its DNAT alone, all paths answer.
    let live = start(&mut podman, "live");
    let live_id = format!("{live}+eth0");
    let live_ip = podman.ip(&live);
    let dump = node.dump();
    let rules = port_dnats(&dump);
    assert!(
        rules.len() == 1 && rules[0].contains(&format!("{live_ip}:80")),
        "{what}: the new container's DNAT alone: {rules:#?}\n{dump}"
    );
    assert!(
        container_rules(&dump)
            .iter()
            .all(|(_, l)| !l.contains(&dead)),
        "{what}: the dead container's rules stay beside the winner's:\n{dump}"
    );
    assert!(
        !node.manifest_exists(&dead_id),
        "{what}: dead manifest stays"
    );
    assert_eq!(node.manifests(), vec![format!("{live_id}.json")], "{what}");
    assert_answers(&node, &format!("{what}, second container"));
    // podman removes the dead container: its DEL finds no manifest and touches nothing.
    let with_live = node.dump();
    let out = podman.run(&["rm", "--force", "--time", "0", &dead]);
    eprintln!("{what}: podman rm of the dead container: {}", show(&out));
    assert_eq!(node.dump(), with_live, "{what}: the dead one's rm");

    // The winner is killed the same way; once its namespace is gone, `natledger sweep`
    // removes its rules and manifest: the full dumps as before any container.
    let live_netns = netns_of(&node, &live_id);
    podman.kill_with_conmon(&live);
    drop_netns(&live_netns);
    assert_eq!(
        node.dump(),
        with_live,
        "{what}: rules went without DEL or sweep"
    );
    let t = Instant::now();
    let out = node.sweep(&[]);
    let sweep_time = t.elapsed();
    assert_ok(&out, "sweep");
    assert!(
        node.manifests().is_empty(),
        "{what}: manifests after sweep: {:?}",
        node.manifests()
    );
    assert_eq!(node.dump(), before, "{what}: full dumps after sweep");
    for (path, ns, dst) in paths(&node) {
        assert!(!answers(ns, dst), "{what}, {path}: answers after sweep");
    }
    let out = podman.run(&["rm", "--force", "--time", "0", &live]);
    eprintln!("{what}: podman rm after sweep: {}", show(&out));
    assert_eq!(node.dump(), before, "{what}: podman rm after sweep");
    eprintln!("{what}: sweep of the dead attachment {sweep_time:?}");
    podman.own.assert_clean(T);
    eprintln!(
        "{what}: podman run -p {run_time:?}, podman rm -f {rm_time:?}, scenario {:?}",
        started.elapsed()
    );
}

/// The control: the same steps with CNI portmap (which writes through the host's `iptables`,
/// iptables-nft on Debian 12). Asserts what portmap does, for comparison.
fn portmap_scenario() {
    let started = Instant::now();
    let what = "podman + portmap CNI (control)";
    let node = Node::new(Backend::IptablesNft);
    let mut podman = chained_podman(&node, Mapper::Portmap);
    podman.import_image(&node);
    // portmap's shared chains come with the first mapping and stay.
    let warm = start(&mut podman, "warm");
    podman.rm(&warm);
    let before = node.dump();

    let t = Instant::now();
    let web = start(&mut podman, "web");
    let run_time = t.elapsed();
    let mut reached = Vec::new();
    for (path, ns, dst) in paths(&node) {
        if http_wait(ns, dst, INDEX_HTML, T).is_ok() {
            reached.push(path);
        }
    }
    eprintln!("{what}: paths answering: {reached:?}");
    assert!(
        reached.contains(&"node address") && reached.contains(&"external client"),
        "{what}: {reached:?}\n{}",
        node.dump()
    );
    let t = Instant::now();
    podman.rm(&web);
    let rm_time = t.elapsed();
    assert_eq!(
        node.dump(),
        before,
        "{what}: DEL with podman's runtimeConfig"
    );

    let dead = start(&mut podman, "dead");
    let dead_ip = podman.ip(&dead);
    podman.kill_with_conmon(&dead);
    let live = start(&mut podman, "live");
    let live_ip = podman.ip(&live);
    let dump = node.dump();
    let rules = port_dnats(&dump);
    eprintln!("{what}: DNATs of {PORT} after the kill and the second run: {rules:#?}");
    // No DEL ran: the dead container's CNI-DN chain and DNAT stay beside the new one's, and
    // its jump from CNI-HOSTPORT-DNAT comes first.
    assert_eq!(rules.len(), 2, "{what}: {rules:#?}\n{dump}");
    assert!(
        rules.iter().any(|r| r.contains(&format!("{dead_ip}:80")))
            && rules.iter().any(|r| r.contains(&format!("{live_ip}:80"))),
        "{what}: {rules:#?}"
    );
    let jumps: Vec<&str> = lines_with(&dump, "-A CNI-HOSTPORT-DNAT ");
    assert!(
        jumps.len() == 2 && jumps[0].contains(&dead) && jumps[1].contains(&live),
        "{what}: the dead container's jump first: {jumps:#?}"
    );
    // natledger doctor names the stale chain and prints the fix (the README's migration).
    let stale_chain = jumps[0].rsplit(' ').next().unwrap();
    let out = node.natledger(&["doctor", "--port", &PORT.to_string()], "", &[]);
    let report = String::from_utf8_lossy(&out.stdout);
    eprintln!("{what}: natledger doctor ({}):\n{report}", out.status);
    assert!(
        report.contains(stale_chain) && report.contains(&format!("-X {stale_chain}")),
        "{what}: doctor does not name or remove {stale_chain}:\n{report}"
    );
    let ext_answers = answers(node.topo.ext(), sock(NODE_V4, PORT));
    eprintln!("{what}: external client answered with a stale DNAT first: {ext_answers}");
    assert!(
        !ext_answers,
        "{what}: the stale DNAT comes first, yet the port answered"
    );
    podman.rm(&dead);
    podman.rm(&live);
    assert_eq!(node.dump(), before, "{what}: after podman rm of both");
    podman.own.assert_clean(T);
    eprintln!(
        "{what}: podman run -p {run_time:?}, podman rm -f {rm_time:?}, scenario {:?}",
        started.elapsed()
    );
}

#[test]
fn podman_cni_natledger_drop_in_for_portmap() {
    let _suite = crate::one_suite_at_a_time(module_path!());
    both(natledger_scenario);
    portmap_scenario();
}
