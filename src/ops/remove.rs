//! Removal: poststop, and the routine that deletes one container's rules, shared with
//! create-runtime (dead holders of a port) and sweep.

use crate::backend::{Backend, BackendError, Native, NativeError};
use crate::family::Family;
use crate::fault;
use crate::layout::{is_owned_chain, tag};
use crate::ledger::{Locked, Manifest, Phase, RuleRecord};
use crate::oci::{ContainerId, HookInput, State};
use crate::rule::{Rule, is_user_chain_name};
use crate::save::{Batch, Op};

use super::{Context, Error};

/// What poststop did.
#[derive(Debug, PartialEq, Eq)]
pub enum Removed {
    /// No manifest and no `io.natledger.ports`: nothing was run.
    Skipped,
    Done {
        rules: usize,
    },
}

/// What [`remove_container`] did.
#[derive(Debug, Default)]
pub struct Removal {
    pub removed: usize,
    /// Recorded rules that may still exist because their removal failed.
    pub remaining: Vec<RuleRecord>,
    pub failures: Vec<BackendError>,
}

/// The poststop hook: delete exactly the rules natledger wrote for this container, wherever
/// they are now, then its manifest. Idempotent; keeps going past a failure.
pub fn poststop(ctx: &Context, state: &State) -> Result<Removed, Error> {
    let id: ContainerId = state.id.parse()?;
    if !ctx.ledger.has_manifest(&id) {
        // Without a manifest, only the annotation says whether natledger ever ran for it.
        match HookInput::from_state(state.clone()) {
            Ok(input) if input.ports().is_none() => return Ok(Removed::Skipped),
            Ok(_) => {}
            Err(e) => eprintln!("natledger: {e}; looking for rules tagged {}", tag(&id)),
        }
    }
    let locked = ctx.ledger.lock()?;
    let manifest = ctx.ledger.load(&id).unwrap_or_else(|e| {
        eprintln!(
            "natledger: {e}; removing the rules tagged {} instead",
            tag(&id)
        );
        None
    });
    fault::point(fault::POSTSTOP_LOCKED);
    let removal = remove_container(ctx, &locked, &id, manifest.as_ref());
    fault::point(fault::POSTSTOP_DELETED);
    settle(&locked, &id, manifest, removal)
}

/// Record the result of a removal: drop the manifest when nothing can remain, otherwise keep
/// the rules that may remain so that a later poststop or sweep retries them.
pub(super) fn settle(
    locked: &Locked,
    id: &ContainerId,
    manifest: Option<Manifest>,
    removal: Removal,
) -> Result<Removed, Error> {
    // The first failure travels in the returned error; print only the others here.
    for failure in removal.failures.iter().skip(1) {
        eprintln!("natledger: {failure}");
    }
    let Some(first) = removal.failures.first() else {
        locked.remove(id)?;
        return Ok(Removed::Done {
            rules: removal.removed,
        });
    };
    let first_error = first.to_string();
    if let Some(mut manifest) = manifest {
        manifest.phase = Phase::Removing;
        manifest.rules = removal.remaining.clone();
        locked.store(&manifest)?;
    }
    Err(Error::Incomplete {
        id: id.clone(),
        remaining: removal.remaining.len().max(1),
        first_error,
    })
}

/// Delete every rule natledger wrote for `id`: the manifest's rules, and any rule in a
/// natledger chain tagged `natledger:<id>`, in each backend and family where they exist now.
///
/// Per backend and family, one transaction. Where the manifest recorded rules, it first tries
/// deleting exactly those: on iptables-nft over netlink when the chains hold exactly the
/// recorded number of tagged rules (no process, [`crate::nftables`]), otherwise with one
/// `*-restore` (a transaction with an absent rule fails whole and changes nothing); if that
/// fails, it reads the table and deletes what is present. Only when
/// recorded rules were not all where they were written (or there is no usable manifest) does
/// it read the other backend too, since a ruleset saved from one backend and restored into
/// the other brings them along. Reading legacy costs nothing when its nat table does not
/// exist. `remaining` names every recorded rule not confirmed gone in a family where
/// something failed.
pub fn remove_container(
    ctx: &Context,
    _locked: &Locked,
    id: &ContainerId,
    manifest: Option<&Manifest>,
) -> Removal {
    let recorded: Vec<&RuleRecord> = manifest
        .map_or(&[][..], |m| &m.rules)
        .iter()
        .filter(|r| usable(r, id))
        .collect();
    // No usable record (no manifest, or one emptied by an earlier partial removal): the tags
    // are the only guide, so every family and backend is read.
    let scan_all = recorded.is_empty();
    let mut families: Vec<Family> = recorded.iter().map(|r| r.family).collect();
    if scan_all {
        families = Family::ALL.to_vec();
    }
    families.sort();
    families.dedup();
    let mut removal = Removal::default();
    for family in families {
        let mut backends = Backend::ALL;
        // Backends holding recorded rules first: if those are complete, the rest is skipped.
        backends.sort_by_key(|b| {
            !recorded
                .iter()
                .any(|r| r.backend == *b && r.family == family)
        });
        let mut unconfirmed: Vec<&RuleRecord> = recorded
            .iter()
            .copied()
            .filter(|r| r.family == family)
            .collect();
        let mut failed = false;
        for backend in backends {
            let here: Vec<&RuleRecord> = unconfirmed
                .iter()
                .copied()
                .filter(|r| r.backend == backend)
                .collect();
            if here.is_empty() && !scan_all && unconfirmed.is_empty() {
                continue;
            }
            match remove_in(ctx, backend, family, id, &here) {
                Ok(found) => {
                    removal.removed += found.deleted;
                    if found.complete {
                        unconfirmed.retain(|r| r.backend != backend);
                    }
                }
                Err(e) => {
                    failed = true;
                    removal.failures.push(e);
                }
            }
        }
        if failed {
            removal.remaining.extend(unconfirmed.into_iter().cloned());
        }
    }
    ctx.netfilter.release_native();
    removal
}

/// A record natledger can act on: a nat rule in a natledger chain that parses as a
/// natledger rule. Anything else in a manifest (damaged or edited by hand) is never deleted.
fn usable(record: &RuleRecord, id: &ContainerId) -> bool {
    let ok = record.table == "nat"
        && is_owned_chain(&record.chain)
        && is_user_chain_name(&record.chain)
        && Rule::parse_args(&record.rule).is_ok();
    if !ok {
        eprintln!(
            "natledger: ignoring an invalid record in the manifest of {id}: -t {} -A {} {}",
            record.table,
            record.chain,
            record.rule.join(" ")
        );
    }
    ok
}

/// Delete the recorded rules without a process: on nft every rule of the recorded chains
/// tagged for `id`, when they are as many as recorded ([`crate::nftables`]); on legacy exactly
/// the recorded rules, when all are present ([`crate::iptc`]).
fn delete_native(
    ctx: &Context,
    backend: Backend,
    family: Family,
    id: &ContainerId,
    recorded: &[&RuleRecord],
) -> Result<Native, NativeError> {
    match backend {
        Backend::Nft => {
            let mut expected: Vec<(&str, usize)> = Vec::new();
            for r in recorded {
                match expected.iter_mut().find(|(c, _)| *c == r.chain) {
                    Some((_, n)) => *n += 1,
                    None => expected.push((r.chain.as_str(), 1)),
                }
            }
            Ok(ctx
                .netfilter
                .delete_tagged_nft(family, &tag(id), &expected)?)
        }
        Backend::Legacy => {
            let Ok(parsed) = recorded
                .iter()
                .map(|r| Ok((r.chain.as_str(), Rule::parse_args(&r.rule)?)))
                .collect::<Result<Vec<_>, crate::rule::RuleParseError>>()
            else {
                return Ok(Native::Declined);
            };
            let rules: Vec<(&str, &Rule)> = parsed.iter().map(|(c, r)| (*c, r)).collect();
            Ok(ctx.netfilter.delete_legacy(family, "nat", &rules)?)
        }
    }
}

struct Found {
    deleted: usize,
    /// Every recorded rule was present (and is now deleted).
    complete: bool,
}

fn remove_in(
    ctx: &Context,
    backend: Backend,
    family: Family,
    id: &ContainerId,
    recorded: &[&RuleRecord],
) -> Result<Found, BackendError> {
    // Whether deleting exactly the recorded rules is worth a try: not when the native path
    // has just seen that the chains hold other tagged rules too (a copy, say).
    let mut exact_first = !recorded.is_empty();
    if exact_first {
        match delete_native(ctx, backend, family, id, recorded) {
            Ok(Native::Done(deleted)) => {
                return Ok(Found {
                    deleted,
                    complete: true,
                });
            }
            Ok(Native::Declined) => exact_first = false,
            Ok(Native::Off) => {}
            // Nothing was changed; the restore below reports what is really wrong.
            Err(e) => eprintln!(
                "natledger: {e}; using {}-{}-restore",
                family.tool_stem(),
                backend.suffix()
            ),
        }
    }
    if exact_first {
        let mut exact = Batch::nat();
        exact.ops = recorded
            .iter()
            .map(|r| Op::Delete(r.chain.clone(), r.rule.clone()))
            .collect();
        if ctx.netfilter.apply(backend, family, &exact).is_ok() {
            return Ok(Found {
                deleted: recorded.len(),
                complete: true,
            });
        }
    }
    let table = match ctx.netfilter.read_nat(backend, family) {
        Ok(table) => table,
        // A backend whose tools are not installed holds nothing unless we wrote there.
        Err(BackendError::ToolNotFound { .. }) if recorded.is_empty() => None,
        Err(e) => return Err(e),
    };
    let Some(table) = table else {
        return Ok(Found {
            deleted: 0,
            complete: recorded.is_empty(),
        });
    };
    let wanted: Vec<(&str, Rule)> = recorded
        .iter()
        .filter_map(|r| Some((r.chain.as_str(), Rule::parse_args(&r.rule).ok()?)))
        .collect();
    let mut seen = vec![false; wanted.len()];
    let tag = tag(id);
    let mut batch = Batch::nat();
    for saved in table.rules.iter().filter(|r| is_owned_chain(&r.chain)) {
        let Ok(rule) = Rule::parse_args(&saved.args) else {
            continue;
        };
        let hit = wanted
            .iter()
            .position(|(c, w)| *c == saved.chain && *w == rule);
        if let Some(i) = hit {
            seen[i] = true;
        }
        if hit.is_some() || rule.comment.as_deref() == Some(tag.as_str()) {
            batch
                .ops
                .push(Op::Delete(saved.chain.clone(), saved.args.clone()));
        }
    }
    if !batch.is_empty() {
        ctx.netfilter.apply(backend, family, &batch)?;
    }
    Ok(Found {
        deleted: batch.ops.len(),
        complete: seen.iter().all(|s| *s),
    })
}
