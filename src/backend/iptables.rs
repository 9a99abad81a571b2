//! What the two iptables drivers share, over their tool names ([`Tools`], private to
//! `backend`): one `*-save -t TABLE` to read, one `*-restore --noflush` process to write.
//! Their drivers differ in the words of their [`Tools`] and in their process-less paths.

use std::path::{Path, PathBuf};

use crate::kernel::exec::Invocation;
use crate::kernel::host_root::Lookup;
use crate::model::capabilities::Capabilities;
use crate::model::family::Family;
use crate::model::layout;
use crate::model::save::{self, Batch, Dump};

use super::driver::Reading;
use super::{BackendError, Netfilter, TOOL_DIRS, legacy_table_exists};

/// An iptables backend's tools, and what sets them apart.
#[derive(Debug)]
pub struct Tools {
    /// The word in the tool names: `ip[6]tables-{word}-save`, `ip[6]tables-{word}-restore`.
    pub word: &'static str,
    /// What `*-restore` takes after `--noflush`.
    pub restore_args: &'static [&'static str],
    /// An absent table is seen in procfs without a process (asking the tool would create it).
    pub tables_in_procfs: bool,
    /// Each restored table is one nf_tables transaction ([`Netfilter::nft_commits`]).
    pub nf_tables: bool,
}

impl Tools {
    /// What an iptables backend writes: the forward accept (a FORWARD drop of any owner in
    /// the same table is passed by it), shifted ranges (a DNAT with a base port); its
    /// tables are seen without its tools where they are in procfs.
    pub fn capabilities(&self) -> Capabilities {
        Capabilities {
            forward_accept: true,
            untracked_guard: false,
            shifted_ranges: true,
            tools: true,
            tables_seen_without_tools: self.tables_in_procfs,
            one_transaction: false,
        }
    }

    /// Absolute path of `ip[6]tables-{word}-{verb}`, as the host names it, found where `look`
    /// says (under the host root when there is one, `crate::kernel::host_root`).
    pub fn path(&self, look: Lookup, family: Family, verb: &str) -> Result<PathBuf, BackendError> {
        let name = format!("{}-{}-{verb}", family.tool_stem(), self.word);
        TOOL_DIRS
            .iter()
            .map(|dir| Path::new(dir).join(&name))
            .find(|p| look.exists(p))
            .ok_or_else(|| BackendError::ToolNotFound {
                tool: name,
                root: look.0.cloned(),
            })
    }

    /// The current `table`, as much as `scope` says ([`Reading::Ours`]: the built-in chains
    /// (its jumps, and where they go), its own chains, and any rule naming one of them);
    /// `None` when it is absent.
    pub fn read(
        &self,
        nf: &Netfilter,
        family: Family,
        table: &str,
        scope: Reading,
    ) -> Result<Option<Dump>, BackendError> {
        let ours = |line: &str| {
            let chain = line.split_whitespace().nth(1).unwrap_or("");
            matches!(
                chain,
                "PREROUTING" | "INPUT" | "FORWARD" | "OUTPUT" | "POSTROUTING"
            ) || line.contains(layout::CHAIN_PREFIX)
        };
        match scope {
            Reading::Ours => self.read_table(nf, family, table, ours),
            Reading::Whole => self.read_table(nf, family, table, |_| true),
        }
    }

    fn read_table(
        &self,
        nf: &Netfilter,
        family: Family,
        table: &str,
        keep: impl Fn(&str) -> bool,
    ) -> Result<Option<Dump>, BackendError> {
        if self.tables_in_procfs && !legacy_table_exists(family, table)? {
            return Ok(None);
        }
        let tables = self.save(nf, family, &["-t", table], keep)?;
        Ok(tables.into_iter().find(|t| t.name == table))
    }

    /// Every table of one family (`*-save` without `-t`, which creates none).
    pub fn read_all(&self, nf: &Netfilter, family: Family) -> Result<Vec<Dump>, BackendError> {
        self.save(nf, family, &[], |_| true)
    }

    fn save(
        &self,
        nf: &Netfilter,
        family: Family,
        args: &[&str],
        keep: impl Fn(&str) -> bool,
    ) -> Result<Vec<Dump>, BackendError> {
        let inv = Invocation {
            program: self.path(nf.tool_lookup(), family, "save")?,
            args: args.iter().map(|a| a.to_string()).collect(),
            stdin: None,
        };
        let out = nf.execute(&inv, None)?;
        let text = String::from_utf8_lossy(&out);
        // iptables-nft prints this comment, exits 0 and omits the table when it cannot
        // decode rules: an unreadable table must not pass for an empty one.
        if let Some(line) = text
            .lines()
            .find(|l| l.starts_with("# Dump") && l.contains("is incompatible"))
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

    /// Batches of different tables with one `*-restore --noflush` process: one transaction
    /// per table, committed in order; the first that fails stops the rest (those before it
    /// stay committed).
    pub fn apply_all(
        &self,
        nf: &Netfilter,
        family: Family,
        batches: &[Batch],
    ) -> Result<(), BackendError> {
        let mut args = vec!["--noflush".to_string()];
        args.extend(self.restore_args.iter().map(|a| a.to_string()));
        nf.forget_legacy_nat(family);
        let input: String = batches.iter().map(Batch::render).collect();
        let inv = Invocation {
            program: self.path(nf.tool_lookup(), family, "restore")?,
            args,
            stdin: Some(input.clone().into_bytes()),
        };
        nf.execute(&inv, Some(&input))?;
        if self.nf_tables {
            let tables = batches.iter().filter(|b| !b.is_empty()).count() as u32;
            nf.nft_commits.set(nf.nft_commits.get() + tables);
        }
        Ok(())
    }
}
