//! Whether a container's rules are in place (a CNI CHECK): each record (a manifest's, or
//! those a create would write, `create::planned`) looked for, argument for argument, in its
//! chain of the backend, family and table it names.

use std::collections::HashSet;

use crate::backend::{Driver, Reading};
use crate::model::family::Family;
use crate::model::layout::TABLES;
use crate::state::ledger::RuleRecord;

use super::{Context, Error};

/// The records of `rules` not found where they name; each (backend, family, table) is read
/// once, by the context's driver of that backend (a record of a backend the context has no
/// driver of is missing: nothing can show it).
pub fn missing_rules(ctx: &Context, rules: &[RuleRecord]) -> Result<Vec<RuleRecord>, Error> {
    let mut missing = Vec::new();
    let mut places: Vec<(&dyn Driver, Family, &'static str)> = Vec::new();
    for record in rules {
        let driver = ctx.drivers.iter().find(|d| d.backend() == record.backend);
        match (driver, TABLES.iter().find(|t| **t == record.table_name())) {
            (Some(driver), Some(table)) => {
                let place = (*driver, record.family, *table);
                if !places.iter().any(|p| same_place(p, &place)) {
                    places.push(place);
                }
            }
            // A table natledger never writes cannot hold the record.
            _ => missing.push(record.clone()),
        }
    }
    for (driver, family, table) in places {
        let dump = driver.read(&ctx.netfilter, family, table, Reading::Ours)?;
        // Looked up, not searched: a container may have thousands of records.
        let present: HashSet<(&str, &[String])> = dump
            .iter()
            .flat_map(|t| t.rules.iter())
            .map(|r| (r.chain.as_str(), r.args.as_slice()))
            .collect();
        let backend = driver.backend();
        for record in rules
            .iter()
            .filter(|r| r.backend == backend && r.family == family && r.table_name() == table)
        {
            if !present.contains(&(record.chain.as_str(), &*record.args())) {
                missing.push(record.clone());
            }
        }
    }
    Ok(missing)
}

/// Whether two places are the same driver's family and table.
fn same_place(a: &(&dyn Driver, Family, &str), b: &(&dyn Driver, Family, &str)) -> bool {
    a.0.backend() == b.0.backend() && a.1 == b.1 && a.2 == b.2
}
