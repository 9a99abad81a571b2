//! natledger called as a CNI runtime calls a plugin: `CNI_*` environment, the network
//! configuration on stdin, in the node namespace, for a container namespace bound at
//! `/run/netns/NS`.

use std::process::Output;

use serde_json::{Value, json};

use super::{Container, Node};

/// A bridge plugin's result for container `c` (host side interface 0, `eth0` in `netns`),
/// as natledger finds it in `prevResult`.
pub fn cni_prev_result(c: &Container, netns: &str) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "interfaces": [
            {"name": "br0", "mac": "0a:58:0a:4d:00:01"},
            {"name": "eth0", "mac": "0a:58:0a:4d:00:02", "sandbox": netns}
        ],
        "ips": [
            {"address": "10.77.0.1/24", "interface": 0},
            {"address": format!("{}/24", c.v4), "gateway": "10.77.0.1", "interface": 1},
            {"address": format!("{}/64", c.v6), "gateway": "fd77::1", "interface": 1}
        ],
        "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}],
        "dns": {}
    })
}

/// A config for `network` forwarding TCP `host_port` to port 80 of `c`.
pub fn cni_config(node: &Node, network: &str, c: &Container, host_port: u16) -> Value {
    let netns = format!("/run/netns/{}", c.ns);
    json!({
        "cniVersion": "1.1.0", "name": network, "type": "natledger",
        "backend": node.backend.name(), "stateDir": node.state_dir(),
        "runtimeConfig": {"portMappings": [{"hostPort": host_port, "containerPort": 80}]},
        "prevResult": cni_prev_result(c, &netns)
    })
}

/// One plugin call for attachment `(container_id, eth0)`, `CNI_NETNS` set when given.
pub fn cni_call(
    node: &Node,
    command: &str,
    container_id: &str,
    netns: Option<&str>,
    config: &Value,
) -> Output {
    let mut env = vec![
        ("CNI_COMMAND", command),
        ("CNI_CONTAINERID", container_id),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin"),
    ];
    if let Some(netns) = netns {
        env.push(("CNI_NETNS", netns));
    }
    node.natledger(&[], &config.to_string(), &env)
}

/// ADD of `container_id` on `network` for container `c`, forwarding `host_port` to its port 80.
pub fn cni_add(
    node: &Node,
    network: &str,
    container_id: &str,
    c: &Container,
    host_port: u16,
) -> Output {
    let netns = format!("/run/netns/{}", c.ns);
    cni_call(
        node,
        "ADD",
        container_id,
        Some(&netns),
        &cni_config(node, network, c, host_port),
    )
}
