//! Listening sockets and the processes that own them.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;

use super::{Roots, entries, sockdiag};
use crate::model::portspec::Protocol;

pub use crate::model::listener::{Listener, PORT_KEEPERS};

/// TCP sockets in state LISTEN (`0A`) and UDP sockets in state `07` (bound, not connected;
/// this includes a client's unconnected socket on an ephemeral port), from `{net}/tcp`,
/// `tcp6`, `udp`, `udp6`, with their owners found through `{proc}/*/fd`. Sorted by port,
/// protocol, address.
pub fn listeners(roots: &Roots) -> Vec<Listener> {
    listeners_where(roots, |_| true)
}

/// The listeners `keep` selects, with owners looked up for those only (the fd scan of every
/// process is the expensive part: create-runtime asks only about its own host ports).
pub fn listeners_where(roots: &Roots, keep: impl Fn(&Listener) -> bool) -> Vec<Listener> {
    // The live namespace: ask the kernel for listening sockets only (sockdiag.rs says why);
    // the socket tables under `net` for a fake tree, or if sock_diag is unavailable.
    let from_kernel = (roots.net == Roots::default().net)
        .then(sockdiag::listening)
        .and_then(Result::ok);
    let mut found = match from_kernel {
        Some(sockets) => sockets
            .into_iter()
            .map(|s| Listener {
                protocol: s.protocol,
                addr: s.addr,
                port: s.port,
                inode: s.inode,
                pid: None,
                command: None,
            })
            .collect(),
        None => {
            let files = [
                ("tcp", Protocol::Tcp, "0A"),
                ("tcp6", Protocol::Tcp, "0A"),
                ("udp", Protocol::Udp, "07"),
                ("udp6", Protocol::Udp, "07"),
            ];
            let mut found = Vec::new();
            for (file, protocol, state) in files {
                let text = std::fs::read_to_string(roots.net.join(file)).unwrap_or_default();
                found.extend(parse_sockets(&text, protocol, state));
            }
            found
        }
    };
    found.retain(|l| keep(l));
    if found.is_empty() {
        return found;
    }
    let owners = socket_owners(&roots.proc, &found.iter().map(|l| l.inode).collect());
    for listener in &mut found {
        if let Some((pid, command)) = owners.get(&listener.inode) {
            listener.pid = Some(*pid);
            listener.command = command.clone();
        }
    }
    found.sort_by_key(|a| (a.port, a.protocol, a.addr));
    found
}

/// The sockets of one `/proc/net/{tcp,udp}[6]` table in `state` (without owners).
fn parse_sockets(text: &str, protocol: Protocol, state: &str) -> Vec<Listener> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.get(3) != Some(&state) {
                return None;
            }
            let (addr, port) = f.get(1)?.split_once(':')?;
            Some(Listener {
                protocol,
                addr: parse_socket_addr(addr)?,
                port: u16::from_str_radix(port, 16).ok()?,
                inode: f.get(9)?.parse().ok()?,
                pid: None,
                command: None,
            })
        })
        .collect()
}

/// A socket table address: hex, each 32-bit word in host byte order (8 digits for IPv4, 32
/// for IPv6).
pub(super) fn parse_socket_addr(hex: &str) -> Option<IpAddr> {
    let word = |i: usize| {
        let w = u32::from_str_radix(hex.get(i * 8..i * 8 + 8)?, 16).ok()?;
        Some(w.to_ne_bytes())
    };
    match hex.len() {
        8 => Some(IpAddr::V4(Ipv4Addr::from(word(0)?))),
        32 => {
            let mut bytes = [0u8; 16];
            for i in 0..4 {
                bytes[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            let v6 = Ipv6Addr::from(bytes);
            Some(v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4))
        }
        _ => None,
    }
}

/// For each wanted inode, the lowest pid with a `socket:[INODE]` fd and its command. Processes
/// that vanish or whose fds may not be read are skipped.
fn socket_owners(proc: &Path, wanted: &HashSet<u64>) -> HashMap<u64, (i32, Option<String>)> {
    let mut owners = HashMap::new();
    if wanted.is_empty() {
        return owners;
    }
    let mut pids: Vec<i32> = entries(proc)
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    for pid in pids {
        for fd in entries(&proc.join(pid.to_string()).join("fd")) {
            let Ok(target) = std::fs::read_link(fd.path()) else {
                continue;
            };
            let inode = target
                .to_str()
                .and_then(|t| t.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok());
            if let Some(inode) = inode.filter(|i| wanted.contains(i) && !owners.contains_key(i)) {
                let comm = std::fs::read_to_string(proc.join(pid.to_string()).join("comm"));
                owners.insert(inode, (pid, comm.ok().map(|c| c.trim().to_string())));
            }
        }
        if owners.len() == wanted.len() {
            break;
        }
    }
    owners
}
