//! The two iptables backends and how natledger talks to them: one `*-save -t nat` to read,
//! one `*-restore --noflush` transaction to write. Both backends take the same syntax; they
//! differ in their tools, in how to tell cheaply that a table is absent, and in which one the
//! host uses ([`detect`]). One exception to "everything through a tool": deleting a
//! container's iptables-nft rules goes over netlink when asked for ([`crate::kernel::nftables`]
//! explains the 10-25 ms it saves).

use std::cell::RefCell;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::kernel::conntrack::{self, ConntrackError};
use crate::kernel::exec::{Invocation, Runner};
use crate::kernel::iptc::{self, IptcError, Place};
use crate::kernel::netlink;
use crate::kernel::nftables::{self, NftError};
use crate::model::family::Family;
use crate::model::layout;
use crate::model::rule::Rule;
use crate::model::save::{self, Batch, Table};

/// Directories searched for iptables tools. Absolute, because podman runs poststop hooks
/// with an empty environment (no PATH).
pub const TOOL_DIRS: [&str; 5] = ["/usr/sbin", "/sbin", "/usr/local/sbin", "/usr/bin", "/bin"];

/// How long iptables-legacy-restore waits for `/run/xtables.lock` held by another program;
/// well inside podman's 10 s hook timeout.
const XTABLES_WAIT_SECS: &str = "5";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// iptables-legacy (`ip_tables`, written with `iptables-legacy-restore` or in-process).
    Legacy,
    /// iptables-nft (the `ip nat`/`ip filter` nf_tables tables iptables-nft writes).
    Nft,
    /// natledger's own nf_tables tables, written in-process ([`crate::kernel::nftables::own`]).
    Nftables,
}

impl Backend {
    /// Every backend a container's rules may be in: sweep and poststop look in each.
    pub const ALL: [Backend; 3] = [Backend::Legacy, Backend::Nft, Backend::Nftables];
    /// The two iptables backends: the ones with `*-save` tools and other owners' rules.
    pub const IPTABLES: [Backend; 2] = [Backend::Legacy, Backend::Nft];

    /// The name in tool names (`iptables-legacy`, `iptables-nft`) and on the command line.
    pub fn suffix(self) -> &'static str {
        match self {
            Backend::Legacy => "legacy",
            Backend::Nft => "nft",
            Backend::Nftables => "nftables",
        }
    }

    /// Whether this is one of the iptables backends (written with `*-restore`): what its
    /// driver reports ([`crate::model::capabilities::Capabilities::tools`]).
    pub fn is_iptables(self) -> bool {
        self.driver().capabilities().tools
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.suffix())
    }
}

mod detect;
mod driver;
mod error;
mod iptables_legacy;
mod iptables_nft;
mod nft_native;
mod own_nftables;
pub mod write;
pub use detect::{BackendChoice, Detected, detect, detect_explained};
pub use driver::Driver;
pub use error::{BackendError, Native, NativeError};
pub use iptables_legacy::IptablesLegacy;
pub use iptables_nft::IptablesNft;
pub use nft_native::Tagged;
pub use own_nftables::OwnNftables;

impl Backend {
    /// The backend's driver: the one place a backend is registered.
    pub fn driver(self) -> &'static dyn Driver {
        match self {
            Backend::Legacy => &IptablesLegacy,
            Backend::Nft => &IptablesNft,
            Backend::Nftables => &OwnNftables,
        }
    }
}

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
    /// ([`crate::analysis::forwards`]), and with `native` the process-less paths (iptables-nft
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
    /// what moved the nf_tables generation that was natledger's own ([`crate::analysis::forwards`]).
    nft_commits: std::cell::Cell<u32>,
    /// Whether rules were deleted through `socket` (its release then waits a grace period).
    nft_deleted: std::cell::Cell<bool>,
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

    /// Insert rules into an iptables-legacy table without a process ([`iptc::insert`]),
    /// provided the table, the chains and the `required` jumps exist.
    pub fn insert_legacy(
        &self,
        family: Family,
        table: &'static str,
        rules: &[(&str, Rule, Place)],
        required: &[(&str, Rule)],
    ) -> Result<Native, IptcError> {
        self.legacy_native(family, table, "inserted", || {
            iptc::insert(family, table, rules, required)
        })
    }

    /// Delete exactly these rules from an iptables-legacy table without a process
    /// ([`iptc::delete`]); declined unless every one is found.
    pub fn delete_legacy(
        &self,
        family: Family,
        table: &'static str,
        rules: &[(&str, &Rule)],
    ) -> Result<Native, IptcError> {
        self.legacy_native(family, table, "deleted", || {
            iptc::delete(family, table, rules)
        })
    }

    fn legacy_native(
        &self,
        family: Family,
        table: &str,
        verb: &str,
        op: impl FnOnce() -> Result<iptc::Outcome, IptcError>,
    ) -> Result<Native, IptcError> {
        // Asking the kernel about an absent table would create it.
        if !self.native() || !legacy_table_exists(family, table).unwrap_or(false) {
            return Ok(Native::Off);
        }
        let start = std::time::Instant::now();
        let outcome = op()?;
        let ms = start.elapsed().as_secs_f64() * 1000.0;
        match outcome {
            iptc::Outcome::Done(n) => {
                log::debug!("iptc: {verb} {n} {family} {table} rule(s) in {ms:.1} ms")
            }
            iptc::Outcome::Declined => log::debug!(
                "iptc: {family} {table} table not as expected; using iptables-legacy-restore"
            ),
        }
        Ok(match outcome {
            iptc::Outcome::Done(n) => Native::Done(n),
            iptc::Outcome::Declined => Native::Declined,
        })
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

    /// The current `table` (nat, filter), or `None` when it does not exist. For legacy, an
    /// absent table is seen in procfs without starting a process (and `-t nat` would create
    /// it).
    pub fn read(
        &self,
        backend: Backend,
        family: Family,
        table: &'static str,
    ) -> Result<Option<Table>, BackendError> {
        if backend == Backend::Nftables {
            return self.read_own(family, table);
        }
        if backend == Backend::Legacy && !legacy_table_exists(family, table)? {
            return Ok(None);
        }
        // Only what natledger reads: the built-in chains (its jumps, and where they go), its
        // own chains, and any rule naming one of them.
        let relevant = |line: &str| {
            let chain = line.split_whitespace().nth(1).unwrap_or("");
            matches!(
                chain,
                "PREROUTING" | "INPUT" | "FORWARD" | "OUTPUT" | "POSTROUTING"
            ) || line.contains(layout::CHAIN_PREFIX)
        };
        let tables = self.save(backend, family, &["-t", table], relevant)?;
        Ok(tables.into_iter().find(|t| t.name == table))
    }

    /// Every rule of `table` (for reading other owners' rules), or `None` when it does not
    /// exist; like [`Netfilter::read`], legacy's absence is seen without a process.
    pub fn read_whole(
        &self,
        backend: Backend,
        family: Family,
        table: &'static str,
    ) -> Result<Option<Table>, BackendError> {
        if backend == Backend::Nftables {
            return self.read_own(family, table);
        }
        if backend == Backend::Legacy && !legacy_table_exists(family, table)? {
            return Ok(None);
        }
        let tables = self.save(backend, family, &["-t", table], |_| true)?;
        Ok(tables.into_iter().find(|t| t.name == table))
    }

    /// Every table of one backend and family (`*-save` without `-t`, which creates none).
    pub fn read_all(&self, backend: Backend, family: Family) -> Result<Vec<Table>, BackendError> {
        if backend == Backend::Nftables {
            let own = self.with_nft(|s| s.own_table(family))?;
            return Ok(own
                .map(|t| layout::TABLES.iter().map(|name| t.logical(name)).collect())
                .unwrap_or_default());
        }
        self.save(backend, family, &[], |_| true)
    }

    /// natledger's own nf_tables table of `family` as the logical `table` (nat, filter), or
    /// `None` when the table does not exist.
    fn read_own(&self, family: Family, table: &str) -> Result<Option<Table>, BackendError> {
        let own = self.with_nft(|s| s.own_table(family))?;
        Ok(own.map(|t| t.logical(table)))
    }

    /// natledger's own nf_tables table of `family` ([`nftables::own`]), whole, with the
    /// generation it was read at (for [`Netfilter::apply_own_to`]).
    pub fn read_own_table(&self, family: Family) -> Result<nftables::own::OwnRead, BackendError> {
        Ok(self.with_nft(|s| s.own_read(family))?)
    }

    fn save(
        &self,
        backend: Backend,
        family: Family,
        args: &[&str],
        keep: impl Fn(&str) -> bool,
    ) -> Result<Vec<Table>, BackendError> {
        let inv = Invocation {
            program: tool(backend, family, "save")?,
            args: args.iter().map(|a| a.to_string()).collect(),
            stdin: None,
        };
        let out = self.execute(&inv, None)?;
        let text = String::from_utf8_lossy(&out);
        // iptables-nft prints this comment, exits 0 and omits the table when it cannot
        // decode rules: an unreadable table must not pass for an empty one.
        if let Some(line) = text
            .lines()
            .find(|l| l.starts_with("# Table") && l.contains("is incompatible"))
        {
            return Err(BackendError::Incompatible {
                command: inv.to_string(),
                line: line.to_string(),
            });
        }
        save::parse_dump_where(&text, keep).map_err(|source| BackendError::Parse {
            command: inv.to_string(),
            source,
        })
    }

    /// Apply one batch as one `*-restore --noflush` transaction.
    pub fn apply(
        &self,
        backend: Backend,
        family: Family,
        batch: &Batch,
    ) -> Result<(), BackendError> {
        self.apply_all(backend, family, std::slice::from_ref(batch))
    }

    /// Apply batches of different tables with one `*-restore --noflush` process: one
    /// transaction per table, committed in order; the first that fails stops the rest (those
    /// before it stay committed).
    pub fn apply_all(
        &self,
        backend: Backend,
        family: Family,
        batches: &[Batch],
    ) -> Result<(), BackendError> {
        if backend == Backend::Nftables {
            return self.apply_own(family, batches);
        }
        let mut args = vec!["--noflush".to_string()];
        if backend == Backend::Legacy {
            args.extend(["--wait".to_string(), XTABLES_WAIT_SECS.to_string()]);
        }
        let input: String = batches.iter().map(Batch::render).collect();
        let result = self.run_restore(backend, family, args, input);
        if backend == Backend::Nft && result.is_ok() {
            let tables = batches.iter().filter(|b| !b.is_empty()).count() as u32;
            self.nft_commits.set(self.nft_commits.get() + tables);
        }
        result
    }

    /// The batches as one nf_tables transaction on natledger's own table: all or nothing.
    fn apply_own(&self, family: Family, batches: &[Batch]) -> Result<(), BackendError> {
        self.apply_own_to(family, None, batches)
    }

    /// [`Netfilter::apply_own`] planned against `read`, the caller's read of the table under
    /// the lock it still holds (`None`: read it now).
    pub fn apply_own_to(
        &self,
        family: Family,
        read: Option<nftables::own::OwnRead>,
        batches: &[Batch],
    ) -> Result<(), BackendError> {
        let start = std::time::Instant::now();
        let applied = self.with_nft(|s| match read {
            Some(read) => s.apply_own_to(family, read, batches),
            None => s.apply_own(family, batches),
        })?;
        if applied.messages > 0 {
            self.nft_commits.set(self.nft_commits.get() + 1);
        }
        if applied.deleted {
            self.nft_deleted.set(true);
        }
        let ms = start.elapsed().as_secs_f64() * 1000.0;
        log::debug!(
            "nftables: {} message(s) on {family} table natledger in {ms:.1} ms",
            applied.messages
        );
        Ok(())
    }

    fn run_restore(
        &self,
        backend: Backend,
        family: Family,
        args: Vec<String>,
        input: String,
    ) -> Result<(), BackendError> {
        let inv = Invocation {
            program: tool(backend, family, "restore")?,
            args,
            stdin: Some(input.clone().into_bytes()),
        };
        self.execute(&inv, Some(&input)).map(drop)
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

/// Absolute path of `ip[6]tables-{legacy,nft}-{save,restore}`.
pub fn tool(backend: Backend, family: Family, verb: &str) -> Result<PathBuf, BackendError> {
    if !backend.is_iptables() {
        return Err(BackendError::NoTool { verb: verb.into() });
    }
    let name = format!("{}-{}-{verb}", family.tool_stem(), backend.suffix());
    TOOL_DIRS
        .iter()
        .map(|dir| Path::new(dir).join(&name))
        .find(|p| p.exists())
        .ok_or(BackendError::ToolNotFound { tool: name })
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
        assert!(Backend::IPTABLES.iter().all(|b| caps(*b).tools));
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
