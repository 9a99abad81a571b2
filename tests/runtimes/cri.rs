//! Kubernetes-style pods end to end through containerd's CRI: Debian's containerd 1.6 inside a
//! node namespace, natledger registered with README.md's containerd snippet (its exact text;
//! `tests/common/containerd.rs`), pods driven by our CRI v1 client (`tests/cri/cri.py`), CNI
//! bridge networking, and locally built pause and busybox images.

use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::{Value, json};

const PORTS: &str = "18080:80";
const HOST_PORT: u16 = 18080;
const T: Duration = Duration::from_secs(10);

/// A ContainerConfig of the busybox image running `command`, with these annotations.
fn container(name: &str, command: &[&str], annotations: &[(&str, &str)]) -> Value {
    let annotations: serde_json::Map<String, Value> = annotations
        .iter()
        .map(|(k, v)| (k.to_string(), Value::from(*v)))
        .collect();
    json!({
        "metadata": {"name": name},
        "image": {"image": BUSYBOX_IMAGE},
        "command": command,
        "annotations": annotations,
        "log_path": format!("{name}.log"),
    })
}

/// Creates and starts a container in `pod`; its id. Panics with the runtime's message.
fn start(
    ctrd: &mut Containerd,
    pod: &str,
    pod_config: &Value,
    config: &Value,
    what: &str,
) -> String {
    let name = &config["metadata"]["name"];
    let id = ctrd
        .create(pod, pod_config, config)
        .unwrap_or_else(|e| panic!("{what}: CreateContainer {name} in pod {pod}: {e}"));
    if let Err(e) = ctrd.cri_result(&["start", &id]) {
        panic!("{what}: StartContainer {name} ({id}) in pod {pod}: {e}");
    }
    id
}

/// StopContainer (SIGTERM, 10 s grace) then RemoveContainer.
fn stop_and_remove(ctrd: &Containerd, id: &str) {
    ctrd.cri_ok(&["stop", id, "10"]);
    ctrd.cri_ok(&["rm", id]);
}

/// Asserts that `dump` holds exactly one DNAT for the port, in `backend`'s IPv4 nat table,
/// to `pod_ip`:80, tagged with `owner`.
fn assert_one_dnat(dump: &str, backend: Backend, owner: &str, pod_ip: &str, what: &str) {
    let rules = dnats(dump, HOST_PORT);
    assert_eq!(
        rules.len(),
        1,
        "{what}: DNAT rules for {HOST_PORT}:\n{dump}"
    );
    let nat = chain_rules(dump, backend, Family::V4, "NATLEDGER-HOSTPORTS");
    let want = dnat_rule(backend, owner, HOST_PORT, &format!("{pod_ip}:80"));
    assert!(
        nat.iter().any(|l| l.contains(&want)),
        "{what}: no `{want}` in {backend:?} IPv4:\n{dump}"
    );
}

/// Asserts that the pod's web server answers on the host port from 127.0.0.1 and the node's
/// address in the node namespace, and from the external client.
fn assert_answers(node: &Node, what: &str) {
    let from = [
        (
            node.topo.node(),
            sock(std::net::Ipv4Addr::LOCALHOST, HOST_PORT),
        ),
        (node.topo.node(), sock(NODE_V4, HOST_PORT)),
        (node.topo.ext(), sock(NODE_V4, HOST_PORT)),
    ];
    for (ns, dst) in from {
        http_wait(ns, dst, INDEX_HTML, T).unwrap_or_else(|e| panic!("{what}: {e}"));
    }
}

/// Asserts that the port no longer answers from the external client.
fn assert_closed(node: &Node, what: &str) {
    let got = http_get(
        node.topo.ext(),
        sock(NODE_V4, HOST_PORT),
        Duration::from_secs(1),
    );
    assert!(
        got.is_err(),
        "{what}: port {HOST_PORT} still answers: {got:?}"
    );
}

/// The ids ListPodSandbox / ListContainers report.
fn listed(ctrd: &Containerd, command: &str, field: &str) -> Vec<String> {
    let list: Value = serde_json::from_str(&ctrd.cri_ok(&[command])).unwrap();
    list[field]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|i| i["id"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// After the last pod is gone: the tables as `before`, no manifest, no pod or container in
/// containerd, nothing of the pods outside containerd's directory; then containerd stops
/// and leaves no process, mount or cgroup.
fn assert_all_gone(node: &Node, mut ctrd: Containerd, before: &str, what: &str) {
    assert_eq!(
        node.dump(),
        before,
        "{what}: the tables after the pod is removed"
    );
    assert_eq!(
        node.manifests(),
        Vec::<String>::new(),
        "{what}: manifests left"
    );
    assert_closed(node, what);
    assert_eq!(
        listed(&ctrd, "pods", "items"),
        Vec::<String>::new(),
        "{what}"
    );
    assert_eq!(
        listed(&ctrd, "ps", "containers"),
        Vec::<String>::new(),
        "{what}"
    );
    assert_eq!(
        ctrd.left_outside(),
        Vec::<std::path::PathBuf>::new(),
        "{what}"
    );
    ctrd.stop()
        .unwrap_or_else(|e| panic!("{what}: {e}\n{}", ctrd.log()));
    ctrd.own.assert_clean(T);
}

/// README.md's snippet as it is (`pod_annotations`): a pod annotated `io.natledger.ports` gets
/// its port at RunPodSandbox (the sandbox's create-runtime: one DNAT to the pod's address);
/// a web server and a sidecar start in it and the port answers from 127.0.0.1, the node's
/// address and an external client, its DNAT still there once; the sidecar's stop and
/// removal change nothing; another pod asking for the same port is refused naming the
/// holder, and nothing of it stays; StopPodSandbox + RemovePodSandbox leave the tables as
/// they were before the pod, no manifest, no network namespace, and containerd stops clean.
#[test]
fn cri_pod_holds_its_port_from_sandbox_to_removal() {
    let _suite = crate::one_suite_at_a_time(module_path!());
    both(|backend| {
        let started = Instant::now();
        let what = format!("cri pod, {backend:?}");
        let node = Node::new(backend);
        node.warm_up();
        let t = Instant::now();
        let mut ctrd = Containerd::start(&node, Annotations::Pod);
        let ctrd_start = t.elapsed();
        let before = node.dump();

        let pod_config = ctrd.pod_config("web", &[("io.natledger.ports", PORTS)]);
        let t = Instant::now();
        let pod = ctrd
            .run_pod(&pod_config)
            .unwrap_or_else(|e| panic!("{what}: RunPodSandbox: {e}"));
        let run_pod = t.elapsed();
        let pod_ip = ctrd.pod_ip(&pod);
        assert_one_dnat(&node.dump(), backend, &pod, &pod_ip, &what);
        assert_eq!(node.manifests(), [format!("{pod}.json")], "{what}");

        let t = Instant::now();
        let web = container("web", &HTTPD_ARGS, &[]);
        let web = start(&mut ctrd, &pod, &pod_config, &web, &what);
        let sidecar = container("sidecar", &WAIT_FOR_TERM, &[]);
        let sidecar = start(&mut ctrd, &pod, &pod_config, &sidecar, &what);
        let containers = t.elapsed();
        assert_answers(&node, &what);
        let with_pod = node.dump();
        assert_one_dnat(&with_pod, backend, &pod, &pod_ip, &what);
        // Each app container has a manifest of its own that shares the sandbox's rules.
        let mut pod_manifests = [pod.clone(), web.clone(), sidecar.clone()];
        pod_manifests.sort();
        let pod_manifests: Vec<String> = pod_manifests
            .iter()
            .map(|id| format!("{id}.json"))
            .collect();
        assert_eq!(node.manifests(), pod_manifests, "{what}");
        for app in [&web, &sidecar] {
            let shares = node.manifest(app)["shares"].clone();
            assert_eq!(
                shares,
                serde_json::json!([{"holder": pod, "mappings": [
                    {"host_ports": {"start": 18080, "end": 18080},
                     "container_ports": {"start": 80, "end": 80}, "protocol": "tcp"}]}]),
                "{what}: {app} shares the sandbox's mapping"
            );
        }

        stop_and_remove(&ctrd, &sidecar);
        let pod_manifests: Vec<String> = pod_manifests
            .into_iter()
            .filter(|m| *m != format!("{sidecar}.json"))
            .collect();
        assert_answers(&node, &format!("{what}, sidecar removed"));
        assert_eq!(
            node.dump(),
            with_pod,
            "{what}: the sidecar's removal changed the tables"
        );

        let other = ctrd.pod_config("other", &[("io.natledger.ports", PORTS)]);
        match ctrd.run_pod(&other) {
            Ok(id) => panic!("{what}: a second pod {id} got {PORTS} while {pod} holds it"),
            Err(e) => assert!(
                e.contains(&format!("host port {PORTS}/tcp is held by live container"))
                    && e.contains(&pod),
                "{what}: the second pod's refusal does not name the holder {pod}: {e}"
            ),
        }
        assert_eq!(
            node.dump(),
            with_pod,
            "{what}: the refused pod changed the tables"
        );
        assert_eq!(
            node.manifests(),
            pod_manifests,
            "{what}: the refused pod's manifest"
        );
        assert_eq!(listed(&ctrd, "pods", "items"), [pod.as_str()], "{what}");
        assert_answers(&node, &format!("{what}, after the refusal"));

        let t = Instant::now();
        ctrd.remove_pod(&pod)
            .unwrap_or_else(|e| panic!("{what}: removing pod {pod}: {e}"));
        let remove_pod = t.elapsed();
        assert_all_gone(&node, ctrd, &before, &what);
        eprintln!(
            "{what}: containerd start {ctrd_start:?}, RunPodSandbox {run_pod:?}, two containers \
             {containers:?}, Stop+RemovePodSandbox {remove_pod:?}, whole test {:?}",
            started.elapsed()
        );
    });
}

/// README.md's alternative, `container_annotations`: only the container whose own
/// ContainerConfig asks gets the port (not the sandbox, not the sidecar); the port answers
/// from everywhere while it runs and closes when StopContainer stops it (poststop), with the
/// pod still there; removing the pod leaves everything as before.
#[test]
fn cri_container_annotations_give_only_that_container_its_port() {
    let _suite = crate::one_suite_at_a_time(module_path!());
    both(|backend| {
        let started = Instant::now();
        let what = format!("cri container annotations, {backend:?}");
        let node = Node::new(backend);
        node.warm_up();
        let mut ctrd = Containerd::start(&node, Annotations::Container);
        let before = node.dump();

        // The pod's own annotation is not copied: only container annotations are.
        let pod_config = ctrd.pod_config("web", &[("io.natledger.ports", "18081:80")]);
        let pod = ctrd
            .run_pod(&pod_config)
            .unwrap_or_else(|e| panic!("{what}: RunPodSandbox: {e}"));
        assert_eq!(node.dump(), before, "{what}: the sandbox got forwards");
        let pod_ip = ctrd.pod_ip(&pod);

        let web = container("web", &HTTPD_ARGS, &[("io.natledger.ports", PORTS)]);
        let web = start(&mut ctrd, &pod, &pod_config, &web, &what);
        let sidecar = container("sidecar", &WAIT_FOR_TERM, &[]);
        let sidecar = start(&mut ctrd, &pod, &pod_config, &sidecar, &what);
        assert_answers(&node, &what);
        assert_one_dnat(&node.dump(), backend, &web, &pod_ip, &what);
        assert_eq!(node.manifests(), [format!("{web}.json")], "{what}");

        stop_and_remove(&ctrd, &sidecar);
        assert_answers(&node, &format!("{what}, sidecar removed"));
        ctrd.cri_ok(&["stop", &web, "10"]);
        assert_removed(&node, &web, T);
        assert_eq!(
            node.dump(),
            before,
            "{what}: the tables after the web server stopped"
        );
        ctrd.cri_ok(&["rm", &web]);

        ctrd.remove_pod(&pod)
            .unwrap_or_else(|e| panic!("{what}: removing pod {pod}: {e}"));
        assert_all_gone(&node, ctrd, &before, &what);
        eprintln!("{what}: whole test {:?}", started.elapsed());
    });
}
