//! How reading or writing a backend fails, and what a process-less change did.

use crate::kernel::host_root::{HostRoot, under};
use crate::kernel::iptc::IptcError;
use crate::kernel::nftables::NftError;
use crate::model::save;

use super::TOOL_DIRS;

/// A failure to read or write a backend, naming the command; its cause, if any, is its
/// `source()` (shown after it by [`crate::causes::Causes`]).
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("{tool} not found in {}{}", TOOL_DIRS.join(", "), under(root.as_ref()))]
    ToolNotFound {
        tool: String,
        /// The host root it was looked for under, if any.
        root: Option<HostRoot>,
    },
    #[error("cannot run {command}")]
    Spawn {
        command: String,
        source: std::io::Error,
    },
    #[error("{command} failed (exit {code}): {stderr}")]
    Failed {
        command: String,
        code: String,
        stderr: String,
        /// The input line the tool named as failing ("line N failed"), if any.
        line: Option<usize>,
    },
    #[error("cannot parse the output of {command}")]
    Parse {
        command: String,
        source: save::ParseError,
    },
    #[error("{command} cannot show the table (written by another iptables version?): {line}")]
    Incompatible { command: String, line: String },
    #[error(transparent)]
    Nftables(#[from] NftError),
    #[error("the nftables backend has no {verb} tool: it works over netlink, in-process")]
    NoTool { verb: String },
    #[error("cannot tell whether the iptables-legacy {table} table exists: {path}")]
    Procfs {
        table: String,
        path: String,
        source: std::io::Error,
    },
}

/// Why a direct change could not be made (nothing was written; the caller uses `*-restore`).
#[derive(Debug, thiserror::Error)]
pub enum DirectError {
    #[error(transparent)]
    Nft(#[from] NftError),
    #[error(transparent)]
    Legacy(#[from] IptcError),
}

/// What a native (no helper process) change did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direct {
    /// Not enabled: nothing was looked at.
    Off,
    /// The table is not as the direct path expects (chains hold other rules than recorded,
    /// a chain or jump is missing): nothing changed.
    Declined,
    /// This many rules were inserted or deleted, exactly those asked for.
    Done(usize),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::causes::text;

    #[test]
    fn each_cause_is_said_once() {
        let spawn = BackendError::Spawn {
            command: "iptables-nft-save".into(),
            source: std::io::Error::other("denied"),
        };
        assert_eq!(text(&spawn), "cannot run iptables-nft-save: denied");
        let procfs = BackendError::Procfs {
            table: "nat".into(),
            path: "/proc/net/ip_tables_names".into(),
            source: std::io::Error::other("denied"),
        };
        assert_eq!(
            text(&procfs),
            "cannot tell whether the iptables-legacy nat table exists: \
             /proc/net/ip_tables_names: denied"
        );
    }
}
