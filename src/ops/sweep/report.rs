//! What a sweep found and did: the `--json` report, and its text for people.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::backend::Backend;
use crate::model::family::Family;
use crate::model::save::rule_line;
use crate::state::ledger::{CniAttachment, Manifest};

use super::{HeldBack, Reason, Removed, Repair, Restored, SweepOptions, TablePlan};

#[derive(Debug, Serialize)]
pub struct SweepReport {
    pub dry_run: bool,
    pub all: bool,
    /// `--repair`: live containers' rules the tables lacked were put back.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub repair: bool,
    pub containers: Vec<ContainerReport>,
    pub tables: Vec<TableReport>,
    /// Rules removed that no manifest claimed.
    pub orphans: usize,
    /// Temp files a crash left in the ledger (removed).
    pub stale_temp_files: usize,
    /// Everything that could not be done; empty means every rule due was removed.
    pub errors: Vec<String>,
    /// How long the sweep took, `--wait` included.
    pub duration_seconds: f64,
    /// Rules tagged for containers no manifest knows were left, and why (`sweep::held`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_back: Option<HeldBack>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Liveness {
    Alive,
    Dead,
    /// The manifest cannot be read: treated as alive.
    Unreadable,
}

/// What happened to a manifest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fate {
    Kept,
    Removed,
    WouldRemove,
    /// Some of its rules could not be removed: kept, phase `removing`.
    KeptIncomplete,
}

#[derive(Debug, Serialize)]
pub struct ContainerReport {
    /// `None` for a manifest whose file name is not a container id.
    pub id: Option<String>,
    pub pid: Option<i32>,
    /// A CNI attachment's network, ifname, container id and netns path (it has no pid).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cni: Option<CniAttachment>,
    pub state: Liveness,
    pub manifest: Fate,
    pub rules_removed: usize,
    /// A dead container's rules kept because these live containers in its network namespace
    /// share them (`crate::state::sharing`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kept_for: Vec<String>,
    /// The manifest's size when it was too large to read whole (over 64 MiB): judged from
    /// its liveness fields alone (`ledger::summarize`), its rules removed by their tag.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub manifest_too_large: Option<u64>,
    /// [`Manifest::origin`], for the text report.
    #[serde(skip)]
    origin: String,
    /// The manifest file.
    #[serde(skip)]
    path: PathBuf,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TableState {
    /// Read (and, unless a dry run, its transaction applied).
    Swept,
    /// The table does not exist (legacy, seen in procfs): nothing to do.
    Absent,
    /// The backend's tools are not installed.
    NotInstalled,
    Failed,
}

#[derive(Debug, Serialize)]
pub struct TableReport {
    pub backend: Backend,
    pub family: Family,
    /// `nat` or `filter`.
    pub table: &'static str,
    pub state: TableState,
    pub rules_removed: Vec<Removed>,
    pub chains_removed: Vec<String>,
    /// `--repair`: rules the table lacked, put back (a dry run: that would be).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rules_restored: Vec<Restored>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub blocked: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// natledger's rules in the table after the sweep (a dry run: those that would remain);
    /// `null` when the table could not be read.
    pub rules_owned_after: Option<usize>,
    /// Rules tagged for containers no manifest knows, left ([`super::Claims`]).
    #[serde(skip_serializing_if = "is_zero")]
    pub unrecorded_kept: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl ContainerReport {
    pub(super) fn judged(
        manifest: &Manifest,
        alive: bool,
        kept_for: Vec<String>,
        path: &Path,
    ) -> Self {
        ContainerReport {
            id: Some(manifest.container_id.to_string()),
            pid: manifest.pid,
            cni: manifest.cni.clone(),
            origin: manifest.origin(),
            state: if alive {
                Liveness::Alive
            } else {
                Liveness::Dead
            },
            manifest: Fate::Kept,
            rules_removed: 0,
            kept_for,
            manifest_too_large: None,
            path: path.to_path_buf(),
        }
    }

    /// [`Self::manifest_too_large`].
    pub(super) fn too_large(mut self, bytes: Option<u64>) -> Self {
        self.manifest_too_large = bytes;
        self
    }

    pub(super) fn unreadable(id: Option<String>, path: &Path) -> Self {
        ContainerReport {
            id,
            pid: None,
            cni: None,
            origin: "pid -".to_string(),
            state: Liveness::Unreadable,
            manifest: Fate::Kept,
            rules_removed: 0,
            kept_for: Vec::new(),
            manifest_too_large: None,
            path: path.to_path_buf(),
        }
    }
}

impl TableReport {
    pub(crate) fn new(backend: Backend, family: Family, table: &'static str) -> Self {
        TableReport {
            backend,
            family,
            table,
            state: TableState::Swept,
            rules_removed: Vec::new(),
            chains_removed: Vec::new(),
            rules_restored: Vec::new(),
            blocked: Vec::new(),
            error: None,
            rules_owned_after: None,
            unrecorded_kept: 0,
        }
    }

    /// `backend/family/table`, as reports name it.
    fn place(&self) -> String {
        format!("{}/{}/{}", self.backend, self.family, self.table)
    }

    pub(crate) fn with_state(mut self, state: TableState) -> Self {
        self.state = state;
        // An absent table holds nothing; a backend not installed is not known.
        self.rules_owned_after = (state == TableState::Absent).then_some(0);
        self
    }

    pub(crate) fn failed(mut self, error: String) -> Self {
        self.state = TableState::Failed;
        self.error = Some(error);
        self.rules_owned_after = None;
        self
    }

    pub(super) fn planned(mut self, plan: TablePlan) -> Self {
        self.rules_removed = plan.rules;
        self.chains_removed = plan.chains;
        self.rules_owned_after = Some(plan.owned_after);
        self.unrecorded_kept = plan.unrecorded_kept;
        self
    }

    pub(super) fn restored(mut self, repair: Repair) -> Self {
        self.rules_owned_after = self.rules_owned_after.map(|n| n + repair.rules.len());
        self.rules_restored = repair.rules;
        self
    }
}

impl SweepReport {
    pub(crate) fn new(opts: &SweepOptions) -> Self {
        SweepReport {
            dry_run: opts.dry_run,
            all: opts.all,
            repair: opts.repair,
            containers: Vec::new(),
            tables: Vec::new(),
            orphans: 0,
            stale_temp_files: 0,
            errors: Vec::new(),
            duration_seconds: 0.0,
            held_back: None,
        }
    }

    /// Whether everything due was removed (exit status 0).
    pub fn ok(&self) -> bool {
        self.errors.is_empty()
    }

    pub(super) fn add_table(&mut self, table: TableReport) {
        let place = table.place();
        if let Some(e) = &table.error {
            self.errors.push(format!("{place}: {e}"));
        }
        for b in &table.blocked {
            self.errors.push(format!("{place}: {b}"));
        }
        self.orphans += table
            .rules_removed
            .iter()
            .filter(|r| r.reason == Reason::Orphan)
            .count();
        self.tables.push(table);
    }

    /// Rules put back in every table (`--repair`).
    pub fn restored(&self) -> usize {
        self.tables.iter().map(|t| t.rules_restored.len()).sum()
    }

    /// Record what happened to each manifest, by file.
    pub(super) fn set_fates(&mut self, fates: &HashMap<PathBuf, Fate>) {
        for c in &mut self.containers {
            if let Some(fate) = fates.get(&c.path) {
                c.manifest = *fate;
            }
        }
    }

    pub(super) fn count_rules_per_container(&mut self) {
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for r in self.tables.iter().flat_map(|t| &t.rules_removed) {
            if let Some(id) = &r.container {
                *counts.entry(id).or_default() += 1;
            }
        }
        for c in &mut self.containers {
            c.rules_removed =
                c.id.as_deref()
                    .and_then(|id| counts.get(id))
                    .copied()
                    .unwrap_or(0);
        }
    }

    /// The report for people: one line per container judged dead or unreadable, per table
    /// that changed, per orphan and per error, then a summary.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let verb = if self.dry_run {
            "would remove"
        } else {
            "removed"
        };
        for c in &self.containers {
            self.render_container(c, verb, &mut out);
        }
        for t in &self.tables {
            self.render_table(t, verb, &mut out);
        }
        for e in &self.errors {
            let _ = writeln!(out, "error: {e}");
        }
        self.render_summary(verb, &mut out);
        out
    }

    /// A container's line: none for a live one (unless `--all`).
    fn render_container(&self, c: &ContainerReport, verb: &str, out: &mut String) {
        let id = c.id.as_deref().unwrap_or("?");
        let origin = &c.origin;
        let state = match c.state {
            Liveness::Alive if !self.all => return,
            Liveness::Alive => "live",
            Liveness::Dead => "dead",
            Liveness::Unreadable => "unreadable",
        };
        let fate = match c.manifest {
            Fate::Kept => "manifest kept",
            Fate::Removed => "manifest removed",
            Fate::WouldRemove => "manifest would be removed",
            Fate::KeptIncomplete => "manifest kept: removal incomplete",
        };
        if !c.kept_for.is_empty() && !self.all {
            let _ = writeln!(
                out,
                "{state} container {id} ({origin}): rules kept, shared with live \
                 container(s) {} in its network namespace",
                c.kept_for.join(", ")
            );
            return;
        }
        let by_tag = match c.manifest_too_large {
            Some(bytes) => format!(
                " by their tag (its manifest of {bytes} bytes is too large to read whole: \
                 judged from its liveness fields)"
            ),
            None => String::new(),
        };
        let _ = writeln!(
            out,
            "{state} container {id} ({origin}): {verb} {} rule(s){by_tag}, {fate}",
            c.rules_removed
        );
    }

    /// A table's lines: the rules removed other than dead containers' (those are counted on
    /// their container's line), the chains removed, the rules put back.
    fn render_table(&self, t: &TableReport, verb: &str, out: &mut String) {
        let place = t.place();
        for r in t
            .rules_removed
            .iter()
            .filter(|r| r.reason != Reason::DeadContainer)
        {
            let _ = writeln!(
                out,
                "{place}: {verb} ({}) {}",
                reason_text(r.reason),
                rule_line(&r.chain, &r.rule)
            );
        }
        for chain in &t.chains_removed {
            let _ = writeln!(out, "{place}: {verb} chain {chain}");
        }
        for r in &t.rules_restored {
            let _ = writeln!(
                out,
                "{place}: {} {}",
                if self.dry_run {
                    "would put back"
                } else {
                    "put back"
                },
                rule_line(&r.chain, &r.rule)
            );
        }
    }

    /// The summary line.
    fn render_summary(&self, verb: &str, out: &mut String) {
        let dead = self
            .containers
            .iter()
            .filter(|c| c.state == Liveness::Dead)
            .count();
        let rules: usize = self.tables.iter().map(|t| t.rules_removed.len()).sum();
        let restored = match self.restored() {
            _ if !self.repair => String::new(),
            n if self.dry_run => format!("; would put back {n} rule(s)"),
            n => format!("; put back {n} rule(s)"),
        };
        let _ = writeln!(
            out,
            "sweep{}: {} container(s), {dead} dead; {verb} {rules} rule(s), {} of them \
             orphans{restored}; {} error(s)",
            if self.dry_run { " (dry run)" } else { "" },
            self.containers.len(),
            self.orphans,
            self.errors.len()
        );
    }
}

fn reason_text(reason: Reason) -> &'static str {
    match reason {
        Reason::DeadContainer => "dead container",
        Reason::Orphan => "orphan",
        Reason::DuplicateJump => "duplicate jump",
        Reason::StaleChain => "stale chain",
        Reason::Uninstall => "uninstall",
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::state::ledger::tests::cni_sample;

    #[test]
    fn an_attachment_is_reported_with_its_network_and_ifname() {
        let m = cni_sample("abc", Path::new("/run/netns/x"), None);
        let mut report = SweepReport::new(&SweepOptions::default());
        report.containers.push(ContainerReport::judged(
            &m,
            false,
            Vec::new(),
            Path::new("/s/abc"),
        ));
        report.set_fates(&HashMap::from([(PathBuf::from("/s/abc"), Fate::Removed)]));
        let text = report.render();
        assert!(
            text.contains(
                "dead container abc+eth0 (cni net=podman ifname=eth0 container=abc): \
                 removed 0 rule(s), manifest removed"
            ),
            "{text}"
        );
        let json = serde_json::to_value(&report).unwrap();
        let c = &json["containers"][0];
        assert_eq!(c["cni"]["network"], "podman");
        assert_eq!(c["cni"]["ifname"], "eth0");
        assert_eq!(c["cni"]["container_id"], "abc");
        assert_eq!(c["pid"], serde_json::Value::Null);
        assert_eq!(c["state"], "dead");
        assert!(c.get("manifest_too_large").is_none(), "{c}");
    }

    #[test]
    fn a_manifest_too_large_to_read_is_named_with_its_size() {
        let m = cni_sample("abc", Path::new("/run/netns/x"), None);
        let mut report = SweepReport::new(&SweepOptions::default());
        report.containers.push(
            ContainerReport::judged(&m, false, Vec::new(), Path::new("/s/abc"))
                .too_large(Some(70_000_000)),
        );
        report.set_fates(&HashMap::from([(PathBuf::from("/s/abc"), Fate::Removed)]));
        let text = report.render();
        assert!(
            text.contains(
                "removed 0 rule(s) by their tag (its manifest of 70000000 bytes is too large \
                 to read whole: judged from its liveness fields), manifest removed"
            ),
            "{text}"
        );
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["containers"][0]["manifest_too_large"], 70_000_000);
    }
}
