//! `natledger list`: every manifest, with whether its container is alive (a CNI attachment:
//! its network namespace, see `crate::state::liveness`), for an attachment its network and
//! ifname, and for a stacked host port (`ops::Held::Stack`) which container serves it and which
//! wait behind.

use std::fmt::Write as _;

use serde::Serialize;

use crate::kernel::machine::Host;
use crate::model::oci::ContainerId;
use crate::state::ledger::{Ledger, LedgerError, Manifest};
use crate::state::liveness::Batched;
use crate::state::sharing::Needs;

#[derive(Debug, Serialize)]
pub struct ListEntry {
    pub alive: bool,
    /// For a dead container: the live containers in its network namespace that share its
    /// rules, which therefore stay (`crate::state::sharing`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kept_for: Vec<ContainerId>,
    /// The containers whose rules for some of its host ports go first (their `stacked_on`
    /// names it, and their manifests, so their rules, are there): it waits behind them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub behind: Vec<ContainerId>,
    /// The containers of its `stacked_on` whose manifests are there: they wait behind it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub in_front_of: Vec<ContainerId>,
    #[serde(flatten)]
    pub manifest: Manifest,
}

/// Every manifest in the ledger (read without the lock: a snapshot for people and scripts).
pub fn list(
    host: &dyn Host,
    ledger: &Ledger,
) -> Result<Vec<Result<ListEntry, LedgerError>>, LedgerError> {
    let entries = ledger.list()?;
    let readable = || entries.iter().filter_map(|m| m.as_ref().ok());
    let host = Batched::new(host, readable().map(Manifest::recorded));
    let needs = Needs::judge(&host, readable());
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
    let present: Vec<&Manifest> = entries.iter().filter_map(|m| m.as_ref().ok()).collect();
    let stacks: Vec<(Vec<ContainerId>, Vec<ContainerId>)> = entries
        .iter()
        .map(|m| {
            m.as_ref()
                .map_or_else(|_| Default::default(), |m| stack(m, &present))
        })
        .collect();
    Ok(entries
        .into_iter()
        .zip(judged)
        .zip(stacks)
        .map(|((m, judged), (behind, in_front_of))| {
            m.map(|manifest| {
                let (alive, kept_for) = judged.unwrap_or_default();
                ListEntry {
                    alive,
                    kept_for: if alive { Vec::new() } else { kept_for },
                    behind,
                    in_front_of,
                    manifest,
                }
            })
        })
        .collect())
}

/// Whom `m` waits behind (those whose `stacked_on` names it) and whom it is in front of
/// (those of its `stacked_on`), among the manifests `present`.
fn stack(m: &Manifest, present: &[&Manifest]) -> (Vec<ContainerId>, Vec<ContainerId>) {
    let id = &m.container_id;
    let behind = present
        .iter()
        .filter(|o| o.container_id != *id && o.stacked_on.contains(id))
        .map(|o| o.container_id.clone())
        .collect();
    let in_front_of = m
        .stacked_on
        .iter()
        .filter(|s| present.iter().any(|o| o.container_id == **s))
        .cloned()
        .collect();
    (behind, in_front_of)
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
        let ids = |ids: &[ContainerId]| -> String {
            let ids: Vec<&str> = ids.iter().map(ContainerId::as_str).collect();
            ids.join(",")
        };
        let mut state = match (e.alive, e.kept_for.is_empty()) {
            (true, _) => "alive".to_string(),
            (false, true) => "dead".to_string(),
            (false, false) => format!("dead (rules kept for {})", ids(&e.kept_for)),
        };
        if !e.behind.is_empty() {
            let _ = write!(state, " (behind {})", ids(&e.behind));
        }
        if !e.in_front_of.is_empty() {
            let _ = write!(state, " (serves, in front of {})", ids(&e.in_front_of));
        }
        let _ = writeln!(
            out,
            "{}  {}  {state}  {:?}  {}  {}",
            m.container_id,
            m.origin(),
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
                r.table_name(),
                r.chain,
                r.args().join(" ")
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::kernel::machine::fake::{FakeHost, netns};
    use crate::state::ledger::tests::{cni_sample, sample};

    #[test]
    fn attachments_are_judged_by_their_netns_and_shown_with_network_and_ifname() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::new(dir.path());
        let net = Path::new("/run/netns/cni-1");
        let host = FakeHost::default().with_namespace("/run/netns/cni-1", netns(1));
        let live = cni_sample("live", net, Some(netns(1)));
        let gone = cni_sample("gone", Path::new("/run/netns/natledger-gone"), live.netns);
        {
            let locked = ledger.lock().unwrap();
            locked.store(&live).unwrap();
            locked.store(&gone).unwrap();
        }
        let entries: Vec<ListEntry> = list(&host, &ledger)
            .unwrap()
            .into_iter()
            .map(Result::unwrap)
            .collect();
        let alive: Vec<(&str, bool)> = entries
            .iter()
            .map(|e| (e.manifest.container_id.as_str(), e.alive))
            .collect();
        assert_eq!(alive, [("gone+eth0", false), ("live+eth0", true)]);
        let text = render_table(&entries);
        assert!(
            text.contains("gone+eth0  cni net=podman ifname=eth0 container=gone  dead"),
            "{text}"
        );
        assert!(
            text.contains("live+eth0  cni net=podman ifname=eth0 container=live  alive"),
            "{text}"
        );
        let json = serde_json::to_value(&entries).unwrap();
        assert_eq!(json[0]["cni"]["network"], "podman");
        assert_eq!(json[0]["cni"]["ifname"], "eth0");
        assert_eq!(json[0]["cni"]["container_id"], "gone");
        assert_eq!(json[0]["alive"], false);
        // A hook container still shows its pid.
        assert!(
            render_table(&[ListEntry {
                alive: true,
                kept_for: Vec::new(),
                behind: Vec::new(),
                in_front_of: Vec::new(),
                manifest: sample(),
            }])
            .contains("c0ffee  pid 4242  alive")
        );
    }

    #[test]
    fn a_stacked_port_shows_who_serves_and_who_waits_behind() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::new(dir.path());
        let host = FakeHost::default()
            .with_namespace("/run/netns/cni-1", netns(1))
            .with_namespace("/run/netns/cni-2", netns(2));
        let older = cni_sample("older", Path::new("/run/netns/cni-1"), Some(netns(1)));
        let mut newer = cni_sample("newer", Path::new("/run/netns/cni-2"), Some(netns(2)));
        newer.stacked_on = vec![older.container_id.clone(), "gone+eth0".parse().unwrap()];
        {
            let locked = ledger.lock().unwrap();
            locked.store(&older).unwrap();
            locked.store(&newer).unwrap();
        }
        let entries: Vec<ListEntry> = list(&host, &ledger)
            .unwrap()
            .into_iter()
            .map(Result::unwrap)
            .collect();
        let text = render_table(&entries);
        assert!(
            text.contains("container=newer  alive (serves, in front of older+eth0)  "),
            "{text}"
        );
        assert!(
            text.contains("container=older  alive (behind newer+eth0)  "),
            "{text}"
        );
        let json = serde_json::to_value(&entries).unwrap();
        assert_eq!(json[0]["container_id"], "newer+eth0");
        assert_eq!(json[0]["in_front_of"], serde_json::json!(["older+eth0"]));
        assert_eq!(
            json[0]["stacked_on"],
            serde_json::json!(["older+eth0", "gone+eth0"])
        );
        assert_eq!(json[1]["behind"], serde_json::json!(["newer+eth0"]));
        assert!(json[0].get("behind").is_none() && json[1].get("in_front_of").is_none());
    }
}
