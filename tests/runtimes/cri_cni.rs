//! Kubernetes' hostPort path with natledger as a chained CNI plugin: kubelet hands a pod's
//! `hostPort` to the CRI as `PodSandboxConfig.port_mappings`, containerd's CRI passes them to
//! the CNI chain as `runtimeConfig.portMappings`, and natledger (after bridge + host-local in
//! containerd's conflist, a link named `natledger` in a test-private plugin directory; its
//! `stateDir` and `backend` the test's) writes and records the forward. Debian's containerd
//! 1.6 in a node namespace (`tests/common/containerd.rs`, [`CniChain::Natledger`]), driven by
//! our CRI v1 client (`tests/cri/cri.py`). The bridge has `ipMasq: false`, so natledger's are
//! the only rules the pod makes and full `*-save` dumps are compared.

use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::json;

const HOST_PORT: u16 = 8087;
const T: Duration = Duration::from_secs(10);

/// Asserts that the pod's web server answers on the host port from the node's 127.0.0.1 and
/// address, and from the external client.
fn assert_answers(node: &Node, what: &str) {
    let from = [
        (
            "node 127.0.0.1",
            node.topo.node(),
            sock(std::net::Ipv4Addr::LOCALHOST, HOST_PORT),
        ),
        ("node address", node.topo.node(), sock(NODE_V4, HOST_PORT)),
        ("external client", node.topo.ext(), sock(NODE_V4, HOST_PORT)),
    ];
    for (path, ns, dst) in from {
        if let Err(e) = http_wait(ns, dst, INDEX_HTML, T) {
            panic!("{what}, {path}: {e}\n{}", node.dump());
        }
    }
}

/// One backend: RunPodSandbox with `port_mappings` (8087 → 80/tcp) gets exactly one DNAT to
/// the pod's address, tagged with the attachment's ledger id `<sandbox id>+eth0`, and a
/// manifest recording the attachment (network, eth0, the sandbox id, containerd's netns
/// path); a busybox httpd container in the pod answers on the host port from the node and the
/// external client; StopPodSandbox + RemovePodSandbox (containerd's CNI DEL) leave the dumps
/// as before the pod, no manifest, a closed port, and containerd stops clean.
fn hostport_scenario(backend: Backend) {
    let started = Instant::now();
    let what = format!("cri + natledger CNI, {backend:?}");
    let node = Node::new(backend);
    node.warm_up();
    let mut ctrd = Containerd::start_with(
        &node,
        Config {
            annotations: Annotations::Pod,
            cni: CniChain::Natledger,
        },
    );
    let before = node.dump();

    // kubelet's path: the hostPort is in the sandbox config, no annotation anywhere.
    let mut pod_config = ctrd.pod_config("web", &[]);
    pod_config["port_mappings"] = json!([
        {"protocol": "TCP", "container_port": 80, "host_port": HOST_PORT}
    ]);
    let t = Instant::now();
    let pod = ctrd
        .run_pod(&pod_config)
        .unwrap_or_else(|e| panic!("{what}: RunPodSandbox: {e}"));
    let run_pod = t.elapsed();
    let pod_ip = ctrd.pod_ip(&pod);
    let ledger_id = format!("{pod}+eth0");
    assert_eq!(node.manifests(), [format!("{ledger_id}.json")], "{what}");
    let manifest = node.manifest(&ledger_id);
    let netns = ctrd
        .pod_netns(&pod)
        .unwrap_or_else(|| panic!("{what}: pod {pod} has no netns"));
    assert_eq!(
        manifest["cni"],
        json!({"container_id": pod, "ifname": "eth0", "network": CNI_NETWORK,
               "netns_path": netns}),
        "{what}: the manifest's attachment"
    );
    let with_pod = node.dump();
    let rules = dnats(&with_pod, HOST_PORT);
    assert_eq!(rules.len(), 1, "{what}: DNATs for {HOST_PORT}:\n{with_pod}");
    let want = dnat_rule(backend, &ledger_id, HOST_PORT, &format!("{pod_ip}:80"));
    let nat = chain_rules(&with_pod, backend, Family::V4, "NATLEDGER-HOSTPORTS");
    assert!(
        nat.iter().any(|l| l.contains(&want)),
        "{what}: no `{want}` in {backend:?} IPv4:\n{with_pod}"
    );

    let web = json!({
        "metadata": {"name": "web"},
        "image": {"image": BUSYBOX_IMAGE},
        "command": HTTPD_ARGS,
        "log_path": "web.log",
    });
    let web = ctrd
        .create(&pod, &pod_config, &web)
        .unwrap_or_else(|e| panic!("{what}: CreateContainer web: {e}"));
    if let Err(e) = ctrd.cri_result(&["start", &web]) {
        panic!("{what}: StartContainer web ({web}): {e}");
    }
    assert_answers(&node, &what);
    // The app container's hooks (no annotation) add nothing.
    assert_eq!(node.dump(), with_pod, "{what}: the web container's start");
    assert_eq!(node.manifests(), [format!("{ledger_id}.json")], "{what}");

    ctrd.cri_ok(&["stop", &web, "10"]);
    ctrd.cri_ok(&["rm", &web]);
    let t = Instant::now();
    ctrd.remove_pod(&pod)
        .unwrap_or_else(|e| panic!("{what}: removing pod {pod}: {e}"));
    let remove_pod = t.elapsed();
    assert_eq!(node.dump(), before, "{what}: the tables after the pod");
    assert_eq!(node.manifests(), Vec::<String>::new(), "{what}: manifests");
    let got = http_get(
        node.topo.ext(),
        sock(NODE_V4, HOST_PORT),
        Duration::from_secs(1),
    );
    assert!(got.is_err(), "{what}: {HOST_PORT} still answers: {got:?}");
    assert!(
        !netns.exists(),
        "{what}: {} is still there",
        netns.display()
    );
    assert_eq!(
        ctrd.left_outside(),
        Vec::<std::path::PathBuf>::new(),
        "{what}"
    );
    ctrd.stop()
        .unwrap_or_else(|e| panic!("{what}: {e}\n{}", ctrd.log()));
    ctrd.own.assert_clean(T);
    eprintln!(
        "{what}: RunPodSandbox {run_pod:?}, Stop+RemovePodSandbox {remove_pod:?}, whole test {:?}",
        started.elapsed()
    );
}

#[test]
fn cri_hostport_reaches_natledger_through_the_cni_chain() {
    let _suite = crate::one_suite_at_a_time(module_path!());
    both(hostport_scenario);
}
