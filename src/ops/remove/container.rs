//! Deleting one container's rules, the policy half: which records are usable, which
//! drivers, families and tables to look in, and what is left ([`Removal`]). Each driver and
//! family is one call to its [`crate::backend::Driver::remove`] (the exact delete, else the
//! read-and-match by tag, in `backend/remove.rs`).

use crate::backend::{BackendError, Deleted};
use crate::kernel::conntrack::Flows;
use crate::model::echo::{MESSAGE, limit};
use crate::model::family::Family;
use crate::model::layout::{Owner, is_owned_chain, owner};
use crate::model::oci::ContainerId;
use crate::model::rule::is_user_chain_name;
use crate::model::table::Table;
use crate::state::ledger::{Locked, Manifest, RuleRecord};

use super::super::{Context, flows};

/// What [`remove_container`] did.
#[derive(Debug, Default)]
pub struct Removal {
    pub removed: usize,
    /// Recorded rules that may still exist because their removal failed.
    pub remaining: Vec<RuleRecord>,
    pub failures: Vec<BackendError>,
    /// The UDP and SCTP flows of the DNAT rules deleted, whose conntrack entries the caller
    /// forgets once every rule change of the operation is done (`flows::forget`).
    pub flows: Vec<Flows>,
}

/// Delete every rule natledger wrote for `id`: the manifest's rules, and any rule in a
/// natledger chain tagged `natledger:<id>`, in each backend and family where they exist now.
///
/// Per driver and family, one call ([`crate::backend::Driver::remove`]): exactly the recorded
/// rules where they were written, else what a read of each table shows. Only when recorded
/// rules were not all where they were written (or there is no usable manifest) does it look
/// in the other drivers too, since a ruleset saved from one backend and restored into the
/// other brings them along. `remaining` names every recorded rule not confirmed gone in a
/// family where something failed.
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
    // are the only guide, so every family and driver is read.
    let scan_all = recorded.is_empty();
    let mut families: Vec<Family> = recorded.iter().map(|r| r.family).collect();
    if scan_all {
        families = Family::ALL.to_vec();
    }
    families.sort();
    families.dedup();
    let mut removal = Removal::default();
    for family in families {
        remove_family(ctx, id, family, &recorded, scan_all, &mut removal);
    }
    removal
}

/// [`remove_container`] in one family: each driver asked once, those holding recorded rules
/// first (if those are complete, the rest are skipped).
fn remove_family(
    ctx: &Context,
    id: &ContainerId,
    family: Family,
    recorded: &[&RuleRecord],
    scan_all: bool,
    removal: &mut Removal,
) {
    let mut drivers = ctx.drivers.to_vec();
    drivers.sort_by_key(|d| {
        !recorded
            .iter()
            .any(|r| r.backend == d.backend() && r.family == family)
    });
    let mut unconfirmed: Vec<&RuleRecord> = recorded
        .iter()
        .copied()
        .filter(|r| r.family == family)
        .collect();
    let mut failed = false;
    for driver in drivers {
        let backend = driver.backend();
        let here: Vec<&RuleRecord> = unconfirmed
            .iter()
            .copied()
            .filter(|r| r.backend == backend)
            .collect();
        if here.is_empty() && !scan_all && unconfirmed.is_empty() {
            continue;
        }
        // The tables to look in (nat first): every table natledger writes without a record
        // to go by, else those of the records still unconfirmed.
        let tables: Vec<Table> = Table::ALL
            .into_iter()
            .rev()
            .filter(|t| scan_all || unconfirmed.iter().any(|r| r.is_in(*t)))
            .collect();
        let found: Deleted = driver.remove(&ctx.netfilter, family, id, &tables, &here);
        removal.removed += found.deleted;
        for flow in flows::of_rules(found.rules.iter().map(|r| (family, r))) {
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

#[cfg(test)]
mod tests {
    use crate::backend::Backend;
    use crate::model::family::Family;
    use crate::model::table::Table;
    use crate::ops::create::create_runtime;
    use crate::ops::testing::{Call, FakeDriver, fake_context, fake_host, input};
    use crate::state::ledger::Ledger;

    use super::remove_container;
    use crate::model::oci::ContainerId;
    use crate::ops::Context;
    use crate::state::ledger::Manifest;

    /// Container c1 created through `nft` (beside `legacy`), then `check` with its context,
    /// both drivers, its id and its manifest.
    fn created(check: impl FnOnce(&Context, &FakeDriver, &FakeDriver, &ContainerId, &Manifest)) {
        let dir = tempfile::tempdir().unwrap();
        let host = fake_host();
        let (nft, legacy) = (
            FakeDriver::new(Backend::IptablesNft),
            FakeDriver::new(Backend::IptablesLegacy),
        );
        let drivers: [&dyn crate::backend::Driver; 2] = [&legacy, &nft];
        let ctx = fake_context(Ledger::new(dir.path()), &nft, &drivers, &host);
        create_runtime(&ctx, &input(dir.path())).unwrap();
        let id = "c1".parse().unwrap();
        let manifest = ctx.ledger.load(&id).unwrap().unwrap();
        check(&ctx, &nft, &legacy, &id, &manifest);
    }

    /// A nat table whose removal fails keeps its family's accept: the driver is asked once
    /// per family, and every record of the family stays, the filter accept's included.
    #[test]
    fn a_failed_nat_removal_keeps_the_accept_and_its_records() {
        created(|ctx, nft, _, id, manifest| {
            let accept = nft.lines(Family::Ipv4, "filter");
            assert!(!accept.is_empty());

            nft.fail(Family::Ipv4, "nat");
            let locked = ctx.ledger.lock().unwrap();
            let removal = remove_container(ctx, &locked, id, Some(manifest));
            assert_eq!(removal.failures.len(), 1);
            assert_eq!(removal.removed, 0);
            assert_eq!(removal.remaining.len(), manifest.rules.len());
            assert_eq!(
                nft.lines(Family::Ipv4, "filter"),
                accept,
                "the accept stays"
            );
            let tables = vec![Table::Nat, Table::Filter];
            assert!(nft.calls().contains(&Call::Remove(Family::Ipv4, tables)));
        });
    }

    /// Records complete in the driver that wrote them: one call, the other drivers are not
    /// asked; without a manifest every driver is asked in each family, every table.
    #[test]
    fn other_drivers_are_asked_only_without_complete_records() {
        created(|ctx, nft, legacy, id, manifest| {
            let locked = ctx.ledger.lock().unwrap();

            let removal = remove_container(ctx, &locked, id, Some(manifest));
            assert_eq!(removal.removed, manifest.rules.len());
            assert!(removal.failures.is_empty() && removal.remaining.is_empty());
            assert!(nft.lines(Family::Ipv4, "nat").is_empty());
            assert!(legacy.calls().is_empty(), "{:?}", legacy.calls());
            let removes = |d: &FakeDriver| {
                let calls = d.calls();
                calls
                    .into_iter()
                    .filter(|c| matches!(c, Call::Remove(..)))
                    .count()
            };
            assert_eq!(removes(nft), 1);

            let removal = remove_container(ctx, &locked, id, None);
            assert_eq!(removal.removed, 0);
            let both = vec![Table::Nat, Table::Filter];
            for family in Family::ALL {
                for driver in [nft, legacy] {
                    assert!(driver.calls().contains(&Call::Remove(family, both.clone())));
                }
            }
        });
    }
}
