//! [`Netfilter`]: the kernel handle the drivers run on, whichever backend: the process
//! runner, what of the kernel it may reach ([`Reach`]), the shared netfilter netlink socket
//! (nf_tables deletions and reads, conntrack), the count of nf_tables transactions this
//! process committed, the iptables-legacy nat table as this process last swapped it in, and
//! the two settings its kernel calls take (the xtables lock, the conntrack dump choice).
//! It names no backend: a driver ([`super::Driver`]) reads and writes through it.

use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};

use crate::kernel::conntrack::{self, ConntrackError, DumpChoice};
use crate::kernel::exec::{Invocation, Runner};
use crate::kernel::host_root::Lookup;
use crate::kernel::iptc::{self, blob::Blob};
use crate::kernel::netlink;
use crate::kernel::nftables::{self, NftError};
use crate::model::family::Family;

use super::BackendError;

/// What of the kernel a [`Netfilter`] reaches besides running its tools, fixed when it is
/// made: code driven by a scripted runner makes one that reaches nothing else.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// Only the tools, through the runner (and natledger's own tables, which have none).
    Tools,
    /// The kernel too: conntrack ([`Netfilter::forget_flows`]), other owners' forwards
    /// (analysis's `forwards`), and with `direct` the direct paths (iptables-nft
    /// deletions over netlink, iptables-legacy through the table's socket options).
    Kernel { direct: bool },
}

/// Reads and writes the nat tables of both backends through a [`Runner`].
pub struct Netfilter<'r> {
    runner: &'r dyn Runner,
    reach: Reach,
    /// The netfilter netlink socket of direct deletions (and conntrack's), kept open across
    /// families so that only one socket is released (and one grace period waited for, by
    /// someone else) per run.
    socket: RefCell<Option<netlink::Socket>>,
    /// iptables-nft transactions this process committed (restore blocks, netlink batches):
    /// what moved the nf_tables generation that was natledger's own (analysis's `forwards` cache).
    pub(super) nft_commits: Cell<u32>,
    /// Whether rules were deleted through `socket` (its release then waits a grace period).
    pub(super) nft_deleted: Cell<bool>,
    /// The iptables-legacy nat tables as this process swapped them in, per family, until
    /// anything else is written: read by create's check of other owners' forwards instead
    /// of the kernel's copy (`IptablesLegacy`'s insert keeps them).
    legacy_nat: RefCell<Vec<(Family, Blob)>>,
    /// The xtables lock the in-process iptables-legacy writer takes ([`iptc::insert`]):
    /// [`iptc::XTABLES_LOCK`] unless [`Netfilter::with_settings`] says otherwise.
    xtables_lock: PathBuf,
    /// How [`conntrack::forget`] filters its dumps: adaptive unless
    /// [`Netfilter::with_settings`] says otherwise.
    conntrack_dump: DumpChoice,
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
            nft_commits: Cell::new(0),
            nft_deleted: Cell::new(false),
            legacy_nat: RefCell::new(Vec::new()),
            xtables_lock: PathBuf::from(iptc::XTABLES_LOCK),
            conntrack_dump: DumpChoice::default(),
        }
    }

    /// This one, taking the xtables lock at `xtables_lock` and filtering conntrack dumps as
    /// `conntrack_dump` says: the settings resolved once at start (`entry::settings`).
    pub fn with_settings(self, xtables_lock: PathBuf, conntrack_dump: DumpChoice) -> Self {
        Netfilter {
            xtables_lock,
            conntrack_dump,
            ..self
        }
    }

    /// Where the runner's tools are found (under its host root, if any).
    pub fn tool_lookup(&self) -> Lookup<'_> {
        self.runner.lookup()
    }

    /// The xtables lock the in-process iptables-legacy writer takes.
    pub fn xtables_lock(&self) -> &Path {
        &self.xtables_lock
    }

    /// One that reaches the kernel ([`Reach::Kernel`]): the hooks', the CNI plugin's and
    /// sweep's, with the direct paths unless `NATLEDGER_NO_NETLINK` is set.
    pub fn on_kernel(runner: &'r dyn Runner, direct: bool) -> Self {
        Netfilter::reaching(runner, Reach::Kernel { direct })
    }

    /// Whether the direct paths are on.
    pub fn direct(&self) -> bool {
        self.reach == Reach::Kernel { direct: true }
    }

    /// How many iptables-nft transactions this process has committed so far.
    pub fn nft_commits(&self) -> u32 {
        self.nft_commits.get()
    }

    /// Run `f` with an nf_tables session on the shared netfilter socket (opened on first
    /// use; [`Netfilter::release_socket`] closes it).
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
        let forgotten = conntrack::forget(sock, flows, self.conntrack_dump)?;
        let ms = start.elapsed().as_secs_f64() * 1000.0;
        log::debug!("conntrack: deleted {forgotten} entries in {ms:.1} ms");
        Ok(forgotten)
    }

    /// Close the direct paths' socket, if any. After an nf_tables deletion through it, the close
    /// waits for the kernel to free what was deleted, so the socket's last reference goes to
    /// a detached process instead ([`netlink::Socket::close_detached`]); after reads and
    /// conntrack deletions only, it is a plain close.
    pub fn release_socket(&self) {
        let sock = self.socket.borrow_mut().take();
        if let Some(sock) = sock.filter(|_| self.nft_deleted.get()) {
            sock.close_detached();
        }
    }

    /// The iptables-legacy nat table of `family` as this process last swapped it in, if
    /// nothing was written since (taken: a reader uses it once).
    pub fn take_legacy_nat(&self, family: Family) -> Option<Blob> {
        let mut kept = self.legacy_nat.borrow_mut();
        let at = kept.iter().position(|(f, _)| *f == family)?;
        Some(kept.swap_remove(at).1)
    }

    /// Keep the iptables-legacy nat table of `family` as this process just swapped it in.
    pub(super) fn keep_legacy_nat(&self, family: Family, blob: Blob) {
        self.legacy_nat.borrow_mut().push((family, blob));
    }

    /// Forget the nat table kept for `family`: something else is written.
    pub(super) fn forget_legacy_nat(&self, family: Family) {
        self.legacy_nat.borrow_mut().retain(|(f, _)| *f != family);
    }

    /// Run; on failure the error carries the first stderr line and, when it names a line of
    /// `input` ("line N failed"), that line, so the failing rule and chain are in the message.
    pub(super) fn execute(
        &self,
        inv: &Invocation,
        input: Option<&str>,
    ) -> Result<Vec<u8>, BackendError> {
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
