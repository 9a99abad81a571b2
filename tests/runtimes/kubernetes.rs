//! The Kubernetes DaemonSet, end to end, on every backend: the test plays kubelet against
//! Debian's containerd 1.6 CRI in a node namespace (`tests/common/containerd.rs`, driven by
//! `tests/cri/cri.py`), with a cluster network's conflist (bridge, then `portmap`) and a CNI
//! plugin directory without natledger.
//!
//! - scripts/build-image.sh's archive is imported with `ctr images import`; the DaemonSet's
//!   pod is run exactly as deploy/kubernetes/natledger.yaml describes it (read with PyYAML,
//!   translated as kubelet translates a pod: `tests/common/kube.rs`; args, env, hostPath
//!   mounts and their propagation, capabilities, read-only root, seccomp, resources): a
//!   host-network, host-pid sandbox; the `install-cni` init container run to completion
//!   (exit 0), after which the conflist names natledger where it named portmap, every other
//!   key unchanged, a backup of the original beside it, and the plugin directory holds
//!   natledger's binary; run again (kubelet reruns init containers), it changes nothing;
//!   then the `watch` container, whose /healthz answers 200 on port 9655.
//! - A pod with a hostPort (kubelet's `port_mappings`) answers from the external client
//!   (a busybox httpd; TCP, a client that keeps sending) through natledger's rules (one DNAT
//!   tagged `<sandbox>+eth0`, full dumps).
//! - The tables wiped (iptables: the rulesets saved before the pod restored; nftables:
//!   natledger's `ip natledger` table flushed): the port answers again and the dump is the
//!   one before the wipe, put back by the watch container (its /metrics counts the repair
//!   and shows doctor's findings gauge). The pod's namespace was mounted after the watch
//!   container started: the repair judged it alive, so the `HostToContainer` mount of
//!   /run/netns shows it.
//! - That pod deleted (StopPodSandbox, RemovePodSandbox): its rules go, the dumps are those
//!   before it.
//! - The DaemonSet's pod deleted as kubelet deletes it (StopContainer with the pod's grace
//!   period, then StopPodSandbox, RemovePodSandbox): its watch exits 0 on SIGTERM; a hostPort
//!   pod started before keeps answering throughout (its client never fails), its rules stay,
//!   the conflist and the plugin stay; deleting that pod afterwards still removes its rules.
//!
//! Where this differs from a cluster: the hostPath volumes are mapped onto the test's node
//! (`/run/natledger` onto the node's state directory, the CNI directories onto containerd's
//! private ones; `/`, `/run/netns` and `/run/xtables.lock` are the machine's own, read as the
//! DaemonSet reads them); the conflist's portmap entry carries the node's `stateDir` and
//! `backend` as extra keys (portmap ignores them; install-cni changes only `type`, so
//! natledger then writes the test's state directory and backend, not the machine's); the
//! liveness probe is the test's GET of /healthz, not kubelet's; the image name is the YAML's
//! (`natledger:<version>`, which containerd resolves to the imported
//! `docker.io/library/natledger:<version>`).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::{Value, json};

const PORT_A: u16 = 8087;
const PORT_B: u16 = 8088;
const METRICS_PORT: u16 = 9655;
const CONFLIST: &str = "10-natledger-cri.conflist";
const T: Duration = Duration::from_secs(20);

/// From network namespace `ns`: `GET path` over HTTP/1.0; the status code and body.
fn http(ns: &str, dst: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let path = path.to_string();
    in_netns(ns, move || {
        let timeout = Duration::from_secs(2);
        let mut stream = TcpStream::connect_timeout(&dst, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: {dst}\r\n\r\n").as_bytes())?;
        let mut reply = String::new();
        stream.read_to_string(&mut reply)?;
        let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
        let code = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        Ok((code, body.to_string()))
    })
}

/// A client that keeps sending: `GET /` to the host port from the external namespace every
/// 100 ms, each answer (or failure) logged with its time.
struct Client {
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<Vec<(Instant, bool)>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Client {
    fn start(ns: &str, port: u16) -> Client {
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(Vec::new()));
        let (ns, s, l) = (ns.to_string(), stop.clone(), log.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let got = http_get(&ns, sock(NODE_V4, port), Duration::from_millis(500));
                let ok = got.as_deref().is_ok_and(|b| b == INDEX_HTML);
                l.lock().unwrap().push((Instant::now(), ok));
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Client {
            stop,
            log,
            thread: Some(thread),
        }
    }

    /// (answers, failures) since `t`.
    fn since(&self, t: Instant) -> (usize, usize) {
        let log = self.log.lock().unwrap();
        let after = log.iter().filter(|(at, _)| *at >= t);
        let ok = after.clone().filter(|(_, ok)| *ok).count();
        (ok, after.count() - ok)
    }

    /// Waits until `n` more answers came after `t`.
    fn answered_since(&self, t: Instant, n: usize) -> bool {
        poll(T, || self.since(t).0 >= n)
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// ContainerStatus (verbose) of `id`: (state, exit code, pid). proto3's JSON leaves out
/// zero values: no state is CONTAINER_CREATED, no exit code is 0.
fn container_state(ctrd: &Containerd, id: &str) -> (String, i64, Option<u32>) {
    let status: Value = serde_json::from_str(&ctrd.cri_ok(&["status", id])).unwrap();
    let state = status["status"]["state"]
        .as_str()
        .unwrap_or("CONTAINER_CREATED")
        .to_string();
    let code = status["status"]["exit_code"].as_i64().unwrap_or(0);
    let pid = status["info"]["info"]
        .as_str()
        .and_then(|i| serde_json::from_str::<Value>(i).ok())
        .and_then(|i| i["pid"].as_u64())
        .map(|p| p as u32);
    (state, code, pid)
}

/// Waits until container `id` has exited; its exit code.
fn wait_exited(ctrd: &Containerd, id: &str, what: &str) -> i64 {
    let mut last = (String::new(), 0, None);
    if poll(T, || {
        last = container_state(ctrd, id);
        last.0 == "CONTAINER_EXITED"
    }) {
        return last.1;
    }
    panic!("{what}: {id} still {last:?} after {T:?}\n{}", ctrd.log());
}

/// The files of `dir` (name → bytes), links followed.
fn files(dir: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().to_string();
            (name, std::fs::read(e.path()).unwrap_or_default())
        })
        .collect()
}

/// kubelet's CreateContainer + StartContainer of the template's container `name`.
fn start_container(
    ctrd: &mut Containerd,
    sandbox: (&str, &Value),
    spec: &Value,
    name: &str,
    attempt: u32,
    map: &dyn Fn(&str) -> Option<PathBuf>,
) -> String {
    let container = pod_container(spec, name);
    let image = container["image"].as_str().unwrap();
    let mut config = cri_container(spec, container, image, map);
    config["metadata"]["attempt"] = json!(attempt);
    let id = ctrd
        .create(sandbox.0, sandbox.1, &config)
        .unwrap_or_else(|e| panic!("CreateContainer {name}: {e}\n{}", ctrd.log()));
    if let Err(e) = ctrd.cri_result(&["start", &id]) {
        panic!("StartContainer {name} ({id}): {e}\n{}", ctrd.log());
    }
    id
}

/// A pod with a busybox httpd on port 80 and `host_port` mapped to it, as kubelet runs a
/// pod whose container declares `hostPort`; (sandbox id, its PodSandboxConfig).
fn web_pod(ctrd: &mut Containerd, name: &str, host_port: u16) -> (String, Value) {
    let mut config = ctrd.pod_config(name, &[]);
    config["port_mappings"] =
        json!([{"protocol": "TCP", "container_port": 80, "host_port": host_port}]);
    let pod = ctrd
        .run_pod(&config)
        .unwrap_or_else(|e| panic!("RunPodSandbox {name}: {e}\n{}", ctrd.log()));
    let web = json!({
        "metadata": {"name": "web"},
        "image": {"image": BUSYBOX_IMAGE},
        "command": HTTPD_ARGS,
        "log_path": "web.log",
    });
    let id = ctrd
        .create(&pod, &config, &web)
        .unwrap_or_else(|e| panic!("CreateContainer web in {name}: {e}"));
    if let Err(e) = ctrd.cri_result(&["start", &id]) {
        panic!("StartContainer web in {name}: {e}");
    }
    (pod, config)
}

/// The pod's one DNAT for `port` in the dump, tagged with its attachment.
fn assert_forwarded(node: &Node, ctrd: &Containerd, pod: &str, port: u16, what: &str) -> String {
    let dump = node.dump();
    let ledger_id = format!("{pod}+eth0");
    assert!(
        node.manifest_exists(&ledger_id),
        "{what}: no manifest {ledger_id}: {:?}",
        node.manifests()
    );
    assert_eq!(
        dnats(&dump, port).len(),
        1,
        "{what}: DNATs for {port}:\n{dump}"
    );
    let want = dnat_rule(
        node.backend,
        &ledger_id,
        port,
        &format!("{}:80", ctrd.pod_ip(pod)),
    );
    let nat = chain_rules(&dump, node.backend, Family::V4, "NATLEDGER-HOSTPORTS");
    assert!(
        nat.iter().any(|l| l.contains(&want)),
        "{what}: no `{want}`:\n{dump}"
    );
    if let Err(e) = http_wait(node.topo.ext(), sock(NODE_V4, port), INDEX_HTML, T) {
        panic!("{what}: {e}\n{dump}");
    }
    dump
}

/// natledger's rules wiped as a firewall reload would: iptables, the raw rulesets saved
/// before any pod restored (`pre`); nftables, natledger's IPv4 table flushed.
fn wipe(node: &Node, pre: &[(Family, String)]) {
    let ns = node.topo.node();
    if !node.backend.is_iptables() {
        // The pod's family (a repair writes a family's shared rules only for its records).
        let out = run_in(ns, "nft", &["flush", "table", "ip", "natledger"], None);
        assert_ok(&out, "nft flush table");
        return;
    }
    for (family, text) in pre {
        let prog = format!("{}-restore", iptables_tool(node.backend, *family));
        assert_ok(
            &run_in(ns, &prog, &["-w", "30"], Some(text.as_bytes())),
            &prog,
        );
    }
}

/// A sample's value in a Prometheus text exposition (summed over label sets).
fn metric(text: &str, name: &str) -> Option<f64> {
    let values: Vec<f64> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(&format!("{name} ")) || l.starts_with(&format!("{name}{{")))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// A process's resident memory (VmRSS, kB).
fn rss_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn daemonset_scenario(backend: Backend) {
    let started = Instant::now();
    let what = format!("kubernetes, {backend:?}");
    let archive = image_archive();
    let node = Node::new(backend);
    node.warm_up();
    let mut ctrd = Containerd::start_with(
        &node,
        Config {
            annotations: Annotations::Pod,
            cni: CniChain::Portmap,
        },
    );
    let ns = node.topo.node();
    let metrics_at = sock(Ipv4Addr::LOCALHOST, METRICS_PORT);

    // The image, as an operator loads it onto a node without a registry.

    let (_, containerd_name) = image_names();
    let imported = ctrd.import(&archive);
    assert!(imported.contains(&containerd_name), "{what}: {imported}");
    let status = ctrd.cri_ok(&["image-status", &containerd_name]);
    assert!(status.contains(&containerd_name), "{what}: {status}");

    let ds = daemonset();
    let spec = &ds["spec"]["template"]["spec"];
    let conf_dir = ctrd.cni_conf_dir();
    let bin_dir = ctrd.cni_bin_dir();
    let state_dir = node.state_dir();
    let map = move |path: &str| -> Option<PathBuf> {
        match path {
            "/run/natledger" => Some(state_dir.clone()),
            "/opt/cni/bin" => Some(bin_dir.clone()),
            "/etc/cni/net.d" => Some(conf_dir.clone()),
            "/" | "/run/netns" | "/run/xtables.lock" => None,
            other => panic!("the DaemonSet mounts {other}: map it onto the test's node"),
        }
    };
    let conflist_before: Value =
        serde_json::from_slice(&std::fs::read(ctrd.cni_conf_dir().join(CONFLIST)).unwrap())
            .unwrap();
    assert_eq!(conflist_before["plugins"][1]["type"], "portmap");
    assert!(!ctrd.cni_bin_dir().join("natledger").exists());

    // The DaemonSet's pod: a host-network, host-pid sandbox in kube-system.
    let mut ds_config = ctrd.pod_config("natledger-node", &[]);
    ds_config["metadata"]["namespace"] = json!("kube-system");
    // kubelet sets no hostname for a host-network pod (it shares the node's UTS namespace).
    ds_config.as_object_mut().unwrap().remove("hostname");
    ds_config["linux"]["security_context"] = json!({"namespace_options": namespace_options(spec)});
    let ds_pod = ctrd
        .run_pod(&ds_config)
        .unwrap_or_else(|e| panic!("{what}: RunPodSandbox (DaemonSet): {e}\n{}", ctrd.log()));
    let sandbox = (ds_pod.as_str(), &ds_config);

    // The init container, to completion.
    let init = start_container(&mut ctrd, sandbox, spec, "install-cni", 0, &map);
    let code = wait_exited(&ctrd, &init, &what);
    let logs = ctrd.own.dir.join("logs/natledger-node");
    let log_of = |name: &str| std::fs::read_to_string(logs.join(name)).unwrap_or_default();
    assert_eq!(
        code,
        0,
        "{what}: install-cni exited {code}: {}",
        log_of("install-cni.log")
    );
    let conf_files = files(&ctrd.cni_conf_dir());
    let conflist: Value = serde_json::from_slice(&conf_files[CONFLIST]).unwrap();
    let mut expected = conflist_before.clone();
    expected["plugins"][1]["type"] = json!("natledger");
    assert_eq!(conflist, expected, "{what}: only portmap's type changes");
    let backups: Vec<&String> = conf_files.keys().filter(|n| *n != CONFLIST).collect();
    assert_eq!(backups.len(), 1, "{what}: one backup: {backups:?}");
    let backup: Value = serde_json::from_slice(&conf_files[backups[0]]).unwrap();
    assert_eq!(backup, conflist_before, "{what}: the backup {}", backups[0]);
    let plugin = ctrd.cni_bin_dir().join("natledger");
    let meta = std::fs::symlink_metadata(&plugin).unwrap();
    assert!(meta.is_file(), "{what}: {} is not a file", plugin.display());
    let version = std::process::Command::new(&plugin)
        .arg("--version")
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&version.stdout)
            .starts_with(&format!("natledger {}", env!("CARGO_PKG_VERSION"))),
        "{what}: {version:?}"
    );
    // kubelet runs init containers again when the pod restarts: nothing changes.
    let bins = files(&ctrd.cni_bin_dir());
    let again = start_container(&mut ctrd, sandbox, spec, "install-cni", 1, &map);
    assert_eq!(
        wait_exited(&ctrd, &again, &what),
        0,
        "{what}: install-cni again"
    );
    assert_eq!(
        files(&ctrd.cni_conf_dir()),
        conf_files,
        "{what}: conf after a rerun"
    );
    assert_eq!(
        files(&ctrd.cni_bin_dir()),
        bins,
        "{what}: plugins after a rerun"
    );

    // The watch container, alive when its probe says so.
    let watch = start_container(&mut ctrd, sandbox, spec, "watch", 0, &map);
    let mut health = None;
    if !poll(T, || {
        health = Some(http(ns, metrics_at, "/healthz"));
        matches!(health, Some(Ok((200, _))))
    }) {
        panic!(
            "{what}: /healthz: {health:?}; watch {:?}: {}",
            container_state(&ctrd, &watch),
            log_of("watch.log")
        );
    }
    let pre: Vec<(Family, String)> = if backend.is_iptables() {
        Family::ALL
            .iter()
            .map(|f| (*f, save(ns, backend, *f)))
            .collect()
    } else {
        Vec::new()
    };
    let before = node.dump();

    // A hostPort pod, through natledger (the switched conflist).
    let (pod_a, _) = web_pod(&mut ctrd, "web-a", PORT_A);
    let with_a = assert_forwarded(&node, &ctrd, &pod_a, PORT_A, &format!("{what}, pod a"));
    let client_a = Client::start(node.topo.ext(), PORT_A);
    assert!(
        client_a.answered_since(Instant::now(), 3),
        "{what}: pod a's client"
    );

    // Wiped: the watch container puts the rules back.
    let wiped = Instant::now();
    wipe(&node, &pre);
    assert!(
        poll(T, || node.dump() == with_a),
        "{what}: not repaired within {T:?}:\n{}\nwatch: {}\nbefore the wipe:\n{with_a}",
        node.dump(),
        log_of("watch.log")
    );
    let repaired = wiped.elapsed();
    assert!(
        client_a.answered_since(Instant::now(), 3),
        "{what}: after the repair"
    );
    let (_, failed) = client_a.since(wiped);
    let (code, served) = http(ns, metrics_at, "/metrics").unwrap();
    assert_eq!(code, 200, "{what}: /metrics");
    let restored = metric(&served, "natledger_watch_rules_restored_total");
    assert!(restored.is_some_and(|n| n >= 1.0), "{what}: {served}");
    assert!(
        served.contains("natledger_doctor_findings"),
        "{what}: no doctor findings gauge:\n{served}"
    );
    let rss = container_state(&ctrd, &watch).2.and_then(rss_kb);

    // Pod a deleted: its rules go.
    drop(client_a);
    ctrd.remove_pod(&pod_a)
        .unwrap_or_else(|e| panic!("{what}: removing pod a: {e}"));
    assert_eq!(node.dump(), before, "{what}: the tables after pod a");
    assert_eq!(node.manifests(), Vec::<String>::new(), "{what}");

    // Pod b, then the DaemonSet's pod deleted: b keeps its port.
    let (pod_b, _) = web_pod(&mut ctrd, "web-b", PORT_B);
    let with_b = assert_forwarded(&node, &ctrd, &pod_b, PORT_B, &format!("{what}, pod b"));
    let client_b = Client::start(node.topo.ext(), PORT_B);
    let deleting = Instant::now();
    assert!(
        client_b.answered_since(deleting, 3),
        "{what}: pod b's client"
    );
    // kubelet: each container stopped with the pod's grace period, then the sandbox
    // (containerd's StopPodSandbox alone would SIGKILL at once).
    let grace = spec["terminationGracePeriodSeconds"]
        .as_u64()
        .unwrap()
        .to_string();
    let t = Instant::now();
    ctrd.cri_ok(&["stop", &watch, &grace]);
    let stopped = t.elapsed();
    ctrd.cri_ok(&["stop-pod", &ds_pod]);
    let (state, code, _) = container_state(&ctrd, &watch);
    assert_eq!(
        (state.as_str(), code),
        ("CONTAINER_EXITED", 0),
        "{what}: watch on SIGTERM"
    );
    ctrd.remove_pod(&ds_pod)
        .unwrap_or_else(|e| panic!("{what}: removing the DaemonSet's pod: {e}"));
    assert!(
        http(ns, metrics_at, "/healthz").is_err(),
        "{what}: watch still serves"
    );
    assert!(client_b.answered_since(Instant::now(), 10), "{what}: pod b");
    assert_eq!(
        client_b.since(deleting).1,
        0,
        "{what}: pod b failed to answer after the DaemonSet's pod went"
    );
    drop(client_b);
    assert_eq!(
        node.dump(),
        with_b,
        "{what}: the tables after the DaemonSet"
    );
    assert_eq!(
        files(&ctrd.cni_conf_dir()),
        conf_files,
        "{what}: conflist stays"
    );
    assert!(plugin.exists(), "{what}: the plugin stays");

    // Without the DaemonSet, the plugin still removes what it wrote.
    ctrd.remove_pod(&pod_b)
        .unwrap_or_else(|e| panic!("{what}: removing pod b: {e}"));
    assert_eq!(node.dump(), before, "{what}: the tables after pod b");
    assert_eq!(node.manifests(), Vec::<String>::new(), "{what}");
    assert_eq!(
        ctrd.left_outside(),
        Vec::<std::path::PathBuf>::new(),
        "{what}"
    );
    ctrd.stop()
        .unwrap_or_else(|e| panic!("{what}: {e}\n{}", ctrd.log()));
    ctrd.own.assert_clean(T);
    eprintln!(
        "{what}: repaired {repaired:?} after the wipe ({failed} failed requests meanwhile), \
         watch RSS {rss:?} kB, stopped in {stopped:?}, whole test {:?}",
        started.elapsed()
    );
}

#[test]
fn the_daemonset_runs_through_the_cri_and_hostports_survive_it() {
    let _suite = crate::one_suite_at_a_time(module_path!());
    both(daemonset_scenario);
}
