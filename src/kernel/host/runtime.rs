//! Containers the runc-style runtimes know, and whether they still run.

use std::path::{Path, PathBuf};

use super::{Roots, entries};

use crate::kernel::safefile::{self, Cap, Links};

/// A container found in a runc-style state directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeContainer {
    /// `id` from `state.json` (the directory name if the field is missing).
    pub id: String,
    /// `init_process_pid`.
    pub pid: Option<i32>,
    /// The init process exists in `{proc}`, is not a zombie, and has the recorded start time
    /// (`init_process_start`, when recorded). A stopped container whose state was not deleted
    /// is not alive. Pids are judged in `{proc}`'s pid namespace: doctor runs in the host's,
    /// where the runtimes record them.
    pub alive: bool,
    pub state_file: PathBuf,
}

/// Whether any of the runtime state roots exists.
pub fn runtime_state_present(roots: &Roots) -> bool {
    roots.runtime_state.iter().any(|d| d.is_dir())
}

/// Every `state.json` at `<root>/<id>/` or `<root>/<namespace>/<id>/` under each runtime state
/// root, with liveness judged against `{proc}`. Sorted by id.
pub fn runtime_containers(roots: &Roots) -> Vec<RuntimeContainer> {
    let mut found = Vec::new();
    for root in &roots.runtime_state {
        for entry in entries(root) {
            let state = entry.path().join("state.json");
            let states = match state.is_file() {
                true => vec![state],
                false => entries(&entry.path())
                    .map(|e| e.path().join("state.json"))
                    .collect(),
            };
            found.extend(
                states
                    .iter()
                    .filter_map(|s| runtime_container(&roots.proc, s)),
            );
        }
    }
    found.sort_by(|a, b| a.id.cmp(&b.id));
    found
}

fn runtime_container(proc: &Path, state_file: &Path) -> Option<RuntimeContainer> {
    // Another program's file: a regular file only, never waiting on a FIFO, capped.
    let text = safefile::read(state_file, Links::Follow, Cap::Config).ok()?;
    let json: serde_json::Value = serde_json::from_slice(&text).ok()?;
    let id = match json.get("id").and_then(|v| v.as_str()) {
        Some(id) => id.to_string(),
        None => state_file.parent()?.file_name()?.to_str()?.to_string(),
    };
    let pid = json_u64(json.get("init_process_pid"))
        .and_then(|p| i32::try_from(p).ok())
        .filter(|p| *p > 0);
    let start = json_u64(json.get("init_process_start"));
    let alive = pid.is_some_and(|pid| {
        let stat = std::fs::read_to_string(proc.join(pid.to_string()).join("stat"));
        stat.ok()
            .and_then(|s| crate::kernel::procfs::parse_stat(&s))
            .is_some_and(|(state, now)| state != "Z" && start.is_none_or(|then| then == now))
    });
    Some(RuntimeContainer {
        id,
        pid,
        alive,
        state_file: state_file.to_path_buf(),
    })
}

/// A number, or a string holding one (old runc wrote `init_process_start` as a string).
fn json_u64(v: Option<&serde_json::Value>) -> Option<u64> {
    let v = v?;
    v.as_u64().or_else(|| v.as_str()?.trim().parse().ok())
}

/// Whether the container `id_prefix` names runs: a full id, or a prefix of at least 12
/// characters (Docker's short ids) that matches exactly one container. `None`: no runtime
/// knows it (or the prefix is ambiguous or too short), which is not proof of anything.
pub fn container_id_alive(id_prefix: &str, containers: &[RuntimeContainer]) -> Option<bool> {
    if id_prefix.is_empty() {
        return None;
    }
    if let Some(c) = containers.iter().find(|c| c.id == id_prefix) {
        return Some(c.alive);
    }
    if id_prefix.len() < 12 {
        return None;
    }
    let mut matching = containers.iter().filter(|c| c.id.starts_with(id_prefix));
    match (matching.next(), matching.next()) {
        (Some(c), None) => Some(c.alive),
        _ => None,
    }
}
