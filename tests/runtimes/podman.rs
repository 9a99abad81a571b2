//! podman end to end: natledger registered through the repo's hooks.d file, with podman 4.3,
//! runc and podman's own bridge network (CNI: Debian 12's podman comes without netavark), all
//! inside a node namespace and isolated in a temporary directory (storage, run root, locks,
//! network configuration, IPAM, hooks, cgroup parent).
//! Proven with HTTP through the host port to busybox httpd in the container, and with full
//! firewall dumps.

use std::time::{Duration, Instant};

use crate::common::*;

/// podman's network inside the node namespace, away from the topology's 10.77/10.78 networks.
const NETWORK: &str = "natledger-test";
const SUBNET: &str = "10.89.0.0/24";
const T: Duration = Duration::from_secs(10);

/// podman with natledger as an OCI hook (the repo's hooks.d file) and podman's bridge network
/// like Debian's 87-podman-bridge.conflist (portmap, firewall, tuning after bridge), plugins
/// from the machine's directories.
fn hooked_podman(node: &Node) -> Podman {
    Podman::new(
        node,
        PodmanConfig {
            network: NETWORK,
            bridge: "nlt-podman0",
            subnet: SUBNET,
            gateway: "10.89.0.1",
            cni_version: "0.4.0",
            ip_masq: true,
            chain: vec![
                serde_json::json!({"type": "portmap", "capabilities": {"portMappings": true}}),
                serde_json::json!({"type": "firewall"}),
                serde_json::json!({"type": "tuning"}),
            ],
            plugin_dir: PluginDir::System,
            hook: true,
        },
    )
}

/// `podman run --annotation io.natledger.ports=8080:80` on podman's bridge: createRuntime
/// installs the forward to the address CNI gave the container (found in its network
/// namespace), busybox httpd answers on the host port from the node (127.0.0.1 and the node's
/// address) and from an external client; `podman rm -f` runs poststop, which removes every
/// rule and the manifest. A container without the annotation never starts the hook.
#[test]
fn podman_hooks_d_forwards_the_port_and_rm_removes_it() {
    let _suite = crate::one_suite_at_a_time(module_path!());
    both(|backend| {
        let started = Instant::now();
        let node = Node::new(backend);
        let mut podman = hooked_podman(&node);
        podman.import_image(&node);
        let what = format!("podman, {backend:?}");

        let t = Instant::now();
        let id = podman.start("web", &["--annotation", "io.natledger.ports=8080:80"]);
        let run_time = t.elapsed();
        let ip = podman.ip(&id);
        assert!(
            ip.starts_with("10.89.0."),
            "{what}: container address {ip:?} is not on podman's network {SUBNET}"
        );

        // The forward is in the backend under test, pointing at CNI's address.
        assert_forward(&node.dump(), backend, &id, 8080, &format!("{ip}:80"));
        assert!(node.manifest_exists(&id), "{what}: no manifest");

        // Real HTTP through the host port.
        let host = node.topo.node();
        let ext = node.topo.ext();
        let paths = [
            (
                "node 127.0.0.1",
                host,
                sock(std::net::Ipv4Addr::LOCALHOST, 8080),
            ),
            ("node address", host, sock(NODE_V4, 8080)),
            ("external client", ext, sock(NODE_V4, 8080)),
        ];
        for (path, ns, dst) in paths {
            if let Err(e) = http_wait(ns, dst, INDEX_HTML, T) {
                panic!("{what}, {path}: {e}\n{}", node.dump());
            }
        }

        // No annotation: the hooks.d `when` clause keeps natledger out entirely.
        let plain = podman.start("plain", &[]);
        assert!(
            !node.manifest_exists(&plain),
            "{what}: hook ran for a plain container"
        );
        let dump = node.dump();
        assert!(
            container_rules(&dump)
                .iter()
                .all(|(_, l)| !l.contains(&plain)),
            "{what}: rules for a plain container:\n{dump}"
        );
        podman.ok(&["rm", "--force", "--time", "0", &plain]);

        let t = Instant::now();
        podman.ok(&["rm", "--force", "--time", "0", &id]);
        let rm_time = t.elapsed();
        assert_removed(&node, &id, T);
        for (path, ns, dst) in paths {
            assert!(
                http_get(ns, dst, Duration::from_secs(1)).is_err(),
                "{what}, {path}: still answered after podman rm"
            );
        }
        let ps = podman.ok(&["ps", "--all", "--quiet"]);
        assert!(ps.is_empty(), "{what}: containers left: {ps}");
        podman.own.assert_clean(T);
        let hook_log = podman.hook_log();
        assert!(
            !hook_log.contains("error"),
            "{what}: the hook reported errors:\n{hook_log}"
        );
        eprintln!(
            "{what}: podman run {run_time:?}, podman rm {rm_time:?}, whole test {:?}",
            started.elapsed()
        );
    });
}

/// Asserts that busybox httpd answers on `port` from the node (127.0.0.1 and its address) and
/// from the external client.
fn assert_answers(node: &Node, port: u16, what: &str) {
    let paths = [
        (node.topo.node(), sock(std::net::Ipv4Addr::LOCALHOST, port)),
        (node.topo.node(), sock(NODE_V4, port)),
        (node.topo.ext(), sock(NODE_V4, port)),
    ];
    for (ns, dst) in paths {
        if let Err(e) = http_wait(ns, dst, INDEX_HTML, T) {
            panic!("{what}: {e}\n{}", node.dump());
        }
    }
}

/// Asserts that `dump` holds exactly one DNAT of `port`: `holder`'s, to `dest`, and no rule
/// of any other container.
fn assert_one_dnat(dump: &str, backend: Backend, holder: &str, port: u16, dest: &str, what: &str) {
    assert_eq!(
        dnats(dump, port).len(),
        1,
        "{what}: DNATs of {port}:\n{dump}"
    );
    assert_forward(dump, backend, holder, port, dest);
}

/// A podman pod whose containers all carry `--annotation io.natledger.ports=8080:80`, as a user
/// annotates every container of a pod: the first (httpd) installs the forward to the pod's
/// address; a sidecar in the pod starts too and shares it (its manifest says so, no rules of
/// its own, one DNAT); the port answers from the node and an external client. The sidecar's
/// removal changes nothing. With another sidecar running, the holder's stop keeps the rules
/// and its manifest; a new web server in the pod shares the kept rules and the port answers
/// again. `podman pod rm -f` leaves the tables exactly as before the pod, and no manifest.
#[test]
fn podman_pod_containers_share_one_forward_until_the_last_goes() {
    let _suite = crate::one_suite_at_a_time(module_path!());
    both(|backend| {
        let started = Instant::now();
        let what = format!("podman pod, {backend:?}");
        let node = Node::new(backend);
        node.warm_up();
        let mut podman = hooked_podman(&node);
        podman.import_image(&node);
        // CNI's own chains come with the network's first container and stay after it.
        let warm = podman.start("warm", &[]);
        podman.ok(&["rm", "--force", "--time", "0", &warm]);
        let before = node.dump();

        let t = Instant::now();
        let (pod, infra) = podman.create_pod("webpod");
        let web = podman.run_in_pod("web", &pod, "8080:80", &HTTPD_ARGS);
        let sidecar = podman.run_in_pod("sidecar", &pod, "8080:80", &WAIT_FOR_TERM);
        let start_time = t.elapsed();
        let dest = format!("{}:80", podman.ip(&infra));
        let with_pod = node.dump();
        assert_one_dnat(&with_pod, backend, &web, 8080, &dest, &what);
        let mut expected = vec![format!("{web}.json"), format!("{sidecar}.json")];
        expected.sort();
        assert_eq!(node.manifests(), expected, "{what}: manifests");
        let mapping = serde_json::json!([{"host_ports": {"start": 8080, "end": 8080},
            "container_ports": {"start": 80, "end": 80}, "protocol": "tcp"}]);
        assert_eq!(
            node.manifest(&sidecar)["shares"],
            serde_json::json!([{"holder": web, "mappings": mapping}]),
            "{what}: the sidecar shares the web server's mapping"
        );
        assert_eq!(
            node.manifest(&web)["shared_by"],
            serde_json::json!([sidecar])
        );
        assert_answers(&node, 8080, &what);

        podman.ok(&["rm", "--force", "--time", "0", &sidecar]);
        assert!(
            !node.manifest_exists(&sidecar),
            "{what}: sidecar's manifest"
        );
        assert_eq!(node.dump(), with_pod, "{what}: the sidecar's removal");
        assert_answers(&node, 8080, &format!("{what}, sidecar removed"));

        // The holder stops while another member lives: its rules and manifest stay.
        let sidecar = podman.run_in_pod("sidecar2", &pod, "8080:80", &WAIT_FOR_TERM);
        assert_eq!(node.dump(), with_pod, "{what}: a second sidecar");
        podman.ok(&["stop", "--time", "0", &web]);
        let kept = format!("of container {web}: live container(s) {sidecar} in its network");
        assert!(
            poll(T, || podman.hook_log().contains(&kept)),
            "{what}: no `{kept}` in the hook log:\n{}",
            podman.hook_log()
        );
        assert_eq!(node.dump(), with_pod, "{what}: the holder's stop");
        assert!(node.manifest_exists(&web), "{what}: the holder's manifest");
        // A new web server in the pod shares the kept rules: the port answers again.
        let web2 = podman.run_in_pod("web2", &pod, "8080:80", &HTTPD_ARGS);
        assert_eq!(
            node.manifest(&web2)["shares"],
            serde_json::json!([{"holder": web, "mappings": mapping}]),
            "{what}: the new web server shares the stopped holder's mapping"
        );
        assert_eq!(node.dump(), with_pod, "{what}: the new web server");
        assert_answers(
            &node,
            8080,
            &format!("{what}, holder stopped, web2 serving"),
        );

        let t = Instant::now();
        podman.ok(&["pod", "rm", "--force", "--time", "0", &pod]);
        let rm_time = t.elapsed();
        let gone = poll(T, || node.manifests().is_empty() && node.dump() == before);
        assert!(gone, "{what}: manifests left: {:?}", node.manifests());
        assert_eq!(
            node.dump(),
            before,
            "{what}: the tables after podman pod rm"
        );
        let got = http_get(node.topo.ext(), sock(NODE_V4, 8080), Duration::from_secs(1));
        assert!(got.is_err(), "{what}: still answers: {got:?}");
        let ps = podman.ok(&["ps", "--all", "--quiet"]);
        assert!(ps.is_empty(), "{what}: containers left: {ps}");
        podman.own.assert_clean(T);
        let hook_log = podman.hook_log();
        assert!(
            !hook_log.contains("error"),
            "{what}: the hook reported errors:\n{hook_log}"
        );
        eprintln!(
            "{what}: pod + two containers {start_time:?}, podman pod rm {rm_time:?}, whole test {:?}",
            started.elapsed()
        );
    });
}
