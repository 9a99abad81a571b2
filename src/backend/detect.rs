//! Which backend the host uses, and what `--backend auto` resolves to: the host's iptables
//! backend where iptables is installed, natledger's own nftables tables where it is not. The
//! tools and links are the host's: looked for where the caller's [`Lookup`] says (under the
//! host root when one is set, `crate::kernel::host_root`).

use std::path::{Path, PathBuf};

use super::{Backend, TOOL_DIRS};
use crate::kernel::host_root::Lookup;

/// Which backend to write to, as given on the command line: `auto` or a backend's word
/// ([`Backend::suffix`]), its values taken from [`Backend::ALL`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendChoice {
    Auto,
    Named(Backend),
}

/// `auto`, then every backend in [`Backend::ALL`]'s order.
const CHOICES: [BackendChoice; Backend::ALL.len() + 1] = {
    let mut choices = [BackendChoice::Auto; Backend::ALL.len() + 1];
    let mut i = 0;
    while i < Backend::ALL.len() {
        choices[i + 1] = BackendChoice::Named(Backend::ALL[i]);
        i += 1;
    }
    choices
};

impl clap::ValueEnum for BackendChoice {
    fn value_variants<'a>() -> &'a [Self] {
        &CHOICES
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(match self {
            BackendChoice::Auto => "auto",
            BackendChoice::Named(backend) => backend.suffix(),
        }))
    }
}

impl BackendChoice {
    /// The backend: named, or what `auto` finds where `look` says.
    pub fn resolve(self, look: Lookup) -> Backend {
        self.explained(look).backend
    }

    /// The backend, and why: named on the command line, or what `auto` found where `look`
    /// says.
    pub fn explained(self, look: Lookup) -> Detected {
        match self {
            BackendChoice::Auto => choose(look),
            BackendChoice::Named(backend) => Detected {
                backend,
                how: "named with --backend or NATLEDGER_BACKEND".into(),
            },
        }
    }
}

/// The iptables tools whose presence means iptables is in use on this host: any of them
/// keeps natledger on the iptables backend [`detect`] names, so that its rules stay where
/// Docker, kube-proxy and an operator's `iptables -t nat -L` see and reach them.
const IPTABLES_TOOLS: [&str; 5] = [
    "iptables",
    "iptables-legacy-restore",
    "iptables-nft-restore",
    "ip6tables-legacy-restore",
    "ip6tables-nft-restore",
];

/// What `--backend auto` resolves to: where any iptables tool is installed, the backend the
/// host's `iptables` uses ([`detect_explained`]); where none is, natledger's own nftables
/// tables (`crate::kernel::nftables::own`), which need no tool at all.
pub fn choose(look: Lookup) -> Detected {
    choose_in(&TOOL_DIRS, look)
}

fn choose_in(dirs: &[&str], look: Lookup) -> Detected {
    let installed = dirs.iter().find_map(|dir| {
        IPTABLES_TOOLS
            .iter()
            .map(|tool| Path::new(dir).join(tool))
            .find(|path| look.exists(path))
    });
    match installed {
        Some(_) => detect_explained(look),
        None => Detected {
            backend: Backend::OwnNftables,
            how: format!(
                "no iptables tool is installed (none of {} in {}), so natledger's own \
                 nftables tables",
                IPTABLES_TOOLS.join(", "),
                dirs.join(", ")
            ),
        },
    }
}

/// The iptables backend the host's own `iptables` command uses: follow the `iptables` symlink chain
/// (Debian's alternatives: `/usr/sbin/iptables -> /etc/alternatives/iptables ->
/// /usr/sbin/iptables-nft`) and look for `legacy` or `nft` in each name. This is what Docker,
/// kube-proxy's wrappers and an operator typing `iptables` get. Starts no process. Without an
/// answer, nft (the default of every current distribution).
pub fn detect(look: Lookup) -> Backend {
    detect_explained(look).backend
}

/// The backend [`detect`] decides on, and how, in words: "/usr/sbin/iptables leads to
/// /usr/sbin/iptables-nft".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Detected {
    pub backend: Backend,
    pub how: String,
}

/// [`detect`], saying how it decided.
pub fn detect_explained(look: Lookup) -> Detected {
    TOOL_DIRS
        .iter()
        .find_map(|dir| {
            let start = Path::new(dir).join("iptables");
            let (backend, link) = backend_of_link(&start, look)?;
            Some(Detected {
                backend,
                how: format!("{} leads to {}", start.display(), link.display()),
            })
        })
        .unwrap_or_else(|| Detected {
            backend: Backend::IptablesNft,
            how: "no iptables symlink names a backend, so nft (the default of current \
                  distributions) is assumed"
                .into(),
        })
}

/// The backend the symlink chain from `start` names, and the link target that names it.
fn backend_of_link(start: &Path, look: Lookup) -> Option<(Backend, PathBuf)> {
    let mut path = start.to_path_buf();
    for _ in 0..8 {
        let target = look.read_link(&path).ok()?;
        let name = target.file_name()?.to_string_lossy().into_owned();
        if name.contains("legacy") {
            return Some((Backend::IptablesLegacy, target));
        }
        if name.contains("nft") {
            return Some((Backend::IptablesNft, target));
        }
        path = match path.parent() {
            Some(parent) if target.is_relative() => parent.join(target),
            _ => target,
        };
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::host_root::HostRoot;

    #[test]
    fn auto_is_nftables_only_where_no_iptables_tool_is_installed() {
        let empty = tempfile::tempdir().unwrap();
        let dir = empty.path().to_str().unwrap();
        let chosen = choose_in(&[dir], Lookup(None));
        assert_eq!(chosen.backend, Backend::OwnNftables);
        assert!(chosen.how.contains("no iptables tool"), "{}", chosen.how);
        // One restore tool is enough to keep the host's iptables backend.
        let with_tool = tempfile::tempdir().unwrap();
        std::fs::write(with_tool.path().join("iptables-nft-restore"), "").unwrap();
        let chosen = choose_in(&[with_tool.path().to_str().unwrap()], Lookup(None));
        assert!(chosen.backend.is_iptables(), "{chosen:?}");
        assert_eq!(chosen, detect_explained(Lookup(None)));
    }

    /// Under a host root, the host's tools and its absolute alternatives links are read
    /// there, never this process's.
    #[test]
    fn auto_reads_the_host_roots_tools_and_links() {
        use std::os::unix::fs::symlink;
        let host = tempfile::tempdir().unwrap();
        let at = |p: &str| host.path().join(p);
        std::fs::create_dir_all(at("usr/sbin")).unwrap();
        std::fs::create_dir_all(at("etc/alternatives")).unwrap();
        std::fs::write(at("usr/sbin/xtables-legacy-multi"), "").unwrap();
        symlink("xtables-legacy-multi", at("usr/sbin/iptables-legacy")).unwrap();
        symlink(
            "xtables-legacy-multi",
            at("usr/sbin/iptables-legacy-restore"),
        )
        .unwrap();
        symlink("/usr/sbin/iptables-legacy", at("etc/alternatives/iptables")).unwrap();
        symlink("/etc/alternatives/iptables", at("usr/sbin/iptables")).unwrap();
        let root = HostRoot::new(host.path()).unwrap();
        let chosen = choose_in(&TOOL_DIRS, Lookup(Some(&root)));
        assert_eq!(
            chosen,
            Detected {
                backend: Backend::IptablesLegacy,
                how: "/usr/sbin/iptables leads to /usr/sbin/iptables-legacy".into()
            }
        );
        let empty = tempfile::tempdir().unwrap();
        let root = HostRoot::new(empty.path()).unwrap();
        let chosen = choose_in(&TOOL_DIRS, Lookup(Some(&root)));
        assert_eq!(chosen.backend, Backend::OwnNftables, "{chosen:?}");
    }

    #[test]
    fn the_choices_are_auto_and_every_backend_word() {
        use clap::ValueEnum;
        let words: Vec<String> = BackendChoice::value_variants()
            .iter()
            .map(|c| c.to_possible_value().unwrap().get_name().to_string())
            .collect();
        assert_eq!(words, ["auto", "legacy", "nft", "nftables"]);
        for backend in Backend::ALL {
            let choice = BackendChoice::from_str(backend.suffix(), false).unwrap();
            assert_eq!(choice.resolve(Lookup(None)), backend);
        }
    }
}
