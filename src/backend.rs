//! The backends and how natledger talks to them. Each backend has a driver ([`Driver`], one
//! file each: [`IptablesLegacy`], [`IptablesNft`], [`OwnNftables`]) registered in
//! [`Backend::driver`]; it reads, applies and installs, and the operations ask it, never which
//! backend it is. The iptables drivers share one implementation over their tool names
//! ([`Tools`]: one `*-save -t nat` to read, one `*-restore --noflush` transaction to write);
//! which one the host uses is [`detect`]'s. [`Netfilter`] is what the drivers run on: the
//! runner, the shared netfilter socket and the commit counter.

use std::cell::RefCell;
use std::path::PathBuf;

use crate::kernel::conntrack::{self, ConntrackError};
use crate::kernel::exec::{Invocation, Runner};
use crate::kernel::netlink;
use crate::kernel::nftables::{self, NftError};
use crate::model::family::Family;
use crate::model::save::{Batch, Table};

/// Directories searched for iptables tools. Absolute, because podman runs poststop hooks
/// with an empty environment (no PATH).
pub const TOOL_DIRS: [&str; 5] = ["/usr/sbin", "/sbin", "/usr/local/sbin", "/usr/bin", "/bin"];

pub use crate::model::backend_name::Backend;

/// What a backend is beyond its name: its driver, registered here.
impl Backend {
    /// The backend's driver: the one place a backend is registered.
    pub fn driver(self) -> &'static dyn Driver {
        match self {
            Backend::Legacy => &IptablesLegacy,
            Backend::Nft => &IptablesNft,
            Backend::Nftables => &OwnNftables,
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

mod detect;
mod driver;
mod error;
mod iptables;
mod iptables_legacy;
mod iptables_nft;
mod nft_native;
mod own_nftables;
pub mod write;
pub use detect::{BackendChoice, Detected, detect, detect_explained};
pub use driver::Driver;
pub use error::{BackendError, Native, NativeError};
pub use iptables::Tools;
pub use iptables_legacy::IptablesLegacy;
pub use iptables_nft::IptablesNft;
pub use nft_native::Tagged;
pub use own_nftables::OwnNftables;

impl From<Backend> for crate::model::capabilities::Capabilities {
    fn from(backend: Backend) -> Self {
        backend.driver().capabilities()
    }
}

/// What of the kernel a [`Netfilter`] reaches besides running its tools, fixed when it is
/// made: code driven by a scripted runner makes one that reaches nothing else.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// Only the tools, through the runner (and natledger's own tables, which have none).
    Tools,
    /// The kernel too: conntrack ([`Netfilter::forget_flows`]), other owners' forwards
    /// (analysis's `forwards`), and with `native` the process-less paths (iptables-nft
    /// deletions over netlink, iptables-legacy through the table's socket options).
    Kernel { native: bool },
}

/// Reads and writes the nat tables of both backends through a [`Runner`].
pub struct Netfilter<'r> {
    runner: &'r dyn Runner,
    reach: Reach,
    /// The netfilter netlink socket of native deletions (and conntrack's), kept open across
    /// families so that only one socket is released (and one grace period waited for, by
    /// someone else) per run.
    socket: RefCell<Option<netlink::Socket>>,
    /// iptables-nft transactions this process committed (restore blocks, netlink batches):
    /// what moved the nf_tables generation that was natledger's own (analysis's `forwards` cache).
    nft_commits: std::cell::Cell<u32>,
    /// Whether rules were deleted through `socket` (its release then waits a grace period).
    nft_deleted: std::cell::Cell<bool>,
    /// The iptables-legacy nat tables as this process swapped them in, per family, until
    /// anything else is written: read by create's check of other owners' forwards instead
    /// of the kernel's copy (`IptablesLegacy`'s insert keeps them).
    legacy_nat: RefCell<Vec<(Family, crate::kernel::iptc::blob::Blob)>>,
}

impl<'r> Netfilter<'r> {
    /// One that reaches only its tools ([`Reach::Tools`]).
    pub fn new(runner: &'r dyn Runner) -> Self {
        Netfilter::reaching(runner, Reach::Tools)
    }

    pub fn reaching(runner: &'r dyn Runner, reach: Reach) -> Self {
        Netfilter {
            runner,
            reach,
            socket: RefCell::new(None),
            nft_commits: std::cell::Cell::new(0),
            nft_deleted: std::cell::Cell::new(false),
            legacy_nat: RefCell::new(Vec::new()),
        }
    }

    /// One that reaches the kernel ([`Reach::Kernel`]): the hooks', the CNI plugin's and
    /// sweep's, with the native paths unless `NATLEDGER_NO_NETLINK` is set.
    pub fn on_kernel(runner: &'r dyn Runner, native: bool) -> Self {
        Netfilter::reaching(runner, Reach::Kernel { native })
    }

    /// Whether the native paths are on.
    pub fn native(&self) -> bool {
        self.reach == Reach::Kernel { native: true }
    }

    /// How many iptables-nft transactions this process has committed so far.
    pub fn nft_commits(&self) -> u32 {
        self.nft_commits.get()
    }

    /// Run `f` with an nf_tables session on the shared netfilter socket (opened on first
    /// use; [`Netfilter::release_native`] closes it).
    pub fn with_nft<T>(
        &self,
        f: impl FnOnce(&mut nftables::Session) -> Result<T, NftError>,
    ) -> Result<T, NftError> {
        let mut slot = self.socket.borrow_mut();
        let sock = match slot.as_mut() {
            Some(sock) => sock,
            None => slot.insert(netlink::Socket::netfilter().map_err(NftError::Open)?),
        };
        f(&mut nftables::Session::new(sock))
    }

    /// Whether create-runtime looks for other owners' forwards: only on the kernel.
    pub fn forwards(&self) -> bool {
        self.reach != Reach::Tools
    }

    /// Delete the conntrack entries of `flows` ([`conntrack::forget`]) over the netfilter
    /// socket shared with the nft deletions; nothing when not allowed, when there are no
    /// flows, or when the namespace has no conntrack entry at all (then no socket is opened).
    pub fn forget_flows(&self, flows: &[conntrack::Flows]) -> Result<usize, ConntrackError> {
        if self.reach == Reach::Tools || flows.is_empty() || conntrack::table_is_empty() {
            return Ok(0);
        }
        let start = std::time::Instant::now();
        let mut slot = self.socket.borrow_mut();
        let sock = match slot.as_mut() {
            Some(sock) => sock,
            None => slot.insert(netlink::Socket::netfilter().map_err(ConntrackError::Dump)?),
        };
        let forgotten = conntrack::forget(sock, flows)?;
        let ms = start.elapsed().as_secs_f64() * 1000.0;
        log::debug!("conntrack: deleted {forgotten} entries in {ms:.1} ms");
        Ok(forgotten)
    }

    /// Close the native socket, if any. After an nf_tables deletion through it, the close
    /// waits for the kernel to free what was deleted, so the socket's last reference goes to
    /// a detached process instead ([`netlink::Socket::close_detached`]); after reads and
    /// conntrack deletions only, it is a plain close.
    pub fn release_native(&self) {
        let sock = self.socket.borrow_mut().take();
        if let Some(sock) = sock.filter(|_| self.nft_deleted.get()) {
            sock.close_detached();
        }
    }

    /// The current `table` (nat, filter) as natledger reads it ([`Driver::read`]), or
    /// `None` when it does not exist.
    pub fn read(
        &self,
        backend: Backend,
        family: Family,
        table: &str,
    ) -> Result<Option<Table>, BackendError> {
        backend.driver().read(self, family, table)
    }

    /// Every rule of `table` (for reading other owners' rules), or `None` when it does not
    /// exist ([`Driver::read_whole`]).
    pub fn read_whole(
        &self,
        backend: Backend,
        family: Family,
        table: &str,
    ) -> Result<Option<Table>, BackendError> {
        backend.driver().read_whole(self, family, table)
    }

    /// Every table of one backend and family ([`Driver::read_all`]).
    pub fn read_all(&self, backend: Backend, family: Family) -> Result<Vec<Table>, BackendError> {
        backend.driver().read_all(self, family)
    }

    /// Apply one batch as one transaction ([`Driver::apply_all`]).
    pub fn apply(
        &self,
        backend: Backend,
        family: Family,
        batch: &Batch,
    ) -> Result<(), BackendError> {
        self.apply_all(backend, family, std::slice::from_ref(batch))
    }

    /// Apply batches of different tables ([`Driver::apply_all`]).
    pub fn apply_all(
        &self,
        backend: Backend,
        family: Family,
        batches: &[Batch],
    ) -> Result<(), BackendError> {
        self.forget_legacy_nat(family);
        backend.driver().apply_all(self, family, batches)
    }

    /// Run; on failure the error carries the first stderr line and, when it names a line of
    /// `input` ("line N failed"), that line, so the failing rule and chain are in the message.
    fn execute(&self, inv: &Invocation, input: Option<&str>) -> Result<Vec<u8>, BackendError> {
        let out = self.runner.run(inv).map_err(|source| BackendError::Spawn {
            command: inv.to_string(),
            source,
        })?;
        if !out.success() {
            let mut stderr = out.stderr_line();
            let line = stderr
                .split("line ")
                .nth(1)
                .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|n| n.parse::<usize>().ok());
            let failed_line = line.and_then(|n| input?.lines().nth(n.checked_sub(1)?));
            if let Some(text) = failed_line {
                stderr = format!("{stderr} [{text}]");
            }
            return Err(BackendError::Failed {
                command: inv.to_string(),
                code: out.code.map_or_else(|| "signal".into(), |c| c.to_string()),
                stderr,
                line: line.filter(|_| failed_line.is_some()),
            });
        }
        Ok(out.stdout)
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

/// Absolute path of a backend's `{verb}` tool (`ip[6]tables-{legacy,nft}-{save,restore}`);
/// an error for a backend without tools.
pub fn tool(backend: Backend, family: Family, verb: &str) -> Result<PathBuf, BackendError> {
    let tools = backend.driver().tools();
    tools
        .ok_or_else(|| BackendError::NoTool { verb: verb.into() })?
        .path(family, verb)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::exec::Outcome;
    use crate::model::save::Op;

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
        for backend in Backend::ALL {
            assert_eq!(backend.driver().backend(), backend);
        }
        let caps = |b: Backend| b.driver().capabilities();
        let iptables: Vec<Backend> = Backend::iptables().collect();
        assert_eq!(iptables, [Backend::Legacy, Backend::Nft]);
        assert!(iptables.iter().all(|b| caps(*b).tools));
        assert_eq!(
            caps(Backend::Nftables),
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
        let err = Netfilter::new(&Refuses)
            .apply(Backend::Legacy, Family::Ipv4, &batch)
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
