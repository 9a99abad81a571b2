//! Whether a container's rules are in place (a CNI CHECK): each record (a manifest's, or
//! those a create would write, `create::planned`) looked for, argument for argument, in its
//! chain of the backend, family and table it names.

use std::collections::HashSet;

use crate::backend::Reading;
use crate::model::layout::TABLES;
use crate::state::ledger::RuleRecord;

use super::{Context, Error};

/// The records of `rules` not found where they name; each (backend, family, table) is read
/// once.
pub fn missing_rules(ctx: &Context, rules: &[RuleRecord]) -> Result<Vec<RuleRecord>, Error> {
    let mut missing = Vec::new();
    let mut places: Vec<(
        crate::backend::Backend,
        crate::model::family::Family,
        &'static str,
    )> = Vec::new();
    for record in rules {
        match TABLES.iter().find(|t| **t == record.table_name()) {
            Some(table) if !places.contains(&(record.backend, record.family, *table)) => {
                places.push((record.backend, record.family, *table));
            }
            Some(_) => {}
            // A table natledger never writes cannot hold the record.
            None => missing.push(record.clone()),
        }
    }
    for (backend, family, table) in places {
        let dump = (ctx.driver_for(backend)).read(&ctx.netfilter, family, table, Reading::Ours)?;
        // Looked up, not searched: a container may have thousands of records.
        let present: HashSet<(&str, &[String])> = dump
            .iter()
            .flat_map(|t| t.rules.iter())
            .map(|r| (r.chain.as_str(), r.args.as_slice()))
            .collect();
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
