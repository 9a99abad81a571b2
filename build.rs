//! The git commit `natledger --version` prints, as `NATLEDGER_COMMIT`.
//!
//! In order: the `NATLEDGER_COMMIT` environment variable (a packager building from a tarball
//! who knows the commit), `git rev-parse --short HEAD` when this source tree is itself a git
//! work tree (a tarball unpacked inside another repository must not take that repository's
//! commit), else `unknown`. Never fails the build: no git, no `.git`, a broken repository all
//! give `unknown`. Also `NATLEDGER_COMMIT_DATE`, the commit's date (empty when unknown), for
//! the man pages.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=NATLEDGER_COMMIT");
    let manifest_dir =
        PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let commit = match std::env::var("NATLEDGER_COMMIT") {
        Ok(c) if !c.trim().is_empty() => c.trim().to_string(),
        _ => from_git(&manifest_dir).unwrap_or_else(|| "unknown".to_string()),
    };
    println!("cargo:rustc-env=NATLEDGER_COMMIT={commit}");
    // The man pages' date (natledger-docs), YYYY-MM-DD of the commit, empty when unknown.
    let date = match commit.as_str() {
        "unknown" => None,
        _ => git(&manifest_dir, &["log", "-1", "--format=%cs", &commit]),
    };
    println!(
        "cargo:rustc-env=NATLEDGER_COMMIT_DATE={}",
        date.unwrap_or_default()
    );
}

/// The short commit of HEAD, if `dir` is the top of a git work tree; asks cargo to run this
/// again when HEAD or the branch it names moves.
fn from_git(dir: &Path) -> Option<String> {
    let top = git(dir, &["rev-parse", "--show-toplevel"])?;
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if !same(Path::new(&top), dir) {
        return None;
    }
    // HEAD (per work tree), the branch file it names and packed-refs (both in the common
    // directory for a linked work tree): `--git-path` answers each.
    let mut watched = vec!["HEAD".to_string(), "packed-refs".to_string()];
    if let Some(branch) = git(dir, &["symbolic-ref", "-q", "HEAD"]) {
        watched.push(branch);
    }
    for name in &watched {
        // A path that does not exist would make cargo run this on every build.
        if let Some(path) = git(dir, &["rev-parse", "--git-path", name]).map(|p| dir.join(p))
            && path.exists()
        {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    git(dir, &["rev-parse", "--short", "HEAD"])
}

/// One git command's trimmed stdout, or None if git is missing or fails.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let output = Command::new("git")
        .current_dir(dir)
        .args(args)
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8(output.stdout).ok()?.trim().to_string();
    (!text.is_empty()).then_some(text)
}
