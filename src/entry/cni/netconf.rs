//! The network configuration a runtime writes on stdin, decoded and validated into a
//! [`NetConf`] (SPEC.md §1, §3 "Deriving request configuration"; `docs/cni-notes.md`).
//!
//! Decoding goes in the order libcni's skel checks, so the codes match what runtimes already
//! see from other plugins: not JSON or wrongly typed is 6, an unknown version is 1, a bad
//! network name or value is 7, a portmap option natledger cannot honour is 2.

use std::net::IpAddr;
use std::path::PathBuf;

use serde::Deserialize;
use serde_json::Value;

use super::spec::{CniError, Code, Version, invalid, kind, valid_name, version_of};
use crate::backend::{Backend, BackendChoice};
use crate::model::echo::{Echo, MESSAGE, limit};
use crate::model::portspec::{PortMapping, PortRange, Protocol};

/// `cni.dev/valid-attachments` present: a list, `null` being the empty one (only called
/// when the key is there; absent stays `None` through `#[serde(default)]`).
fn null_is_empty<'de, D>(d: D) -> Result<Option<Vec<ValidAttachment>>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    let list: Option<Vec<ValidAttachment>> = Deserialize::deserialize(d)?;
    Ok(Some(list.unwrap_or_default()))
}

/// One entry of `cni.dev/valid-attachments` (GC, spec 1.1).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct ValidAttachment {
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
}

/// The network configuration natledger received, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct NetConf {
    pub version: Version,
    pub name: String,
    pub plugin_type: String,
    /// `runtimeConfig.portMappings` in natledger's port model; empty when the runtime sent
    /// none (DEL may come without).
    pub mappings: Vec<PortMapping>,
    /// Passed through unchanged on ADD; read for container addresses (`super::result`).
    pub prev_result: Option<Value>,
    /// natledger's own keys.
    pub state_dir: Option<PathBuf>,
    pub backend: Option<BackendChoice>,
    /// `portConflict: "refuse"` (default `warn`), as `io.natledger.port-conflict`.
    pub refuse_conflicts: Option<bool>,
    /// GC's `cni.dev/valid-attachments`.
    pub valid_attachments: Option<Vec<ValidAttachment>>,
}

/// The keys natledger reads, as they come; every other key is ignored (SPEC.md §1 "Other
/// keys": runtimes pass plugin keys through, and conflists carry other plugins' habits).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Wire {
    // `cniVersion` is read from the value first (`version_of`).
    #[serde(default)]
    name: Option<String>,
    #[serde(default, rename = "type")]
    plugin_type: Option<String>,
    #[serde(default)]
    runtime_config: Option<WireRuntimeConfig>,
    #[serde(default)]
    prev_result: Option<Value>,
    #[serde(default)]
    state_dir: Option<String>,
    #[serde(default)]
    backend: Option<String>,
    #[serde(default)]
    port_conflict: Option<String>,
    /// Absent: `None`; JSON `null` (libcni marshals a nil Go slice, no live attachment, so)
    /// is the empty list: nothing is valid.
    #[serde(
        default,
        rename = "cni.dev/valid-attachments",
        deserialize_with = "null_is_empty"
    )]
    valid_attachments: Option<Vec<ValidAttachment>>,
    // portmap's options: honoured when they ask for what natledger does anyway.
    #[serde(default)]
    snat: Option<bool>,
    #[serde(default)]
    masq_all: Option<bool>,
    #[serde(default, rename = "conditionsV4")]
    conditions_v4: Option<Vec<String>>,
    #[serde(default, rename = "conditionsV6")]
    conditions_v6: Option<Vec<String>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct WireRuntimeConfig {
    #[serde(default)]
    port_mappings: Option<Vec<WireMapping>>,
}

/// One `portMappings` entry (CONVENTIONS.md). Numbers are read wide so that an out-of-range
/// port is an invalid value (7), not a decoding failure.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireMapping {
    host_port: i64,
    container_port: i64,
    #[serde(default)]
    protocol: Option<String>,
    #[serde(default, rename = "hostIP")]
    host_ip: Option<String>,
}

/// The keys natledger reads in `runtimeConfig` and in each `portMappings` entry.
const RUNTIME_KEYS: [&str; 1] = ["portMappings"];
const MAPPING_KEYS: [&str; 4] = ["hostPort", "containerPort", "protocol", "hostIP"];

/// Runtimes write `runtimeConfig` from their own structs, and Go plugins (portmap) read it
/// with `encoding/json`, which matches keys case-insensitively: containerd (go-cni's
/// `PortMapping` has no JSON tags) sends `{"HostPort": 8087, "ContainerPort": 80, "Protocol":
/// "tcp", "HostIP": ""}`. So a key of `runtimeConfig` or of a `portMappings` entry that
/// equals one natledger reads but for ASCII case is renamed to natledger's spelling (unless
/// that spelling is there too). Two spellings with different values are refused
/// ([`super::validate::one_spelling`]: Go would take the last one, natledger cannot tell
/// which was meant).
fn fold_runtime_keys(config: &mut Value) -> Result<(), CniError> {
    let Some(runtime) = config
        .get_mut("runtimeConfig")
        .and_then(Value::as_object_mut)
    else {
        return Ok(());
    };
    super::validate::one_spelling(runtime, &RUNTIME_KEYS)?;
    fold_keys(runtime, &RUNTIME_KEYS);
    if let Some(entries) = runtime
        .get_mut("portMappings")
        .and_then(Value::as_array_mut)
    {
        for entry in entries.iter_mut().filter_map(Value::as_object_mut) {
            super::validate::one_spelling(entry, &MAPPING_KEYS)?;
            fold_keys(entry, &MAPPING_KEYS);
        }
    }
    Ok(())
}

/// Renames each key of `object` that equals one of `canonical` ignoring ASCII case, when the
/// canonical spelling itself is absent.
fn fold_keys(object: &mut serde_json::Map<String, Value>, canonical: &[&str]) {
    for want in canonical {
        if object.contains_key(*want) {
            continue;
        }
        let found = object
            .keys()
            .find(|k| k.eq_ignore_ascii_case(want))
            .cloned();
        if let Some(key) = found
            && let Some(value) = object.remove(&key)
        {
            object.insert(want.to_string(), value);
        }
    }
}

impl NetConf {
    /// Decode and validate a configuration already known to be a JSON object.
    /// DEL's view: only what DEL uses (the version, and `stateDir`/`backend` when they are
    /// valid), so a configuration ADD refused (a portmap option natledger cannot honour, a
    /// bad port, a config edited since) never fails the DEL. DEL is best-effort (SPEC.md:
    /// "a delete must still be executed even if the add fails"), and libcni stops a
    /// conflist's DEL at the first plugin that fails: the bridge's and IPAM's DEL would
    /// never run, leaking the interface and the address.
    pub fn for_del(config: Value) -> Result<NetConf, CniError> {
        let version = version_of(&config)?;
        let text = |key: &str| config.get(key).and_then(Value::as_str);
        Ok(NetConf {
            version,
            name: text("name").unwrap_or_default().to_string(),
            plugin_type: text("type").unwrap_or_default().to_string(),
            mappings: Vec::new(),
            prev_result: None,
            state_dir: text("stateDir")
                .filter(|dir| dir.starts_with('/'))
                .map(PathBuf::from),
            backend: text("backend").and_then(|b| backend_choice(b).ok()),
            refuse_conflicts: None,
            valid_attachments: None,
        })
    }

    pub fn from_value(config: Value) -> Result<NetConf, CniError> {
        let version = version_of(&config)?;
        let mut config = config;
        fold_runtime_keys(&mut config)?;
        let wire: Wire = serde_json::from_value(config).map_err(|e| {
            CniError::new(Code::Decode, "error decoding network config", e.to_string())
        })?;
        refuse_portmap_only(&wire)?;
        let name = network_name(wire.name)?;
        let plugin_type = plugin_type(wire.plugin_type)?;
        let mappings = wire
            .runtime_config
            .unwrap_or_default()
            .port_mappings
            .unwrap_or_default()
            .iter()
            .map(to_mapping)
            .collect::<Result<Vec<_>, _>>()?;
        let mappings = super::validate::distinct_host_ports(mappings)?;
        Ok(NetConf {
            version,
            name,
            plugin_type,
            mappings,
            prev_result: prev_result(wire.prev_result)?,
            state_dir: state_dir(wire.state_dir)?,
            backend: wire.backend.as_deref().map(backend_choice).transpose()?,
            refuse_conflicts: port_conflict(wire.port_conflict.as_deref())?,
            valid_attachments: wire.valid_attachments,
        })
    }
}

/// `name`: present, in the characters a network name may hold.
fn network_name(name: Option<String>) -> Result<String, CniError> {
    let name = name.unwrap_or_default();
    if name.is_empty() {
        return Err(invalid("missing network name"));
    }
    if !valid_name(&name) {
        return Err(CniError::new(
            Code::InvalidConfig,
            "invalid characters found in network name",
            Echo::from(name).to_string(),
        ));
    }
    Ok(name)
}

/// `type`: a file name in CNI_PATH.
fn plugin_type(plugin_type: Option<String>) -> Result<String, CniError> {
    let plugin_type = plugin_type.unwrap_or_default();
    if plugin_type.is_empty() || plugin_type.contains(['/', '\\']) {
        return Err(CniError::new(
            Code::InvalidConfig,
            "invalid plugin type",
            format!(
                "type {} must be a file name in CNI_PATH",
                Echo::from(plugin_type)
            ),
        ));
    }
    Ok(plugin_type)
}

/// `prevResult`: absent, null or an object.
fn prev_result(prev_result: Option<Value>) -> Result<Option<Value>, CniError> {
    match prev_result {
        None | Some(Value::Null) => Ok(None),
        Some(v @ Value::Object(_)) => Ok(Some(v)),
        Some(other) => Err(CniError::new(
            Code::Decode,
            "error decoding prevResult",
            format!("prevResult is a JSON {}, not an object", kind(&other)),
        )),
    }
}

/// `stateDir`: absent or an absolute path.
fn state_dir(dir: Option<String>) -> Result<Option<PathBuf>, CniError> {
    match dir {
        None => Ok(None),
        Some(dir) if dir.starts_with('/') => Ok(Some(PathBuf::from(dir))),
        Some(dir) => Err(CniError::new(
            Code::InvalidConfig,
            "invalid stateDir",
            format!("stateDir {} is not an absolute path", Echo::from(dir)),
        )),
    }
}

/// `portConflict`: whether a conflict is refused (`refuse`) or warned of (`warn`).
fn port_conflict(word: Option<&str>) -> Result<Option<bool>, CniError> {
    match word {
        None => Ok(None),
        Some("warn") => Ok(Some(false)),
        Some("refuse") => Ok(Some(true)),
        Some(other) => Err(CniError::new(
            Code::InvalidConfig,
            "invalid portConflict",
            format!("portConflict {} is not warn or refuse", Echo::from(other)),
        )),
    }
}

/// Why natledger would refuse `plugin` (one plugin's configuration in a conflist) in
/// portmap's place: a portmap option it cannot honour ([`refuse_portmap_only`]) or a key it
/// reads of the wrong type; `None` when it takes it (`natledger install-cni`).
pub fn refused_as_portmap(plugin: &Value) -> Option<CniError> {
    let wire = Wire::deserialize(plugin)
        .map_err(|e| CniError::new(Code::Decode, "error decoding network config", e.to_string()));
    wire.and_then(|wire| refuse_portmap_only(&wire)).err()
}

/// portmap's options that would change which packets are forwarded or how: natledger cannot
/// do what they ask, and silently forwarding differently is worse than refusing (code 2 names
/// key and value, as the spec requires). `markMasqBit` and `externalSetMarkChain` only say how
/// portmap marks packets it masquerades; natledger masquerades in its own chain without marks,
/// so they are accepted and have no effect.
fn refuse_portmap_only(wire: &Wire) -> Result<(), CniError> {
    let unsupported = |key: &str, value: &str, why: &str| {
        CniError::new(
            Code::UnsupportedField,
            "unsupported field in network configuration",
            format!("{key}: {value}: {why}"),
        )
    };
    if wire.snat == Some(false) {
        return Err(unsupported(
            "snat",
            "false",
            "natledger always masquerades hairpin and localhost connections",
        ));
    }
    if wire.masq_all == Some(true) {
        return Err(unsupported(
            "masqAll",
            "true",
            "natledger masquerades only hairpin and localhost connections",
        ));
    }
    for (key, conditions) in [
        ("conditionsV4", &wire.conditions_v4),
        ("conditionsV6", &wire.conditions_v6),
    ] {
        if let Some(words) = conditions
            .as_ref()
            .filter(|w| w.iter().any(|s| !s.is_empty()))
        {
            return Err(unsupported(
                key,
                &limit(&format!("{words:?}"), MESSAGE),
                "natledger writes its own rules only (use hostIP to narrow a mapping)",
            ));
        }
    }
    Ok(())
}

/// `backend`: natledger's names, and portmap's: `iptables` (the host's iptables, which is
/// what `auto` follows where iptables is installed) and `nftables` (its own nf_tables table:
/// natledger's `nftables` backend is the same idea, `crate::kernel::nftables::own`).
fn backend_choice(name: &str) -> Result<BackendChoice, CniError> {
    if matches!(name, "auto" | "iptables") {
        return Ok(BackendChoice::Auto);
    }
    Backend::named(name)
        .map(BackendChoice::Named)
        .ok_or_else(|| {
            let words: Vec<&str> = Backend::ALL.iter().map(|b| b.suffix()).collect();
            CniError::new(
                Code::InvalidConfig,
                "invalid backend",
                format!(
                    "backend {} is not auto, {} or iptables",
                    Echo::from(name),
                    words.join(", ")
                ),
            )
        })
}

/// One `portMappings` entry as natledger's mapping: single ports (the capability has no
/// ranges), protocol `tcp` when missing (as Kubernetes' default), any case; an empty `hostIP`
/// is no address.
fn to_mapping(entry: &WireMapping) -> Result<PortMapping, CniError> {
    let port = |what: &str, n: i64| {
        u16::try_from(n).ok().filter(|p| *p > 0).ok_or_else(|| {
            CniError::new(
                Code::InvalidConfig,
                "invalid port mapping",
                format!("{what} {n} is not in 1-65535"),
            )
        })
    };
    let host = port("hostPort", entry.host_port)?;
    let container = port("containerPort", entry.container_port)?;
    let protocol = match entry.protocol.as_deref() {
        None | Some("") => Protocol::Tcp,
        Some(p) => p.to_ascii_lowercase().parse::<Protocol>().map_err(|_| {
            CniError::new(
                Code::InvalidConfig,
                "invalid port mapping",
                format!("protocol {} is not tcp, udp or sctp", Echo::from(p)),
            )
        })?,
    };
    let host_ip = match entry.host_ip.as_deref() {
        None | Some("") => None,
        Some(ip) => Some(ip.parse::<IpAddr>().map_err(|_| {
            CniError::new(
                Code::InvalidConfig,
                "invalid port mapping",
                format!("hostIP {} is not an IP address", Echo::from(ip)),
            )
        })?),
    };
    Ok(PortMapping {
        host_ip,
        host_ports: PortRange::single(host),
        container_ports: PortRange::single(container),
        protocol,
    })
}
