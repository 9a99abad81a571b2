//! The write strategy the iptables drivers share (`install`, what their
//! [`Driver::install`] is), and the read-and-diff every backend uses: one family's rules, one
//! transaction per table, filter before nat; first assuming the shared chains and rules exist
//! (in-process where the driver can, `Primitives::insert_in_process`, else one `*-restore`
//! checking them with `-C`), then reading each table not yet written and writing what is
//! missing ([`missing`]). Removal's side is `super::remove`.

use crate::kernel::iptc::Place;
use crate::model::capabilities::Capabilities;
use crate::model::family::Family;
use crate::model::layout::{goes_first, jump_op, owned_chains, shared_rules};
use crate::model::rule::Rule;
use crate::model::save::{Batch, Op};
use crate::model::table::Table;
use crate::state::ledger::RuleRecord;

use super::driver::{Primitives, Reading};
use super::{BackendError, Driver, Netfilter};

/// Why `install` failed, and whether one of the family's tables may have been written.
#[derive(Debug)]
pub struct InstallError {
    pub error: BackendError,
    pub partial: bool,
}

/// Install one family's rules: one transaction per table, filter before nat (the accept is in
/// force before the DNAT is). First try assuming the shared chains and rules (the jumps and
/// the localhost guard, [`shared_rules`]) exist: on legacy in-process ([`crate::kernel::iptc`],
/// declined unless they do; once a table is left to a process, so are the ones after it, to
/// keep the order), otherwise with one restore process whose transaction per table checks
/// that table's shared rules with `-C` (a missing one fails it atomically; the tables before
/// it stay committed). Then read each table not yet written and create what is missing: a
/// host written before the guard existed gets it on its next create.
///
/// The filter accept is needed only where FORWARD drops, and the nat rules forward from the
/// node whatever happens to it: a filter table natledger cannot write (an nft `ip filter`
/// table iptables-nft cannot read, a kernel without the filter table) is a warning, and is
/// returned, so that the manifest records exactly what was written.
pub(super) fn install(
    driver: &(impl Primitives + ?Sized),
    nf: &Netfilter,
    family: Family,
    rules: &[&RuleRecord],
) -> Result<Vec<Table>, InstallError> {
    let caps = driver.capabilities();
    let mut partial = false;
    let mut pending: Vec<(Table, Vec<Placement>)> = Vec::new();
    for table in Table::ALL {
        let here: Vec<&RuleRecord> = rules.iter().copied().filter(|r| r.is_in(table)).collect();
        if here.is_empty() {
            continue;
        }
        let placed = placements(&here);
        if pending.is_empty() && driver.insert_in_process(nf, family, table, &placed) {
            partial = true;
            continue;
        }
        pending.push((table, placed));
    }
    let mut skipped = Vec::new();
    if pending.is_empty() {
        return Ok(skipped);
    }
    let fast: Vec<Batch> = pending
        .iter()
        .map(|(table, placed)| {
            let mut batch = Batch::new(table.as_str());
            for (chain, jump) in shared_rules(caps, table.as_str(), family) {
                batch.ops.push(Op::Check(chain.to_string(), jump.to_args()));
            }
            push_rules(&mut batch, placed);
            batch
        })
        .collect();
    let first_block = fast[0].render().lines().count();
    match driver.apply_batches(nf, family, &fast) {
        Ok(()) => return Ok(skipped),
        // The first table's transaction failed: nothing was committed.
        Err(BackendError::Failed { line: Some(n), .. }) if n <= first_block => {}
        // The tables before the failed one are committed (they show every rule already).
        Err(_) => partial |= pending.len() > 1,
    }
    for (table, placed) in &pending {
        let written = write_table(driver, nf, family, *table, placed);
        match written {
            Ok(wrote) => partial |= wrote,
            Err(error) if *table == Table::Filter => {
                log::warn!(
                    "the {family} forward accept was not written ({}); where FORWARD \
                     drops, these ports answer only from this host (doctor: forward-dropped)",
                    crate::chain::Chain(&error)
                );
                skipped.push(Table::Filter);
            }
            Err(error) => return Err(InstallError { error, partial }),
        }
    }
    Ok(skipped)
}

/// The batch that makes `table` (as `dump` shows it) hold natledger's chains and shared
/// rules and `placed`: empty when it holds them all already.
pub fn missing(
    driver: &(impl Driver + ?Sized),
    family: Family,
    table: Table,
    dump: &crate::model::save::Table,
    placed: &[Placement],
) -> Batch {
    let mut full = Batch::new(table.as_str());
    full.ops = missing_shared(driver.capabilities(), family, table, dump);
    if full.ops.is_empty() && all_present(dump, placed) {
        return full;
    }
    push_rules(&mut full, placed);
    full
}

/// The operations that make `table` (as `dump` shows it) hold natledger's chains and shared
/// rules (the jumps, the localhost guard): none when it holds them all. Shared by create's
/// read-and-diff ([`missing`]) and `sweep --repair`.
pub fn missing_shared(
    caps: Capabilities,
    family: Family,
    table: Table,
    dump: &crate::model::save::Table,
) -> Vec<Op> {
    let mut ops = Vec::new();
    for chain in owned_chains(caps, table.as_str(), family) {
        if !dump.has_chain(chain) {
            ops.push(Op::DeclareChain(chain.to_string()));
        }
    }
    for (chain, shared) in shared_rules(caps, table.as_str(), family) {
        let present = dump
            .rules_in(chain)
            .any(|r| Rule::parse_args(&r.args).is_ok_and(|r| r == shared));
        if !present {
            ops.push(jump_op(dump, chain, shared.to_args()));
        }
    }
    ops
}

/// Read `table` and write what is missing of `placed`, its chains and shared rules included;
/// whether anything was written (a table showing every rule already was committed before).
fn write_table(
    driver: &(impl Primitives + ?Sized),
    nf: &Netfilter,
    family: Family,
    table: Table,
    placed: &[Placement],
) -> Result<bool, BackendError> {
    let dump = driver
        .read(nf, family, table.as_str(), Reading::Ours)?
        .unwrap_or_default();
    let full = missing(driver, family, table, &dump, placed);
    if full.is_empty() {
        return Ok(false);
    }
    driver.apply_batches(nf, family, std::slice::from_ref(&full))?;
    Ok(true)
}

/// Whether every rule of `placed` is in the dump (as many times as placed).
pub fn all_present(dump: &crate::model::save::Table, placed: &[Placement]) -> bool {
    placed.iter().all(|(chain, rule, _)| {
        let wanted = placed
            .iter()
            .filter(|(c, r, _)| c == chain && r == rule)
            .count();
        let args = rule.to_args();
        dump.rules_in(chain).filter(|r| r.args == args).count() >= wanted
    })
}

pub type Placement<'a> = (&'a str, &'a Rule, Place);

/// Where each rule goes: DNAT rules to the top of their chain (newest container first, in
/// mapping order, so they are inserted in reverse), masquerade rules appended.
/// Records not typed (none from a create) have no place.
pub fn placements<'a>(rules: &[&'a RuleRecord]) -> Vec<Placement<'a>> {
    let typed = |r: &&&'a RuleRecord| Some((r.chain.as_str(), r.rule()?));
    let first = rules.iter().rev().filter(|r| goes_first(&r.chain));
    let last = rules.iter().filter(|r| !goes_first(&r.chain));
    first
        .filter_map(|r| typed(&r).map(|(c, rule)| (c, rule, Place::First)))
        .chain(last.filter_map(|r| typed(&r).map(|(c, rule)| (c, rule, Place::Last))))
        .collect()
}

pub fn push_rules(batch: &mut Batch, placed: &[Placement]) {
    for (chain, rule, place) in placed {
        let (chain, args) = (chain.to_string(), rule.to_args());
        batch.ops.push(match place {
            Place::First => Op::InsertFirst(chain, args),
            Place::Last => Op::Append(chain, args),
        });
    }
}
