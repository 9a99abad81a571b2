//! `natledger sweep`: remove what dead containers left behind, and every natledger rule no
//! live container claims, in both backends and both families.
//!
//! One pass, under the ledger lock (so hooks wait while it runs, and it never sees a
//! container half-created):
//! 1. judge every manifest: alive (pid, start time and boot all match), dead, or unreadable
//!    (kept: its container might be alive); one only too large to read whole is judged from
//!    its liveness fields (`ledger::summarize`, read before the lock);
//! 2. per backend, family and table (nat, filter), one read and at most one `*-restore`
//!    transaction: natledger's rules tagged for a container that is not alive go, wherever
//!    they are now (see [`plan`]); a transaction that fails because the table changed since
//!    the read is planned again from a new read, once;
//! 3. dead manifests go once no table that could hold their rules failed; otherwise they stay
//!    (phase `removing`, naming the rules that may remain) for the next sweep.
//!
//! Records carry their container's tag, so the tagged rules in natledger's chains are exactly
//! the recorded rules, plus any copy a ruleset restore or a backend switch made of them.

mod held;
mod leftover;
mod native;
mod order;
mod plan;
mod repair;
mod report;
mod wait;

pub use held::HeldBack;
pub use order::{Ranked, rank};
pub use plan::{Claims, REWRITE_AT, Reason, Removed, TablePlan, plan};
pub use repair::{Repair, Restored, repair};
pub use report::{ContainerReport, Fate, Liveness, SweepReport, TableReport, TableState};
pub use wait::{QUIET, wait_for_exits};

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use crate::backend::{Backend, BackendError};
use crate::chain::Chain;
use crate::fault;
use crate::model::family::Family;
use crate::model::oci::ContainerId;
use crate::model::table::Table;
use crate::state::ledger::{FileId, Locked, Manifest, Phase, RuleRecord, Scan, Summary, summarize};
use crate::state::liveness::Batched;
use crate::state::sharing::Needs;

use super::{Context, Error, flows};

/// What to sweep and how.
#[derive(Clone, Debug, Default)]
pub struct SweepOptions {
    /// Plan and report; change nothing.
    pub dry_run: bool,
    /// Remove everything natledger owns, live containers' rules, shared chains and jumps
    /// included (for uninstalling).
    pub all: bool,
    /// First give exiting containers up to this long to die (see [`wait_for_exits`]).
    pub wait: Option<Duration>,
    /// Also put back what live containers' manifests record and the tables lack, with the
    /// chains, jumps and guard they need ([`repair`]), in the same transactions.
    pub repair: bool,
    /// The boot, before any runtime: every tagged rule no manifest claims goes, even when
    /// nothing is recorded or the state directory is missing ([`held`]).
    pub boot: bool,
    /// Give up at once, with [`Error::Busy`], when another process holds the ledger lock
    /// (`natledger watch`: its signals are never kept waiting by a hook).
    pub try_lock: bool,
    /// Containers whose rules a repair does not put back this time (`natledger watch`'s
    /// back-off of a container whose rules are deleted again and again): the others' are.
    pub hold: Vec<ContainerId>,
}

/// Run one sweep. `Err` only when the ledger itself cannot be read or locked; everything
/// else that fails is in the report's `errors`.
pub fn sweep(ctx: &Context, opts: &SweepOptions) -> Result<SweepReport, Error> {
    let started = Instant::now();
    if let (Some(limit), false) = (opts.wait, opts.all) {
        wait_for_exits(ctx.host, &ctx.ledger, limit);
    }
    // Read before the lock: a manifest too large to read whole takes its time.
    let early = ctx.ledger.summarize_oversized();
    let mut report = SweepReport::new(opts);
    let locked = match held::lock(&ctx.ledger, opts)? {
        held::Hold::Locked(locked) => Some(locked),
        held::Hold::Absent => None,
        held::Hold::Busy => {
            return Err(Error::Busy {
                path: ctx.ledger.file("lock"),
            });
        }
        held::Hold::Refused(why) => {
            report.held_back = Some(why);
            report.duration_seconds = started.elapsed().as_secs_f64();
            return Ok(report);
        }
    };
    let judged = judge(ctx, opts, early, locked.is_some(), &mut report)?;
    fault::point(fault::SWEEP_JUDGED);

    let mut first = true;
    let live: Vec<(SystemTime, &Manifest)> = judged
        .live
        .iter()
        .filter(|(_, m)| !opts.hold.contains(&m.container_id))
        .map(|(t, m)| (*t, m))
        .collect();
    let live = rank(&live, &judged.stacks);
    // A repair writes filter before nat, as create does: a DNAT put back finds its accept.
    let order: Vec<Table> = match opts.repair {
        true => Table::ALL.to_vec(),
        false => Table::ALL.into_iter().rev().collect(),
    };
    for backend in Backend::ALL {
        for family in Family::ALL {
            // nat first: a DNAT is never left in force without its accept, so when the nat
            // table fails its filter table is left as it is too (its records stay).
            let mut nat_failed = false;
            for name in order.iter().copied() {
                let table = if nat_failed && name == Table::Filter {
                    TableReport::new(backend, family, name.as_str()).failed(
                        "not swept: the nat table failed, and its DNATs keep their accepts"
                            .to_string(),
                    )
                } else {
                    let repair = opts.repair.then_some(&live);
                    let claims = &judged.claims;
                    sweep_table(ctx, backend, family, name, claims, repair, opts.dry_run)
                };
                nat_failed |= name == Table::Nat && table.state == TableState::Failed;
                if !opts.dry_run && !table.rules_removed.is_empty() && std::mem::take(&mut first) {
                    fault::point(fault::SWEEP_FIRST_TABLE_APPLIED);
                }
                report.add_table(table);
            }
        }
    }
    fault::point(fault::SWEEP_APPLIED);
    if !opts.dry_run {
        // The flows of the DNAT rules that went or came back, once every table is done.
        let removed = report.tables.iter().flat_map(|t| {
            let restored = t.rules_restored.iter().map(|r| r.rule.as_slice());
            t.rules_removed
                .iter()
                .map(|r| r.rule.as_slice())
                .chain(restored)
                .map(move |rule| (t.family, rule))
        });
        flows::forget(ctx, &flows::of_saved(removed));
        if opts.all {
            leftover::drop_emptied_tables(ctx, &mut report);
        }
        ctx.netfilter.release_native();
    }
    if judged.claims.keep_unrecorded {
        report.held_back = held::empty(&ctx.ledger, &report.tables);
    }
    if let Some(locked) = &locked {
        settle(locked, opts, judged, &mut report);
    }
    report.count_rules_per_container();
    report.duration_seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// The verdict on every manifest.
struct Judged {
    claims: Claims,
    /// Manifests whose rules go (dead containers; every container with `--all`).
    doomed: Vec<Doomed>,
    /// Manifests that cannot be read or do not match their file name: removed only by
    /// `--all`.
    unreadable: Vec<PathBuf>,
    /// Temp files a crash left (always removed).
    temps: Vec<PathBuf>,
    /// With `--repair`: the kept manifests whose create completed, whose rules must be in
    /// force, each with its file's modification time (ranked by [`order::rank`]).
    live: Vec<(SystemTime, Manifest)>,
    /// Every readable manifest's `stacked_on`, dead ones' included (a stack's order runs
    /// through them).
    stacks: HashMap<ContainerId, Vec<ContainerId>>,
}

struct Doomed {
    path: PathBuf,
    /// Without its records when `summary` is set.
    manifest: Manifest,
    /// A manifest too large to read whole: where its rules are, not which.
    summary: Option<Summary>,
}

/// Per readable manifest: whether its container lives, and who shares its rules alive.
type Verdicts = (Vec<bool>, Vec<Vec<String>>);

fn judge(
    ctx: &Context,
    opts: &SweepOptions,
    early: Vec<(PathBuf, Summary)>,
    ledgered: bool,
    report: &mut SweepReport,
) -> Result<Judged, Error> {
    let mut early: HashMap<PathBuf, Summary> = early.into_iter().collect();
    // Without /proc every container would look dead.
    ctx.host.check_procfs().map_err(Error::Procfs)?;
    // Without a state directory (`--boot`, `--all`) nothing is read: one made meanwhile is
    // not locked.
    let scan = match ledgered {
        true => ctx.ledger.scan()?,
        false => Scan::default(),
    };
    let mut judged = Judged {
        claims: Claims {
            all: opts.all,
            keep_unrecorded: held::keep_unrecorded(opts, scan.manifests.len()),
            ..Claims::default()
        },
        doomed: Vec::new(),
        unreadable: Vec::new(),
        temps: scan.temps,
        live: Vec::new(),
        stacks: HashMap::new(),
    };
    let mut readable = Vec::new();
    let mut unreadable_ids: HashSet<String> = HashSet::new();
    // Manifests too large to read whole, read for their liveness fields (`ledger::summarize`):
    // judged as any other; a dead one's rules go by their tag.
    let mut summaries: HashMap<PathBuf, Summary> = HashMap::new();
    for scanned in scan.manifests {
        let read = match scanned.manifest {
            Err(e) if e.is_too_large() => match early.remove(&scanned.path) {
                Some(s) if Some(s.file) == FileId::at(&scanned.path) => Ok(s),
                _ => summarize(&scanned.path),
            }
            .map(|s| {
                let manifest = s.manifest.clone();
                summaries.insert(scanned.path.clone(), s);
                manifest
            }),
            other => other,
        };
        let manifest = match read {
            Ok(m) if scanned.id.as_ref() == Some(&m.container_id) => m,
            other => {
                // Whose rules it names is unknown: keep those of both the id in its file
                // name and the id inside it.
                let mut ids: Vec<String> = scanned.id.iter().map(ToString::to_string).collect();
                let problem = match other {
                    Ok(m) => {
                        ids.push(m.container_id.to_string());
                        format!(
                            "manifest {} names container {}, not the one its file name says",
                            scanned.path.display(),
                            m.container_id
                        )
                    }
                    Err(e) => crate::chain::text(&e),
                };
                unreadable_ids.extend(ids.iter().cloned());
                if !opts.all {
                    judged.claims.kept.extend(ids.iter().cloned());
                    let tags: Vec<String> = ids.iter().map(crate::model::layout::tag).collect();
                    report.errors.push(format!(
                        "{problem}; the rules tagged {} are kept; repair or delete the file, \
                         or run sweep --all",
                        if tags.is_empty() {
                            "with it".to_string()
                        } else {
                            tags.join(", ")
                        }
                    ));
                }
                report.containers.push(ContainerReport::unreadable(
                    ids.first().cloned(),
                    &scanned.path,
                ));
                judged.unreadable.push(scanned.path);
                continue;
            }
        };
        readable.push((scanned.path, manifest));
    }
    judged.stacks = readable
        .iter()
        .map(|(_, m)| (m.container_id.clone(), m.stacked_on.clone()))
        .collect();
    // A dead container's rules stay while a live container in its network namespace shares
    // them (a pod's sandbox gone before its app containers), or one whose manifest cannot be
    // read may (named in `shared_by`: what it shares is unknown).
    let ((keep, sharers), shared_unrecorded): (Verdicts, HashSet<String>) = {
        // The namespace cookies of every attachment read in one hand-over.
        let host = Batched::new(ctx.host, readable.iter().map(|(_, m)| m.recorded()));
        let needs = Needs::judge(&host, readable.iter().map(|(_, m)| m));
        // A holder without a manifest (natledger's state lost) whose rules a live
        // container's manifest says it shares: its tagged rules stay for that container.
        let recorded: HashSet<&ContainerId> =
            readable.iter().map(|(_, m)| &m.container_id).collect();
        let shared_unrecorded = readable
            .iter()
            .flat_map(|(_, m)| m.shares.iter().map(|s| &s.holder))
            .filter(|holder| !recorded.contains(holder) && !needs.sharers(holder).is_empty())
            .map(ToString::to_string)
            .collect();
        let each = readable
            .iter()
            .map(|(_, m)| {
                let id = &m.container_id;
                let sharers = needs.sharers(id).into_iter();
                let maybe = m.shared_by.iter().map(ToString::to_string);
                (
                    needs.alive(id),
                    sharers
                        .map(|s| s.container_id.to_string())
                        .chain(maybe.filter(|s| unreadable_ids.contains(s)))
                        .collect(),
                )
            })
            .unzip();
        (each, shared_unrecorded)
    };
    if !opts.all {
        for id in shared_unrecorded {
            log::info!(
                "kept the rules tagged natledger:{id} (no manifest): a live container's \
                 manifest says it shares them"
            );
            judged.claims.kept.insert(id);
        }
    }
    for (((path, manifest), alive), kept_for) in readable.into_iter().zip(keep).zip(sharers) {
        let id = manifest.container_id.to_string();
        let needed = alive || !kept_for.is_empty();
        let summary = summaries.remove(&path);
        report.containers.push(
            ContainerReport::judged(&manifest, alive, kept_for, &path)
                .too_large(summary.as_ref().map(|s| s.bytes)),
        );
        if needed && !opts.all {
            judged.claims.kept.insert(id);
            if opts.repair && summary.is_none() && manifest.phase == Phase::Installed {
                let written = std::fs::metadata(&path).and_then(|m| m.modified());
                let written = written.unwrap_or(SystemTime::UNIX_EPOCH);
                judged.live.push((written, manifest));
            }
        } else {
            judged.claims.dead.insert(id);
            judged.doomed.push(Doomed {
                path,
                manifest,
                summary,
            });
        }
    }
    Ok(judged)
}

/// Read one table, plan, apply; re-plan from a new read once if the transaction fails.
/// With `repair` (the live manifests in create's order), what they lack goes back in the same
/// transaction, after the removals.
fn sweep_table(
    ctx: &Context,
    backend: Backend,
    family: Family,
    name: Table,
    claims: &Claims,
    repair: Option<&Ranked>,
    dry_run: bool,
) -> TableReport {
    let mut report = TableReport::new(backend, family, name.as_str());
    for attempt in 0..2 {
        let table = match ctx.netfilter.read(backend, family, name.as_str()) {
            Ok(Some(table)) => table,
            // A table gone whole (`nft flush ruleset`) holds nothing to remove, but may lack
            // live containers' rules.
            Ok(None) if repair.is_some_and(|live| needs(&live.manifests, backend, family)) => {
                crate::model::save::Table {
                    name: name.as_str().to_string(),
                    ..Default::default()
                }
            }
            Ok(None) => return report.with_state(TableState::Absent),
            // Legacy is only read when its table exists: rules may be there, unreadable.
            Err(e @ BackendError::ToolNotFound { .. })
                if backend.driver().capabilities().tables_seen_without_tools =>
            {
                return report.failed(format!("the {name} table exists, but {e}"));
            }
            Err(BackendError::ToolNotFound { .. }) => {
                return report.with_state(TableState::NotInstalled);
            }
            Err(e) => return report.failed(crate::chain::text(&e)),
        };
        let plan = plan(backend, name, &table, family, claims);
        report.blocked = plan.blocked.clone();
        let caps = backend.driver().capabilities();
        let none = Ranked::default();
        let live = repair.unwrap_or(&none);
        let fix = repair::repair(backend, caps, family, name, &table, &plan.rules, live);
        if (plan.batch.is_empty() && fix.ops.is_empty()) || dry_run {
            return report.planned(plan).restored(fix);
        }
        let applied = if fix.ops.is_empty() {
            native::apply(ctx, backend, family, name.as_str(), &plan)
        } else {
            let mut batch = plan.batch.clone();
            batch.ops.extend(fix.ops.iter().cloned());
            ctx.netfilter.apply(backend, family, &batch)
        };
        match applied {
            Ok(()) => {
                if !fix.rules.is_empty() {
                    log::info!(
                        "{backend}/{family}/{name}: put back {} rule(s) the table lacked: {}",
                        fix.rules.len(),
                        repair::describe(&fix.rules)
                    );
                }
                return report.planned(plan).restored(fix);
            }
            // The table changed between the read and the write (a rule natledger meant to
            // delete is gone, or a chain got a new reference): read it again.
            Err(e) if attempt == 0 => {
                log::info!(
                    "{backend}/{family}/{name}: {}; reading the table again",
                    Chain(&e)
                );
            }
            Err(e) => return report.failed(crate::chain::text(&e)),
        }
    }
    unreachable!("the second attempt returns")
}

/// Whether a live manifest records a rule of this backend and family (its tables need
/// natledger's chains and shared rules).
fn needs(live: &[&Manifest], backend: Backend, family: Family) -> bool {
    live.iter()
        .flat_map(|m| &m.rules)
        .any(|r| r.backend == backend && r.family == family)
}

/// Remove the manifests whose rules are gone; keep the others as `removing`, naming what may
/// remain. Temp files left by a crash go too (under the lock no write is in flight). A dry run
/// reports the same verdicts and changes nothing.
fn settle(locked: &Locked, opts: &SweepOptions, judged: Judged, report: &mut SweepReport) {
    let any_failed = report.tables.iter().any(|t| t.state == TableState::Failed);
    let mut fates: HashMap<PathBuf, Fate> = HashMap::new();
    let mut gone: Vec<PathBuf> = Vec::new();
    for Doomed {
        path,
        manifest,
        summary,
    } in judged.doomed
    {
        if let Some(summary) = summary {
            // Its rules went by their tag; the file stays, as it is, while a table that may
            // hold some could not be swept.
            let unsettled = unsettled(&report.tables);
            let left: Vec<&(Backend, Family, String)> = summary
                .places
                .iter()
                .filter(|(b, f, t)| unsettled.contains(&(*b, *f, t.as_str())))
                .collect();
            if left.is_empty() {
                fates.insert(path.clone(), Fate::Removed);
                gone.push(path);
            } else {
                let places: Vec<String> = left
                    .iter()
                    .map(|(b, f, t)| format!("{b}/{f}/{t}"))
                    .collect();
                report.errors.push(format!(
                    "rules of container {} may remain in {}; its manifest {} is kept as it is",
                    manifest.container_id,
                    places.join(", "),
                    path.display()
                ));
                fates.insert(path, Fate::KeptIncomplete);
            }
            continue;
        }
        let remaining = remaining(&manifest.rules, &report.tables);
        if remaining.is_empty() {
            fates.insert(path.clone(), Fate::Removed);
            gone.push(path);
            continue;
        }
        report.errors.push(format!(
            "{} rule(s) of container {} may remain in {}; its manifest is kept",
            remaining.len(),
            manifest.container_id,
            where_(&remaining)
        ));
        fates.insert(path, Fate::KeptIncomplete);
        if !opts.dry_run {
            let mut left = manifest;
            left.phase = Phase::Removing;
            left.rules = remaining;
            if let Err(e) = locked.store(&left) {
                report.errors.push(crate::chain::text(&e));
            }
        }
    }
    if opts.all && !any_failed {
        for path in judged.unreadable {
            fates.insert(path.clone(), Fate::Removed);
            gone.push(path);
        }
    }
    report.stale_temp_files = judged.temps.len();
    if opts.dry_run {
        for fate in fates.values_mut().filter(|f| **f == Fate::Removed) {
            *fate = Fate::WouldRemove;
        }
    } else {
        gone.extend(judged.temps);
        for e in locked.remove_files(&gone) {
            report.errors.push(crate::chain::text(&e));
        }
        for (path, fate) in &mut fates {
            if *fate == Fate::Removed && path.exists() {
                *fate = Fate::Kept;
            }
        }
    }
    report.set_fates(&fates);
}

/// The records of `rules` that may still be in force: those in a table the sweep could not
/// clean (failed, or its backend not installed). A nat table swept clean settles the DNATs
/// even when the same backend's filter table failed, and the other way round.
fn remaining(rules: &[RuleRecord], tables: &[TableReport]) -> Vec<RuleRecord> {
    let unsettled = unsettled(tables);
    rules
        .iter()
        .filter(|r| unsettled.contains(&(r.backend, r.family, r.table_name())))
        .cloned()
        .collect()
}

/// The tables the sweep could not clean (failed, or its backend not installed).
fn unsettled(tables: &[TableReport]) -> HashSet<(Backend, Family, &'static str)> {
    tables
        .iter()
        .filter(|t| matches!(t.state, TableState::Failed | TableState::NotInstalled))
        .map(|t| (t.backend, t.family, t.table))
        .collect()
}

fn where_(records: &[RuleRecord]) -> String {
    let mut places: Vec<String> = records
        .iter()
        .map(|r| format!("{}/{}", r.backend, r.family))
        .collect();
    places.sort();
    places.dedup();
    places.join(", ")
}

#[cfg(test)]
mod tests;
