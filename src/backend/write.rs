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

use super::driver::Reading;
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
    driver: &(impl Driver + ?Sized),
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
                    crate::causes::Causes(&error)
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
    dump: &crate::model::save::Dump,
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
    dump: &crate::model::save::Dump,
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
    driver: &(impl Driver + ?Sized),
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
pub fn all_present(dump: &crate::model::save::Dump, placed: &[Placement]) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::testing::{Script, fail, ok};
    use crate::backend::{Backend, IptablesNft};
    use crate::kernel::exec::Invocation;
    use crate::model::layout::mapping_rules;

    fn stdin_of(inv: &Invocation) -> String {
        String::from_utf8(inv.stdin.clone().unwrap()).unwrap()
    }

    /// Container c1's IPv4 records of 8080:80 towards 10.77.0.2, as create plans them.
    fn records() -> Vec<RuleRecord> {
        let id = "c1".parse().unwrap();
        let mapping = crate::model::portspec::parse_mappings("8080:80").unwrap();
        let container: std::net::IpAddr = "10.77.0.2".parse().unwrap();
        mapping_rules(IptablesNft.capabilities(), &id, &mapping[0], container)
            .into_iter()
            .map(|p| RuleRecord::new(Backend::IptablesNft, Family::Ipv4, p.table, p.chain, p.rule))
            .collect()
    }

    fn install_nft(script: &Script) -> Result<Vec<Table>, InstallError> {
        let records = records();
        let rules: Vec<&RuleRecord> = records.iter().collect();
        IptablesNft.install(&Netfilter::new(script), Family::Ipv4, &rules)
    }

    #[test]
    fn with_the_shared_chains_present_install_is_one_restore() {
        let script = Script::new(vec![ok("")]);
        assert_eq!(install_nft(&script).unwrap(), Vec::<Table>::new());
        let calls = script.calls.borrow();
        assert_eq!(calls.len(), 1);
        assert!(calls[0].program.ends_with("iptables-nft-restore"));
        let batch = stdin_of(&calls[0]);
        // Filter first: the accept is in force before the DNAT.
        let (filter, nat) = batch.split_once("*nat").unwrap();
        assert!(filter.starts_with("*filter\n"));
        assert!(filter.contains("-C FORWARD -m comment --comment natledger -j NATLEDGER-FORWARD"));
        assert!(filter.contains("-A NATLEDGER-FORWARD -m conntrack --ctstate DNAT --ctproto 6"));
        assert!(nat.contains("-C PREROUTING -m addrtype --dst-type LOCAL"));
        assert!(nat.contains("-I NATLEDGER-HOSTPORTS 1 -p tcp"));
    }

    #[test]
    fn without_them_install_reads_and_creates_only_what_is_missing() {
        let dump = "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n\
                    :NATLEDGER-MASQ - [0:0]\n\
                    -A POSTROUTING -m comment --comment natledger -j NATLEDGER-MASQ\nCOMMIT\n";
        // Docker's FORWARD: natledger's jump goes after DOCKER-USER, the isolation jump and
        // the rest.
        let filter = "*filter\n:FORWARD DROP [0:0]\n:DOCKER-USER - [0:0]\n\
                      :DOCKER-ISOLATION-STAGE-1 - [0:0]\n:DOCKER - [0:0]\n\
                      -A FORWARD -j DOCKER-USER\n-A FORWARD -j DOCKER-ISOLATION-STAGE-1\n\
                      -A FORWARD -o docker0 -j DOCKER\nCOMMIT\n";
        let script = Script::new(vec![fail(), ok(filter), ok(""), ok(dump), ok("")]);
        install_nft(&script).unwrap();
        let calls = script.calls.borrow();
        assert_eq!(calls.len(), 5);
        assert_eq!(calls[1].args, ["-t", "filter"]);
        let batch = stdin_of(&calls[2]);
        assert!(batch.contains(":NATLEDGER-FORWARD - [0:0]"));
        assert!(batch.contains("-A FORWARD -m comment --comment natledger -j NATLEDGER-FORWARD"));
        assert_eq!(calls[3].args, ["-t", "nat"]);
        let batch = stdin_of(&calls[4]);
        assert!(batch.contains(":NATLEDGER-HOSTPORTS - [0:0]"));
        assert!(
            !batch.contains(":NATLEDGER-MASQ"),
            "an existing chain is never redeclared"
        );
        assert!(batch.contains("-I PREROUTING 1"));
        assert!(batch.contains("-I OUTPUT 1"));
        assert!(
            !batch.contains("-I POSTROUTING"),
            "an existing jump is not duplicated"
        );
    }

    /// The fast transaction fails, then reading the tables fails (the filter table only
    /// costs its accept, the nat table the install): nothing was applied.
    #[test]
    fn a_failed_install_names_the_failed_read() {
        let script = Script::new(vec![fail(), fail(), fail()]);
        let err = install_nft(&script).unwrap_err();
        let text = crate::causes::text(&err.error);
        assert!(text.contains("iptables-nft-save -t nat failed"), "{text}");
        assert!(!err.partial);
        assert_eq!(script.calls.borrow().len(), 3);
    }

    #[test]
    fn a_filter_table_that_cannot_be_written_costs_only_the_accept() {
        let nat = "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
                   :POSTROUTING ACCEPT [0:0]\nCOMMIT\n";
        let script = Script::new(vec![fail(), fail(), ok(nat), ok("")]);
        assert_eq!(install_nft(&script).unwrap(), [Table::Filter]);
    }
}
