//! Which backend the host uses: what `--backend auto` resolves to.

use std::path::Path;

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
    TOOL_DIRS
        .iter()
        .find_map(|dir| backend_of_link(&Path::new(dir).join("iptables")))
        .unwrap_or(Backend::Nft)
}

fn backend_of_link(start: &Path) -> Option<Backend> {
    let mut path = start.to_path_buf();
    for _ in 0..8 {
        let target = std::fs::read_link(&path).ok()?;
        let name = target.file_name()?.to_string_lossy().into_owned();
        if name.contains("legacy") {
            return Some(Backend::Legacy);
        }
        if name.contains("nft") {
            return Some(Backend::Nft);
        }
        path = match path.parent() {
            Some(parent) if target.is_relative() => parent.join(target),
            _ => target,
        };
    }
    None
}
