//! Which backend the host uses: what `--backend auto` resolves to.

use std::path::{Path, PathBuf};

use super::{Backend, TOOL_DIRS};

/// Which backend to write to, as given on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendChoice {
    Auto,
    Legacy,
    Nft,
}

impl BackendChoice {
    pub fn resolve(self) -> Backend {
        match self {
            BackendChoice::Auto => detect(),
            BackendChoice::Legacy => Backend::Legacy,
            BackendChoice::Nft => Backend::Nft,
        }
    }
}

/// The backend the host's own `iptables` command uses: follow the `iptables` symlink chain
/// (Debian's alternatives: `/usr/sbin/iptables -> /etc/alternatives/iptables ->
/// /usr/sbin/iptables-nft`) and look for `legacy` or `nft` in each name. This is what Docker,
/// kube-proxy's wrappers and an operator typing `iptables` get. Starts no process. Without an
/// answer, nft (the default of every current distribution).
pub fn detect() -> Backend {
    detect_explained().backend
}

/// The backend [`detect`] decides on, and how, in words: "/usr/sbin/iptables leads to
/// /usr/sbin/iptables-nft".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Detected {
    pub backend: Backend,
    pub how: String,
}

/// [`detect`], saying how it decided.
pub fn detect_explained() -> Detected {
    TOOL_DIRS
        .iter()
        .find_map(|dir| {
            let start = Path::new(dir).join("iptables");
            let (backend, link) = backend_of_link(&start)?;
            Some(Detected {
                backend,
                how: format!("{} leads to {}", start.display(), link.display()),
            })
        })
        .unwrap_or_else(|| Detected {
            backend: Backend::Nft,
            how: "no iptables symlink names a backend, so nft (the default of current \
                  distributions) is assumed"
                .into(),
        })
}

/// The backend the symlink chain from `start` names, and the link target that names it.
fn backend_of_link(start: &Path) -> Option<(Backend, PathBuf)> {
    let mut path = start.to_path_buf();
    for _ in 0..8 {
        let target = std::fs::read_link(&path).ok()?;
        let name = target.file_name()?.to_string_lossy().into_owned();
        if name.contains("legacy") {
            return Some((Backend::Legacy, target));
        }
        if name.contains("nft") {
            return Some((Backend::Nft, target));
        }
        path = match path.parent() {
            Some(parent) if target.is_relative() => parent.join(target),
            _ => target,
        };
    }
    None
}
