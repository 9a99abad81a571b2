//! Host facts that `natledger doctor` cites as evidence: who listens on which port, which
//! addresses CNI's host-local IPAM has handed out, which containers the runc-style runtimes
//! know and whether they still run, which addresses the host routes, and which container ids
//! rule comments name.
//!
//! Every collector reads below a [`Roots`], so tests point it at a fake tree. Nothing here
//! fails: a missing or unreadable file yields an empty result (doctor says which evidence it
//! had, the caller can ask [`cni_networks_present`] and [`runtime_state_present`]).

mod sockdiag;

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use crate::portspec::Protocol;

/// The entries of `dir`; none if it cannot be read.
fn entries(dir: &Path) -> impl Iterator<Item = std::fs::DirEntry> {
    std::fs::read_dir(dir).into_iter().flatten().flatten()
}

/// Where the collectors look.
#[derive(Clone, Debug)]
pub struct Roots {
    /// procfs: processes (`PID/fd`, `PID/comm`, `PID/stat`). Default `/proc`.
    pub proc: PathBuf,
    /// The network files (`tcp`, `udp`, `route`, `ipv6_route`, `if_inet6`, …). Default
    /// `/proc/thread-self/net`: the calling thread's network namespace (`/proc/net` follows
    /// the thread-group leader's, which differs on a thread that has `setns`ed).
    pub net: PathBuf,
    /// CNI host-local IPAM state, one directory per network. Default `/var/lib/cni/networks`.
    pub cni_networks: PathBuf,
    /// runc-style state roots, holding `<id>/state.json` or, one level deeper,
    /// `<namespace>/<id>/state.json`. Default: `/run/runc` (runc, podman with runc),
    /// `/run/containerd/runc` (containerd's runc shim, per containerd namespace, e.g.
    /// `k8s.io`, `moby`), `/run/docker/runtime-runc` (dockerd, namespace `moby`). crun's
    /// `status` files and podman's storage directories are not read.
    pub runtime_state: Vec<PathBuf>,
    /// The host's own addresses. `None`: ask the kernel (`getifaddrs` for IPv4, `{net}/if_inet6`
    /// for IPv6). Tests inject a list.
    pub local_addresses: Option<Vec<IpAddr>>,
}

impl Default for Roots {
    fn default() -> Self {
        Roots {
            proc: "/proc".into(),
            net: "/proc/thread-self/net".into(),
            cni_networks: "/var/lib/cni/networks".into(),
            runtime_state: [
                "/run/runc",
                "/run/containerd/runc",
                "/run/docker/runtime-runc",
            ]
            .map(PathBuf::from)
            .to_vec(),
            local_addresses: None,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Listeners

/// A listening TCP socket or a bound, unconnected UDP socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listener {
    pub protocol: Protocol,
    /// The bound address; unspecified (`0.0.0.0`, `::`) means every address. An IPv4-mapped
    /// IPv6 address (`::ffff:a.b.c.d`) is given as the IPv4 address. procfs does not show
    /// `IPV6_V6ONLY`: a `::` socket usually receives IPv4 too.
    pub addr: IpAddr,
    pub port: u16,
    /// The socket inode (`socket:[INODE]` in `/proc/PID/fd`).
    pub inode: u64,
    /// The lowest pid holding the socket, if one could be seen (another user's processes may
    /// be unreadable without privileges).
    pub pid: Option<i32>,
    /// That process's `comm` (at most 15 characters, as the kernel keeps it).
    pub command: Option<String>,
}

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
fn parse_socket_addr(hex: &str) -> Option<IpAddr> {
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

// ---------------------------------------------------------------------------------------------
// CNI IPAM

/// One address reserved by CNI's host-local IPAM plugin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    /// The network's directory name (the CNI network name).
    pub network: String,
    pub addr: IpAddr,
    pub container_id: String,
    /// The container's interface, written by plugins since v0.8 (`eth0`).
    pub interface: Option<String>,
}

/// Whether `{cni_networks}` exists (so an address missing from [`cni_reservations`] means
/// something).
pub fn cni_networks_present(roots: &Roots) -> bool {
    roots.cni_networks.is_dir()
}

/// Every reservation in `{cni_networks}/<network>/<ip>` (content: the container id, then
/// optionally a line with the interface). `last_reserved_ip.*`, `lock` and other names that
/// are not addresses are skipped. Sorted by network and address.
pub fn cni_reservations(roots: &Roots) -> Vec<Reservation> {
    let mut found = Vec::new();
    for net in entries(&roots.cni_networks) {
        let Some(network) = net.file_name().to_str().map(str::to_string) else {
            continue;
        };
        for file in entries(&net.path()) {
            let Some(addr) = file.file_name().to_str().and_then(|n| n.parse().ok()) else {
                continue;
            };
            let Ok(text) = std::fs::read_to_string(file.path()) else {
                continue;
            };
            let mut lines = text.lines().map(str::trim);
            let Some(container_id) = lines.next().filter(|id| !id.is_empty()) else {
                continue;
            };
            found.push(Reservation {
                network: network.clone(),
                addr,
                container_id: container_id.to_string(),
                interface: lines.next().filter(|i| !i.is_empty()).map(str::to_string),
            });
        }
    }
    found.sort_by(|a, b| (&a.network, a.addr).cmp(&(&b.network, b.addr)));
    found
}

// ---------------------------------------------------------------------------------------------
// Runtime containers

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
    let text = std::fs::read_to_string(state_file).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
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
            .and_then(|s| crate::procfs::parse_stat(&s))
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

// ---------------------------------------------------------------------------------------------
// Routes and local addresses

const RTF_UP: u32 = 0x0001;
const RTF_GATEWAY: u32 = 0x0002;
const RTF_REJECT: u32 = 0x0200;
const RTF_ANYCAST: u32 = 0x0010_0000;
const RTF_LOCAL: u32 = 0x8000_0000;

/// A route of the host's tables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    pub dest: IpAddr,
    pub prefix_len: u8,
    pub interface: String,
    /// The next hop, for routes through a gateway.
    pub gateway: Option<IpAddr>,
}

/// The longest non-default route covering `addr` (see [`routes`]): the address is on a
/// network this host reaches directly or by a specific route (a bridge, a veth, a tunnel).
pub fn route_to(roots: &Roots, addr: IpAddr) -> Option<Route> {
    routes(roots)
        .into_iter()
        .filter(|r| covers(r, addr))
        .max_by_key(|r| r.prefix_len)
}

/// Whether a non-default route covers `addr` ([`route_to`]).
pub fn has_route(roots: &Roots, addr: IpAddr) -> bool {
    route_to(roots, addr).is_some()
}

/// The routes that are up, not default (`/0`), not unreachable/prohibit, and not the host's
/// own addresses: IPv4 from `{net}/route` (the main table), IPv6 from `{net}/ipv6_route` (all
/// tables; local and anycast entries and anything on `lo` skipped).
pub fn routes(roots: &Roots) -> Vec<Route> {
    let read = |f| std::fs::read_to_string(roots.net.join(f)).unwrap_or_default();
    let mut all = parse_routes(&read("route"), false);
    all.extend(parse_routes(&read("ipv6_route"), true));
    all
}

/// `route`: `Iface Destination Gateway Flags RefCnt Use Metric Mask …` under a header, IPv4
/// addresses in host-order hex. `ipv6_route`: `dest plen src plen nexthop metric refcnt use
/// flags iface`, addresses as 32 hex digits in network order.
fn parse_routes(text: &str, ipv6: bool) -> Vec<Route> {
    let parse = |line: &str| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let hex = |i: usize| u32::from_str_radix(f.get(i)?, 16).ok();
        let addr = |i: usize| match ipv6 {
            true => parse_v6_hex(f.get(i)?).map(IpAddr::V6),
            false => Some(IpAddr::V4(Ipv4Addr::from(hex(i)?.to_ne_bytes()))),
        };
        let (iface, dest, gateway, flags, prefix_len) = if ipv6 {
            let plen = u8::try_from(hex(1)?).ok()?;
            (*f.get(9)?, addr(0)?, addr(4)?, hex(8)?, plen)
        } else {
            let mask = u32::from_be_bytes(hex(7)?.to_ne_bytes());
            (mask.count_ones() == mask.leading_ones()).then_some(())?;
            (f[0], addr(1)?, addr(2)?, hex(3)?, mask.leading_ones() as u8)
        };
        let usable = flags & RTF_UP != 0
            && flags & (RTF_REJECT | RTF_LOCAL | RTF_ANYCAST) == 0
            && prefix_len > 0
            && !matches!(iface, "lo" | "*");
        usable.then(|| Route {
            dest,
            prefix_len,
            interface: iface.to_string(),
            gateway: (flags & RTF_GATEWAY != 0).then_some(gateway),
        })
    };
    text.lines().filter_map(parse).collect()
}

/// 32 hex digits in network order (`ipv6_route`, `if_inet6`).
fn parse_v6_hex(hex: &str) -> Option<Ipv6Addr> {
    (hex.len() == 32).then_some(())?;
    Some(Ipv6Addr::from(u128::from_str_radix(hex, 16).ok()?))
}

fn covers(route: &Route, addr: IpAddr) -> bool {
    let len = u32::from(route.prefix_len);
    match (route.dest, addr) {
        (IpAddr::V4(net), IpAddr::V4(a)) if len <= 32 => {
            let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
            u32::from(net) & mask == u32::from(a) & mask
        }
        (IpAddr::V6(net), IpAddr::V6(a)) if len <= 128 => {
            let mask = u128::MAX.checked_shl(128 - len).unwrap_or(0);
            u128::from(net) & mask == u128::from(a) & mask
        }
        _ => false,
    }
}

/// Whether `addr` is one of the host's own addresses: loopback (`127.0.0.0/8`, `::1`), or in
/// [`Roots::local_addresses`] when given, else an interface address (`getifaddrs` in the
/// calling thread's namespace for IPv4, `{net}/if_inet6` for IPv6).
pub fn is_local_address(roots: &Roots, addr: IpAddr) -> bool {
    if addr.is_loopback() {
        return true;
    }
    if let Some(list) = &roots.local_addresses {
        return list.contains(&addr);
    }
    match addr {
        IpAddr::V4(_) => nix::ifaddrs::getifaddrs().is_ok_and(|mut all| {
            all.any(|ifa| {
                ifa.address
                    .as_ref()
                    .and_then(|a| a.as_sockaddr_in())
                    .is_some_and(|s| IpAddr::V4(s.ip()) == addr)
            })
        }),
        IpAddr::V6(v6) => std::fs::read_to_string(roots.net.join("if_inet6"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| parse_v6_hex(l.split_whitespace().next()?))
            .any(|a| a == v6),
    }
}

// ---------------------------------------------------------------------------------------------
// Container ids in rule comments

/// The container ids a rule comment names, in order, without duplicates: CNI portmap's
/// `name: "NET" id: "ID"` and `dnat name: "NET" id: "ID"` (quotes possibly still
/// backslash-escaped as in `iptables-save` output), netavark's unquoted `name: NET id: ID`
/// and `dnat name: NET id: ID`, natledger's `natledger:ID`, and any run of exactly 64 hex
/// digits (a Docker/containerd id written by anyone).
pub fn comment_container_ids(comment: &str) -> Vec<String> {
    let words: Vec<&str> = comment
        .split_whitespace()
        .map(|w| w.trim_matches(['"', '\'', '\\']))
        .collect();
    let mut found: Vec<&str> = Vec::new();
    for (i, word) in words.iter().enumerate() {
        if *word == "id:" && i >= 2 && words[i - 2] == "name:" {
            found.extend(words.get(i + 1));
        }
        found.extend(word.strip_prefix("natledger:"));
    }
    found.extend(
        comment
            .split(|c: char| !c.is_ascii_alphanumeric())
            .filter(|w| w.len() == 64 && w.bytes().all(|b| b.is_ascii_hexdigit())),
    );
    let mut ids: Vec<String> = Vec::new();
    for id in found {
        let valid = id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_+-.".contains(&b));
        if !id.is_empty() && valid && !ids.iter().any(|known| known == id) {
            ids.push(id.to_string());
        }
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::symlink;

    const ID_A: &str = "fb7cdb0a4f8da673da0a9818ec9a1576f953a8e8decf87a081827c11e4aa7138";
    const ID_B: &str = "0961bad27f1a52a28701b7038120b8188e7a78df21f57a08428f021ab3c071e2";

    /// An address as the socket tables print it: each 32-bit word in host order.
    fn sock_hex(ip: &str) -> String {
        let octets = match ip.parse().unwrap() {
            IpAddr::V4(a) => a.octets().to_vec(),
            IpAddr::V6(a) => a.octets().to_vec(),
        };
        let words = octets
            .chunks(4)
            .map(|w| u32::from_ne_bytes(w.try_into().unwrap()));
        words.map(|w| format!("{w:08X}")).collect()
    }

    /// A socket table: header, then one line per (address, port, state, inode).
    fn table(rows: &[(&str, u16, &str, u64)]) -> String {
        let mut t =
            "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   \
                     uid  timeout inode\n"
                .to_string();
        for (ip, port, st, inode) in rows {
            let (local, remote) = (
                sock_hex(ip),
                "0".repeat(if ip.contains(':') { 32 } else { 8 }),
            );
            t += &format!(
                "   0: {local}:{port:04X} {remote}:0000 {st} 00000000:00000000 00:00000000 \
                 00000000     0        0 {inode} 1 0000000000000000 100 0 0 10 0\n"
            );
        }
        t
    }

    fn write(path: &Path, text: &str) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }

    fn roots(dir: &Path) -> Roots {
        Roots {
            proc: dir.join("proc"),
            net: dir.join("net"),
            cni_networks: dir.join("cni"),
            runtime_state: vec![dir.join("run/runc"), dir.join("run/containerd/runc")],
            local_addresses: Some(vec!["192.0.2.7".parse().unwrap()]),
        }
    }

    #[test]
    fn listeners_in_a_fake_tree_with_owners() {
        let tmp = tempfile::tempdir().unwrap();
        let r = roots(tmp.path());
        let tcp = [
            ("0.0.0.0", 8080, "0A", 1111),
            ("127.0.0.1", 53, "0A", 2222),
            ("10.0.0.1", 40000, "01", 3333), // established: not a listener
        ];
        write(&r.net.join("tcp"), &table(&tcp));
        write(&r.net.join("tcp6"), &table(&[("::", 443, "0A", 4444)]));
        let udp = [("0.0.0.0", 5353, "07", 5555), ("10.0.0.1", 99, "01", 6666)];
        write(&r.net.join("udp"), &table(&udp)); // and no udp6 at all
        let links = [
            ("1234/fd/0", "/dev/null"),
            ("1234/fd/3", "socket:[1111]"),
            ("1234/fd/4", "socket:[5555]"),
            ("4321/fd/3", "socket:[1111]"), // shared with a child: the lower pid is named
            ("4321/fd/5", "socket:[4444]"),
            ("self/fd/7", "socket:[2222]"), // not a pid
        ];
        for (link, target) in links {
            fs::create_dir_all(r.proc.join(link).parent().unwrap()).unwrap();
            symlink(target, r.proc.join(link)).unwrap();
        }
        write(&r.proc.join("1234/comm"), "nginx\n");
        fs::create_dir_all(r.proc.join("77")).unwrap(); // no fd dir: vanished or unreadable

        let show = |l: &Listener| format!("{} {} {} {}", l.protocol, l.addr, l.port, l.inode);
        let show = |l: &Listener| format!("{} {:?} {:?}", show(l), l.pid, l.command);
        let got: Vec<String> = listeners(&r).iter().map(show).collect();
        let want = [
            "tcp 127.0.0.1 53 2222 None None",
            "tcp :: 443 4444 Some(4321) None",
            "udp 0.0.0.0 5353 5555 Some(1234) Some(\"nginx\")",
            "tcp 0.0.0.0 8080 1111 Some(1234) Some(\"nginx\")",
        ];
        assert_eq!(got, want);
        assert!(listeners(&roots(&tmp.path().join("nothing"))).is_empty());
        let lo = if cfg!(target_endian = "little") {
            "0100007F"
        } else {
            "7F000001"
        };
        assert_eq!(parse_socket_addr(lo), "127.0.0.1".parse().ok());
        let mapped = sock_hex("::ffff:10.1.2.3");
        assert_eq!(
            parse_socket_addr(&mapped),
            "10.1.2.3".parse().ok(),
            "given as IPv4"
        );
        assert_eq!(parse_socket_addr("0100007"), None);
    }

    #[test]
    fn real_proc_finds_this_process_listening() {
        let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = socket.local_addr().unwrap().port();
        let found = listeners(&Roots::default());
        let me = found
            .iter()
            .find(|l| l.protocol == Protocol::Tcp && l.port == port)
            .expect("own listener found");
        assert_eq!(me.addr, IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert_eq!(me.pid, Some(std::process::id() as i32));
        let comm = fs::read_to_string("/proc/self/comm").unwrap();
        assert_eq!(me.command.as_deref(), Some(comm.trim()));
    }

    #[test]
    fn cni_reservations_from_host_local_files() {
        let tmp = tempfile::tempdir().unwrap();
        let r = roots(tmp.path());
        assert!(!cni_networks_present(&r) && cni_reservations(&r).is_empty());
        let files = [
            ("cbr0/10.88.0.5", format!("{ID_A}\neth0")),
            ("cbr0/fd00::5", format!("{ID_A}\r\neth0\n")),
            ("cbr0/10.88.0.3", format!("{ID_B}\n")),
            ("cbr0/last_reserved_ip.0", "10.88.0.5".into()),
            ("cbr0/lock", "".into()),
            ("podman/10.89.0.2", "".into()),
            ("podman/10.89.0.9", "abc".into()),
        ];
        for (name, text) in files {
            write(&r.cni_networks.join(name), &text);
        }
        assert!(cni_networks_present(&r));
        let show = |v: &Reservation| format!("{} {} {}", v.network, v.addr, v.container_id);
        let got: Vec<String> = cni_reservations(&r).iter().map(show).collect();
        let want = [
            format!("cbr0 10.88.0.3 {ID_B}"),
            format!("cbr0 10.88.0.5 {ID_A}"),
            format!("cbr0 fd00::5 {ID_A}"),
            "podman 10.89.0.9 abc".into(),
        ];
        assert_eq!(got, want);
        let interfaces: Vec<_> = cni_reservations(&r)
            .into_iter()
            .map(|v| v.interface)
            .collect();
        assert_eq!(
            interfaces,
            [None, Some("eth0".into()), Some("eth0".into()), None]
        );
    }

    #[test]
    fn runtime_containers_and_liveness() {
        let tmp = tempfile::tempdir().unwrap();
        let r = roots(tmp.path());
        assert!(!runtime_state_present(&r));
        for (pid, state, start) in [(1234, "S", 5555), (666, "Z", 7)] {
            let stat =
                format!("{pid} (a (b) c) {state} 1 {pid} {pid} 0 -1 4194560 1 0 0 0 0 0 0 0");
            let stat = format!("{stat} 20 0 1 0 {start} 100 10\n");
            write(&r.proc.join(format!("{pid}/stat")), &stat);
        }
        let json = |id: &str, pid, start: &str| {
            let start = format!(r#""init_process_start":{start}"#);
            format!(r#"{{"id":"{id}","init_process_pid":{pid},{start},"x":1}}"#)
        };
        let files = [
            (format!("runc/{ID_A}"), json(ID_A, 1234, "5555")),
            ("runc/stopped".into(), json("stopped", 4321, "5555")),
            ("runc/zombie".into(), json("zombie", 666, "7")),
            ("runc/garbage".into(), "{not json".into()),
            // containerd's layout; the pid was reused (start time as a string, as old runc)
            (
                format!("containerd/runc/k8s.io/{ID_B}"),
                json(ID_B, 1234, "\"999\""),
            ),
            (
                "containerd/runc/moby/noid".into(),
                r#"{"init_process_pid":1234}"#.into(),
            ),
        ];
        for (dir, text) in &files {
            write(&tmp.path().join("run").join(dir).join("state.json"), text);
        }
        assert!(runtime_state_present(&r));
        let all = runtime_containers(&r);
        let got: Vec<String> = all
            .iter()
            .map(|c| format!("{} {:?} {}", c.id, c.pid, c.alive))
            .collect();
        let want = [
            format!("{ID_B} Some(1234) false"),
            format!("{ID_A} Some(1234) true"),
            "noid Some(1234) true".into(), // id from the directory; no start time recorded
            "stopped Some(4321) false".into(),
            "zombie Some(666) false".into(),
        ];
        assert_eq!(got, want);
        let reused = format!("run/containerd/runc/k8s.io/{ID_B}/state.json");
        assert_eq!(all[0].state_file, tmp.path().join(reused));

        let alive = |id: &str| container_id_alive(id, &all);
        assert_eq!(alive(ID_A), Some(true));
        assert_eq!(alive(&ID_A[..12]), Some(true));
        assert_eq!(alive(&ID_B[..12]), Some(false));
        assert_eq!(alive(&ID_A[..11]), None, "too short");
        assert_eq!(alive("stopped"), Some(false), "exact id");
        assert_eq!(alive("deadbeefdeadbeef"), None, "unknown");
        assert_eq!(alive(""), None);
        let mut twins = all.clone();
        twins[0].id = format!("{}ffff", &ID_A[..20]);
        assert_eq!(container_id_alive(&ID_A[..12], &twins), None, "ambiguous");
    }

    // As this kernel prints them (x86: IPv4 in little-endian host order).
    const ROUTE: &str = "\
Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0
eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0
docker0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0
eth0\t00000A0A\t050200C0\t0003\t0\t0\t0\t0000FFFF\t0\t0\t0
*\t0000FE0A\t00000000\t0201\t0\t0\t0\t0000FFFF\t0\t0\t0
";
    const IPV6_ROUTE: &str = "\
fd000000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth0
fe800000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000002 00000000 00000001     eth0
00000000000000000000000000000000 00 00000000000000000000000000000000 00 fd000000000000000000000000000001 00000400 00000003 00000000 00000003     eth0
00000000000000000000000000000001 80 00000000000000000000000000000000 00 00000000000000000000000000000000 00000000 00000002 00000000 80200001       lo
fd000000000000000000000000000002 80 00000000000000000000000000000000 00 00000000000000000000000000000000 00000000 00000004 00000000 80200001     eth0
fd770000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001  br-natl
20010db8000000000000000000000000 20 00000000000000000000000000000000 00 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo
";

    #[cfg(target_endian = "little")]
    #[test]
    fn routes_skip_default_reject_and_local_entries() {
        let tmp = tempfile::tempdir().unwrap();
        let mut r = roots(tmp.path());
        write(&r.net.join("route"), ROUTE);
        write(&r.net.join("ipv6_route"), IPV6_ROUTE);
        let inet6 = "fd000000000000000000000000000002 04 40 00 82     eth0\n";
        write(&r.net.join("if_inet6"), inet6);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let show = |r: Route| {
            format!(
                "{}/{} {} {:?}",
                r.dest, r.prefix_len, r.interface, r.gateway
            )
        };
        let route = |s: &str| route_to(&r, ip(s)).map(show).unwrap();
        assert_eq!(route("172.17.0.2"), "172.17.0.0/16 docker0 None");
        assert_eq!(route("10.10.3.4"), "10.10.0.0/16 eth0 Some(192.0.2.5)");
        assert_eq!(route("fd77::2"), "fd77::/64 br-natl None");
        assert!(has_route(&r, ip("192.0.2.99")) && has_route(&r, ip("fd00::9")));
        assert!(!has_route(&r, ip("8.8.8.8")), "only the default route");
        assert!(!has_route(&r, ip("10.254.0.1")), "unreachable route");
        assert!(!has_route(&r, ip("2001:db8::1")), "unreachable on lo");
        assert!(!has_route(&r, ip("2a00::1")) && !has_route(&r, ip("::1")));
        assert_eq!(routes(&r).len(), 6);

        assert!(is_local_address(&r, ip("192.0.2.7")), "injected");
        assert!(is_local_address(&r, ip("127.0.0.9")));
        assert!(!is_local_address(&r, ip("192.0.2.8")));
        r.local_addresses = None;
        assert!(is_local_address(&r, ip("fd00::2")), "from if_inet6");
        assert!(!is_local_address(&r, ip("fd00::3")));
        assert!(is_local_address(&r, ip("::1")));
        assert!(!is_local_address(&r, ip("203.0.113.254")), "not here");
    }

    #[test]
    fn container_ids_from_comments() {
        let ids = |c: &str| comment_container_ids(c);
        assert_eq!(ids(&format!(r#"dnat name: "cbr0" id: "{ID_A}""#)), [ID_A]);
        let saved = format!(r#""dnat name: \"cbr0\" id: \"{ID_A}\"""#);
        assert_eq!(ids(&saved), [ID_A], "as iptables-save quotes it");
        assert_eq!(ids("dnat name: podman id: 3f2a8e"), ["3f2a8e"]); // netavark
        assert_eq!(ids("name: podman id: c1"), ["c1"]);
        assert_eq!(ids("natledger:web-1.a"), ["web-1.a"]);
        let both = format!("kube {ID_B} and natledger:{ID_B} then {ID_A}");
        assert_eq!(ids(&both), [ID_B, ID_A]);
        let nones = [
            "natledger",
            "natledger:",
            "hostname: x id: y",
            "KUBE-SVC-X ns/web:http",
        ];
        for none in nones {
            assert!(ids(none).is_empty(), "{none}");
        }
        assert!(ids(&format!("{ID_A}0")).is_empty(), "65 hex digits");
    }
}
