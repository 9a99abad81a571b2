//! natledger's container image (scripts/build-image.sh, from the static release build).
//!
//! - The archive is an OCI image layout: exactly `oci-layout`, `index.json` and three blobs,
//!   owned by 0:0 with one mtime; every blob's name is its sha256 and its size the
//!   descriptor's; the index names the image `natledger:<version>` (ref.name) and
//!   `docker.io/library/natledger:<version>` (containerd's name); the config's entrypoint is
//!   `/natledger`, its labels carry the version and the commit, its diff_id is the
//!   uncompressed layer's digest; the one layer holds `/natledger` (0755, 0:0) and nothing
//!   else; archive and layer are a few MB (under 8 MiB).
//! - Reproducible: built twice from the same binary, the archive is the same byte for byte.
//! - `podman load -i` takes it (a private storage root, removed after) and names it
//!   `docker.io/library/natledger:<version>`; `natledger --version` runs in it (no network)
//!   and prints this version; there is no shell in it. `ctr images import` is proved by
//!   `kubernetes::`, which runs the DaemonSet's pod from this archive.

use std::path::Path;
use std::process::{Command, Output};

use crate::common::*;
use serde_json::Value;

const MAX_SIZE: u64 = 8 << 20;

fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn sha256(path: &Path) -> String {
    let out = run(Command::new("sha256sum").arg(path));
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// `tar tvf` lines of `archive`: (mode, owner, size, mtime, name).
fn listing(archive: &Path) -> Vec<(String, String, u64, String, String)> {
    let out = run(Command::new("tar")
        .args([
            "--list",
            "--verbose",
            "--numeric-owner",
            "--full-time",
            "--file",
        ])
        .arg(archive));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            (
                f[0].to_string(),
                f[1].to_string(),
                f[2].parse().unwrap(),
                format!("{} {}", f[3], f[4]),
                f[5].to_string(),
            )
        })
        .collect()
}

/// A blob of the extracted layout, checked against its descriptor.
fn blob(layout: &Path, descriptor: &Value) -> std::path::PathBuf {
    let digest = descriptor["digest"].as_str().unwrap();
    let hex = digest.strip_prefix("sha256:").unwrap();
    let path = layout.join("blobs/sha256").join(hex);
    assert_eq!(sha256(&path), hex, "{digest}: content");
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        descriptor["size"].as_u64().unwrap(),
        "{digest}: size"
    );
    path
}

fn json_of(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn the_image_is_a_small_reproducible_oci_layout() {
    let _suite = crate::one_suite_at_a_time(module_path!());
    let archive = image_archive();
    let version = env!("CARGO_PKG_VERSION");
    let (ref_name, containerd_name) = image_names();
    let size = std::fs::metadata(&archive).unwrap().len();
    assert!(size < MAX_SIZE, "{}: {size} bytes", archive.display());

    let entries = listing(&archive);
    let names: Vec<&str> = entries.iter().map(|e| e.4.as_str()).collect();
    assert_eq!(names.len(), 7, "{names:?}");
    assert_eq!(
        &names[..4],
        ["oci-layout", "index.json", "blobs/", "blobs/sha256/"]
    );
    assert!(names[4..].iter().all(|n| n.starts_with("blobs/sha256/")));
    for e in &entries {
        assert_eq!(e.1, "0/0", "{e:?}");
        assert_eq!(e.3, entries[0].3, "one mtime: {e:?}");
    }

    let dir = tempfile::tempdir().unwrap();
    let layout = dir.path().join("layout");
    std::fs::create_dir(&layout).unwrap();
    run(Command::new("tar")
        .arg("-xf")
        .arg(&archive)
        .arg("-C")
        .arg(&layout));
    assert_eq!(
        json_of(&layout.join("oci-layout")),
        serde_json::json!({"imageLayoutVersion": "1.0.0"})
    );
    let index = json_of(&layout.join("index.json"));
    assert_eq!(index["schemaVersion"], 2);
    let manifests = index["manifests"].as_array().unwrap();
    assert_eq!(manifests.len(), 1, "{index:#}");
    let annotations = &manifests[0]["annotations"];
    assert_eq!(annotations["org.opencontainers.image.ref.name"], ref_name);
    assert_eq!(annotations["io.containerd.image.name"], containerd_name);

    let manifest = json_of(&blob(&layout, &manifests[0]));
    assert_eq!(
        manifest["mediaType"],
        "application/vnd.oci.image.manifest.v1+json"
    );
    let config = json_of(&blob(&layout, &manifest["config"]));
    assert_eq!(config["os"], "linux");
    assert_eq!(
        config["config"]["Entrypoint"],
        serde_json::json!(["/natledger"])
    );
    let labels = &config["config"]["Labels"];
    assert_eq!(labels["org.opencontainers.image.version"], version);
    let head =
        run(Command::new("git").args(["-C", env!("CARGO_MANIFEST_DIR"), "rev-parse", "HEAD"]));
    assert_eq!(
        labels["org.opencontainers.image.revision"],
        String::from_utf8_lossy(&head.stdout).trim()
    );
    assert!(labels["org.opencontainers.image.source"].is_string());

    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1, "{manifest:#}");
    assert_eq!(
        layers[0]["mediaType"],
        "application/vnd.oci.image.layer.v1.tar+gzip"
    );
    let layer_gz = blob(&layout, &layers[0]);
    let layer_tar = dir.path().join("layer.tar");
    let gunzipped = run(Command::new("gzip").arg("-dc").arg(&layer_gz));
    std::fs::write(&layer_tar, &gunzipped.stdout).unwrap();
    assert_eq!(
        config["rootfs"]["diff_ids"],
        serde_json::json!([format!("sha256:{}", sha256(&layer_tar))])
    );
    let files = listing(&layer_tar);
    assert_eq!(files.len(), 1, "{files:?}");
    let (mode, owner, binary_size, _, name) = &files[0];
    assert_eq!(
        (mode.as_str(), owner.as_str(), name.as_str()),
        ("-rwxr-xr-x", "0/0", "natledger")
    );
    eprintln!(
        "image: archive {size} bytes, layer {} bytes gzipped, /natledger {binary_size} bytes",
        layers[0]["size"]
    );

    // Built again: the same bytes.
    let before = sha256(&archive);
    let again = run(Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scripts/build-image.sh"
    ))
    .env_remove("NATLEDGER_COMMIT"));
    let path = String::from_utf8_lossy(&again.stdout);
    assert_eq!(Path::new(path.lines().last().unwrap()), archive);
    assert_eq!(sha256(&archive), before, "built twice, the archives differ");
}

/// podman with every piece of its state under `dir`.
fn podman(dir: &Path) -> Command {
    let mut cmd = Command::new("podman");
    let at = |p: &str| dir.join(p).display().to_string();
    cmd.args(["--root", &at("root")])
        .args(["--runroot", &at("runroot")])
        .args(["--tmpdir", &at("tmp")])
        .args(["--storage-driver", "vfs", "--runtime", "runc"])
        .args(["--cgroup-manager", "cgroupfs"]);
    cmd
}

#[test]
fn podman_loads_the_image_and_runs_natledger_in_it() {
    let _suite = crate::one_suite_at_a_time(module_path!());
    let archive = image_archive();
    let (ref_name, containerd_name) = image_names();
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let loaded = run(podman(dir.path()).arg("load").arg("-i").arg(&archive));
    let said = String::from_utf8_lossy(&loaded.stdout);
    assert!(
        said.contains(&format!("Loaded image: {containerd_name}")),
        "{said}"
    );
    // podman's default limits (nofile 1048576) are above this machine's hard limit.
    let run_args = [
        "run",
        "--rm",
        "--network",
        "none",
        "--ulimit",
        "nofile=10000:10000",
        "--ulimit",
        "nproc=1000:1000",
    ];
    let version = run(podman(dir.path())
        .args(run_args)
        .args([&ref_name, "--version"]));
    let version = String::from_utf8_lossy(&version.stdout);
    assert!(
        version.starts_with(&format!("natledger {} (commit ", env!("CARGO_PKG_VERSION"))),
        "{version}"
    );
    let shell = podman(dir.path())
        .args(run_args)
        .args(["--entrypoint", "/bin/sh", &ref_name, "-c", "true"])
        .output()
        .unwrap();
    assert!(!shell.status.success(), "a shell ran in the image");

    run(podman(dir.path()).args(["rmi", &containerd_name]));
    let left = run(podman(dir.path()).args(["images", "--quiet"]));
    assert_eq!(String::from_utf8_lossy(&left.stdout).trim(), "");
}
