//! Registering natledger in an OCI bundle's `config.json`, for runtimes that take hooks only
//! from there (runc, crun, and Docker or containerd through the wrapper runtime).
//!
//! The file is edited as a JSON value, not through a typed spec: every field natledger does
//! not touch (unknown ones included) and the key order stay as they were. natledger's hooks
//! are appended after the hooks already there, so a network hook runs first and the container
//! has its address when natledger reads it. The edit is idempotent and atomic (temp file,
//! fsync, rename, with the original's permissions); a file natledger cannot read as a config
//! is refused and left unchanged.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use crate::kernel::safefile;
use crate::model::oci::{
    IP_ANNOTATION, PORT_CONFLICT_ANNOTATION, PORT_CONFLICT_ENV, PORTS_ANNOTATION,
};
use crate::state::durable;

/// A bundle edit that failed, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("{action} {}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is not valid JSON", path.display())]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{}: {what}; left unchanged", path.display())]
    Malformed { path: PathBuf, what: String },
}

/// Environment variables a container can set (`docker run -e`) to ask for ports, for runtimes
/// that cannot pass annotations (Docker before 24.0): copied into the annotations.
pub const PORTS_ENV: &str = "NATLEDGER_PORTS";
pub const IP_ENV: &str = "NATLEDGER_IP";

/// How the hooks are written into a bundle.
#[derive(Clone, Debug)]
pub struct HookSpec {
    /// Absolute path of the natledger binary the runtime runs.
    pub binary: PathBuf,
    /// `KEY=VALUE` environment for the hooks (runc gives a hook exactly this).
    pub env: Vec<String>,
    /// Seconds the runtime gives each hook.
    pub timeout: u32,
}

/// What [`inject`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Injected {
    /// The file changed.
    Written,
    /// The hooks were already there, exactly: nothing written.
    Unchanged,
    /// The container asks for no ports (wrapper only): nothing written.
    NotWanted,
}

const STAGES: [(&str, &str); 2] = [
    ("createRuntime", "create-runtime"),
    ("poststop", "poststop"),
];

/// Add natledger's createRuntime and poststop hooks to `BUNDLE/config.json`.
pub fn inject(bundle: &Path, spec: &HookSpec) -> Result<Injected, BundleError> {
    edit(bundle, |config, path| {
        add_hooks(config, spec, path)?;
        Ok(true)
    })
}

/// The wrapper runtime's edit: if the container asks for ports (the `io.natledger.ports`
/// annotation, or `NATLEDGER_PORTS` in its environment, copied into the annotations together
/// with `NATLEDGER_IP`), add the hooks; otherwise leave the file alone.
pub fn inject_if_wanted(bundle: &Path, spec: &HookSpec) -> Result<Injected, BundleError> {
    edit(bundle, |config, path| {
        copy_env_annotations(config, path)?;
        let wanted = config
            .get("annotations")
            .and_then(|a| a.get(PORTS_ANNOTATION))
            .is_some();
        if wanted {
            add_hooks(config, spec, path)?;
        }
        Ok(wanted)
    })
}

/// Read, change with `f` (false: not wanted), and write back only if something changed.
fn edit(
    bundle: &Path,
    f: impl FnOnce(&mut Map<String, Value>, &Path) -> Result<bool, BundleError>,
) -> Result<Injected, BundleError> {
    let path = bundle.join("config.json");
    // Only a regular file, without waiting on a FIFO, of a bounded size (`crate::kernel::safefile`).
    let text = safefile::read(&path, safefile::Links::Follow, safefile::Cap::Config)
        .map_err(io("read", &path))?;
    let mut value: Value = serde_json::from_slice(&text).map_err(|source| BundleError::Json {
        path: path.clone(),
        source,
    })?;
    let before = value.clone();
    let config = value
        .as_object_mut()
        .ok_or_else(|| malformed(&path, "the top level is not an object"))?;
    if !f(config, &path)? {
        return Ok(Injected::NotWanted);
    }
    if value == before {
        return Ok(Injected::Unchanged);
    }
    write_atomically(&path, &value)?;
    Ok(Injected::Written)
}

/// Append (or replace in place) natledger's entry in each hook stage.
fn add_hooks(
    config: &mut Map<String, Value>,
    spec: &HookSpec,
    path: &Path,
) -> Result<(), BundleError> {
    let hooks = config
        .entry("hooks")
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
        .ok_or_else(|| malformed(path, "\"hooks\" is not an object"))?;
    for (stage, arg) in STAGES {
        let list = hooks
            .entry(stage)
            .or_insert_with(|| Value::Array(Vec::new()))
            .as_array_mut()
            .ok_or_else(|| malformed(path, &format!("\"hooks.{stage}\" is not an array")))?;
        let mut entry = json!({
            "path": spec.binary,
            "args": ["natledger", "hook", arg],
        });
        if !spec.env.is_empty() {
            entry["env"] = json!(spec.env);
        }
        entry["timeout"] = json!(spec.timeout);
        let ours = |h: &Value| {
            h.get("path").and_then(Value::as_str) == spec.binary.to_str()
                && h.get("args") == entry.get("args")
        };
        match list.iter_mut().find(|h| ours(h)) {
            Some(existing) => *existing = entry,
            None => list.push(entry),
        }
    }
    Ok(())
}

/// `NATLEDGER_PORTS` / `NATLEDGER_IP` / `NATLEDGER_PORT_CONFLICT` in `process.env` become
/// the annotations, unless the annotations are already set (an explicit annotation wins).
fn copy_env_annotations(config: &mut Map<String, Value>, path: &Path) -> Result<(), BundleError> {
    let env: Vec<(String, String)> = config
        .get("process")
        .and_then(|p| p.get("env"))
        .and_then(Value::as_array)
        .map(|env| {
            env.iter()
                .filter_map(Value::as_str)
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .unwrap_or_default();
    let wanted: Vec<(&str, &String)> = [
        (PORTS_ENV, PORTS_ANNOTATION),
        (IP_ENV, IP_ANNOTATION),
        (PORT_CONFLICT_ENV, PORT_CONFLICT_ANNOTATION),
    ]
    .into_iter()
    .filter_map(|(var, annotation)| {
        env.iter()
            .find(|(k, _)| k == var)
            .map(|(_, v)| (annotation, v))
    })
    .collect();
    if wanted.is_empty() {
        return Ok(());
    }
    let annotations = config
        .entry("annotations")
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
        .ok_or_else(|| malformed(path, "\"annotations\" is not an object"))?;
    for (annotation, value) in wanted {
        annotations
            .entry(annotation)
            .or_insert_with(|| Value::String(value.clone()));
    }
    Ok(())
}

fn write_atomically(path: &Path, value: &Value) -> Result<(), BundleError> {
    let mode = fs::metadata(path)
        .map_err(io("stat", path))?
        .permissions()
        .mode();
    let tmp = path.with_file_name(".config.json.natledger.tmp");
    let mut text = serde_json::to_vec_pretty(value).expect("a JSON value serialises");
    text.push(b'\n');
    durable::replace(path, &tmp, &text, mode & 0o7777).map_err(|f| BundleError::Io {
        action: f.action,
        path: f.path,
        source: f.source,
    })
}

fn io<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> BundleError + 'a {
    move |source| BundleError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

fn malformed(path: &Path, what: &str) -> BundleError {
    BundleError::Malformed {
        path: path.to_path_buf(),
        what: what.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> HookSpec {
        HookSpec {
            binary: "/usr/local/bin/natledger".into(),
            env: vec!["NATLEDGER_STATE_DIR=/run/x".into()],
            timeout: 10,
        }
    }

    fn bundle(config: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("config.json"), config).unwrap();
        dir
    }

    fn read(dir: &tempfile::TempDir) -> String {
        fs::read_to_string(dir.path().join("config.json")).unwrap()
    }

    const CONFIG: &str = r#"{"ociVersion":"1.0.2","zz-unknown":{"keep":[1,2]},"process":{"args":["sh"]},
        "hooks":{"createRuntime":[{"path":"/usr/libexec/net-hook","args":["net-hook","up"]}]},"aa-last":true}"#;

    #[test]
    fn appends_after_existing_hooks_and_keeps_everything_else_in_order() {
        let dir = bundle(CONFIG);
        assert_eq!(inject(dir.path(), &spec()).unwrap(), Injected::Written);
        let text = read(&dir);
        let v: Value = serde_json::from_str(&text).unwrap();
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert_eq!(
            keys,
            ["ociVersion", "zz-unknown", "process", "hooks", "aa-last"]
        );
        assert_eq!(v["zz-unknown"], json!({"keep": [1, 2]}));
        let create = v["hooks"]["createRuntime"].as_array().unwrap();
        assert_eq!(
            create[0]["path"], "/usr/libexec/net-hook",
            "the network hook stays first"
        );
        assert_eq!(
            create[1],
            json!({"path": "/usr/local/bin/natledger", "args": ["natledger", "hook", "create-runtime"],
                   "env": ["NATLEDGER_STATE_DIR=/run/x"], "timeout": 10})
        );
        assert_eq!(v["hooks"]["poststop"][0]["args"][2], "poststop");
    }

    #[test]
    fn is_idempotent() {
        let dir = bundle(CONFIG);
        inject(dir.path(), &spec()).unwrap();
        let once = read(&dir);
        assert_eq!(inject(dir.path(), &spec()).unwrap(), Injected::Unchanged);
        assert_eq!(read(&dir), once);
        // A changed environment replaces natledger's entry in place.
        let mut other = spec();
        other.env = vec!["NATLEDGER_BACKEND=nft".into()];
        inject(dir.path(), &other).unwrap();
        let v: Value = serde_json::from_str(&read(&dir)).unwrap();
        assert_eq!(v["hooks"]["createRuntime"].as_array().unwrap().len(), 2);
        assert_eq!(v["hooks"]["poststop"][0]["env"][0], "NATLEDGER_BACKEND=nft");
    }

    #[test]
    fn refuses_malformed_files_unchanged() {
        for bad in [
            "{\"hooks\": ",
            "[1, 2]",
            r#"{"hooks": []}"#,
            r#"{"hooks": {"poststop": {"path": "/x"}}}"#,
        ] {
            let dir = bundle(bad);
            let err = inject(dir.path(), &spec()).unwrap_err();
            assert!(err.to_string().contains("config.json"), "{err}");
            assert_eq!(read(&dir), bad);
        }
        let empty = tempfile::tempdir().unwrap();
        assert!(matches!(
            inject(empty.path(), &spec()),
            Err(BundleError::Io { .. })
        ));
    }

    #[test]
    fn the_wrapper_injects_only_for_containers_asking_for_ports() {
        let plain = bundle(r#"{"process":{"env":["PATH=/bin"]}}"#);
        assert_eq!(
            inject_if_wanted(plain.path(), &spec()).unwrap(),
            Injected::NotWanted
        );
        assert_eq!(read(&plain), r#"{"process":{"env":["PATH=/bin"]}}"#);

        let asking = bundle(
            r#"{"process":{"env":["PATH=/bin","NATLEDGER_PORTS=8080:80","NATLEDGER_IP=10.77.0.5","NATLEDGER_PORT_CONFLICT=refuse"]}}"#,
        );
        inject_if_wanted(asking.path(), &spec()).unwrap();
        let v: Value = serde_json::from_str(&read(&asking)).unwrap();
        assert_eq!(v["annotations"][PORTS_ANNOTATION], "8080:80");
        assert_eq!(v["annotations"][IP_ANNOTATION], "10.77.0.5");
        assert_eq!(v["annotations"][PORT_CONFLICT_ANNOTATION], "refuse");
        assert_eq!(v["hooks"]["poststop"].as_array().unwrap().len(), 1);

        // An explicit annotation wins over the environment.
        let both = bundle(
            r#"{"annotations":{"io.natledger.ports":"9090:90"},"process":{"env":["NATLEDGER_PORTS=1:1"]}}"#,
        );
        inject_if_wanted(both.path(), &spec()).unwrap();
        let v: Value = serde_json::from_str(&read(&both)).unwrap();
        assert_eq!(v["annotations"][PORTS_ANNOTATION], "9090:90");
    }
}
