//! The removal strategy every driver shares, symmetric to [`super::write`]: a container's
//! rules of one family ([`remove`]) and a sweep's plan of one table ([`apply_plan`]). Per
//! table, nat first (a failing nat table keeps the family's filter rules: the accept of a DNAT
//! that may still be in force): exactly the recorded rules where they all are (without a
//! process where the driver can, else one `*-restore` whose transaction fails whole if one
//! is absent), else a read of the table and the deletion of what it shows recorded or tagged
//! for the container, a chain most of whose rules go rewritten ([`REWRITE_AT`]), without a
//! process where the driver can ([`Primitives::delete_tagged`]).

use std::collections::HashMap;

use crate::causes::Causes;
use crate::model::family::Family;
use crate::model::layout::{Owner, is_owned_chain, owner, tag};
use crate::model::oci::ContainerId;
use crate::model::rule::Rule;
use crate::model::save::{Batch, Op, SavedRule};
use crate::model::table::Table;
use crate::state::ledger::RuleRecord;

use super::driver::{Driver, Reading};
use super::{BackendError, Direct, DirectError, Netfilter, Tagged};

/// A chain with at least this many rules to delete, and no more to keep, is rewritten
/// (`-F` and the kept rules appended again) instead of deleted rule by rule: iptables-nft
/// spends ~80 µs on each `-D` but ~45 µs on each `-A`, and a flush is one operation.
pub const REWRITE_AT: usize = 64;

/// Whether rewriting a chain (flush, then the kept rules appended again) costs less than
/// deleting `gone` rules from it one by one while `kept` stay ([`REWRITE_AT`]): the backends'
/// cost fact, which a sweep's plan and a removal both ask.
pub fn rewrite_pays(gone: usize, kept: usize) -> bool {
    gone >= REWRITE_AT && gone >= kept
}

/// What [`super::Driver::remove`] deleted in one backend and family.
#[derive(Debug, Default)]
pub struct Deleted {
    pub deleted: usize,
    /// The tables where every recorded rule was present (and is now deleted).
    pub complete: Vec<Table>,
    pub failures: Vec<BackendError>,
    /// The typed rules deleted (recorded, or read and natledger's): where the caller finds
    /// the flows whose conntrack entries go.
    pub rules: Vec<Rule>,
}

/// A sweep's change of one table ([`super::Driver::apply_plan`]).
#[derive(Debug)]
pub enum Plan<'a> {
    /// Apply `batch` as one transaction; `tagged`, when the batch removes only containers'
    /// rules (no chain, no jump, no shared rule): how many per chain and tag, which lets a
    /// driver delete them without a process when the chains hold exactly those.
    Batch {
        batch: &'a Batch,
        tagged: Option<&'a [Tagged<'a>]>,
    },
    /// After `sweep --all` removed natledger's chains from `table`: drop the table when
    /// nothing but empty, accepting built-in chains is left of it (where the driver does).
    DropIfEmptied { table: &'a str },
}

impl<'a> Plan<'a> {
    /// A batch applied as it is.
    pub fn batch(batch: &'a Batch) -> Self {
        Plan::Batch {
            batch,
            tagged: None,
        }
    }
}

/// [`super::Driver::apply_plan`] of every driver.
pub(super) fn apply_plan(
    driver: &(impl Driver + ?Sized),
    nf: &Netfilter,
    family: Family,
    plan: &Plan,
) -> Result<(), BackendError> {
    match plan {
        Plan::Batch { batch, tagged } => {
            if let Some(expected) = tagged
                && driver.delete_tagged(nf, family, expected)
            {
                return Ok(());
            }
            driver.apply_batches(nf, family, std::slice::from_ref(*batch))
        }
        Plan::DropIfEmptied { table } => Ok(driver.drop_emptied_table(nf, family, table)?),
    }
}

/// [`super::Driver::remove`] of every driver: the container's rules from `tables` of one
/// family (nat first). A failing nat table keeps the filter rules too: deleting the accept
/// while the DNAT may still be in force would leave it dropping its packets. Their records
/// stay for the next poststop or sweep.
pub(super) fn remove(
    driver: &(impl Driver + ?Sized),
    nf: &Netfilter,
    family: Family,
    id: &ContainerId,
    tables: &[Table],
    recorded: &[&RuleRecord],
) -> Deleted {
    let mut found = Deleted::default();
    // Whether deleting exactly the recorded rules is worth a try: not when the direct path
    // has just seen that the chains hold other tagged rules too (a copy, say).
    let mut exact_first = !recorded.is_empty();
    if exact_first {
        match driver.delete_recorded(nf, family, id, recorded) {
            Ok(Direct::Done(deleted)) => {
                found.deleted = deleted;
                found.complete = tables.to_vec();
                found.rules = typed(recorded);
                return found;
            }
            Ok(Direct::Declined) => exact_first = false,
            Ok(Direct::Off) => {}
            Err(e) => falling_back(driver, &e, family),
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
        match remove_table(driver, nf, family, table, id, &here, exact_first) {
            Ok(gone) => {
                found.deleted += gone.deleted;
                if gone.complete {
                    found.complete.push(table);
                }
                found.rules.extend(gone.rules);
            }
            Err(e) => {
                nat_failed |= table == Table::Nat;
                found.failures.push(e);
            }
        }
    }
    found
}

/// The typed rules of `records`.
fn typed(records: &[&RuleRecord]) -> Vec<Rule> {
    records.iter().filter_map(|r| r.rule()).cloned().collect()
}

/// What [`remove_table`] deleted.
struct Gone {
    deleted: usize,
    /// Every recorded rule was there.
    complete: bool,
    rules: Vec<Rule>,
}

impl Gone {
    fn nothing(complete: bool) -> Self {
        Gone {
            deleted: 0,
            complete,
            rules: Vec::new(),
        }
    }
}

/// Remove the container's rules from one table: exactly the recorded ones (in-process where
/// the driver can, else with one restore), or, if that fails, what a read of the table shows
/// tagged for it or recorded.
fn remove_table(
    driver: &(impl Driver + ?Sized),
    nf: &Netfilter,
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
        rules: typed(recorded),
    };
    if exact_first {
        match driver.delete_recorded_in_table(nf, family, recorded) {
            Ok(Direct::Done(deleted)) => return Ok(all_recorded(deleted)),
            Ok(Direct::Declined) => exact_first = false,
            Ok(Direct::Off) => {}
            Err(e) => falling_back(driver, &e, family),
        }
    }
    if exact_first {
        let mut exact = Batch::new(table.as_str());
        exact.ops = recorded
            .iter()
            .map(|r| Op::Delete(r.chain.clone(), r.args().into_owned()))
            .collect();
        if driver.apply_batches(nf, family, &[exact]).is_ok() {
            return Ok(all_recorded(recorded.len()));
        }
    }
    // Without records, a table whose natledger chains hold nothing tagged for `id` (told
    // without a process where the driver can) is not read.
    if recorded.is_empty() && driver.holds_tagged(nf, family, table, &tag(id)) == Some(false) {
        return Ok(Gone::nothing(true));
    }
    let dump = match driver.read(nf, family, table.as_str(), Reading::Ours) {
        Ok(dump) => dump,
        // A backend whose tools are not installed holds nothing unless we wrote there.
        Err(BackendError::ToolNotFound { .. }) if recorded.is_empty() => None,
        Err(e) => return Err(e),
    };
    let Some(dump) = dump else {
        return Ok(Gone::nothing(recorded.is_empty()));
    };
    let (cuts, complete) = cut(&dump.rules, id, recorded);
    let mut batch = Batch::new(table.as_str());
    for cut in &cuts {
        batch.ops.extend(cut.ops());
    }
    // Only deletions (no rewrite): without a process where the driver can.
    let direct = !batch.is_empty() && delete_found(driver, nf, family, id, &batch);
    if !batch.is_empty() && !direct {
        driver.apply_batches(nf, family, std::slice::from_ref(&batch))?;
    }
    let gone = cuts.iter().flat_map(|c| &c.gone);
    Ok(Gone {
        deleted: gone.clone().count(),
        complete,
        rules: gone
            .filter_map(|r| Rule::parse_args(&r.args).ok())
            .collect(),
    })
}

/// Per natledger chain of a table's `rules`, in the table's order: its rules that go
/// (recorded, or tagged for `id`), those that stay, and whether these are all natledger's own;
/// and whether every recorded rule was found.
fn cut<'a>(
    rules: &'a [SavedRule],
    id: &ContainerId,
    recorded: &[&RuleRecord],
) -> (Vec<Cut<'a>>, bool) {
    // The records by rule, each identical record once per copy: one lookup per saved rule,
    // so the pass is linear in the table (thousands of records against thousands of rules).
    let mut unseen: HashMap<(&str, Rule), usize> = HashMap::new();
    for r in recorded {
        if let Some(rule) = r.rule() {
            *unseen.entry((r.chain.as_str(), rule.clone())).or_default() += 1;
        }
    }
    let tag = tag(id);
    let mut cuts: Vec<Cut> = Vec::new();
    let mut at: HashMap<&str, usize> = HashMap::new();
    for saved in rules.iter().filter(|r| is_owned_chain(&r.chain)) {
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
    let complete = unseen.values().all(|left| *left == 0);
    (cuts, complete)
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
            && rewrite_pays(self.gone.len(), self.kept.len());
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

/// Apply `batch` (deletions, each of a rule tagged for `id` in natledger's chains, found by a
/// read of its table) without a process where the driver can ([`Primitives::delete_tagged`]),
/// when each chain still holds exactly as many rules tagged for `id` as the batch deletes
/// there: a chain all of whose rules go is flushed by one message, the others lose theirs by
/// handle (which the kernel looks up from the chain's top: D of N rules cost D×N/2 steps, so
/// many go by a rewrite instead, [`Cut::ops`]). `false`: nothing changed, the caller uses the
/// restore.
fn delete_found(
    driver: &(impl Driver + ?Sized),
    nf: &Netfilter,
    family: Family,
    id: &ContainerId,
    batch: &Batch,
) -> bool {
    let tag = tag(id);
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for op in &batch.ops {
        let Op::Delete(chain, _) = op else {
            return false;
        };
        *counts.entry(chain.as_str()).or_default() += 1;
    }
    let expected: Vec<Tagged> = counts
        .into_iter()
        .map(|(chain, count)| Tagged {
            table: batch.table,
            chain,
            tag: &tag,
            count,
        })
        .collect();
    driver.delete_tagged(nf, family, &expected)
}

/// A process-less deletion failed and changed nothing: the restore that follows reports
/// what is really wrong.
fn falling_back(driver: &(impl Driver + ?Sized), e: &DirectError, family: Family) {
    log::info!(
        "{}; using {}-{}-restore",
        Causes(e),
        family.tool_stem(),
        driver.backend()
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::testing::{Script, fail, ok};
    use crate::backend::{Backend, Driver, IptablesNft};
    use crate::model::layout::mapping_rules;

    /// `remove_table` of iptables-nft's IPv4 nat table, through `script`.
    fn remove_nft_nat(
        script: &Script,
        id: &ContainerId,
        recorded: &[&RuleRecord],
        exact_first: bool,
    ) -> Gone {
        let nf = Netfilter::new(script);
        let (family, table) = (Family::Ipv4, Table::Nat);
        remove_table(&IptablesNft, &nf, family, table, id, recorded, exact_first).unwrap()
    }

    /// A nat table whose removal fails keeps its backend and family's accept: the filter
    /// table is not even read (a scripted runner with no answer left would panic), and its
    /// records stay for the next try.
    #[test]
    fn a_failed_nat_removal_keeps_the_accept() {
        let id: ContainerId = "c1".parse().unwrap();
        let mapping = crate::model::portspec::parse_mappings("8080:80").unwrap();
        let container: std::net::IpAddr = "10.77.0.2".parse().unwrap();
        let records: Vec<RuleRecord> =
            mapping_rules(IptablesNft.capabilities(), &id, &mapping[0], container)
                .into_iter()
                .map(|p| {
                    RuleRecord::new(Backend::IptablesNft, Family::Ipv4, p.table, p.chain, p.rule)
                })
                .collect();
        let recorded: Vec<&RuleRecord> = records.iter().collect();
        assert!(recorded.iter().any(|r| r.is_in(Table::Filter)));

        // The exact delete of the nat rules fails, and so does the read of the nat table.
        let removing = Script::new(vec![fail(), fail()]);
        let nf = Netfilter::new(&removing);
        let tables = [Table::Nat, Table::Filter];
        let found = IptablesNft.remove(&nf, Family::Ipv4, &id, &tables, &recorded);
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
            Backend::IptablesNft,
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
