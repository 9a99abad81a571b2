//! One family's rules written: one transaction per table, filter before nat, in-process on
//! legacy when the shared chains exist, else one restore process; and a failed create's
//! rules and manifest undone ([`roll_back`]).

use super::*;

/// Why [`install`] failed, and whether one of the family's tables may have been written.
pub(super) struct InstallError {
    pub(super) error: BackendError,
    pub(super) partial: bool,
}

/// Install one family's rules: one transaction per table, filter before nat (the accept is in
/// force before the DNAT is). First try assuming the shared chains and rules (the jumps and
/// the localhost guard, [`shared_rules`]) exist: on legacy in-process ([`crate::iptc`],
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
    ctx: &Context,
    family: Family,
    rules: &[&RuleRecord],
) -> Result<Vec<Table>, InstallError> {
    if ctx.backend == Backend::Nftables {
        return install_own(ctx, family, rules)
            .map(|()| Vec::new())
            .map_err(|error| InstallError {
                error,
                partial: false,
            });
    }
    let mut partial = false;
    let mut pending: Vec<(Table, Vec<Placement>)> = Vec::new();
    for table in Table::ALL {
        let here: Vec<&RuleRecord> = rules.iter().copied().filter(|r| r.is_in(table)).collect();
        if here.is_empty() {
            continue;
        }
        let placed = placements(&here);
        if ctx.backend == Backend::Legacy
            && pending.is_empty()
            && insert_native(ctx, family, table, &placed)
        {
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
            for (chain, jump) in shared_rules(ctx.backend, table.as_str(), family) {
                batch.ops.push(Op::Check(chain.to_string(), jump.to_args()));
            }
            push_rules(&mut batch, placed);
            batch
        })
        .collect();
    let first_block = fast[0].render().lines().count();
    match ctx.netfilter.apply_all(ctx.backend, family, &fast) {
        Ok(()) => return Ok(skipped),
        // The first table's transaction failed: nothing was committed.
        Err(BackendError::Failed { line: Some(n), .. }) if n <= first_block => {}
        // The tables before the failed one are committed (they show every rule already).
        Err(_) => partial |= pending.len() > 1,
    }
    for (table, placed) in &pending {
        let written = write_table(ctx, family, *table, placed);
        match written {
            Ok(wrote) => partial |= wrote,
            Err(error) if *table == Table::Filter => {
                eprintln!(
                    "natledger: warning: the {family} forward accept was not written ({error}); \
                     where FORWARD drops, these ports answer only from this host (doctor: \
                     forward-dropped)"
                );
                skipped.push(Table::Filter);
            }
            Err(error) => return Err(InstallError { error, partial }),
        }
    }
    Ok(skipped)
}

/// Undo a create that failed once its manifest was written ahead: remove the rules of
/// `applied` (what may have been written), then the manifest. Deleting and unlinking need no
/// room, so a full state directory ends with neither. When a rule cannot be removed, the
/// manifest keeps it (phase removing) for poststop or sweep; if even that cannot be recorded,
/// the manifest written ahead, which names every rule this create may have written, stays.
pub(super) fn roll_back(
    ctx: &Context,
    locked: &Locked,
    applied: Manifest,
    after: &mut AfterWrites,
) -> Result<(), Error> {
    let id = applied.container_id.clone();
    if applied.rules.is_empty() {
        locked.remove(&id)?;
        return Ok(());
    }
    let removal = remove_container(ctx, locked, &id, Some(&applied));
    after.stale_flows.extend(removal.flows.iter().copied());
    if let Err(undo) = settle(locked, &id, Some(applied), removal) {
        eprintln!("natledger: rollback incomplete: {undo}");
    }
    Ok(())
}

/// On the nftables backend: one read of natledger's table and one nf_tables transaction for
/// every table (`crate::nftables::own`): the table, its chains and the shared rules (the
/// jumps, the localhost guard) where missing, then the rules. All or nothing, so a failure
/// leaves nothing of this family written. The IPv4 guard is ensured by every IPv4 create, so
/// route_localnet is never on without it.
fn install_own(ctx: &Context, family: Family, rules: &[&RuleRecord]) -> Result<(), BackendError> {
    let own = ctx.netfilter.read_own_table(family)?;
    let mut batches = Vec::with_capacity(Table::ALL.len());
    for table in Table::ALL {
        let here: Vec<&RuleRecord> = rules.iter().copied().filter(|r| r.is_in(table)).collect();
        let placed = placements(&here);
        let dump = own
            .table
            .as_ref()
            .map(|t| t.logical(table.as_str()))
            .unwrap_or_default();
        batches.push(missing(ctx, family, table, &dump, &placed));
    }
    // Planned against that same read: the ledger lock is held throughout.
    ctx.netfilter.apply_own_to(family, Some(own), &batches)
}

/// The batch that makes `table` (as `dump` shows it) hold natledger's chains and shared
/// rules and `placed`: empty when it holds them all already.
fn missing(
    ctx: &Context,
    family: Family,
    table: Table,
    dump: &crate::save::Table,
    placed: &[Placement],
) -> Batch {
    let mut full = Batch::new(table.as_str());
    for chain in owned_chains(ctx.backend, table.as_str(), family) {
        if !dump.has_chain(chain) {
            full.ops.push(Op::DeclareChain(chain.to_string()));
        }
    }
    for (chain, shared) in shared_rules(ctx.backend, table.as_str(), family) {
        let present = dump
            .rules_in(chain)
            .any(|r| Rule::parse_args(&r.args).is_ok_and(|r| r == shared));
        if !present {
            full.ops.push(jump_op(dump, chain, shared.to_args()));
        }
    }
    if full.ops.is_empty() && all_present(dump, placed) {
        return full;
    }
    push_rules(&mut full, placed);
    full
}

/// Read `table` and write what is missing of `placed`, its chains and shared rules included;
/// whether anything was written (a table showing every rule already was committed before).
pub(super) fn write_table(
    ctx: &Context,
    family: Family,
    table: Table,
    placed: &[Placement],
) -> Result<bool, BackendError> {
    let dump = ctx
        .netfilter
        .read(ctx.backend, family, table.as_str())?
        .unwrap_or_default();
    let full = missing(ctx, family, table, &dump, placed);
    if full.is_empty() {
        return Ok(false);
    }
    ctx.netfilter.apply(ctx.backend, family, &full)?;
    Ok(true)
}

/// On legacy, insert one table's rules in-process; whether that was done.
pub(super) fn insert_native(
    ctx: &Context,
    family: Family,
    table: Table,
    placed: &[Placement],
) -> bool {
    let rules: Vec<(&str, Rule, Place)> = placed
        .iter()
        .map(|(chain, rule, place)| (*chain, (*rule).clone(), *place))
        .collect();
    match ctx.netfilter.insert_legacy(
        family,
        table.as_str(),
        &rules,
        &shared_rules(ctx.backend, table.as_str(), family),
    ) {
        Ok(Native::Done(_)) => true,
        Ok(Native::Declined | Native::Off) => false,
        // Nothing was written; the restore reports what is really wrong.
        Err(e) => {
            eprintln!(
                "natledger: {e}; using {}-legacy-restore",
                family.tool_stem()
            );
            false
        }
    }
}

/// Whether every rule of `placed` is in the dump (as many times as placed).
pub(super) fn all_present(dump: &crate::save::Table, placed: &[Placement]) -> bool {
    placed.iter().all(|(chain, rule, _)| {
        let wanted = placed
            .iter()
            .filter(|(c, r, _)| c == chain && r == rule)
            .count();
        let args = rule.to_args();
        dump.rules_in(chain).filter(|r| r.args == args).count() >= wanted
    })
}

pub(super) type Placement<'a> = (&'a str, &'a Rule, Place);

/// Where each rule goes: DNAT rules to the top of their chain (newest container first, in
/// mapping order, so they are inserted in reverse), masquerade rules appended.
/// Records not typed (none from a create) have no place.
pub(super) fn placements<'a>(rules: &[&'a RuleRecord]) -> Vec<Placement<'a>> {
    let typed = |r: &&&'a RuleRecord| Some((r.chain.as_str(), r.rule()?));
    let first = rules.iter().rev().filter(|r| goes_first(&r.chain));
    let last = rules.iter().filter(|r| !goes_first(&r.chain));
    first
        .filter_map(|r| typed(&r).map(|(c, rule)| (c, rule, Place::First)))
        .chain(last.filter_map(|r| typed(&r).map(|(c, rule)| (c, rule, Place::Last))))
        .collect()
}

pub(super) fn push_rules(batch: &mut Batch, placed: &[Placement]) {
    for (chain, rule, place) in placed {
        let (chain, args) = (chain.to_string(), rule.to_args());
        batch.ops.push(match place {
            Place::First => Op::InsertFirst(chain, args),
            Place::Last => Op::Append(chain, args),
        });
    }
}
