//! deploy/kubernetes/natledger.yaml read as kubelet reads it: the documents as JSON (PyYAML,
//! which scripts/test.sh installs with kubernetes-validate), the DaemonSet's pod template,
//! and a container of it translated into the CRI v1 message kubelet would send
//! (`ContainerConfig`, protobuf's JSON mapping, for `tests/cri/cri.py`): args, env, mounts
//! (hostPath volumes onto the paths a test chooses), the security context and resources.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

/// The DaemonSet's YAML.
pub const DEPLOY_YAML: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/deploy/kubernetes/natledger.yaml"
);

/// Every document of a YAML file, as JSON values (`yaml.safe_load_all`).
pub fn yaml_documents(path: &Path) -> Result<Vec<Value>, String> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import json, sys, yaml\n\
             with open(sys.argv[1], encoding='utf-8') as f:\n    \
                 print(json.dumps([d for d in yaml.safe_load_all(f) if d is not None]))",
        ])
        .arg(path)
        .output()
        .map_err(|e| format!("python3: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())
}

/// The DaemonSet document of [`DEPLOY_YAML`].
pub fn daemonset() -> Value {
    let docs = yaml_documents(Path::new(DEPLOY_YAML)).unwrap_or_else(|e| panic!("{e}"));
    docs.into_iter()
        .find(|d| d["kind"] == "DaemonSet")
        .unwrap_or_else(|| panic!("{DEPLOY_YAML} has no DaemonSet"))
}

/// The container named `name` among the pod spec's `containers` or `initContainers`.
pub fn pod_container<'a>(pod_spec: &'a Value, name: &str) -> &'a Value {
    ["initContainers", "containers"]
        .iter()
        .filter_map(|k| pod_spec[k].as_array())
        .flatten()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("the pod has no container {name}"))
}

/// A Kubernetes quantity of CPU in millicores ("20m", "1", "0.5").
fn millicpu(q: &str) -> u64 {
    match q.strip_suffix('m') {
        Some(m) => m.parse().unwrap(),
        None => (q.parse::<f64>().unwrap() * 1000.0) as u64,
    }
}

/// A Kubernetes quantity of memory in bytes ("32Mi", "1Gi", "64M", "1000").
fn bytes(q: &str) -> u64 {
    let units = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("k", 1000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
    ];
    for (suffix, scale) in units {
        if let Some(n) = q.strip_suffix(suffix) {
            return n.parse::<u64>().unwrap() * scale;
        }
    }
    q.parse().unwrap()
}

/// The CRI `ContainerConfig` kubelet sends for `container` of `pod_spec` (kubelet's
/// kuberuntime_container.go, generateLinuxContainerConfig): `host_path_of` maps a hostPath
/// volume's host path onto the test's (`None`: the volume's own path), `image` is the image
/// reference the runtime knows it by.
pub fn cri_container(
    pod_spec: &Value,
    container: &Value,
    image: &str,
    host_path_of: &dyn Fn(&str) -> Option<PathBuf>,
) -> Value {
    let name = container["name"].as_str().unwrap();
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| a.iter().map(|s| s.as_str().unwrap().to_string()).collect())
            .unwrap_or_default()
    };
    let envs: Vec<Value> = container["env"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| json!({"key": e["name"], "value": e["value"]}))
        .collect();
    let volumes = pod_spec["volumes"].as_array().cloned().unwrap_or_default();
    let mounts: Vec<Value> = container["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            let volume = volumes
                .iter()
                .find(|v| v["name"] == m["name"])
                .unwrap_or_else(|| panic!("{name}: no volume {}", m["name"]));
            let path = volume["hostPath"]["path"]
                .as_str()
                .unwrap_or_else(|| panic!("{name}: volume {} is not a hostPath", m["name"]));
            let host = host_path_of(path).unwrap_or_else(|| PathBuf::from(path));
            // kubelet makes a missing DirectoryOrCreate (0755) or FileOrCreate (0644) path.
            match volume["hostPath"]["type"].as_str() {
                Some("DirectoryOrCreate") => std::fs::create_dir_all(&host).unwrap(),
                Some("FileOrCreate") if !host.exists() => std::fs::write(&host, "").unwrap(),
                _ => {}
            }
            let propagation = match m["mountPropagation"].as_str() {
                None | Some("None") => "PROPAGATION_PRIVATE",
                Some("HostToContainer") => "PROPAGATION_HOST_TO_CONTAINER",
                Some("Bidirectional") => "PROPAGATION_BIDIRECTIONAL",
                Some(other) => panic!("{name}: mountPropagation {other}"),
            };
            json!({
                "container_path": m["mountPath"],
                "host_path": host,
                "readonly": m["readOnly"].as_bool().unwrap_or(false),
                "propagation": propagation,
            })
        })
        .collect();
    let sc = &container["securityContext"];
    let mut security = json!({
        "capabilities": {
            "add_capabilities": strings(&sc["capabilities"]["add"]),
            "drop_capabilities": strings(&sc["capabilities"]["drop"]),
        },
        "privileged": sc["privileged"].as_bool().unwrap_or(false),
        "readonly_rootfs": sc["readOnlyRootFilesystem"].as_bool().unwrap_or(false),
        "no_new_privs": !sc["allowPrivilegeEscalation"].as_bool().unwrap_or(true),
        "namespace_options": namespace_options(pod_spec),
    });
    if let Some(uid) = sc["runAsUser"].as_u64() {
        security["run_as_user"] = json!({"value": uid});
    }
    if sc["seccompProfile"]["type"] == "RuntimeDefault" {
        security["seccomp"] = json!({"profile_type": "RuntimeDefault"});
    }
    let limits = &container["resources"]["limits"];
    let requests = &container["resources"]["requests"];
    let mut resources = serde_json::Map::new();
    // kubelet: shares from the request, quota from the limit over a 100 ms period.
    if let Some(cpu) = requests["cpu"].as_str() {
        resources.insert(
            "cpu_shares".into(),
            json!((millicpu(cpu) * 1024 / 1000).max(2)),
        );
    }
    if let Some(cpu) = limits["cpu"].as_str() {
        resources.insert("cpu_period".into(), json!(100_000));
        resources.insert("cpu_quota".into(), json!(millicpu(cpu) * 100));
    }
    if let Some(memory) = limits["memory"].as_str() {
        resources.insert("memory_limit_in_bytes".into(), json!(bytes(memory)));
    }
    json!({
        "metadata": {"name": name},
        "image": {"image": image},
        "command": strings(&container["command"]),
        "args": strings(&container["args"]),
        "envs": envs,
        "mounts": mounts,
        "log_path": format!("{name}.log"),
        "linux": {"resources": resources, "security_context": security},
    })
}

/// `NamespaceOption` of a pod spec: the node's network and pids where the spec says so.
pub fn namespace_options(pod_spec: &Value) -> Value {
    let mode = |host: &str| {
        if pod_spec[host].as_bool().unwrap_or(false) {
            "NODE"
        } else {
            "POD"
        }
    };
    json!({"network": mode("hostNetwork"), "pid": mode("hostPID"), "ipc": mode("hostIPC")})
}

/// scripts/build-image.sh's archive (the static release build, built once per test process;
/// the script's last stdout line is its path).
pub fn image_archive() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/build-image.sh");
            let out = Command::new(script)
                .env_remove("NATLEDGER_BINARY")
                // cargo hands the test build.rs's short commit; the label is git's full one.
                .env_remove("NATLEDGER_COMMIT")
                .output()
                .expect("scripts/build-image.sh");
            assert!(
                out.status.success(),
                "build-image.sh: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let stdout = String::from_utf8_lossy(&out.stdout);
            PathBuf::from(
                stdout
                    .lines()
                    .last()
                    .expect("build-image.sh printed nothing"),
            )
        })
        .clone()
}

/// The names the image's index gives it: (podman's `org.opencontainers.image.ref.name`,
/// containerd's `io.containerd.image.name`).
pub fn image_names() -> (String, String) {
    let version = env!("CARGO_PKG_VERSION");
    (
        format!("natledger:{version}"),
        format!("docker.io/library/natledger:{version}"),
    )
}
