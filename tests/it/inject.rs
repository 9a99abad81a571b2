//! `natledger inject`: the edit of a bundle's `config.json` that registers natledger's hooks
//! for runc and crun (no container is run here; tests/runtimes/runc.rs and tests/runtimes/crun.rs run them).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use crate::common::*;

/// A bundle as a runtime's caller leaves it: `runc spec` plus the network hook, an existing
/// poststop hook and a field natledger knows nothing about.
fn plain_bundle(dir: &Path) -> PathBuf {
    let bundle = dir.join("bundle");
    std::fs::create_dir_all(&bundle).expect("bundle dir");
    make_bundle(
        Runtime::Runc,
        &bundle,
        Path::new("/usr/local/bin/net-hook"),
        7,
        "7\n",
        |c| {
            c["annotations"] = json!({"io.natledger.ports": PORTS, "org.example": "kept"});
            c["hooks"]["poststop"] =
                json!([{"path": "/usr/local/bin/cleanup", "args": ["cleanup"]}]);
            c["x-vendor"] = json!({"z": 1, "a": [true, null]});
        },
    );
    bundle
}

/// `value` serialized without `hooks`: equal strings mean every other field is kept, with
/// its key order.
fn without_hooks(value: &Value) -> String {
    let mut value = value.clone();
    value
        .as_object_mut()
        .expect("config.json is an object")
        .shift_remove("hooks");
    value.to_string()
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read bundle dir")
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

/// inject appends natledger after the hooks already there (the network hook stays first),
/// keeps every other field and its key order, leaves no temporary file behind, and a second
/// run leaves the file byte for byte as the first did.
#[test]
fn inject_appends_after_existing_hooks_keeps_the_rest_and_is_idempotent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bundle = plain_bundle(dir.path());
    let config = bundle.join("config.json");
    let original = read_json(&config);
    let files = names(&bundle);
    let b = bundle.to_str().expect("utf-8");
    let env = ["NATLEDGER_STATE_DIR=/run/x", "NATLEDGER_BACKEND=nft"];
    let args = [b, "--hook-env", env[0], "--hook-env", env[1]];

    assert_ok(&inject(&args), "natledger inject");
    let first = std::fs::read(&config).expect("read config.json");
    let injected = read_json(&config);
    // createRuntime: the network hook first; poststop: the existing cleanup hook first.
    for (stage, arg) in [
        ("createRuntime", "create-runtime"),
        ("poststop", "poststop"),
    ] {
        assert_eq!(
            injected["hooks"][stage],
            json!([original["hooks"][stage][0], hook_entry(BIN, arg, &env)]),
            "{stage}: the hook already there first, natledger after it"
        );
    }
    assert_eq!(
        without_hooks(&injected),
        without_hooks(&original),
        "every other field kept, in its order"
    );
    assert_eq!(
        names(&bundle),
        files,
        "no temporary file left in the bundle"
    );

    assert_ok(&inject(&args), "second natledger inject");
    assert_eq!(
        std::fs::read(&config).expect("read config.json"),
        first,
        "a second inject leaves config.json byte for byte as it was"
    );
}

/// A config.json straight from `runc spec` has no `hooks`: inject adds them at the end,
/// natledger's entries alone, and keeps everything else.
#[test]
fn inject_adds_hooks_to_a_config_without_any() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = output(Command::new("runc").arg("spec").current_dir(dir.path()));
    assert_ok(&out, "runc spec");
    let config = dir.path().join("config.json");
    let original = read_json(&config);
    assert!(original.get("hooks").is_none(), "runc spec: {original}");
    let env = ["NATLEDGER_BACKEND=legacy"];
    let out = inject(&[dir.path().to_str().expect("utf-8"), "--hook-env", env[0]]);
    assert_ok(&out, "natledger inject");
    let injected = read_json(&config);
    assert_eq!(
        injected["hooks"],
        json!({
            "createRuntime": [hook_entry(BIN, "create-runtime", &env)],
            "poststop": [hook_entry(BIN, "poststop", &env)],
        })
    );
    assert_eq!(without_hooks(&injected), without_hooks(&original));
}

/// An existing natledger entry (same path and args) is replaced where it stands, never
/// duplicated: a later inject with other hook environment and `--binary` only updates it.
#[test]
fn inject_replaces_its_own_entries_in_place() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bundle = plain_bundle(dir.path());
    let config = bundle.join("config.json");
    let b = bundle.to_str().expect("utf-8");
    let binary = "/opt/natledger/bin/natledger";

    let out = inject(&[
        b,
        "--binary",
        binary,
        "--hook-env",
        "NATLEDGER_BACKEND=legacy",
    ]);
    assert_ok(&out, "inject --binary");
    let net_hook = read_json(&config)["hooks"]["createRuntime"][0].clone();
    let out = inject(&[b, "--binary", binary, "--hook-env", "NATLEDGER_BACKEND=nft"]);
    assert_ok(&out, "inject --binary again");
    let hooks = read_json(&config)["hooks"].clone();
    let env = ["NATLEDGER_BACKEND=nft"];
    assert_eq!(
        hooks["createRuntime"],
        json!([net_hook, hook_entry(binary, "create-runtime", &env)]),
        "createRuntime"
    );
    assert_eq!(
        hooks["poststop"].as_array().map(Vec::len),
        Some(2),
        "poststop: {}",
        hooks["poststop"]
    );
    assert_eq!(hooks["poststop"][1], hook_entry(binary, "poststop", &env));
}

/// A config.json that is not an OCI config is refused (exit status 1) and left untouched.
#[test]
fn inject_refuses_a_malformed_config_and_leaves_it_unchanged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bundle = dir.path().join("bundle");
    std::fs::create_dir_all(&bundle).expect("bundle dir");
    let config = bundle.join("config.json");
    let b = bundle.to_str().expect("utf-8");
    let cases = [
        (
            "truncated JSON",
            r#"{"ociVersion": "1.0.2", "process": {"args": ["#,
        ),
        ("not an object", r#"["ociVersion", "1.0.2"]"#),
        (
            "hooks not an object",
            r#"{"ociVersion": "1.0.2", "hooks": "none"}"#,
        ),
        (
            "createRuntime not a list",
            r#"{"ociVersion": "1.0.2", "hooks": {"createRuntime": {"path": "/x"}}}"#,
        ),
        ("empty file", ""),
    ];
    for (what, text) in cases {
        std::fs::write(&config, text).expect("write config.json");
        let out = inject(&[b, "--hook-env", "NATLEDGER_BACKEND=nft"]);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{what}: exit status 1 expected; stderr: {}",
            stderr(&out)
        );
        assert!(!stderr(&out).trim().is_empty(), "{what}: says why");
        assert_eq!(
            std::fs::read_to_string(&config).expect("read config.json"),
            text,
            "{what}: config.json unchanged"
        );
        assert_eq!(
            names(&bundle),
            ["config.json"],
            "{what}: no temporary file left"
        );
    }
}
