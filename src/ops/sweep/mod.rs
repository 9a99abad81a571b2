//! `natledger sweep`: remove what dead containers left behind, and every natledger rule no
//! live container claims, in both backends and both families.
//!
//! One pass, under the ledger lock (so hooks wait while it runs, and it never sees a
//! container half-created):
//! 1. judge every manifest (`judge.rs`): alive (pid, start time and boot all match), dead, or
//!    unreadable (kept: its container might be alive); one only too large to read whole is
//!    judged from its liveness fields (`ledger::summarize`, read before the lock);
//! 2. per driver (backend), family and table (nat, filter), one read and at most one `*-restore`
//!    transaction (`table.rs`): natledger's rules tagged for a container that is not alive go,
//!    wherever they are now (see [`plan`]); a transaction that fails because the table changed
//!    since the read is planned again from a new read, once; then the flows of the DNATs that
//!    went or came back are forgotten;
//! 3. dead manifests go once no table that could hold their rules failed; otherwise they stay
//!    (phase `removing`, naming the rules that may remain) for the next sweep (`settle.rs`).
//!
//! Records carry their container's tag, so the tagged rules in natledger's chains are exactly
//! the recorded rules, plus any copy a ruleset restore or a backend switch made of them.

mod apply;
mod held;
mod judge;
mod leftover;
mod order;
mod plan;
mod repair;
mod report;
mod settle;
mod table;
mod wait;

pub use held::HeldBack;
pub use order::{Ranked, rank};
pub use plan::{Claims, Reason, Removed, TablePlan, plan};
pub use repair::{Repair, Restored, repair};
pub use report::{ContainerReport, Fate, Liveness, SweepReport, TableReport, TableState};
pub use wait::{QUIET, wait_for_exits};

use std::time::{Duration, Instant, SystemTime};

use crate::fault;
use crate::model::family::Family;
use crate::model::oci::ContainerId;
use crate::model::table::Table;
use crate::state::ledger::Manifest;

use super::after_writes::after_writes;
use super::{Context, Error, flows};
use judge::judge;
use settle::settle;
use table::sweep_table;

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

    let live: Vec<(SystemTime, &Manifest)> = judged
        .live
        .iter()
        .filter(|(_, m)| !opts.hold.contains(&m.container_id))
        .map(|(t, m)| (*t, m))
        .collect();
    let live = rank(&live, &judged.stacks);
    sweep_tables(ctx, opts, &judged.claims, &live, &mut report);
    fault::point(fault::SWEEP_APPLIED);
    if !opts.dry_run {
        after_tables(ctx, opts, &mut report);
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

/// Every table of every driver of the context and both families, each swept ([`table::sweep_table`]) and
/// reported. With `--repair`, `live` (in create's order) is put back where the tables lack it.
fn sweep_tables(
    ctx: &Context,
    opts: &SweepOptions,
    claims: &Claims,
    live: &Ranked,
    report: &mut SweepReport,
) {
    let mut first = true;
    // A repair writes filter before nat, as create does: a DNAT put back finds its accept.
    let order: Vec<Table> = match opts.repair {
        true => Table::ALL.to_vec(),
        false => Table::ALL.into_iter().rev().collect(),
    };
    for driver in ctx.drivers.iter().copied() {
        for family in Family::ALL {
            // nat first: a DNAT is never left in force without its accept, so when the nat
            // table fails its filter table is left as it is too (its records stay).
            let mut nat_failed = false;
            for name in order.iter().copied() {
                let table = if nat_failed && name == Table::Filter {
                    TableReport::new(driver.backend(), family, name.as_str()).failed(
                        "not swept: the nat table failed, and its DNATs keep their accepts"
                            .to_string(),
                    )
                } else {
                    let repair = opts.repair.then_some(live);
                    sweep_table(ctx, driver, family, name, claims, repair, opts.dry_run)
                };
                nat_failed |= name == Table::Nat && table.state == TableState::Failed;
                if !opts.dry_run && !table.rules_removed.is_empty() && std::mem::take(&mut first) {
                    fault::point(fault::SWEEP_FIRST_TABLE_APPLIED);
                }
                report.add_table(table);
            }
        }
    }
}

/// Once every table is done: with `--all` the tables emptied go, then the flows of the DNAT
/// rules that went or came back are forgotten and the netlink socket is released
/// ([`after_writes`]). The forwards cache is not carried: a sweep notes no generation
/// before its writes, so the next create reads the forwards again.
fn after_tables(ctx: &Context, opts: &SweepOptions, report: &mut SweepReport) {
    let removed = report.tables.iter().flat_map(|t| {
        let restored = t.rules_restored.iter().map(|r| r.rule.as_slice());
        t.rules_removed
            .iter()
            .map(|r| r.rule.as_slice())
            .chain(restored)
            .map(move |rule| (t.family, rule))
    });
    let stale_flows = flows::of_saved(removed);
    if opts.all {
        leftover::drop_emptied_tables(ctx, report);
    }
    after_writes(ctx, &stale_flows, None);
}
