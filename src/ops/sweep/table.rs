//! Step 2 of a sweep, one table of one driver and family: read, plan, apply (with
//! `--repair`, what live containers' manifests record and the table lacks goes back in the same
//! transaction); a transaction that fails because the table changed since the read is planned
//! again from a new read, once.

use crate::backend::{Backend, BackendError, Driver, Reading};
use crate::causes::Causes;
use crate::model::family::Family;
use crate::model::table::Table;
use crate::state::ledger::Manifest;

use super::report::{TableReport, TableState};
use super::{Claims, Context, Ranked, apply, plan, repair};

/// Read one table of `driver`, plan, apply; re-plan from a new read once if the transaction fails.
/// With `repair` (the live manifests in create's order), what they lack goes back in the same
/// transaction, after the removals.
pub(super) fn sweep_table(
    ctx: &Context,
    driver: &dyn Driver,
    family: Family,
    name: Table,
    claims: &Claims,
    repair: Option<&Ranked>,
    dry_run: bool,
) -> TableReport {
    let backend = driver.backend();
    let mut report = TableReport::new(backend, family, name.as_str());
    for attempt in 0..2 {
        let table = match read(ctx, driver, family, name, repair) {
            Ok(table) => table,
            Err(Unread::State(state)) => return report.with_state(state),
            Err(Unread::Failed(error)) => return report.failed(error),
        };
        let plan = plan(backend, name, &table, family, claims);
        report.blocked = plan.blocked.clone();
        let caps = driver.capabilities();
        let none = Ranked::default();
        let live = repair.unwrap_or(&none);
        let fix = repair::repair(backend, caps, family, name, &table, &plan.rules, live);
        if (plan.batch.is_empty() && fix.ops.is_empty()) || dry_run {
            return report.planned(plan).restored(fix);
        }
        let applied = if fix.ops.is_empty() {
            apply::apply(ctx, driver, family, name.as_str(), &plan)
        } else {
            let mut batch = plan.batch.clone();
            batch.ops.extend(fix.ops.iter().cloned());
            apply::apply_batch(ctx, driver, family, &batch)
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
                    Causes(&e)
                );
            }
            Err(e) => return report.failed(crate::causes::text(&e)),
        }
    }
    unreachable!("the second attempt returns")
}

/// Why a table was not read: absent, or its tools missing (a state to report), or a failure.
enum Unread {
    State(TableState),
    Failed(String),
}

/// One read of the table. A table gone whole (`nft flush ruleset`) reads as empty when
/// `repair`'s live manifests need it.
fn read(
    ctx: &Context,
    driver: &dyn Driver,
    family: Family,
    name: Table,
    repair: Option<&Ranked>,
) -> Result<crate::model::save::Dump, Unread> {
    match driver.read(&ctx.netfilter, family, name.as_str(), Reading::Ours) {
        Ok(Some(table)) => Ok(table),
        // A table gone whole (`nft flush ruleset`) holds nothing to remove, but may lack
        // live containers' rules.
        Ok(None) if repair.is_some_and(|live| needs(&live.manifests, driver.backend(), family)) => {
            Ok(crate::model::save::Dump {
                name: name.as_str().to_string(),
                ..Default::default()
            })
        }
        Ok(None) => Err(Unread::State(TableState::Absent)),
        // Legacy is only read when its table exists: rules may be there, unreadable.
        Err(e @ BackendError::ToolNotFound { .. })
            if driver.capabilities().tables_seen_without_tools =>
        {
            Err(Unread::Failed(format!("the {name} table exists, but {e}")))
        }
        Err(BackendError::ToolNotFound { .. }) => Err(Unread::State(TableState::NotInstalled)),
        Err(e) => Err(Unread::Failed(crate::causes::text(&e))),
    }
}

/// Whether a live manifest records a rule of this backend and family (its tables need
/// natledger's chains and shared rules).
fn needs(live: &[&Manifest], backend: Backend, family: Family) -> bool {
    live.iter()
        .flat_map(|m| &m.rules)
        .any(|r| r.backend == backend && r.family == family)
}
