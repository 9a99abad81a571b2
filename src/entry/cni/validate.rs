//! What libcni's plugins refuse beyond the wire format, and what natledger refuses because it
//! cannot tell what was meant: a `CNI_NETNS` that is no network namespace, one host port
//! mapped twice, a mapping key spelt twice with different values. Each an error object with
//! the code a runtime expects (SPEC.md §5).

use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use serde_json::{Map, Value};

use super::spec::{CniError, Code};
use crate::model::echo::Echo;
use crate::model::portspec::{PortMapping, bounds};

/// `CNI_NETNS` must name a network namespace (`/proc/PID/ns/net` or a bind mount of one, as
/// `ip netns` and runtimes make): nsfs, of type `CLONE_NEWNET`. libcni's plugins open it with
/// `ns.GetNS`, which refuses anything else; a regular file (`/etc/passwd`) would otherwise be
/// recorded as the attachment's namespace. Code 4: the variable is invalid.
pub fn netns(path: &Path) -> Result<(), CniError> {
    let invalid = |why: String| {
        CniError::new(
            Code::InvalidEnv,
            "invalid CNI_NETNS",
            format!(
                "CNI_NETNS {}: {why}",
                Echo::from(path.to_string_lossy().into_owned())
            ),
        )
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| invalid(format!("cannot open it: {e}")))?;
    let fs = nix::sys::statfs::fstatfs(&file).map_err(|e| invalid(format!("fstatfs: {e}")))?;
    if fs.filesystem_type() != nix::sys::statfs::NSFS_MAGIC {
        return Err(invalid("not a namespace (not on nsfs)".into()));
    }
    // SAFETY: NS_GET_NSTYPE takes no argument and only reads the open descriptor.
    let kind = unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&file), NS_GET_NSTYPE) };
    if kind != libc::CLONE_NEWNET {
        return Err(invalid("a namespace, but not a network namespace".into()));
    }
    Ok(())
}

/// `_IO(0xb7, 0x3)`: the type of the namespace a descriptor refers to.
const NS_GET_NSTYPE: libc::Ioctl = (0xb7 << 8) | 0x3;

/// Mappings that claim the same host address, port and protocol (what the annotation path
/// refuses, [`PortMapping::conflicts_with`]): one host port cannot forward to two container
/// ports. An entry repeated exactly is kept once (it asks for nothing new). Code 7.
pub fn distinct_host_ports(mappings: Vec<PortMapping>) -> Result<Vec<PortMapping>, CniError> {
    // Exact repeats go first, in O(n log n): a runtime may send 65,535 entries.
    let mut seen = std::collections::BTreeSet::new();
    let kept: Vec<PortMapping> = mappings
        .into_iter()
        .filter(|m| seen.insert(key(m)))
        .collect();
    // Judged on merged runs, as the annotation's conflicts are (`portspec::check_conflicts`):
    // the pairs are few. Over the mappings limit, create refuses the whole request (code 7)
    // before anything else, so the pairs are never compared.
    let runs = bounds::coalesce(&kept, true);
    if runs.len() > bounds::MAX_MAPPINGS {
        return Ok(kept);
    }
    for (i, m) in runs.iter().enumerate() {
        if let Some(other) = runs[..i].iter().find(|k| k.conflicts_with(m)) {
            return Err(CniError::new(
                Code::InvalidConfig,
                "invalid port mapping",
                format!("{other} and {m} claim the same host port twice"),
            ));
        }
    }
    Ok(kept)
}

/// A mapping's identity, ordered (`PortMapping` has no `Ord`).
fn key(m: &PortMapping) -> (Option<std::net::IpAddr>, u16, u16, u16, u16, u8) {
    (
        m.host_ip,
        m.host_ports.start,
        m.host_ports.end,
        m.container_ports.start,
        m.container_ports.end,
        m.protocol.number(),
    )
}

/// A key natledger reads spelt twice in one object but for ASCII case (`hostPort` and
/// `HostPort`) with different values: Go's `encoding/json` (portmap) takes the last, natledger
/// the exact spelling, so what was meant is unknown. The same value twice is fine. Code 7.
pub fn one_spelling(object: &Map<String, Value>, canonical: &[&str]) -> Result<(), CniError> {
    for want in canonical {
        let mut spellings = object.iter().filter(|(k, _)| k.eq_ignore_ascii_case(want));
        let Some((first, value)) = spellings.next() else {
            continue;
        };
        if let Some((other, _)) = spellings.find(|(_, v)| *v != value) {
            return Err(CniError::new(
                Code::InvalidConfig,
                "invalid port mapping",
                format!(
                    "{} and {} are one key with two values",
                    Echo::from(first.as_str()),
                    Echo::from(other.as_str())
                ),
            ));
        }
    }
    Ok(())
}
