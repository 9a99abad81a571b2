//! The backends and how natledger talks to them. Each backend has a driver ([`Driver`], one
//! file each: [`IptablesLegacy`], [`IptablesNft`], [`OwnNftables`]) registered in
//! [`DRIVERS`] and [`Backend::driver`]; it reads, installs, removes and applies a sweep's plan,
//! and the operations hold drivers as values, never asking which backend one is. The shared
//! strategies are `write` (install) and `remove` (removal, plans), built from each
//! driver's private primitives (`driver::Primitives`: its transaction and its process-less
//! paths); the iptables drivers share their tools (`iptables::Tools`: one `*-save -t nat`
//! to read, one `*-restore --noflush` transaction to write). Which backend the host uses is
//! [`detect`]'s. [`Netfilter`] is the kernel handle the drivers run on, naming no backend:
//! the runner, the shared netfilter socket, the commit counter, the kept legacy nat table.

use std::path::PathBuf;

use crate::kernel::host_root::Lookup;
use crate::model::family::Family;

/// Directories searched for iptables tools. Absolute, because podman runs poststop hooks
/// with an empty environment (no PATH).
pub const TOOL_DIRS: [&str; 5] = ["/usr/sbin", "/sbin", "/usr/local/sbin", "/usr/bin", "/bin"];

pub use crate::model::backend_name::Backend;

/// What a backend is beyond its name: its driver, registered here.
impl Backend {
    /// The backend's driver ([`DRIVERS`]).
    pub fn driver(self) -> &'static dyn Driver {
        match self {
            Backend::IptablesLegacy => &IptablesLegacy,
            Backend::IptablesNft => &IptablesNft,
            Backend::OwnNftables => &OwnNftables,
        }
    }

    /// The iptables backends: the ones with `*-save` tools and other owners' rules.
    pub fn iptables() -> impl Iterator<Item = Backend> {
        Backend::ALL.into_iter().filter(|b| b.is_iptables())
    }

    /// Whether this is one of the iptables backends (written with `*-restore`): what its
    /// driver reports ([`crate::model::capabilities::Capabilities::tools`]).
    pub fn is_iptables(self) -> bool {
        self.driver().capabilities().tools
    }
}

/// Every driver, in [`Backend::ALL`]'s order: the one place a backend is registered.
pub static DRIVERS: [&dyn Driver; 3] = [&IptablesLegacy, &IptablesNft, &OwnNftables];

mod detect;
mod driver;
mod error;
#[cfg(test)]
pub(crate) mod fake;
mod iptables;
mod iptables_legacy;
mod iptables_nft;
mod netfilter;
mod nft_direct;
mod own_nftables;
mod remove;
#[cfg(test)]
pub(crate) mod testing;
pub mod write;
pub use detect::{BackendChoice, Detected, detect, detect_explained};
pub use driver::{Driver, Reading};
pub use error::{BackendError, Direct, DirectError};
pub use iptables_legacy::IptablesLegacy;
pub use iptables_nft::IptablesNft;
pub use netfilter::{Netfilter, Reach};
pub use nft_direct::Tagged;
pub use own_nftables::OwnNftables;
pub use remove::{Deleted, Plan, REWRITE_AT, rewrite_pays};

impl From<Backend> for crate::model::capabilities::Capabilities {
    fn from(backend: Backend) -> Self {
        backend.driver().capabilities()
    }
}

/// Whether an iptables-legacy table exists in this network namespace (procfs, no process).
/// Only a missing names file means "no legacy table at all"; any other read error is an
/// error, so that an unreadable /proc never passes for an empty table.
pub fn legacy_table_exists(family: Family, table: &str) -> Result<bool, BackendError> {
    let path = family.legacy_tables_file();
    match std::fs::read_to_string(path) {
        Ok(names) => Ok(names.lines().any(|l| l.trim() == table)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(BackendError::Procfs {
            table: table.to_string(),
            path: path.to_string(),
            source,
        }),
    }
}

/// Absolute path of a backend's `{verb}` tool (`ip[6]tables-{legacy,nft}-{save,restore}`),
/// found where `look` says; an error for a backend without tools.
pub fn tool(
    look: Lookup,
    backend: Backend,
    family: Family,
    verb: &str,
) -> Result<PathBuf, BackendError> {
    let tools = backend.driver().tools();
    let tools = tools.ok_or_else(|| BackendError::NoTool { verb: verb.into() })?;
    tools.path(look, family, verb)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::exec::{Invocation, Outcome, Runner};
    use crate::model::save::{Batch, Op};

    struct Refuses;
    impl Runner for Refuses {
        fn run(&self, _: &Invocation) -> std::io::Result<Outcome> {
            Ok(Outcome {
                code: Some(1),
                stdout: Vec::new(),
                stderr: b"iptables-restore: line 3 failed\n".to_vec(),
            })
        }
    }

    #[test]
    fn each_backend_is_registered_with_its_own_driver() {
        for (backend, driver) in Backend::ALL.into_iter().zip(DRIVERS) {
            assert_eq!(backend.driver().backend(), backend);
            assert_eq!(driver.backend(), backend);
        }
        let caps = |b: Backend| b.driver().capabilities();
        let iptables: Vec<Backend> = Backend::iptables().collect();
        assert_eq!(iptables, [Backend::IptablesLegacy, Backend::IptablesNft]);
        assert!(iptables.iter().all(|b| caps(*b).tools));
        assert_eq!(
            caps(Backend::OwnNftables),
            crate::kernel::nftables::own::CAPABILITIES
        );
    }

    #[test]
    fn a_failed_restore_names_the_failing_rule() {
        let mut batch = Batch::nat();
        batch.ops.push(Op::DeclareChain("NATLEDGER-MASQ".into()));
        batch.ops.push(Op::Delete(
            "NATLEDGER-MASQ".into(),
            vec!["-j".into(), "MASQUERADE".into()],
        ));
        let err = IptablesLegacy
            .apply_plan(
                &Netfilter::new(&Refuses),
                Family::Ipv4,
                &Plan::batch(&batch),
            )
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("iptables-legacy-restore --noflush --wait 5 failed (exit 1)"),
            "{err}"
        );
        assert!(
            err.ends_with("line 3 failed [-D NATLEDGER-MASQ -j MASQUERADE]"),
            "{err}"
        );
    }
}
