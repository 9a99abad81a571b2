//! A manifest's rule records, typed: parsed once when a manifest is loaded, rendered when it
//! is stored, the JSON byte for byte as written (`{"backend", "family", "table", "chain",
//! "rule": [args after -A CHAIN]}`).
//!
//! A record is typed when it parses as a rule ([`Rule::parse_args`]) in a table natledger
//! writes, as every record before the types was judged at removal: such a rule is removed
//! as before, whatever its spelling (`--ctproto 6` or `tcp`), and a text this release would
//! spell otherwise is kept to be stored again byte for byte. Anything else (a manifest
//! damaged, or edited into what natledger never writes) is kept as its text
//! ([`Entry::Text`]): shown, stored again as read, never acted on (removal names it and
//! leaves it alone), never dropped by a load.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::model::backend_name::Backend;
use crate::model::family::Family;
use crate::model::rule::Rule;
use crate::model::save::rule_line;
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
    /// A rule natledger writes, in a table it writes; `text` is its arguments as recorded
    /// (stored again as read, and what the restore tools and natledger's own tables take:
    /// never rendered again).
    Rule {
        table: Table,
        rule: Rule,
        text: Vec<String>,
    },
    /// Anything else, as read: `table` and the arguments after `-A CHAIN`.
    Text { table: String, rule: Vec<String> },
}

impl RuleRecord {
    pub fn new(backend: Backend, family: Family, table: Table, chain: &str, rule: Rule) -> Self {
        RuleRecord {
            backend,
            family,
            chain: chain.to_string(),
            entry: Entry::Rule {
                table,
                text: rule.to_args(),
                rule,
            },
        }
    }

    /// A record as a manifest has it (`rule`: the arguments after `-A CHAIN`): typed when it
    /// parses as a rule in a table natledger writes; kept as text otherwise.
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
            Entry::Rule { text, .. } => Cow::Borrowed(text),
            Entry::Text { rule, .. } => Cow::Borrowed(rule),
        }
    }

    /// `-t TABLE -A CHAIN ARGS`, as shown in warnings.
    pub fn shown(&self) -> String {
        format!(
            "-t {} {}",
            self.table_name(),
            rule_line(&self.chain, &self.args())
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
        let typed = wire
            .table
            .parse::<Table>()
            .ok()
            .and_then(|table| Some((table, Rule::parse_args(&wire.rule).ok()?)));
        let entry = match typed {
            Some((table, rule)) => Entry::Rule {
                table,
                rule,
                text: wire.rule,
            },
            None => Entry::Text {
                table: wire.table,
                rule: wire.rule,
            },
        };
        RuleRecord {
            backend: wire.backend,
            family: wire.family,
            chain: wire.chain,
            entry,
        }
    }
}

impl From<RuleRecord> for Wire {
    fn from(record: RuleRecord) -> Self {
        let (table, rule) = match record.entry {
            Entry::Rule { table, text, .. } => (table.as_str().to_string(), text),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn args(text: &str) -> Vec<String> {
        text.split_whitespace().map(String::from).collect()
    }

    /// A rule spelled otherwise than this release renders it (`--ctproto tcp` for `6`) is
    /// still typed, so removal acts on it as it always did, and is stored again as read.
    #[test]
    fn a_rule_spelled_otherwise_is_typed_and_stored_as_read() {
        let text = "-m conntrack --ctstate DNAT --ctproto tcp --ctorigdst 10.78.0.1 \
                    --ctreplsrc 10.77.0.2 --ctorigdstport 9000 --ctreplsrcport 80 \
                    -m comment --comment natledger:c1 -j ACCEPT";
        let record = RuleRecord::parse(
            Backend::IptablesLegacy,
            Family::Ipv4,
            "filter",
            "NATLEDGER-FORWARD",
            args(text),
        );
        let rule = record.rule().expect("typed");
        assert_ne!(
            rule.to_args(),
            args(text),
            "the example must be spelled otherwise"
        );
        assert_eq!(record.table(), Some(Table::Filter));
        assert_eq!(record.args().as_ref(), args(text).as_slice());
        let json = serde_json::to_string(&record).unwrap();
        let again: RuleRecord = serde_json::from_str(&json).unwrap();
        assert_eq!(again, record);
        assert!(json.contains("\"--ctproto\",\"tcp\""), "{json}");
    }

    /// What does not parse, or sits in a table natledger never writes, stays text.
    #[test]
    fn what_natledger_never_writes_stays_text() {
        for (table, text) in [
            ("nat", "-p tcp --bogus 1 -j ACCEPT"),
            ("mangle", "-m comment --comment natledger:c1 -j ACCEPT"),
        ] {
            let record = RuleRecord::parse(
                Backend::IptablesNft,
                Family::Ipv4,
                table,
                "NATLEDGER-X",
                args(text),
            );
            assert_eq!(record.rule(), None, "{table} {text}");
            assert_eq!(record.table_name(), table);
            assert_eq!(record.args().as_ref(), args(text).as_slice());
        }
    }
}
