//! A chained CNI port-mapping plugin called as a runtime calls it: the binary, the `CNI_*`
//! environment and one network configuration on stdin whose `prevResult` names the
//! container's address, for a container namespace wired to the node by a veth. The same
//! invocation for CNI portmap and for natledger, so their costs compare.

use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};

use super::{BIN, NamedNetns, run};

pub const PORTMAP: &str = "/usr/lib/cni/portmap";

/// The container's side: `ctr` wired to the node namespace (the current one) by a veth,
/// `host_if` 10.77.0.1/24 on the node, eth0 10.77.0.2/24 in the container, as a bridge or ptp
/// plugin earlier in the chain leaves it.
pub struct Attachment {
    netns: String,
    host_if: String,
}

impl Attachment {
    pub fn wire(ctr: &NamedNetns, host_if: &str) -> Attachment {
        run(
            "ip",
            &[
                "link",
                "add",
                host_if,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                ctr.name(),
            ],
            None,
        );
        run("ip", &["addr", "add", "10.77.0.1/24", "dev", host_if], None);
        run("ip", &["link", "set", host_if, "up"], None);
        ctr.link_up("eth0", &["10.77.0.2/24"])
            .unwrap_or_else(|e| panic!("{e}"));
        Attachment {
            netns: format!("/var/run/netns/{}", ctr.name()),
            host_if: host_if.to_string(),
        }
    }

    /// The result of the plugin before in the chain, naming the container's eth0 and address.
    fn prev_result(&self) -> Value {
        json!({
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "eth0", "sandbox": self.netns}],
            "ips": [{"address": "10.77.0.2/24", "interface": 0}]
        })
    }
}

impl Drop for Attachment {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_if])
            .status();
    }
}

/// One chained plugin for one attachment, mapping host port 8080 to the container's 80/tcp.
pub struct Chained {
    program: String,
    netns: String,
    /// The network configuration, stdin of every call.
    pub config: String,
}

impl Chained {
    /// CNI portmap, as users configure it; its backend comes from PATH (see `PathDirs`).
    pub fn portmap(at: &Attachment) -> Chained {
        Chained::new(PORTMAP, at, json!({"type": "portmap"}))
    }

    /// natledger in portmap's place, its ledger in `state`, on `backend` (legacy, nft).
    pub fn natledger(at: &Attachment, state: &Path, backend: &str) -> Chained {
        Chained::natledger_at(BIN, at, state, backend)
    }

    /// [`Chained::natledger`] run from `bin`, another build of natledger (legacy, nft,
    /// nftables).
    pub fn natledger_at(bin: &str, at: &Attachment, state: &Path, backend: &str) -> Chained {
        let own = json!({"type": "natledger", "stateDir": state, "backend": backend});
        Chained::new(bin, at, own)
    }

    fn new(program: &str, at: &Attachment, own: Value) -> Chained {
        let mut config = json!({
            "cniVersion": "1.0.0",
            "name": "bench",
            "capabilities": {"portMappings": true},
            "runtimeConfig": {"portMappings": [
                {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}
            ]},
            "prevResult": at.prev_result()
        });
        for (key, value) in own.as_object().unwrap() {
            config[key] = value.clone();
        }
        Chained {
            program: program.to_string(),
            netns: at.netns.clone(),
            config: config.to_string(),
        }
    }

    /// The plugin with the environment of `verb` (ADD, DEL, …); stdin is `config`.
    pub fn cmd(&self, verb: &str) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.env("CNI_COMMAND", verb)
            .env("CNI_CONTAINERID", "benchcontainer")
            .env("CNI_NETNS", &self.netns)
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", "/usr/lib/cni");
        cmd
    }
}
