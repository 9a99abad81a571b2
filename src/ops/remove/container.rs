//! Deleting one container's rules: the recorded ones where they were written, else what a
//! read of each table shows tagged for it, per backend, family and table.

use std::collections::HashMap;

use crate::backend::{Backend, BackendError, Native, NativeError};
use crate::chain::Chain;
use crate::kernel::conntrack::Flows;
use crate::model::echo::{MESSAGE, limit};
use crate::model::family::Family;
use crate::model::layout::{Owner, is_owned_chain, owner, tag};
use crate::model::oci::ContainerId;
use crate::model::rule::{Rule, is_user_chain_name};
use crate::model::save::{Batch, Op, SavedRule};
use crate::model::table::Table;
use crate::state::ledger::{Locked, Manifest, RuleRecord};

use super::super::sweep::REWRITE_AT;
use super::super::{Context, flows};
use super::native::delete_found;

/// What [`remove_container`] did.
#[derive(Debug, Default)]
pub struct Removal {
    pub removed: usize,
    /// Recorded rules that may still exist because their removal failed.
    pub remaining: Vec<RuleRecord>,
    pub failures: Vec<BackendError>,
    /// The UDP and SCTP flows of the DNAT rules deleted, whose conntrack entries the caller
    /// forgets once every rule change of the operation is done ([`flows::forget`]).
    pub flows: Vec<Flows>,
}

/// Delete every rule natledger wrote for `id`: the manifest's rules, and any rule in a
/// natledger chain tagged `natledger:<id>`, in each backend and family where they exist now.
///
/// Per backend and family, one transaction. Where the manifest recorded rules, it first tries
/// deleting exactly those: on iptables-nft over netlink when the chains hold exactly the
/// recorded number of tagged rules (no process, [`crate::kernel::nftables`]), otherwise with one
/// `*-restore` (a transaction with an absent rule fails whole and changes nothing); if that
/// fails, it reads the table and deletes what is present (a chain most of which goes
/// rewritten, as sweep does; on iptables-nft over netlink where it can be). Only when
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
    // A container that only shares others' rules never had rules of its own.
    if manifest.is_some_and(|m| m.mappings.is_empty() && m.rules.is_empty()) {
        return Removal::default();
    }
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
            // The tables to look in: every table natledger writes without a record to go
            // by, else those of the records still unconfirmed.
            let tables: Vec<Table> = Table::ALL
                .into_iter()
                .rev()
                .filter(|t| scan_all || unconfirmed.iter().any(|r| r.is_in(*t)))
                .collect();
            let found = remove_in(ctx, backend, family, id, &tables, &here);
            removal.removed += found.deleted;
            for flow in found.flows {
                if !removal.flows.contains(&flow) {
                    removal.flows.push(flow);
                }
            }
            unconfirmed.retain(|r| {
                r.backend != backend || !r.table().is_some_and(|t| found.complete.contains(&t))
            });
            failed |= !found.failures.is_empty();
            removal.failures.extend(found.failures);
        }
        if failed {
            removal.remaining.extend(unconfirmed.into_iter().cloned());
        }
    }
    removal
}

/// A record natledger can act on: a rule in a natledger chain of a table natledger writes,
/// tagged for this very container (`layout::owner`), that parses as a natledger rule.
/// Anything else in a manifest (damaged or edited by hand: another container's rule, an
/// untagged rule, a rule in a built-in chain, a shared jump) is never deleted, and is named.
fn usable(record: &RuleRecord, id: &ContainerId) -> bool {
    let ok = record.rule().is_some()
        && is_owned_chain(&record.chain)
        && is_user_chain_name(&record.chain)
        && owner(&record.chain, &record.args()) == Owner::Container(id.as_str());
    if !ok {
        let shown = record.shown();
        log::warn!(
            "the manifest of {id} records a rule that is not one natledger wrote for {id} in \
             its own chains; it is left alone: {}",
            limit(&shown, MESSAGE)
        );
    }
    ok
}

/// What [`remove_in`] found in one backend and family.
#[derive(Default)]
struct Found {
    deleted: usize,
    /// The tables where every recorded rule was present (and is now deleted).
    complete: Vec<Table>,
    failures: Vec<BackendError>,
    /// The UDP and SCTP flows of the DNAT rules deleted.
    flows: Vec<Flows>,
}

/// The flows of the DNAT rules among `records`.
fn flows_of(family: Family, records: &[&RuleRecord]) -> Vec<Flows> {
    flows::of_rules(records.iter().filter_map(|r| Some((family, r.rule()?))))
}

/// Remove the container's rules from `tables` of one backend and family (nat first). A failing
/// nat table keeps that backend and family's filter rules too: deleting the accept while the
/// DNAT may still be in force would leave it dropping its packets. Their records stay for the
/// next poststop or sweep.
fn remove_in(
    ctx: &Context,
    backend: Backend,
    family: Family,
    id: &ContainerId,
    tables: &[Table],
    recorded: &[&RuleRecord],
) -> Found {
    let mut found = Found::default();
    // Whether deleting exactly the recorded rules is worth a try: not when the native path
    // has just seen that the chains hold other tagged rules too (a copy, say).
    let mut exact_first = !recorded.is_empty();
    if exact_first {
        match backend
            .driver()
            .delete_recorded(&ctx.netfilter, family, id, recorded)
        {
            Ok(Native::Done(deleted)) => {
                found.deleted = deleted;
                found.complete = tables.to_vec();
                found.flows = flows_of(family, recorded);
                return found;
            }
            Ok(Native::Declined) => exact_first = false,
            Ok(Native::Off) => {}
            Err(e) => falling_back(&e, backend, family),
        }
    }
    let mut nat_failed = false;
    for &table in tables {
        if nat_failed && table == Table::Filter {
            continue;
        }
        let here: Vec<&RuleRecord> = recorded
            .iter()
            .copied()
            .filter(|r| r.is_in(table))
            .collect();
        match remove_table(ctx, backend, family, table, id, &here, exact_first) {
            Ok(gone) => {
                found.deleted += gone.deleted;
                if gone.complete {
                    found.complete.push(table);
                }
                found.flows.extend(gone.flows);
            }
            Err(e) => {
                nat_failed |= table == Table::Nat;
                found.failures.push(e);
            }
        }
    }
    found
}

/// What [`remove_table`] deleted.
struct Gone {
    deleted: usize,
    /// Every recorded rule was there.
    complete: bool,
    flows: Vec<Flows>,
}

/// Remove the container's rules from one table: exactly the recorded ones (in-process on
/// legacy, else with one restore), or, if that fails, what a read of the table shows tagged
/// for it or recorded.
fn remove_table(
    ctx: &Context,
    backend: Backend,
    family: Family,
    table: Table,
    id: &ContainerId,
    recorded: &[&RuleRecord],
    mut exact_first: bool,
) -> Result<Gone, BackendError> {
    exact_first &= !recorded.is_empty();
    let all_recorded = |deleted| Gone {
        deleted,
        complete: true,
        flows: flows_of(family, recorded),
    };
    if exact_first {
        match backend
            .driver()
            .delete_recorded_in_table(&ctx.netfilter, family, recorded)
        {
            Ok(Native::Done(deleted)) => return Ok(all_recorded(deleted)),
            Ok(Native::Declined) => exact_first = false,
            Ok(Native::Off) => {}
            Err(e) => falling_back(&e, backend, family),
        }
    }
    if exact_first {
        let mut exact = Batch::new(table.as_str());
        exact.ops = recorded
            .iter()
            .map(|r| Op::Delete(r.chain.clone(), r.args().into_owned()))
            .collect();
        if ctx.netfilter.apply(backend, family, &exact).is_ok() {
            return Ok(all_recorded(recorded.len()));
        }
    }
    // Without records, a table whose natledger chains hold nothing tagged for `id` (told
    // without a process where the driver can) is not read.
    if recorded.is_empty()
        && backend
            .driver()
            .holds_tagged(&ctx.netfilter, family, table, &tag(id))
            == Some(false)
    {
        return Ok(Gone {
            deleted: 0,
            complete: true,
            flows: Vec::new(),
        });
    }
    let dump = match ctx.netfilter.read(backend, family, table.as_str()) {
        Ok(dump) => dump,
        // A backend whose tools are not installed holds nothing unless we wrote there.
        Err(BackendError::ToolNotFound { .. }) if recorded.is_empty() => None,
        Err(e) => return Err(e),
    };
    let Some(dump) = dump else {
        return Ok(Gone {
            deleted: 0,
            complete: recorded.is_empty(),
            flows: Vec::new(),
        });
    };
    // The records by rule, each identical record once per copy: one lookup per saved rule,
    // so the pass is linear in the table (thousands of records against thousands of rules).
    let mut unseen: HashMap<(&str, Rule), usize> = HashMap::new();
    for r in recorded {
        if let Some(rule) = r.rule() {
            *unseen.entry((r.chain.as_str(), rule.clone())).or_default() += 1;
        }
    }
    let tag = tag(id);
    // Per natledger chain, in the table's order: its rules that go, those that stay, and
    // whether these are all natledger's own (parsed, a container's or shared).
    let mut cuts: Vec<Cut> = Vec::new();
    let mut at: HashMap<&str, usize> = HashMap::new();
    for saved in dump.rules.iter().filter(|r| is_owned_chain(&r.chain)) {
        let i = *at.entry(saved.chain.as_str()).or_insert_with(|| {
            cuts.push(Cut::default());
            cuts.len() - 1
        });
        let cut = &mut cuts[i];
        let Ok(rule) = Rule::parse_args(&saved.args) else {
            cut.kept.push(saved);
            cut.foreign = true;
            continue;
        };
        let tagged = rule.comment.as_deref() == Some(tag.as_str());
        let is_recorded = match unseen.get_mut(&(saved.chain.as_str(), rule)) {
            Some(left) => {
                *left = left.saturating_sub(1);
                true
            }
            None => false,
        };
        if is_recorded || tagged {
            cut.gone.push(saved);
        } else {
            cut.foreign |= owner(&saved.chain, &saved.args) == Owner::Foreign;
            cut.kept.push(saved);
        }
    }
    let mut batch = Batch::new(table.as_str());
    for cut in &cuts {
        batch.ops.extend(cut.ops());
    }
    // Only deletions (no rewrite): on iptables-nft, by handle if it can be.
    let native = !batch.is_empty() && delete_found(ctx, backend, family, id, &batch);
    if !batch.is_empty() && !native {
        ctx.netfilter.apply(backend, family, &batch)?;
    }
    let gone = cuts.iter().flat_map(|c| &c.gone);
    let flows = flows::of_saved(gone.clone().map(|r| (family, r.args.as_slice())));
    Ok(Gone {
        deleted: gone.count(),
        complete: unseen.values().all(|left| *left == 0),
        flows,
    })
}

/// One natledger chain's rules in [`remove_table`]'s read: those that go and those that stay.
#[derive(Default)]
struct Cut<'a> {
    gone: Vec<&'a SavedRule>,
    kept: Vec<&'a SavedRule>,
    /// A rule that stays is not natledger's own, or does not parse.
    foreign: bool,
}

impl Cut<'_> {
    /// The deletions, or, as sweep does ([`REWRITE_AT`]), when many rules go, at least as
    /// many as stay and those are all natledger's own, a rewrite: the chain flushed (one
    /// operation) and the rules that stay appended again. Deleting rule by rule costs each
    /// rule a walk of its chain (`iptables-nft-restore`'s `-D` compares it with every rule,
    /// the kernel looks its handle up from the chain's top): quadratic in the rules that go
    /// (55,000 on iptables-nft: 14 s; rewritten, 5 s with everything else poststop does).
    fn ops(&self) -> Vec<Op> {
        let rewrite = !self.foreign
            && !self.kept.is_empty()
            && self.gone.len() >= REWRITE_AT
            && self.gone.len() >= self.kept.len();
        if !rewrite {
            return (self.gone.iter())
                .map(|r| Op::Delete(r.chain.clone(), r.args.clone()))
                .collect();
        }
        let chain = self.gone[0].chain.clone();
        let kept = self
            .kept
            .iter()
            .map(|r| Op::Append(r.chain.clone(), r.args.clone()));
        std::iter::once(Op::Flush(chain)).chain(kept).collect()
    }
}

/// A process-less deletion failed and changed nothing: the restore that follows reports
/// what is really wrong.
fn falling_back(e: &NativeError, backend: Backend, family: Family) {
    log::info!(
        "{}; using {}-{backend}-restore",
        Chain(e),
        family.tool_stem()
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::create::create_runtime;
    use crate::ops::testing::*;
    use crate::state::ledger::Ledger;

    /// `remove_table` of iptables-nft's IPv4 nat table, through `script`, in a fresh ledger.
    fn remove_nft_nat(
        script: &Script,
        id: &ContainerId,
        recorded: &[&RuleRecord],
        exact_first: bool,
    ) -> Gone {
        let dir = tempfile::tempdir().unwrap();
        let host = fake_host();
        let ctx = context(Ledger::new(dir.path()), Backend::Nft, script, &host);
        remove_table(
            &ctx,
            Backend::Nft,
            Family::Ipv4,
            Table::Nat,
            id,
            recorded,
            exact_first,
        )
        .unwrap()
    }

    /// A nat table whose removal fails keeps its backend and family's accept: the filter
    /// table is not even read (a scripted runner with no answer left would panic), and its
    /// records stay for the next try.
    #[test]
    fn a_failed_nat_removal_keeps_the_accept() {
        let dir = tempfile::tempdir().unwrap();
        let host = fake_host();
        let id: ContainerId = "c1".parse().unwrap();
        let created = Script::new(vec![ok("")]);
        let ctx = context(Ledger::new(dir.path()), Backend::Nft, &created, &host);
        create_runtime(&ctx, &input(dir.path())).unwrap();
        let manifest = ctx.ledger.load(&id).unwrap().unwrap();
        let recorded: Vec<&RuleRecord> = manifest.rules.iter().collect();
        assert!(recorded.iter().any(|r| r.is_in(Table::Filter)));

        // The exact delete of the nat rules fails, and so does the read of the nat table.
        let removing = Script::new(vec![fail(), fail()]);
        let ctx = context(Ledger::new(dir.path()), Backend::Nft, &removing, &host);
        let found = remove_in(
            &ctx,
            Backend::Nft,
            Family::Ipv4,
            &id,
            &[Table::Nat, Table::Filter],
            &recorded,
        );
        assert_eq!(found.failures.len(), 1);
        assert!(found.complete.is_empty(), "{:?}", found.complete);
        assert_eq!(found.deleted, 0);
        let programs: Vec<String> = removing
            .calls
            .borrow()
            .iter()
            .map(|c| {
                let stdin = String::from_utf8_lossy(c.stdin.as_deref().unwrap_or_default());
                format!("{} {stdin}", c.args.join(" "))
            })
            .collect();
        assert_eq!(programs.len(), 2, "{programs:?}");
        assert!(
            programs.iter().all(|a| !a.contains("filter")),
            "{programs:?}"
        );
    }

    /// Without records, what the read shows tagged goes: a chain where many of the
    /// container's rules go, and only natledger's stay, is rewritten (`-F`, the rest appended
    /// again, in order); one holding someone else's rule loses them rule by rule.
    #[test]
    fn a_chain_mostly_going_is_rewritten_unless_a_foreign_rule_stays() {
        let id: ContainerId = "c1".parse().unwrap();
        let dnat = |who: &str, port: usize| {
            format!(
                "-A NATLEDGER-HOSTPORTS -p tcp -m tcp --dport {port} -m comment --comment \
                 natledger:{who} -j DNAT --to-destination 10.77.0.2:80\n"
            )
        };
        let ours: String = (0..REWRITE_AT).map(|p| dnat("c1", 9000 + p)).collect();
        let foreign = "-A NATLEDGER-HOSTPORTS -p tcp -m tcp --dport 5 -j RETURN\n";
        for (stays, rewritten) in [(dnat("c2", 8000), true), (foreign.to_string(), false)] {
            let dump = format!(
                "*nat\n:PREROUTING ACCEPT [0:0]\n:NATLEDGER-HOSTPORTS - [0:0]\n{}{ours}{}COMMIT\n",
                dnat("c1", 7000),
                stays
            );
            let script = Script::new(vec![ok(&dump), ok("")]);
            let gone = remove_nft_nat(&script, &id, &[], false);
            assert_eq!((gone.deleted, gone.complete), (REWRITE_AT + 1, true));
            let calls = script.calls.borrow();
            let stdin = String::from_utf8_lossy(calls[1].stdin.as_deref().unwrap_or_default());
            let deletes = stdin.lines().filter(|l| l.starts_with("-D ")).count();
            if rewritten {
                assert_eq!(deletes, 0, "{stdin}");
                assert!(stdin.contains("-F NATLEDGER-HOSTPORTS\n"), "{stdin}");
                assert!(stdin.contains(stays.trim_end()), "{stdin}");
            } else {
                assert_eq!(deletes, REWRITE_AT + 1, "{stdin}");
                assert!(!stdin.contains("-F ") && !stdin.contains("-A "), "{stdin}");
            }
        }
    }

    /// The read-and-match removal counts identical records once per copy: two records of the
    /// same rule are complete only when both copies were found, and every copy found goes.
    #[test]
    fn identical_records_are_matched_once_per_copy() {
        let id: ContainerId = "c1".parse().unwrap();
        let args = "-d 10.78.0.1/32 -p tcp -m tcp --dport 8080 -m comment --comment \
                    natledger:c1 -j DNAT --to-destination 10.77.0.2:80";
        let record = RuleRecord::parse(
            Backend::Nft,
            Family::Ipv4,
            "nat",
            "NATLEDGER-HOSTPORTS",
            args.split_whitespace().map(String::from).collect(),
        );
        let recorded = [&record, &record];
        for (copies, complete) in [(1, false), (2, true)] {
            let line = format!("-A NATLEDGER-HOSTPORTS {args}\n");
            let dump = format!(
                "*nat\n:PREROUTING ACCEPT [0:0]\n:NATLEDGER-HOSTPORTS - [0:0]\n{}COMMIT\n",
                line.repeat(copies)
            );
            // The exact delete fails (a copy is missing), the read answers, the delete of
            // what was found succeeds.
            let script = Script::new(vec![fail(), ok(&dump), ok("")]);
            let gone = remove_nft_nat(&script, &id, &recorded, true);
            assert_eq!((gone.deleted, gone.complete), (copies, complete));
        }
    }
}
