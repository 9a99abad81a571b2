//! `natledger list`: every manifest, with whether its container is alive.

use std::fmt::Write as _;

use serde::Serialize;

use crate::ledger::{Ledger, LedgerError, Manifest};

#[derive(Debug, Serialize)]
pub struct ListEntry {
    pub alive: bool,
    #[serde(flatten)]
    pub manifest: Manifest,
}

/// Every manifest in the ledger (read without the lock: a snapshot for people and scripts).
pub fn list(ledger: &Ledger) -> Result<Vec<Result<ListEntry, LedgerError>>, LedgerError> {
    Ok(ledger
        .list()?
        .into_iter()
        .map(|m| {
            m.map(|manifest| ListEntry {
                alive: manifest.alive(),
                manifest,
            })
        })
        .collect())
}

/// A table for people: one block per container, its rules indented below.
pub fn render_table(entries: &[ListEntry]) -> String {
    let mut out = String::new();
    if entries.is_empty() {
        out.push_str("no containers\n");
    }
    for e in entries {
        let m = &e.manifest;
        let mappings: Vec<String> = m.mappings.iter().map(ToString::to_string).collect();
        let backend = m
            .rules
            .first()
            .map_or("-".to_string(), |r| r.backend.to_string());
        let _ = writeln!(
            out,
            "{}  pid {}  {}  {:?}  {}  {}",
            m.container_id,
            m.pid.map_or("-".into(), |p| p.to_string()),
            if e.alive { "alive" } else { "dead" },
            m.phase,
            backend,
            mappings.join(","),
        );
        for r in &m.rules {
            let _ = writeln!(
                out,
                "    {}/{} -t {} -A {} {}",
                r.backend,
                r.family,
                r.table,
                r.chain,
                r.rule.join(" ")
            );
        }
    }
    out
}
