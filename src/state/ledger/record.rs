//! A manifest's rule records, typed: parsed once when a manifest is loaded, rendered when it
//! is stored, the JSON byte for byte as written (`{"backend", "family", "table", "chain",
//! "rule": [args after -A CHAIN]}`).
//!
//! A record is typed only when its text is exactly what this release renders for the rule it
//! parses as ([`Rule::to_args`]) in a table natledger writes. Anything else (a manifest
//! edited by hand, or damaged) is kept as its text ([`Entry::Text`]): shown, stored again as
//! read, never acted on (removal names it and leaves it alone), never dropped by a load.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::model::backend_name::Backend;
use crate::model::family::Family;
use crate::model::rule::Rule;
use crate::model::table::Table;

/// One rule exactly as written: where, and what.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "Wire", into = "Wire")]
pub struct RuleRecord {
    pub backend: Backend,
    pub family: Family,
    pub chain: String,
    pub entry: Entry,
}

/// A record's table and rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    /// A rule natledger writes, in a table it writes.
    Rule { table: Table, rule: Rule },
    /// Anything else, as read: `table` and the arguments after `-A CHAIN`.
    Text { table: String, rule: Vec<String> },
}

impl RuleRecord {
    pub fn new(backend: Backend, family: Family, table: Table, chain: &str, rule: Rule) -> Self {
        RuleRecord {
            backend,
            family,
            chain: chain.to_string(),
            entry: Entry::Rule { table, rule },
        }
    }

    /// A record as a manifest has it (`rule`: the arguments after `-A CHAIN`): typed when it
    /// is one natledger writes, as this release renders it; kept as text otherwise.
    pub fn parse(
        backend: Backend,
        family: Family,
        table: &str,
        chain: &str,
        rule: Vec<String>,
    ) -> Self {
        RuleRecord::from(Wire {
            backend,
            family,
            table: table.to_string(),
            chain: chain.to_string(),
            rule,
        })
    }

    /// The table, when it is one natledger writes and the rule one it writes.
    pub fn table(&self) -> Option<Table> {
        match &self.entry {
            Entry::Rule { table, .. } => Some(*table),
            Entry::Text { .. } => None,
        }
    }

    /// The rule, when it is one natledger writes in a table it writes.
    pub fn rule(&self) -> Option<&Rule> {
        match &self.entry {
            Entry::Rule { rule, .. } => Some(rule),
            Entry::Text { .. } => None,
        }
    }

    /// Whether this is a typed record of `table`.
    pub fn is_in(&self, table: Table) -> bool {
        self.table() == Some(table)
    }

    /// The table's name as recorded.
    pub fn table_name(&self) -> &str {
        match &self.entry {
            Entry::Rule { table, .. } => table.as_str(),
            Entry::Text { table, .. } => table,
        }
    }

    /// The arguments after `-A CHAIN`, as recorded.
    pub fn args(&self) -> Cow<'_, [String]> {
        match &self.entry {
            Entry::Rule { rule, .. } => Cow::Owned(rule.to_args()),
            Entry::Text { rule, .. } => Cow::Borrowed(rule),
        }
    }

    /// `-t TABLE -A CHAIN ARGS`, as shown in warnings.
    pub fn shown(&self) -> String {
        format!(
            "-t {} -A {} {}",
            self.table_name(),
            self.chain,
            self.args().join(" ")
        )
    }
}

/// A record as the manifest's JSON has it.
#[derive(Serialize, Deserialize)]
struct Wire {
    backend: Backend,
    family: Family,
    table: String,
    chain: String,
    rule: Vec<String>,
}

impl From<Wire> for RuleRecord {
    fn from(wire: Wire) -> Self {
        let typed = wire.table.parse::<Table>().ok().and_then(|table| {
            let rule = Rule::parse_args(&wire.rule).ok()?;
            (rule.to_args() == wire.rule).then_some(Entry::Rule { table, rule })
        });
        RuleRecord {
            backend: wire.backend,
            family: wire.family,
            chain: wire.chain,
            entry: typed.unwrap_or(Entry::Text {
                table: wire.table,
                rule: wire.rule,
            }),
        }
    }
}

impl From<RuleRecord> for Wire {
    fn from(record: RuleRecord) -> Self {
        let (table, rule) = match record.entry {
            Entry::Rule { table, rule } => (table.as_str().to_string(), rule.to_args()),
            Entry::Text { table, rule } => (table, rule),
        };
        Wire {
            backend: record.backend,
            family: record.family,
            table,
            chain: record.chain,
            rule,
        }
    }
}
