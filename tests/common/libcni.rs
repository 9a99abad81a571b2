//! A small CNI runtime: a conflist run as libcni runs it (containernetworking/cni
//! `libcni/api.go`, `AddNetworkList`, `CheckNetworkList`, `DelNetworkList`, `GCNetworkList`,
//! `GetStatusNetworkList`), the plugins being real binaries run in a [`Node`]'s namespace.
//!
//! - ADD runs every plugin in order, each with the conflist's `name` and `cniVersion` injected,
//!   the previous plugin's result as `prevResult`, and `runtimeConfig` holding the runtime's
//!   capability arguments the plugin declares (`capabilities: {"portMappings": true}`); the
//!   last result is cached (per network, container id and ifname) only when every plugin
//!   succeeded.
//! - DEL runs them in reverse order with the cached result as `prevResult` (CNI 0.4.0 and
//!   later; none after a failed ADD), stops at the first failure (the cache stays) and drops
//!   the cache on success. CHECK (0.4.0 and later) runs them in order with the cached result.
//! - GC DELs every cached attachment of the network missing from the valid list, then (1.1.0
//!   and later) sends GC with `cni.dev/valid-attachments` (and the misspelt
//!   `cni.dev/attachments`) to every plugin. STATUS (1.1.0 and later) asks each plugin in order
//!   and stops at the first failure. Below 1.1.0 both send nothing to the plugins, as libcni.
//! - Every call gets all six `CNI_*` variables (empty when not given), `CNI_PATH` being the
//!   driver's directory (a `natledger` symlink to the binary under test) then Debian's
//!   `/usr/lib/cni` (bridge, host-local, portmap: containernetworking/plugins 1.1.1, which
//!   accept at most CNI 1.0.0: [`PLUGINS_VERSION`]), and `PATH`; nothing else of the test's
//!   environment, except what [`Conflist::with_env`] gives one plugin type; a plugin type
//!   may run with a directory hidden under an empty tmpfs ([`Conflist::with_hidden`], its own
//!   mount namespace: tools not installed). `validate` is `ValidateNetworkList` (VERSION).
//!
//! What differs from libcni: the cache keeps the configuration as JSON (libcni: base64), and
//! a cached result is handed on as the plugin printed it (libcni converts it to the list's
//! version, the same version here). The cache, host-local's `dataDir` and the symlink live
//! in the node's temporary directory, never in `/var/lib/cni`.
//!
//! `Conflist::bridge(&node, "net1", 1)` is bridge (`cnibr1`, gateway, hairpin mode, no
//! masquerade) with host-local on 10.79.1.0/24 and fd79:1::/64; add the port mapper with
//! `.with_plugin("natledger", json!({}))` (its `backend` and `stateDir` are the node's) or
//! `.with_plugin("portmap", json!({}))`. Containers are bare namespaces
//! ([`Topology::add_sandbox`]) the bridge plugin wires; the `ext` namespace reaches the node.

use std::net::IpAddr;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::{Map, Value, json};

use super::{BIN, Node, run_in};

/// Where Debian's containernetworking-plugins package installs the plugins.
pub const DEBIAN_PLUGINS: &str = "/usr/lib/cni";
/// The highest `cniVersion` Debian 12's plugins (1.1.1) accept (`CNI_COMMAND=VERSION`).
pub const PLUGINS_VERSION: &str = "1.0.0";
/// The interface the bridge plugin makes in the container (libcni's `RuntimeConf.IfName`).
pub const IFNAME: &str = "eth0";

/// One port mapping, as a runtime passes it in the `portMappings` capability.
#[derive(Clone, Debug, PartialEq)]
pub struct PortMap {
    pub host_port: u16,
    pub container_port: u16,
    pub protocol: &'static str,
    pub host_ip: Option<IpAddr>,
}

impl PortMap {
    pub fn tcp(host_port: u16, container_port: u16) -> PortMap {
        PortMap {
            host_port,
            container_port,
            protocol: "tcp",
            host_ip: None,
        }
    }

    pub fn udp(host_port: u16, container_port: u16) -> PortMap {
        PortMap {
            protocol: "udp",
            ..PortMap::tcp(host_port, container_port)
        }
    }

    pub fn sctp(host_port: u16, container_port: u16) -> PortMap {
        PortMap {
            protocol: "sctp",
            ..PortMap::tcp(host_port, container_port)
        }
    }

    /// Only for packets to `host_ip` (the mapping's `hostIP`).
    pub fn on(self, host_ip: impl Into<IpAddr>) -> PortMap {
        PortMap {
            host_ip: Some(host_ip.into()),
            ..self
        }
    }

    fn to_json(&self) -> Value {
        let mut m = json!({
            "hostPort": self.host_port,
            "containerPort": self.container_port,
            "protocol": self.protocol,
        });
        if let Some(ip) = self.host_ip {
            m["hostIP"] = ip.to_string().into();
        }
        m
    }
}

/// A failed call of the conflist: which plugin, how it ended, what it printed. A plugin
/// killed by a signal printed nothing (libcni: "netplugin failed with no error message").
#[derive(Clone, Debug)]
pub struct CniFailure {
    /// The plugin's `type`, or `libcni` for what the runtime itself refuses.
    pub plugin: String,
    pub command: &'static str,
    /// The signal that ended the plugin, if one did.
    pub signal: Option<i32>,
    /// The error object printed on stdout, if any (boxed: a failure stays small).
    pub error: Option<Box<Value>>,
    pub stderr: String,
}

impl CniFailure {
    /// The plugin was SIGKILLed (as `NATLEDGER_FAULT` does).
    pub fn killed(&self) -> bool {
        self.signal == Some(libc::SIGKILL)
    }

    /// The error object's `code`.
    pub fn code(&self) -> Option<u64> {
        self.error.as_ref()?["code"].as_u64()
    }

    /// The error object's `msg` and `details`, one line.
    pub fn message(&self) -> String {
        let field = |k: &str| {
            self.error
                .as_ref()
                .and_then(|e| e[k].as_str())
                .unwrap_or("")
                .to_string()
        };
        format!("{}: {}", field("msg"), field("details"))
    }

    fn refused(command: &'static str, why: String) -> CniFailure {
        CniFailure {
            plugin: "libcni".into(),
            command,
            signal: None,
            error: Some(Box::new(json!({"code": 999, "msg": why}))),
            stderr: String::new(),
        }
    }
}

impl std::fmt::Display for CniFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "plugin {} failed ({}): ", self.plugin, self.command)?;
        match (self.signal, &self.error) {
            (Some(sig), _) => write!(f, "killed by signal {sig}")?,
            (None, Some(e)) => write!(f, "{e}")?,
            (None, None) => write!(f, "no error object")?,
        }
        write!(f, "; stderr: {}", self.stderr.trim())
    }
}

/// What a runtime passes for one attachment (libcni's `RuntimeConf`).
struct Runtime {
    container_id: String,
    netns: String,
    capability_args: Map<String, Value>,
}

impl Runtime {
    fn new(container_id: &str, ns: &str, ports: &[PortMap]) -> Runtime {
        let mut capability_args = Map::new();
        capability_args.insert(
            "portMappings".into(),
            ports.iter().map(PortMap::to_json).collect(),
        );
        Runtime {
            container_id: container_id.into(),
            netns: format!("/run/netns/{ns}"),
            capability_args,
        }
    }
}

/// A network configuration list and the runtime that runs it on a node.
#[derive(Clone)]
pub struct Conflist<'n> {
    node: &'n Node,
    pub name: String,
    pub cni_version: String,
    plugins: Vec<Value>,
    /// (plugin type, variable, value): extra environment for one plugin type.
    env: Vec<(String, String, String)>,
    /// (plugin type, directory): hidden from that plugin type under an empty tmpfs.
    hidden: Vec<(String, String)>,
}

impl<'n> Conflist<'n> {
    /// An empty list: add plugins with [`Conflist::with_plugin`].
    pub fn new(node: &'n Node, name: &str, cni_version: &str) -> Conflist<'n> {
        let conflist = Conflist {
            node,
            name: name.into(),
            cni_version: cni_version.into(),
            plugins: Vec::new(),
            env: Vec::new(),
            hidden: Vec::new(),
        };
        let bin = conflist.dir().join("bin");
        std::fs::create_dir_all(&bin).expect("the driver's CNI_PATH directory");
        let link = bin.join("natledger");
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(BIN, &link).expect("symlink natledger into CNI_PATH");
        }
        conflist
    }

    /// bridge `cnibrN` (gateway, hairpin mode, no masquerade) with host-local on
    /// 10.79.N.0/24 and fd79:N::/64, default routes through the bridge; at
    /// [`PLUGINS_VERSION`].
    pub fn bridge(node: &'n Node, name: &str, subnet: u8) -> Conflist<'n> {
        let conflist = Conflist::new(node, name, PLUGINS_VERSION);
        let data_dir = conflist.dir().join("ipam");
        conflist.with_plugin(
            "bridge",
            json!({
                "bridge": format!("cnibr{subnet}"),
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "dataDir": data_dir,
                    "ranges": [
                        [{"subnet": format!("10.79.{subnet}.0/24")}],
                        [{"subnet": format!("fd79:{subnet}::/64")}]
                    ],
                    "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]
                }
            }),
        )
    }

    /// Appends plugin `plugin_type` with the keys of `extra`. A port mapper (`natledger`,
    /// `portmap`) declares the `portMappings` capability; natledger gets the node's `backend`
    /// and `stateDir`; `extra` overrides either.
    pub fn with_plugin(mut self, plugin_type: &str, extra: Value) -> Conflist<'n> {
        let mut plugin = json!({"type": plugin_type});
        if matches!(plugin_type, "natledger" | "portmap") {
            plugin["capabilities"] = json!({"portMappings": true});
        }
        if plugin_type == "natledger" {
            plugin["backend"] = self.node.backend.name().into();
            plugin["stateDir"] = json!(self.node.state_dir());
        }
        for (k, v) in extra.as_object().expect("a plugin's keys as an object") {
            plugin[k] = v.clone();
        }
        self.plugins.push(plugin);
        self
    }

    /// Runs every plugin of type `plugin_type` with `key=value` in its environment (e.g.
    /// `NATLEDGER_FAULT`, or a `PATH`).
    pub fn with_env(mut self, plugin_type: &str, key: &str, value: &str) -> Conflist<'n> {
        self.env
            .push((plugin_type.into(), key.into(), value.into()));
        self
    }

    /// Runs every plugin of type `plugin_type` with an empty tmpfs over `dir`, in a mount
    /// namespace of its own (as if what `dir` holds were not installed).
    pub fn with_hidden(mut self, plugin_type: &str, dir: &str) -> Conflist<'n> {
        self.hidden.push((plugin_type.into(), dir.into()));
        self
    }

    /// The conflist as its file would hold it.
    pub fn to_json(&self) -> Value {
        json!({"cniVersion": self.cni_version, "name": self.name, "plugins": self.plugins})
    }

    /// `AddNetworkList`: the last plugin's result, cached.
    pub fn add(
        &self,
        container_id: &str,
        ns: &str,
        ports: &[PortMap],
    ) -> Result<Value, CniFailure> {
        let rt = Runtime::new(container_id, ns, ports);
        let mut result: Option<Value> = None;
        for plugin in &self.plugins {
            let conf = self.one_config(plugin, result.as_ref(), Some(&rt));
            let printed = self.exec(plugin, "ADD", Some(&rt), &conf)?;
            result = Some(serde_json::from_slice(&printed.stdout).unwrap_or_else(|e| {
                panic!(
                    "{} ADD printed no result ({e}): {printed:?}",
                    plugin["type"]
                )
            }));
        }
        let result = result.unwrap_or(Value::Null);
        let cache = json!({
            "kind": "cniCacheV1",
            "containerId": rt.container_id,
            "config": self.to_json(),
            "ifName": IFNAME,
            "networkName": self.name,
            "netns": rt.netns,
            "capabilityArgs": rt.capability_args,
            "result": result,
        });
        let path = self.cache_file(container_id);
        std::fs::create_dir_all(path.parent().unwrap()).expect("the cache directory");
        std::fs::write(&path, cache.to_string()).expect("write the cached result");
        Ok(result)
    }

    /// `CheckNetworkList`: every plugin in order, the cached result as `prevResult`.
    pub fn check(&self, container_id: &str, ns: &str, ports: &[PortMap]) -> Result<(), CniFailure> {
        if !self.at_least("0.4.0") {
            return Err(CniFailure::refused(
                "CHECK",
                format!(
                    "configuration version {:?} does not support the CHECK command",
                    self.cni_version
                ),
            ));
        }
        let rt = Runtime::new(container_id, ns, ports);
        let cached = self.cached(container_id);
        for plugin in &self.plugins {
            let conf = self.one_config(plugin, cached.as_ref(), Some(&rt));
            self.exec(plugin, "CHECK", Some(&rt), &conf)?;
        }
        Ok(())
    }

    /// `DelNetworkList`: every plugin in reverse order, the cached result (if any) as
    /// `prevResult`; the cache dropped once every plugin succeeded.
    pub fn del(&self, container_id: &str, ns: &str, ports: &[PortMap]) -> Result<(), CniFailure> {
        let rt = Runtime::new(container_id, ns, ports);
        self.del_runtime(&rt)
    }

    fn del_runtime(&self, rt: &Runtime) -> Result<(), CniFailure> {
        let cached = if self.at_least("0.4.0") {
            self.cached(&rt.container_id)
        } else {
            None
        };
        for plugin in self.plugins.iter().rev() {
            let conf = self.one_config(plugin, cached.as_ref(), Some(rt));
            self.exec(plugin, "DEL", Some(rt), &conf)?;
        }
        let _ = std::fs::remove_file(self.cache_file(&rt.container_id));
        Ok(())
    }

    /// `GCNetworkList`: DEL of every cached attachment of this network whose container id is
    /// not in `valid` (ifname [`IFNAME`]), then GC to every plugin (1.1.0 and later). Every
    /// failure, as libcni joins them.
    pub fn gc(&self, valid: &[&str]) -> Result<(), Vec<CniFailure>> {
        let mut failures = Vec::new();
        for cached in self.cached_attachments() {
            let id = cached["containerId"].as_str().unwrap_or_default();
            if valid.contains(&id) {
                continue;
            }
            let rt = Runtime {
                container_id: id.into(),
                netns: cached["netns"].as_str().unwrap_or_default().into(),
                capability_args: cached["capabilityArgs"]
                    .as_object()
                    .cloned()
                    .unwrap_or_default(),
            };
            if let Err(e) = self.del_runtime(&rt) {
                failures.push(e);
            }
        }
        if self.at_least("1.1.0") {
            let valid: Vec<Value> = valid
                .iter()
                .map(|id| json!({"containerID": id, "ifname": IFNAME}))
                .collect();
            for plugin in &self.plugins {
                let mut conf = plugin.clone();
                conf["name"] = self.name.clone().into();
                conf["cniVersion"] = self.cni_version.clone().into();
                conf["cni.dev/valid-attachments"] = valid.clone().into();
                conf["cni.dev/attachments"] = valid.clone().into();
                if let Err(e) = self.exec(plugin, "GC", None, &conf) {
                    failures.push(e);
                }
            }
        }
        if failures.is_empty() {
            Ok(())
        } else {
            Err(failures)
        }
    }

    /// `GetStatusNetworkList`: STATUS to each plugin in order (1.1.0 and later), the first
    /// failure returned.
    pub fn status(&self) -> Result<(), CniFailure> {
        if !self.at_least("1.1.0") {
            return Ok(());
        }
        for plugin in &self.plugins {
            let mut conf = plugin.clone();
            conf["name"] = self.name.clone().into();
            conf["cniVersion"] = self.cni_version.clone().into();
            self.exec(plugin, "STATUS", None, &conf)?;
        }
        Ok(())
    }

    /// `ValidateNetworkList`: every plugin answers VERSION with the list's `cniVersion` among
    /// its supported versions; the first that does not is the failure.
    pub fn validate(&self) -> Result<(), CniFailure> {
        for plugin in &self.plugins {
            let conf = json!({"cniVersion": self.cni_version});
            let out = self.exec(plugin, "VERSION", None, &conf)?;
            let info: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            let supported = info["supportedVersions"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            if !supported.iter().any(|v| *v == self.cni_version.as_str()) {
                return Err(CniFailure::refused(
                    "VERSION",
                    format!(
                        "plugin {} does not support config version {:?}",
                        plugin["type"], self.cni_version
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The cached ADD result of `(container_id, eth0)` on this network, if any.
    pub fn cached(&self, container_id: &str) -> Option<Value> {
        let text = std::fs::read_to_string(self.cache_file(container_id)).ok()?;
        let cached: Value = serde_json::from_str(&text).ok()?;
        Some(cached["result"].clone())
    }

    /// The driver's files on this node: `bin` (CNI_PATH), `cache`, `ipam`.
    fn dir(&self) -> PathBuf {
        self.node.dir.path().join("cni")
    }

    fn cache_file(&self, container_id: &str) -> PathBuf {
        self.dir()
            .join("cache/results")
            .join(format!("{}-{container_id}-{IFNAME}", self.name))
    }

    fn cached_attachments(&self) -> Vec<Value> {
        let Ok(entries) = std::fs::read_dir(self.dir().join("cache/results")) else {
            return Vec::new();
        };
        let mut names: Vec<PathBuf> = entries.filter_map(|e| Some(e.ok()?.path())).collect();
        names.sort();
        names
            .iter()
            .filter_map(|p| serde_json::from_str::<Value>(&std::fs::read_to_string(p).ok()?).ok())
            .filter(|c| c["kind"] == "cniCacheV1" && c["networkName"] == self.name.as_str())
            .collect()
    }

    fn at_least(&self, version: &str) -> bool {
        let parse =
            |v: &str| -> Vec<u32> { v.split('.').map(|p| p.parse().unwrap_or(0)).collect() };
        parse(&self.cni_version) >= parse(version)
    }

    /// libcni's `buildOneConfig`: `name`, `cniVersion`, `prevResult` injected, and
    /// `runtimeConfig` from the capabilities the plugin declares.
    fn one_config(&self, plugin: &Value, prev: Option<&Value>, rt: Option<&Runtime>) -> Value {
        let mut conf = plugin.clone();
        conf["name"] = self.name.clone().into();
        conf["cniVersion"] = self.cni_version.clone().into();
        if let Some(prev) = prev {
            conf["prevResult"] = prev.clone();
        }
        if let Some(rt) = rt {
            let runtime_config: Map<String, Value> = plugin["capabilities"]
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(_, on)| on.as_bool() == Some(true))
                .filter_map(|(cap, _)| Some((cap.clone(), rt.capability_args.get(cap)?.clone())))
                .collect();
            if !runtime_config.is_empty() {
                conf["runtimeConfig"] = runtime_config.into();
            }
        }
        conf
    }

    /// One plugin run in the node namespace, as libcni's `invoke` runs it.
    fn exec(
        &self,
        plugin: &Value,
        command: &'static str,
        rt: Option<&Runtime>,
        conf: &Value,
    ) -> Result<Output, CniFailure> {
        let plugin_type = plugin["type"].as_str().expect("a plugin type");
        let bin = self.dir().join("bin");
        let cni_path = format!("{}:{DEBIAN_PLUGINS}", bin.display());
        let Some(program) = [bin.as_path(), Path::new(DEBIAN_PLUGINS)]
            .iter()
            .map(|d| d.join(plugin_type))
            .find(|p| p.exists())
        else {
            return Err(CniFailure::refused(
                command,
                format!("failed to find plugin {plugin_type:?} in path [{cni_path}]"),
            ));
        };
        let path = std::env::var("PATH").unwrap_or_else(|_| "/usr/sbin:/usr/bin:/sbin:/bin".into());
        let mut env = vec![
            ("PATH".to_string(), path),
            ("CNI_COMMAND".into(), command.into()),
            (
                "CNI_CONTAINERID".into(),
                rt.map_or("", |r| r.container_id.as_str()).into(),
            ),
            (
                "CNI_NETNS".into(),
                rt.map_or("", |r| r.netns.as_str()).into(),
            ),
            ("CNI_ARGS".into(), String::new()),
            (
                "CNI_IFNAME".into(),
                if rt.is_some() { IFNAME } else { "" }.into(),
            ),
            ("CNI_PATH".into(), cni_path),
        ];
        for (ty, key, value) in &self.env {
            if ty == plugin_type {
                env.retain(|(k, _)| k != key);
                env.push((key.clone(), value.clone()));
            }
        }
        let hidden: Vec<&str> = (self.hidden.iter())
            .filter(|(ty, _)| ty == plugin_type)
            .map(|(_, dir)| dir.as_str())
            .collect();
        let mut argv: Vec<String> = Vec::new();
        if !hidden.is_empty() {
            // unshare --mount sh -c 'mount -t tmpfs … DIR && … && exec "$@"' sh env …
            let mounts: Vec<String> = (hidden.iter())
                .map(|d| format!("mount -t tmpfs libcni-hidden {d}"))
                .collect();
            argv.extend(["--mount", "--propagation", "private", "sh", "-c"].map(String::from));
            argv.push(format!("{} && exec \"$@\"", mounts.join(" && ")));
            argv.extend(["sh", "env"].map(String::from));
        }
        argv.push("-i".into());
        argv.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
        argv.push(program.display().to_string());
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let launcher = if hidden.is_empty() { "env" } else { "unshare" };
        let out = run_in(
            self.node.topo.node(),
            launcher,
            &argv,
            Some(conf.to_string().as_bytes()),
        );
        if out.status.success() {
            return Ok(out);
        }
        Err(CniFailure {
            plugin: plugin_type.into(),
            command,
            signal: out.status.signal(),
            error: serde_json::from_slice(&out.stdout).ok().map(Box::new),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }
}

/// The container's addresses in an ADD result: the `ips` on an interface inside a sandbox.
pub fn container_ips(result: &Value) -> Vec<IpAddr> {
    let interfaces = result["interfaces"].as_array().cloned().unwrap_or_default();
    result["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|ip| {
            ip["interface"]
                .as_u64()
                .and_then(|i| interfaces.get(i as usize))
                .is_some_and(|i| i["sandbox"].is_string())
        })
        .filter_map(|ip| ip["address"].as_str()?.split('/').next()?.parse().ok())
        .collect()
}
