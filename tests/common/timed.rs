//! Timed runs of natledger in the node (killed past a limit), and the CNI configs and
//! manifests of the tests of many mappings (`tests/timed/bounds.rs`, `tests/timed/oversized.rs`).

use std::process::Output;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{BIN, Container, Node, cni_prev_result, run_in};

/// `natledger ARGS` in the node as [`Node::natledger`] runs it, with `env`, killed after
/// `limit` (exit 124), timed.
pub fn timed(
    node: &Node,
    args: &[&str],
    stdin: &str,
    env: &[(&str, &str)],
    limit: u64,
) -> (Output, Duration) {
    let limit = limit.to_string();
    let state_dir = format!("NATLEDGER_STATE_DIR={}", node.state_dir().display());
    let backend = format!("NATLEDGER_BACKEND={}", node.backend.name());
    let env: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let mut argv: Vec<&str> = vec![&limit, "env", &state_dir, &backend];
    argv.extend(env.iter().map(String::as_str));
    argv.push(BIN);
    argv.extend_from_slice(args);
    let start = Instant::now();
    let out = run_in(node.topo.node(), "timeout", &argv, Some(stdin.as_bytes()));
    (out, start.elapsed())
}

/// One CNI call for `(container_id, eth0)` of container `c`, timed, killed after `limit` s.
pub fn cni_timed(
    node: &Node,
    command: &str,
    container_id: &str,
    c: &Container,
    config: &Value,
    limit: u64,
) -> (Output, Duration) {
    let netns = format!("/run/netns/{}", c.ns);
    let env = [
        ("CNI_COMMAND", command),
        ("CNI_CONTAINERID", container_id),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin"),
        ("CNI_NETNS", netns.as_str()),
    ];
    timed(node, &[], &config.to_string(), &env, limit)
}

pub fn bounds_config(node: &Node, c: &Container, mappings: Vec<Value>) -> Value {
    let netns = format!("/run/netns/{}", c.ns);
    json!({
        "cniVersion": "1.0.0", "name": "bounds", "type": "natledger",
        "backend": node.backend.name(), "stateDir": node.state_dir(),
        "runtimeConfig": {"portMappings": mappings},
        "prevResult": cni_prev_result(c, &netns)
    })
}

/// `hostPort` `h` to `containerPort` `f(h)` for every port, TCP, optionally on `host_ip`.
pub fn port_mappings(
    f: impl Fn(u16) -> u16,
    ports: impl Iterator<Item = u16>,
    host_ip: Option<&str>,
) -> Vec<Value> {
    ports
        .map(|h| {
            let mut m = json!({"hostPort": h, "containerPort": f(h), "protocol": "tcp"});
            if let Some(ip) = host_ip {
                m["hostIP"] = ip.into();
            }
            m
        })
        .collect()
}

/// The size of container `id`'s manifest.
pub fn manifest_size(node: &Node, id: &str) -> u64 {
    let path = node
        .state_dir()
        .join("containers")
        .join(format!("{id}.json"));
    std::fs::metadata(path).expect("the manifest").len()
}
