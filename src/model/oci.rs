//! OCI hook input: the container state on stdin and the bundle's `config.json`.
//!
//! Both are parsed with small serde types that read only what natledger uses: the state's id,
//! status, pid, bundle and annotations, and `config.json`'s annotations. Every other field may
//! be missing or unknown: a hook must not refuse a bundle the runtime accepts (runc starts a
//! `process` without `user`, which a full `Spec` parse refuses). Annotations from both count,
//! the state's winning, because podman passes `--annotation` values in the state.

use std::collections::HashMap;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::model::echo::{Cut, Echo};

pub(crate) const PORTS_ANNOTATION: &str = "io.natledger.ports";
pub(crate) const IP_ANNOTATION: &str = "io.natledger.ip";
/// `refuse`: create-runtime fails when a local process already listens on a mapped host
/// port; otherwise (`warn`, the default) it only warns.
pub(crate) const PORT_CONFLICT_ANNOTATION: &str = "io.natledger.port-conflict";
/// The same setting for every container (the annotation wins).
pub(crate) const PORT_CONFLICT_ENV: &str = "NATLEDGER_PORT_CONFLICT";

/// Largest accepted state document; a runtime sends a few hundred bytes.
const MAX_STATE_BYTES: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error("cannot read the container state from stdin")]
    StateRead(#[source] std::io::Error),
    #[error("malformed container state on stdin")]
    StateJson(#[source] Cut),
    #[error("unsafe container id {0}: use 1-128 of A-Z a-z 0-9 _ + - . (not starting with '.')")]
    UnsafeId(Echo),
    #[error("cannot read {}", path.display())]
    ConfigRead {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is not a valid OCI config", path.display())]
    ConfigJson { path: PathBuf, source: Cut },
    #[error("the container state has no bundle, so config.json cannot be read")]
    NoBundle,
    #[error("unknown container status {0} (expected creating or stopped); name the stage")]
    UnknownStatus(Echo),
}

/// A container id that is safe as a file name and inside an iptables comment.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ContainerId(String);

impl ContainerId {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for ContainerId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl FromStr for ContainerId {
    type Err = OciError;
    fn from_str(s: &str) -> Result<Self, OciError> {
        let ok = (1..=128).contains(&s.len())
            && !s.starts_with('.')
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'+' | b'-' | b'.'));
        if ok {
            Ok(ContainerId(s.to_string()))
        } else {
            Err(OciError::UnsafeId(Echo::from(s)))
        }
    }
}

impl TryFrom<String> for ContainerId {
    type Error = OciError;
    fn try_from(s: String) -> Result<Self, OciError> {
        s.parse()
    }
}

impl From<ContainerId> for String {
    fn from(id: ContainerId) -> String {
        id.0
    }
}

impl fmt::Display for ContainerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Which hook is running.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Stage {
    CreateRuntime,
    Poststop,
}

/// The OCI state as runtimes send it to hooks.
#[derive(Debug, Clone, Deserialize)]
pub struct State {
    pub id: String,
    #[serde(default)]
    pub status: String,
    /// Host pid; runc and podman send it to createRuntime, not to poststop (or as 0).
    #[serde(default)]
    pub pid: Option<i32>,
    #[serde(default)]
    pub bundle: Option<PathBuf>,
    #[serde(default)]
    pub annotations: Option<HashMap<String, String>>,
}

impl State {
    pub fn read(mut input: impl Read) -> Result<State, OciError> {
        let mut bytes = Vec::new();
        input
            .by_ref()
            .take(MAX_STATE_BYTES)
            .read_to_end(&mut bytes)
            .map_err(OciError::StateRead)?;
        serde_json::from_slice(&bytes).map_err(|e| OciError::StateJson(Cut::of(&e)))
    }

    /// The stage implied by the status, for hooks.d files that give one argument list.
    pub fn stage(&self) -> Result<Stage, OciError> {
        match self.status.as_str() {
            "creating" => Ok(Stage::CreateRuntime),
            "stopped" => Ok(Stage::Poststop),
            other => Err(OciError::UnknownStatus(Echo::from(other))),
        }
    }

    pub fn pid(&self) -> Option<i32> {
        self.pid.filter(|p| *p > 0)
    }
}

/// Everything a hook knows about its container.
#[derive(Debug, Clone)]
pub struct HookInput {
    pub id: ContainerId,
    /// As the state gives it: createRuntime refuses one that is missing or not positive.
    pub pid: Option<i32>,
    pub bundle: Option<PathBuf>,
    pub annotations: HashMap<String, String>,
}

impl HookInput {
    /// Validate the state and merge the annotations of the bundle's `config.json` (state
    /// wins), the file's bytes as `read` gives them (the caller opens a path the container's
    /// owner controls as it opens every such path).
    pub(crate) fn from_state(
        state: State,
        read: impl FnOnce(&Path) -> std::io::Result<Vec<u8>>,
    ) -> Result<HookInput, OciError> {
        let id: ContainerId = state.id.parse()?;
        let bundle = state.bundle.clone().filter(|b| !b.as_os_str().is_empty());
        let mut annotations = match &bundle {
            Some(b) => config_annotations(b, read)?,
            None => return Err(OciError::NoBundle),
        };
        annotations.extend(state.annotations.clone().unwrap_or_default());
        Ok(HookInput {
            id,
            pid: state.pid,
            bundle,
            annotations,
        })
    }

    pub fn ports(&self) -> Option<&str> {
        self.annotations.get(PORTS_ANNOTATION).map(String::as_str)
    }

    /// Which runtime or engine started the container, as far as its annotations and bundle
    /// path tell: for messages that say what to do in that runtime's terms.
    pub fn runtime(&self) -> Runtime {
        let has = |key: &str| self.annotations.contains_key(key);
        let bundle = self
            .bundle
            .as_deref()
            .map(|b| b.to_string_lossy().into_owned())
            .unwrap_or_default();
        if has(CRIO_CONTAINER_TYPE) {
            Runtime::CriO
        } else if has(CRI_CONTAINER_TYPE) {
            Runtime::ContainerdCri
        } else if self
            .annotations
            .get("io.container.manager")
            .map(String::as_str)
            == Some("libpod")
            || bundle.contains("/overlay-containers/")
        {
            Runtime::Podman
        } else if bundle.contains("/io.containerd.runtime.v2.task/moby/") {
            Runtime::Docker
        } else if bundle.contains("/io.containerd.runtime.v2.task/") {
            Runtime::Containerd
        } else {
            Runtime::Direct
        }
    }
}

/// containerd's CRI: `sandbox` or `container`.
pub(crate) const CRI_CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
/// containerd's CRI: the pod's sandbox container id.
pub(crate) const CRI_SANDBOX_ID: &str = "io.kubernetes.cri.sandbox-id";
/// CRI-O: `sandbox` or `container`.
pub(crate) const CRIO_CONTAINER_TYPE: &str = "io.kubernetes.cri-o.ContainerType";
/// CRI-O: the pod's sandbox id.
pub(crate) const CRIO_SANDBOX_ID: &str = "io.kubernetes.cri-o.SandboxID";

/// Who runs the container (see [`HookInput::runtime`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Runtime {
    /// dockerd, through the wrapper runtime (containerd namespace `moby`).
    Docker,
    /// podman, through the hooks.d file.
    Podman,
    /// containerd's CRI plugin (Kubernetes), through the wrapper runtime.
    ContainerdCri,
    /// CRI-O (Kubernetes), through the hooks.d file.
    CriO,
    /// containerd without CRI (ctr, nerdctl), through the wrapper runtime.
    Containerd,
    /// runc or crun run directly, with `natledger inject`.
    Direct,
}

impl Runtime {
    /// What to do when the container's network namespace has no address to forward to.
    pub(crate) fn no_address_advice(self) -> &'static str {
        match self {
            Runtime::Docker => {
                "the container has no network (`--network none`?): run it on a bridge network \
                 (the default, or `--network NAME`), or give the address with -e NATLEDGER_IP=ADDR"
            }
            Runtime::Podman => {
                "the container has no network natledger can forward to (`--network none`, or \
                 rootless slirp4netns/pasta): run it rootful on a bridge network (the default, or \
                 `--network NAME`), or set --annotation io.natledger.ip=ADDR"
            }
            Runtime::ContainerdCri | Runtime::CriO => {
                "the pod's network has no address: check the node's CNI configuration (a \
                 hostNetwork pod needs no forward), or set io.natledger.ip"
            }
            Runtime::Containerd => {
                "the container has no network (containerd sets up none by itself: use nerdctl \
                 or a CNI plugin), or set io.natledger.ip"
            }
            Runtime::Direct => {
                "put the hook that sets up the network before natledger in config.json's \
                 createRuntime hooks (`natledger inject` appends after the hooks already \
                 there), or set io.natledger.ip"
            }
        }
    }
}

/// The annotations of `BUNDLE/config.json`, whose bytes `read` gives. Missing or unknown
/// fields are fine (see the module comment); a missing, unreadable or non-JSON file, one that
/// is not an object, or annotations that are not a map of strings (the runtime spec's type,
/// and runc's), are errors naming the file.
pub(crate) fn config_annotations(
    bundle: &Path,
    read: impl FnOnce(&Path) -> std::io::Result<Vec<u8>>,
) -> Result<HashMap<String, String>, OciError> {
    let path = bundle.join("config.json");
    let bytes = match read(&path) {
        Ok(bytes) => bytes,
        Err(source) => return Err(OciError::ConfigRead { path, source }),
    };
    // An object of anything (a struct would also take a JSON array), then its annotations.
    let annotations = serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&bytes)
        .and_then(|mut config| match config.remove("annotations") {
            None | Some(serde_json::Value::Null) => Ok(HashMap::new()),
            Some(value) => serde_json::from_value(value),
        });
    annotations.map_err(|e| OciError::ConfigJson {
        path,
        source: Cut::of(&e),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_checked() {
        for ok in ["abc", "0123456789abcdef", "a.b_c+d-e", &"f".repeat(128)] {
            ok.parse::<ContainerId>().expect(ok);
        }
        for bad in [
            "",
            ".",
            "..",
            "../x",
            "a/b",
            ".hidden",
            "a b",
            "a\nb",
            "a\u{1}",
            &"f".repeat(129),
        ] {
            assert!(bad.parse::<ContainerId>().is_err(), "{bad:?}");
        }
        assert!(serde_json::from_str::<ContainerId>("\"../etc\"").is_err());
    }

    #[test]
    fn reads_runc_and_podman_states() {
        let runc = r#"{"ociVersion":"1.0.2","id":"c1","status":"creating","pid":4242,
                       "bundle":"/b","annotations":{"a":"b"}}"#;
        let s = State::read(runc.as_bytes()).unwrap();
        assert_eq!(s.stage().unwrap(), Stage::CreateRuntime);
        assert_eq!(s.pid(), Some(4242));
        let podman_poststop =
            r#"{"ociVersion":"1.0.2","id":"c1","status":"stopped","bundle":"/b"}"#;
        let s = State::read(podman_poststop.as_bytes()).unwrap();
        assert_eq!(s.stage().unwrap(), Stage::Poststop);
        assert_eq!(s.pid(), None);
        let zero = r#"{"id":"c1","status":"stopped","pid":0}"#;
        assert_eq!(State::read(zero.as_bytes()).unwrap().pid(), None);
        assert!(matches!(
            State::read(&b"{\"id\":"[..]),
            Err(OciError::StateJson(_))
        ));
        let running = State::read(&br#"{"id":"c1","status":"running"}"#[..]).unwrap();
        assert!(running.stage().is_err());
    }

    #[test]
    fn annotations_merge_with_the_state_winning() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"ociVersion":"1.0.2","annotations":{"io.natledger.ports":"1:1","x":"config"}}"#,
        )
        .unwrap();
        let state = State {
            id: "c1".into(),
            status: "creating".into(),
            pid: Some(1),
            bundle: Some(dir.path().into()),
            annotations: Some([("x".to_string(), "state".to_string())].into()),
        };
        let input = HookInput::from_state(state.clone(), |p| std::fs::read(p)).unwrap();
        assert_eq!(input.ports(), Some("1:1"));
        assert_eq!(input.annotations["x"], "state");

        let missing = State {
            bundle: Some(dir.path().join("nope")),
            ..state
        };
        let err = HookInput::from_state(missing, |p| std::fs::read(p)).unwrap_err();
        assert!(err.to_string().contains("nope/config.json"), "{err}");
    }

    /// The runtime is told by the annotations the engines add and by where they keep bundles.
    #[test]
    fn runtime_is_told_by_annotations_and_bundle() {
        let input = |annotations: &[(&str, &str)], bundle: &str| HookInput {
            id: "c1".parse().unwrap(),
            pid: Some(1),
            bundle: Some(bundle.into()),
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        let task = "/run/containerd/io.containerd.runtime.v2.task";
        for (annotations, bundle, runtime) in [
            (&[][..], "/tmp/bundle", Runtime::Direct),
            (
                &[],
                "/run/docker/containerd/daemon/io.containerd.runtime.v2.task/moby/c1",
                Runtime::Docker,
            ),
            (&[], &format!("{task}/default/c1"), Runtime::Containerd),
            (
                &[(CRI_CONTAINER_TYPE, "sandbox")],
                &format!("{task}/k8s.io/c1"),
                Runtime::ContainerdCri,
            ),
            (
                &[
                    (CRIO_CONTAINER_TYPE, "container"),
                    ("io.container.manager", "cri-o"),
                ],
                "/run/containers/storage/overlay-containers/c1/userdata",
                Runtime::CriO,
            ),
            (
                &[("io.container.manager", "libpod")],
                "/var/lib/containers/storage/overlay-containers/c1/userdata",
                Runtime::Podman,
            ),
        ] {
            assert_eq!(input(annotations, bundle).runtime(), runtime, "{bundle}");
        }
        assert!(Runtime::Docker.no_address_advice().contains("--network"));
        assert!(!Runtime::Docker.no_address_advice().contains("network hook"));
        assert!(
            Runtime::Direct
                .no_address_advice()
                .contains("createRuntime hooks")
        );
    }

    /// Only the annotations are read: configs runc starts (no `process.user`, no
    /// `ociVersion`, fields of newer specs or of other runtimes) are accepted; what is not a
    /// config at all is an error naming the file.
    #[test]
    fn config_json_is_read_as_leniently_as_runc_reads_it() {
        let bundle = Path::new("/bundle");
        let read = |text: &str| config_annotations(bundle, |_| Ok(text.as_bytes().to_vec()));
        let ports = |text: &str| read(text).unwrap().get(PORTS_ANNOTATION).cloned();
        let p = Some("8080:80".to_string());
        assert_eq!(
            ports(
                r#"{"process":{"args":["sh"],"cwd":"/"},"annotations":{"io.natledger.ports":"8080:80"}}"#
            ),
            p
        );
        assert_eq!(
            ports(
                r#"{"annotations":{"io.natledger.ports":"8080:80"},"linux":{"newField":[1,{"x":null}]},"vm":{}}"#
            ),
            p
        );
        assert_eq!(ports("{}"), None);
        assert_eq!(ports(r#"{"annotations":null}"#), None);
        for (bad, says) in [
            ("", "not a valid OCI config"),
            ("not json", "not a valid OCI config"),
            ("[]", "not a valid OCI config"),
            (
                r#"{"annotations":{"io.natledger.ports":8080}}"#,
                "not a valid OCI config",
            ),
        ] {
            let err = read(bad).unwrap_err().to_string();
            assert!(
                err.contains(says) && err.contains("config.json"),
                "{bad:?}: {err}"
            );
        }
        let missing = |_: &Path| Err(std::io::ErrorKind::NotFound.into());
        let err = config_annotations(bundle, missing).unwrap_err().to_string();
        assert!(
            err.starts_with("cannot read") && err.contains("config.json"),
            "{err}"
        );
    }
}
