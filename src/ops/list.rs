//! `natledger list`: every manifest, with whether its container is alive (a CNI attachment:
//! its network namespace, see `crate::state::liveness`), for an attachment its network and
//! ifname, and for a stacked host port (`ops::Held::Stack`) where each stands ([`Stack`]):
//! the one that serves, who waits behind whom, dead rules still in front, stacks across
//! backends (whose order no one here decides).

use std::fmt::Write as _;

use serde::Serialize;

use crate::kernel::machine::Host;
use crate::model::oci::ContainerId;
use crate::model::save::rule_line;
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
    #[serde(flatten)]
    pub stack: Stack,
    #[serde(flatten)]
    pub manifest: Manifest,
}

/// Where a container stands in the stacks of its host ports (`ops::Held::Stack`): who is in
/// front of whom follows the manifests' `stacked_on`, within one backend; a container is in
/// force while it lives or live sharers keep its rules (`Needs::needed`).
#[derive(Debug, Default, PartialEq, Eq, Serialize)]
pub struct Stack {
    /// It takes the traffic of its stacked ports: it is in force, in front of someone, and
    /// nothing is in front of it, nor stacked with it in another backend.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub serves: bool,
    /// The containers in force whose rules for some of its host ports go first (their
    /// `stacked_on` names it): it waits behind them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub behind: Vec<ContainerId>,
    /// Dead containers, in force for no one, whose rules still go first until a sweep (or the
    /// next create of the port) removes them: until then the port goes to them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub behind_dead: Vec<ContainerId>,
    /// The containers of its `stacked_on` whose manifests are there: they wait behind it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub in_front_of: Vec<ContainerId>,
    /// Containers stacked with it (either way) whose rules are in another backend: which of
    /// them serves is the backends' hook order (natledger's own nftables tables first).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub other_backend: Vec<ContainerId>,
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
    let present: Vec<&Manifest> = readable().collect();
    let judged: Vec<Option<(bool, Vec<ContainerId>, Stack)>> = entries
        .iter()
        .map(|m| {
            let m = m.as_ref().ok()?;
            let id = &m.container_id;
            let sharers = needs.sharers(id).into_iter();
            Some((
                needs.alive(id),
                sharers.map(|s| s.container_id.clone()).collect(),
                stack(m, &present, &|id| needs.needed(id)),
            ))
        })
        .collect();
    Ok(entries
        .into_iter()
        .zip(judged)
        .map(|(m, judged)| {
            m.map(|manifest| {
                let (alive, kept_for, stack) = judged.unwrap_or_default();
                ListEntry {
                    alive,
                    kept_for: if alive { Vec::new() } else { kept_for },
                    stack,
                    manifest,
                }
            })
        })
        .collect())
}

/// Where `m` stands among the manifests `present`, `in_force` telling whose rules are needed.
fn stack(m: &Manifest, present: &[&Manifest], in_force: &dyn Fn(&ContainerId) -> bool) -> Stack {
    let id = &m.container_id;
    let backend = |m: &Manifest| m.rules.first().map(|r| r.backend);
    let same_backend = |o: &Manifest| match (backend(m), backend(o)) {
        (Some(a), Some(b)) => a == b,
        _ => true,
    };
    let mut stack = Stack::default();
    for o in present.iter().filter(|o| o.container_id != *id) {
        let oid = o.container_id.clone();
        let (front, back) = (o.stacked_on.contains(id), m.stacked_on.contains(&oid));
        if !(front || back) {
            continue;
        }
        if !same_backend(o) {
            stack.other_backend.push(oid);
        } else if front && in_force(&oid) {
            stack.behind.push(oid);
        } else if front {
            stack.behind_dead.push(oid);
        } else {
            stack.in_front_of.push(oid);
        }
    }
    stack.serves = in_force(id)
        && !stack.in_front_of.is_empty()
        && stack.behind.is_empty()
        && stack.behind_dead.is_empty()
        && stack.other_backend.is_empty();
    stack
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
        let state = state_text(e);
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
                "    {}/{} -t {} {}",
                r.backend,
                r.family,
                r.table_name(),
                rule_line(&r.chain, &r.args())
            );
        }
    }
    out
}

/// A container's state in its block's first line: alive or dead (whose rules are kept for
/// whom), then its place in a stack.
fn state_text(e: &ListEntry) -> String {
    let ids = |ids: &[ContainerId]| -> String {
        let ids: Vec<&str> = ids.iter().map(ContainerId::as_str).collect();
        ids.join(",")
    };
    let mut state = match (e.alive, e.kept_for.is_empty()) {
        (true, _) => "alive".to_string(),
        (false, true) => "dead".to_string(),
        (false, false) => format!("dead (rules kept for {})", ids(&e.kept_for)),
    };
    let st = &e.stack;
    if !st.behind.is_empty() {
        let _ = write!(state, " (behind {})", ids(&st.behind));
    }
    if !st.behind_dead.is_empty() {
        let _ = write!(
            state,
            " (behind dead {}, whose rules go at the next sweep)",
            ids(&st.behind_dead)
        );
    }
    if !st.in_front_of.is_empty() {
        let serves = if st.serves { "serves, " } else { "" };
        let _ = write!(state, " ({serves}in front of {})", ids(&st.in_front_of));
    }
    if !st.other_backend.is_empty() {
        let _ = write!(
            state,
            " (stacked with {} in another backend: the hooks' order decides who serves)",
            ids(&st.other_backend)
        );
    }
    state
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
                stack: Stack::default(),
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

    /// Attachments `names` in namespaces 1, 2, … (one each, all alive), `stacked_on` as
    /// given by index, the backend of each one's rules as given; returns `list`'s text and
    /// `--json`.
    fn listed(
        stacked: &[(&str, &[&str], crate::backend::Backend)],
        host: impl Fn(FakeHost) -> FakeHost,
    ) -> (String, serde_json::Value) {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::new(dir.path());
        let mut fake = FakeHost::default();
        {
            let locked = ledger.lock().unwrap();
            for (n, (name, on, backend)) in stacked.iter().enumerate() {
                let path = format!("/run/netns/cni-{n}");
                let ns = netns(n as u64 + 1);
                fake = fake.with_namespace(&path, ns);
                let mut m = cni_sample(name, Path::new(&path), Some(ns));
                m.stacked_on = on
                    .iter()
                    .map(|o| format!("{o}+eth0").parse().unwrap())
                    .collect();
                m.rules.iter_mut().for_each(|r| r.backend = *backend);
                locked.store(&m).unwrap();
            }
        }
        let fake = host(fake);
        let entries: Vec<ListEntry> = list(&fake, &ledger)
            .unwrap()
            .into_iter()
            .map(Result::unwrap)
            .collect();
        (
            render_table(&entries),
            serde_json::to_value(&entries).unwrap(),
        )
    }

    fn state_of<'t>(text: &'t str, name: &str) -> &'t str {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{name}+eth0 ")))
            .unwrap_or_else(|| panic!("{name}: {text}"));
        let (_, rest) = line.split_once(&format!("container={name}  ")).unwrap();
        rest.split("  ").next().unwrap()
    }

    fn entry<'j>(json: &'j serde_json::Value, name: &str) -> &'j serde_json::Value {
        let id = format!("{name}+eth0");
        json.as_array()
            .unwrap()
            .iter()
            .find(|e| e["container_id"] == id.as_str())
            .unwrap()
    }

    /// a < b < c: only c serves; b is behind c and in front of a; a behind both.
    #[test]
    fn of_three_stacked_only_the_newest_serves() {
        use crate::backend::Backend::IptablesNft;
        let (text, json) = listed(
            &[
                ("a", &[], IptablesNft),
                ("b", &["a"], IptablesNft),
                ("c", &["a", "b"], IptablesNft),
            ],
            |h| h,
        );
        assert_eq!(
            state_of(&text, "c"),
            "alive (serves, in front of a+eth0,b+eth0)"
        );
        assert_eq!(
            state_of(&text, "b"),
            "alive (behind c+eth0) (in front of a+eth0)"
        );
        assert_eq!(state_of(&text, "a"), "alive (behind b+eth0,c+eth0)");
        assert_eq!(entry(&json, "c")["serves"], true);
        for name in ["a", "b"] {
            assert!(entry(&json, name).get("serves").is_none(), "{json:#}");
        }
        assert_eq!(entry(&json, "b")["behind"], serde_json::json!(["c+eth0"]));
        assert_eq!(
            entry(&json, "b")["in_front_of"],
            serde_json::json!(["a+eth0"])
        );
    }

    /// A dead newer (its namespace gone) serves no one but its rules still go first until a
    /// sweep: neither it nor the one behind it serves.
    #[test]
    fn a_dead_newer_serves_no_one() {
        use crate::backend::Backend::IptablesNft;
        let (text, json) = listed(
            &[("a", &[], IptablesNft), ("b", &["a"], IptablesNft)],
            |h| h.with_namespace("/run/netns/cni-1", netns(9)),
        );
        assert_eq!(state_of(&text, "b"), "dead (in front of a+eth0)");
        assert_eq!(
            state_of(&text, "a"),
            "alive (behind dead b+eth0, whose rules go at the next sweep)"
        );
        assert!(entry(&json, "b").get("serves").is_none());
        assert_eq!(
            entry(&json, "a")["behind_dead"],
            serde_json::json!(["b+eth0"])
        );
        assert!(entry(&json, "a").get("behind").is_none());
    }

    /// Stacked across backends: the hooks' order decides, so neither is said to serve.
    #[test]
    fn across_backends_no_one_is_said_to_serve() {
        use crate::backend::Backend::{IptablesLegacy, OwnNftables};
        let (text, json) = listed(
            &[("a", &[], OwnNftables), ("b", &["a"], IptablesLegacy)],
            |h| h,
        );
        let other = |o: &str| {
            format!(
                "alive (stacked with {o}+eth0 in another backend: the hooks' order decides who serves)"
            )
        };
        assert_eq!(state_of(&text, "b"), other("a"));
        assert_eq!(state_of(&text, "a"), other("b"));
        for (name, o) in [("a", "b+eth0"), ("b", "a+eth0")] {
            let e = entry(&json, name);
            assert_eq!(e["other_backend"], serde_json::json!([o]));
            assert!(
                e.get("serves").is_none() && e.get("behind").is_none(),
                "{e:#}"
            );
        }
    }
}
