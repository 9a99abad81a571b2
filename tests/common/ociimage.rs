//! OCI image-layout archives written by hand, for containerd's `ctr images import` (no
//! registry, no image builder): one busybox layer ([`super::busybox_rootfs`]) shared by every
//! image in the archive, each image its own config (entrypoint) and manifest.
//!
//! ```text
//! archive.tar: oci-layout               {"imageLayoutVersion": "1.0.0"}
//!              index.json               a manifest per image, named by the annotation
//!                                       io.containerd.image.name (what ctr calls it)
//!              blobs/sha256/<digest>    the layer (tar.gz), each config and manifest
//! ```

use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};

const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// One image of an archive: its full name (`localhost/NAME:TAG`) and entrypoint.
pub struct OciImage<'a> {
    pub name: &'a str,
    pub entrypoint: &'a [&'a str],
}

/// Runs a command to completion; panics with its stderr unless it succeeds.
fn run(cmd: &mut Command) -> Vec<u8> {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    out.stdout
}

/// `sha256:<hex>` of a file (coreutils' sha256sum: no hashing crate needed for a test).
fn sha256(path: &Path) -> String {
    let out = run(Command::new("sha256sum").arg(path));
    let hex = String::from_utf8_lossy(&out)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string();
    assert_eq!(hex.len(), 64, "sha256sum {}: {hex:?}", path.display());
    format!("sha256:{hex}")
}

/// Moves `file` into the layout's blobs under its digest; returns its descriptor.
fn add_blob(layout: &Path, file: &Path, media_type: &str) -> Value {
    let digest = sha256(file);
    let size = std::fs::metadata(file).unwrap().len();
    let blobs = layout.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::rename(file, blobs.join(&digest["sha256:".len()..])).unwrap();
    json!({"mediaType": media_type, "digest": digest, "size": size})
}

/// [`add_blob`] of a JSON document.
fn add_json_blob(layout: &Path, doc: &Value, media_type: &str) -> Value {
    let file = layout.join("blob.tmp");
    std::fs::write(&file, serde_json::to_vec(doc).unwrap()).unwrap();
    add_blob(layout, &file, media_type)
}

/// The GOARCH name of this machine, as image configs and containerd's platform match want it.
fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// Writes an OCI image-layout archive at `path` holding `images`, all on one busybox layer.
/// `scratch` is a directory for the work (left with the layout in it).
pub fn oci_archive(path: &Path, scratch: &Path, images: &[OciImage]) {
    let rootfs = scratch.join("rootfs");
    let layout = scratch.join("layout");
    std::fs::create_dir_all(&layout).unwrap();
    super::busybox_rootfs(&rootfs);

    // The layer: an uncompressed tar's digest is the config's diff_id, the gzip's the blob's.
    let tar = scratch.join("layer.tar");
    run(Command::new("tar")
        .args(["--numeric-owner", "--owner=0", "--group=0", "-C"])
        .arg(&rootfs)
        .arg("-cf")
        .arg(&tar)
        .arg("."));
    let diff_id = sha256(&tar);
    run(Command::new("gzip").args(["-n", "-f"]).arg(&tar));
    let layer = add_blob(&layout, &scratch.join("layer.tar.gz"), LAYER);

    let manifests: Vec<Value> = images
        .iter()
        .map(|image| {
            let config = json!({
                "architecture": oci_arch(),
                "os": "linux",
                "config": {"Entrypoint": image.entrypoint, "WorkingDir": "/"},
                "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            });
            let manifest = json!({
                "schemaVersion": 2,
                "mediaType": MANIFEST,
                "config": add_json_blob(&layout, &config, CONFIG),
                "layers": [layer],
            });
            let mut descriptor = add_json_blob(&layout, &manifest, MANIFEST);
            let tag = image.name.rsplit_once(':').map_or("latest", |(_, t)| t);
            descriptor["annotations"] = json!({
                "io.containerd.image.name": image.name,
                "org.opencontainers.image.ref.name": tag,
            });
            descriptor
        })
        .collect();
    let index = json!({"schemaVersion": 2, "manifests": manifests});
    std::fs::write(layout.join("index.json"), index.to_string()).unwrap();
    std::fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .unwrap();
    run(Command::new("tar")
        .args(["--numeric-owner", "--owner=0", "--group=0", "-C"])
        .arg(&layout)
        .arg("-cf")
        .arg(path)
        .arg("."));
}
