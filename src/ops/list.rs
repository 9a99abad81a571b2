//! `natledger list`: every manifest, with whether its container is alive.

use std::fmt::Write as _;

use serde::Serialize;

use crate::ledger::{Ledger, LedgerError, Manifest};
use crate::oci::ContainerId;
use crate::sharing::Needs;

#[derive(Debug, Serialize)]
pub struct ListEntry {
    pub alive: bool,
    /// For a dead container: the live containers in its network namespace that share its
    /// rules, which therefore stay (`crate::sharing`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kept_for: Vec<ContainerId>,
    #[serde(flatten)]
    pub manifest: Manifest,
}

/// Every manifest in the ledger (read without the lock: a snapshot for people and scripts).
pub fn list(ledger: &Ledger) -> Result<Vec<Result<ListEntry, LedgerError>>, LedgerError> {
    let entries = ledger.list()?;
    let needs = Needs::judge(entries.iter().filter_map(|m| m.as_ref().ok()));
    let judged: Vec<Result<(bool, Vec<ContainerId>), ()>> = entries
        .iter()
        .map(|m| {
            m.as_ref().map_err(|_| ()).map(|m| {
                let id = &m.container_id;
                let sharers = needs.sharers(id).into_iter();
                (
                    needs.alive(id),
                    sharers.map(|s| s.container_id.clone()).collect(),
                )
            })
        })
        .collect();
    Ok(entries
        .into_iter()
        .zip(judged)
        .map(|(m, judged)| {
            m.map(|manifest| {
                let (alive, kept_for) = judged.unwrap_or_default();
                ListEntry {
                    alive,
                    kept_for: if alive { Vec::new() } else { kept_for },
                    manifest,
                }
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
        let state = match (e.alive, e.kept_for.is_empty()) {
            (true, _) => "alive".to_string(),
            (false, true) => "dead".to_string(),
            (false, false) => {
                let ids: Vec<&str> = e.kept_for.iter().map(ContainerId::as_str).collect();
                format!("dead (rules kept for {})", ids.join(","))
            }
        };
        let _ = writeln!(
            out,
            "{}  pid {}  {state}  {:?}  {}  {}",
            m.container_id,
            m.pid.map_or("-".into(), |p| p.to_string()),
            m.phase,
            backend,
            mappings.join(","),
        );
        for shared in &m.shares {
            let mappings: Vec<String> = shared.mappings.iter().map(ToString::to_string).collect();
            let _ = writeln!(
                out,
                "    shares {} with {} (same network namespace)",
                mappings.join(","),
                shared.holder
            );
        }
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
