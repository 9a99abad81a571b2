//! The registration files under hooks/ are what runtimes read: check their shape.

fn load(name: &str) -> serde_json::Value {
    let path = format!("{}/hooks/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// `hooks/natledger.json` is an OCI hooks 1.0.0 file: absolute path, `natledger hook`, both
/// stages, only for containers with `io.natledger.ports`.
#[test]
fn hooks_d_file_matches_oci_hooks_schema_1() {
    let v = load("natledger.json");
    assert_eq!(v["version"], "1.0.0");
    let path = v["hook"]["path"].as_str().unwrap();
    assert!(
        path.starts_with('/'),
        "podman's poststop has no PATH: {path}"
    );
    assert_eq!(v["hook"]["args"], serde_json::json!(["natledger", "hook"]));
    assert_eq!(
        v["when"]["annotations"],
        serde_json::json!({"^io\\.natledger\\.ports$": ".+"})
    );
    assert_eq!(
        v["stages"],
        serde_json::json!(["createRuntime", "poststop"])
    );
}

/// `hooks/runc-config-hooks.json` runs `natledger hook create-runtime` and `natledger hook
/// poststop` by absolute path.
#[test]
fn runc_snippet_names_both_stages() {
    let v = load("runc-config-hooks.json");
    for (stage, arg) in [
        ("createRuntime", "create-runtime"),
        ("poststop", "poststop"),
    ] {
        let hook = &v["hooks"][stage][0];
        assert!(hook["path"].as_str().unwrap().starts_with('/'));
        assert_eq!(hook["args"], serde_json::json!(["natledger", "hook", arg]));
    }
}
