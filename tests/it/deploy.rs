//! deploy/: the manifests an operator applies, checked offline. No namespace, no firewall.
//!
//! - deploy/kubernetes/natledger.yaml: every document validates against the Kubernetes 1.31
//!   API schema, strictly (an unknown field is refused), with kubernetes-validate (pinned in
//!   scripts/test.sh; it bundles the schemas); the same check refuses a copy with one
//!   misspelt field, so it is no rubber stamp.
//! - The DaemonSet runs what docs/kubernetes.md and the other parts agree on: the image
//!   `natledger:<Cargo.toml's version>`, the init container `install-cni` into the host's CNI
//!   directories, the `watch` container with its metrics port 9655 (named `metrics`, probed on
//!   /healthz), `NATLEDGER_HOST_ROOT=/host` and the host's system bus under it, not
//!   privileged.
//! - Every deploy/**/*.yaml (the Prometheus rules too) is YAML (PyYAML).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;
use serde_json::{Value, json};

/// The Kubernetes version the YAML is checked against (docs/kubernetes.md says it).
const KUBERNETES: &str = "1.31.0";
const DEPLOY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy");

/// `kubernetes-validate --strict` of `path`: Ok(its report) or Err(its report).
fn validate(path: &Path) -> Result<String, String> {
    let out = Command::new("python3")
        .args([
            "-m",
            "kubernetes_validate",
            "--strict",
            "--no-warn",
            "-k",
            KUBERNETES,
        ])
        .arg(path)
        .output()
        .expect("kubernetes-validate (scripts/test.sh installs it)");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(report)
    } else {
        Err(report)
    }
}

#[test]
fn the_daemonset_yaml_validates_strictly_against_the_kubernetes_schema() {
    let path = Path::new(DEPLOY_YAML);
    let report = validate(path).unwrap_or_else(|r| panic!("{}:\n{r}", path.display()));
    let docs = yaml_documents(path).unwrap();
    let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["ServiceAccount", "DaemonSet"], "{}", path.display());
    for doc in &docs {
        let name = format!(
            "{}/{}",
            doc["kind"].as_str().unwrap().to_lowercase(),
            doc["metadata"]["name"].as_str().unwrap()
        );
        assert!(
            report.contains(&format!("passed for resource {name}")),
            "{name} not reported valid:\n{report}"
        );
        assert_eq!(doc["metadata"]["namespace"], "kube-system", "{name}");
    }

    // One misspelt field in the watch container: refused.
    let text = std::fs::read_to_string(path).unwrap();
    assert_eq!(text.matches("livenessProbe:").count(), 1);
    let dir = tempfile::tempdir().unwrap();
    let typo = dir.path().join("typo.yaml");
    std::fs::write(&typo, text.replace("livenessProbe:", "livenesProbe:")).unwrap();
    let refused = validate(&typo).expect_err("a misspelt field passed the strict check");
    assert!(refused.contains("livenesProbe"), "{refused}");
}

#[test]
fn the_daemonset_runs_the_agreed_commands_unprivileged() {
    let ds = daemonset();
    let version = env!("CARGO_PKG_VERSION");
    let spec = &ds["spec"]["template"]["spec"];
    assert_eq!(spec["hostNetwork"], true);
    assert_eq!(spec["priorityClassName"], "system-node-critical");
    assert_eq!(spec["tolerations"], json!([{"operator": "Exists"}]));
    assert_eq!(ds["spec"]["updateStrategy"]["type"], "RollingUpdate");

    let init = pod_container(spec, "install-cni");
    let watch = pod_container(spec, "watch");
    assert_eq!(spec["initContainers"].as_array().unwrap().len(), 1);
    assert_eq!(spec["containers"].as_array().unwrap().len(), 1);
    for c in [init, watch] {
        assert_eq!(c["image"], format!("natledger:{version}"), "{}", c["name"]);
        assert_eq!(
            c["command"],
            Value::Null,
            "{}: the image's entrypoint",
            c["name"]
        );
        let sc = &c["securityContext"];
        assert_ne!(sc["privileged"], true, "{}", c["name"]);
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{}", c["name"]);
        assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]), "{}", c["name"]);
        assert!(
            c["resources"]["limits"]["memory"].is_string(),
            "{}",
            c["name"]
        );
        assert!(
            c["resources"]["requests"]["cpu"].is_string(),
            "{}",
            c["name"]
        );
    }
    assert_eq!(
        init["args"],
        json!([
            "install-cni",
            "--bin-dir",
            "/host/opt/cni/bin",
            "--conf-dir",
            "/host/etc/cni/net.d"
        ])
    );
    assert_eq!(
        watch["args"],
        json!([
            "watch",
            "--metrics-address",
            "0.0.0.0:9655",
            "--doctor-period",
            "300"
        ])
    );
    assert_eq!(
        watch["env"],
        json!([
            {"name": "NATLEDGER_HOST_ROOT", "value": "/host"},
            {"name": "DBUS_SYSTEM_BUS_ADDRESS",
             "value": "unix:path=/host/run/dbus/system_bus_socket"},
        ])
    );
    assert_eq!(
        watch["ports"],
        json!([{"name": "metrics", "containerPort": 9655, "protocol": "TCP"}])
    );
    assert_eq!(watch["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(watch["livenessProbe"]["httpGet"]["port"], "metrics");

    // Where each container's mounts come from on the host.
    let volumes = spec["volumes"].as_array().unwrap();
    let host_path = |mount: &Value| -> String {
        let v = volumes.iter().find(|v| v["name"] == mount["name"]).unwrap();
        v["hostPath"]["path"].as_str().unwrap().to_string()
    };
    let mounts = |c: &Value| -> Vec<(String, String, bool)> {
        c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    host_path(m),
                    m["mountPath"].as_str().unwrap().to_string(),
                    m["readOnly"].as_bool().unwrap_or(false),
                )
            })
            .collect()
    };
    let owned = |v: &[(&str, &str, bool)]| -> Vec<(String, String, bool)> {
        v.iter()
            .map(|(h, c, r)| (h.to_string(), c.to_string(), *r))
            .collect()
    };
    assert_eq!(
        mounts(init),
        owned(&[
            ("/opt/cni/bin", "/host/opt/cni/bin", false),
            ("/etc/cni/net.d", "/host/etc/cni/net.d", false),
            ("/run/natledger", "/run/natledger", false),
        ])
    );
    assert_eq!(
        mounts(watch),
        owned(&[
            ("/run/natledger", "/run/natledger", false),
            ("/run/xtables.lock", "/run/xtables.lock", false),
            ("/run/netns", "/run/netns", false),
            ("/run/netns", "/var/run/netns", false),
            ("/", "/host", true),
        ])
    );
}

/// Every `*.yaml` under `dir`, sorted.
fn yaml_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            yaml_files(&path, found);
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            found.push(path);
        }
    }
    found.sort();
}

#[test]
fn every_deploy_file_is_yaml() {
    let mut files = Vec::new();
    yaml_files(Path::new(DEPLOY), &mut files);
    assert!(
        files
            .iter()
            .any(|f| f.ends_with("kubernetes/natledger.yaml")),
        "{files:?}"
    );
    for file in &files {
        let docs = yaml_documents(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert!(!docs.is_empty(), "{}: no document", file.display());
    }
}
