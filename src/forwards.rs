//! Other owners' forwards of a host port: the DNAT and REDIRECT rules, of anyone but
//! natledger (Docker's `DOCKER` chain, CNI portmap's `CNI-HOSTPORT-DNAT`, kube-proxy's
//! `KUBE-NODEPORTS`, netavark's, hand-written), that may take packets to a host port
//! natledger is about to forward, in either backend.
//!
//! natledger's jump is the first rule of its backend's PREROUTING and OUTPUT, so it silently
//! wins such a port on its own backend (and the other backend's rules run too): local
//! traffic reaches natledger's container, other traffic breaks for both, and since the other
//! owner's port keeper (docker-proxy) is not counted as a listener, nothing says so.
//! create-runtime asks [`find`] first and warns, or refuses.
//!
//! # How
//! Each backend and family's nat table is walked from PREROUTING and OUTPUT as the kernel
//! does, with a packet to the host port ([`probe`]: its protocol and ports, to an address of
//! this host, or to the mapping's host address): every rule whose conditions may match
//! ([`crate::packet`]) is followed through its jumps, and every DNAT or REDIRECT reached is a
//! forward, with the rules on its path. natledger's own chains and jumps are skipped.
//!
//! The rules are read in-process ([`crate::iptc`] for iptables-legacy, the table's blob;
//! [`crate::nftables`] for iptables-nft, chain by chain, only the chains the walk enters),
//! or through `*-save` when the native paths are off.
//!
//! # Cost, and the iptables-nft cache
//! Reading a chain over netlink costs about 6 us a rule in the kernel, and more: the kernel
//! restarts a dump for every 32 KiB, so a 10,000-rule chain (kube-proxy's KUBE-SERVICES) costs
//! 55-85 ms. So the result of a walk with a packet to *any* port and protocol of this host (the
//! candidates: every forward any host port could meet, with its path) is kept in the state
//! directory, valid while the nf_tables generation of the network namespace (bumped by every
//! committed transaction, by anyone) and the host's addresses are as they were. natledger
//! moves the generation itself when it writes; it carries the cache over when the generation
//! moved by exactly its own transactions ([`Cache::carry`]). iptables-legacy has no
//! generation, but its whole table is one read (a few ms at 10,000 rules), so it is walked
//! each time.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::backend::{Backend, BackendError, Netfilter, legacy_table_exists};
use crate::family::Family;
use crate::iptc;
use crate::layout::{NAT, Owner, is_owned_chain, owner};
use crate::matchset::{Target, parse_rule};
use crate::nftables::{self, NftError};
use crate::packet::{Addresses, Conntrack, Packet, Tri};
use crate::portspec::{PortMapping, Protocol};
use crate::save::Table;

/// Chains deeper than this are not followed (iptables itself refuses loops).
const MAX_DEPTH: usize = 32;
/// The built-in nat chains a packet to a host port goes through.
const HOOKS: [&str; 2] = ["PREROUTING", "OUTPUT"];

/// A rule on the way to a forward: its chain, 1-based position, and arguments.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    pub chain: String,
    pub position: usize,
    pub args: Vec<String>,
}

/// A DNAT or REDIRECT of another owner, and the jumps that lead to it (the last step is the
/// rule itself).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Candidate {
    pub path: Vec<Step>,
}

impl Candidate {
    /// The DNAT or REDIRECT rule.
    pub fn rule(&self) -> &Step {
        self.path.last().expect("a candidate has its rule")
    }

    /// Whether `packet` may be taken by it: every rule on its path may match.
    pub fn takes(&self, packet: &Packet) -> bool {
        self.path
            .iter()
            .all(|s| packet.test(&parse_rule(&s.args).0) != Tri::No)
    }
}

/// A forward found for a mapping: where, and the rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Forward {
    pub backend: Backend,
    pub family: Family,
    pub mapping: PortMapping,
    pub candidate: Candidate,
}

/// The rules of a chain a walk kept, with their 1-based positions.
pub type Kept = Vec<(usize, Vec<String>)>;

/// The rules of one table, chain by chain, as the walk asks for them.
pub trait Chains {
    type Error;
    /// The rules of `chain` that `keep` keeps, in order, with their positions; `None` when
    /// there is no such chain.
    fn rules(
        &mut self,
        chain: &str,
        keep: &mut dyn FnMut(&[String]) -> bool,
    ) -> Result<Option<Kept>, Self::Error>;
}

impl Chains for &Table {
    type Error = std::convert::Infallible;

    fn rules(
        &mut self,
        chain: &str,
        keep: &mut dyn FnMut(&[String]) -> bool,
    ) -> Result<Option<Kept>, Self::Error> {
        if !self.has_chain(chain) {
            return Ok(None);
        }
        Ok(Some(
            self.rules_in(chain)
                .enumerate()
                .filter(|(_, r)| keep(&r.args))
                .map(|(i, r)| (i + 1, r.args.clone()))
                .collect(),
        ))
    }
}

/// The packet that opens a connection to a host port: `mapping`'s protocol and host ports,
/// to its host address or to any of `locals` (this host's addresses), conntrack NEW (nat sees
/// only those). `mapping: None` is a packet to any port of any protocol of this host.
pub fn probe(mapping: Option<&PortMapping>, family: Family, locals: &[IpAddr]) -> Packet {
    let host = mapping.and_then(PortMapping::host_destination);
    let dst = match host {
        Some(addr) => Addresses::Exactly(addr),
        None => Addresses::AnyOf(
            locals
                .iter()
                .copied()
                .filter(|a| Family::of(*a) == family)
                .collect(),
        ),
    };
    Packet {
        protocol: mapping.map(|m| protocol_number(m.protocol)),
        dst: dst.clone(),
        dports: mapping.map(|m| m.host_ports),
        dst_local: Some(true),
        conntrack: Some(Conntrack {
            states: vec!["NEW"],
            unsure: Vec::new(),
            orig_dst: dst,
            orig_dst_ports: mapping.map(|m| m.host_ports),
            repl_src: None,
            repl_src_ports: None,
            original: true,
        }),
        ..Packet::unknown(family)
    }
}

fn protocol_number(p: Protocol) -> u8 {
    match p {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

/// Every forward of another owner `packet` may meet in one nat table, with its path: the
/// rules of PREROUTING and OUTPUT that may match it, through their jumps (each chain read
/// once), to every DNAT or REDIRECT. A rule certain to end nat for the packet (DNAT, REDIRECT,
/// ACCEPT) stops that hook; a certain RETURN ends its chain.
pub fn walk<C: Chains>(chains: &mut C, packet: &Packet) -> Result<Vec<Candidate>, C::Error> {
    let mut walker = Walker {
        packet,
        read: HashMap::new(),
        found: Vec::new(),
    };
    for hook in HOOKS {
        let mut path = Vec::new();
        walker.chain(chains, hook, &mut path)?;
    }
    Ok(walker.found)
}

struct Walker<'p> {
    packet: &'p Packet,
    /// The rules kept of every chain read so far.
    read: HashMap<String, Option<Kept>>,
    found: Vec<Candidate>,
}

/// How a chain ended for the walk.
enum End {
    /// Its rules ran out, or a RETURN: back to the caller.
    Back,
    /// A rule certain to end nat for the packet.
    Stop,
}

impl Walker<'_> {
    fn chain<C: Chains>(
        &mut self,
        chains: &mut C,
        name: &str,
        path: &mut Vec<Step>,
    ) -> Result<End, C::Error> {
        if path.len() >= MAX_DEPTH || path.iter().any(|s| s.chain == name) {
            return Ok(End::Back);
        }
        if !self.read.contains_key(name) {
            let packet = self.packet;
            let mut keep = |args: &[String]| packet.test(&parse_rule(args).0) != Tri::No;
            let rules = chains.rules(name, &mut keep)?;
            self.read.insert(name.to_string(), rules);
        }
        let Some(rules) = self.read.get(name).cloned().flatten() else {
            return Ok(End::Back);
        };
        for (position, args) in rules {
            if !matches!(owner(name, &args), Owner::Foreign) || is_owned_chain(name) {
                continue;
            }
            let (m, target) = parse_rule(&args);
            let sure = self.packet.test(&m) == Tri::Yes;
            let step = Step {
                chain: name.to_string(),
                position,
                args,
            };
            match &target {
                Target::Dnat { .. } | Target::Redirect { .. } => {
                    let mut full = path.clone();
                    full.push(step);
                    self.found.push(Candidate { path: full });
                    if sure {
                        return Ok(End::Stop);
                    }
                }
                Target::Accept if sure => return Ok(End::Stop),
                Target::Return if sure => return Ok(End::Back),
                Target::Jump(to) | Target::Goto(to) if !is_owned_chain(to) => {
                    let goto = matches!(target, Target::Goto(_));
                    path.push(step);
                    let end = self.chain(chains, to, path)?;
                    path.pop();
                    match end {
                        End::Stop if sure => return Ok(End::Stop),
                        End::Back if sure && goto => return Ok(End::Back),
                        _ => {}
                    }
                }
                _ => {}
            }
        }
        Ok(End::Back)
    }
}

/// The iptables-nft candidates of one family, kept between hook runs in the state
/// directory (see the module comment).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cache {
    pub schema: u32,
    pub entries: Vec<CacheEntry>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheEntry {
    pub family: Family,
    /// The nf_tables generation the candidates were read at.
    pub generation: u32,
    /// The host's addresses then (the walk judges destinations by them).
    pub locals: Vec<IpAddr>,
    pub candidates: Vec<Candidate>,
}

const CACHE_SCHEMA: u32 = 1;
/// The cache's file in the state directory.
pub const CACHE_FILE: &str = "forwards.json";

impl Cache {
    /// The cache, or an empty one when there is none or it cannot be read (it is only ever
    /// a cache: reading the tables again is always right).
    pub fn load(path: &Path) -> Cache {
        std::fs::read(path)
            .ok()
            .and_then(|b| serde_json::from_slice::<Cache>(&b).ok())
            .filter(|c| c.schema == CACHE_SCHEMA)
            .unwrap_or_default()
    }

    /// Write it (temp file and rename; not synced: after a crash a lost or old cache is only
    /// re-read). Failures are ignored for the same reason.
    pub fn store(&self, path: &Path) {
        let mut out = self.clone();
        out.schema = CACHE_SCHEMA;
        let Ok(json) = serde_json::to_vec(&out) else {
            return;
        };
        let tmp = path.with_extension("json.tmp");
        if std::fs::write(&tmp, json).is_ok() {
            let _ = std::fs::rename(&tmp, path);
        }
    }

    /// The candidates of `family` if they were read at `generation` with these `locals`.
    pub fn valid(
        &self,
        family: Family,
        generation: u32,
        locals: &[IpAddr],
    ) -> Option<&[Candidate]> {
        self.entries
            .iter()
            .find(|e| e.family == family && e.generation == generation && e.locals == locals)
            .map(|e| e.candidates.as_slice())
    }

    pub fn put(&mut self, entry: CacheEntry) {
        self.entries.retain(|e| e.family != entry.family);
        self.entries.push(entry);
    }

    /// After natledger's own transactions moved the generation from `before` to `after`:
    /// entries read at `before` stay valid at `after` when `after - before` is exactly the
    /// number of transactions natledger committed (so nobody else committed meanwhile; its
    /// own rules are never candidates). Others are dropped.
    pub fn carry(&mut self, before: u32, after: u32, own: u32) {
        let exact = after.wrapping_sub(before) == own;
        self.entries.retain_mut(|e| {
            if exact && e.generation == before {
                e.generation = after;
                true
            } else {
                e.generation == after
            }
        });
    }
}

/// A table that could not be read for the check, and why.
#[derive(Debug, thiserror::Error)]
#[error("cannot read the {backend} {family} nat table for other owners' forwards: {reason}")]
pub struct Unread {
    pub backend: Backend,
    pub family: Family,
    pub reason: String,
}

/// Every other owner's forward of any of `mappings` (each in the families it applies to among
/// `families`), in both backends: iptables-legacy from its table blob, iptables-nft chain by
/// chain (candidates kept in `cache` while the generation holds), or both through `*-save`
/// when the native paths are off. Tables that cannot be read are returned beside what was
/// found elsewhere.
pub fn find(
    nf: &Netfilter,
    cache: &Path,
    mappings: &[PortMapping],
    families: &[Family],
) -> (Vec<Forward>, Vec<Unread>) {
    let trace = std::env::var_os("NATLEDGER_TRACE").is_some();
    let mut found: Vec<Forward> = Vec::new();
    let mut unread = Vec::new();
    for family in families.iter().copied() {
        let wanted: Vec<&PortMapping> = mappings
            .iter()
            .filter(|m| m.family().is_none_or(|f| f == family))
            .collect();
        if wanted.is_empty() {
            continue;
        }
        let locals = local_addresses(family);
        for backend in Backend::ALL {
            let start = std::time::Instant::now();
            let read = candidates(nf, cache, backend, family, &locals);
            if trace {
                let ms = start.elapsed().as_secs_f64() * 1000.0;
                match &read {
                    Ok((c, how)) => eprintln!(
                        "natledger: forwards: {backend} {family}: {} candidate(s) {how} in \
                         {ms:.1} ms",
                        c.len()
                    ),
                    Err(e) => eprintln!("natledger: forwards: {backend} {family}: {e}"),
                }
            }
            let candidates = match read {
                Ok((c, _)) => c,
                Err(reason) => {
                    unread.push(Unread {
                        backend,
                        family,
                        reason,
                    });
                    continue;
                }
            };
            for m in &wanted {
                let packet = probe(Some(m), family, &locals);
                for c in candidates.iter().filter(|c| c.takes(&packet)) {
                    let known = found.iter().any(|f| {
                        f.backend == backend && f.family == family && f.candidate.rule() == c.rule()
                    });
                    if !known {
                        found.push(Forward {
                            backend,
                            family,
                            mapping: (*m).clone(),
                            candidate: c.clone(),
                        });
                    }
                }
            }
        }
    }
    (found, unread)
}

/// The candidates of one backend and family: every forward a packet to some port of this
/// host may meet (empty when the table does not exist), and how they were had.
fn candidates(
    nf: &Netfilter,
    cache: &Path,
    backend: Backend,
    family: Family,
    locals: &[IpAddr],
) -> Result<(Vec<Candidate>, &'static str), String> {
    let any = probe(None, family, locals);
    match (backend, nf.native()) {
        (Backend::Legacy, true) => {
            if !legacy_table_exists(family, NAT).map_err(|e| e.to_string())? {
                return Ok((Vec::new(), "(no table)"));
            }
            let blob = iptc::read(family, NAT).map_err(|e| e.to_string())?;
            let mut source = Legacy(&blob);
            let found = walk(&mut source, &any).unwrap_or_else(|never| match never {});
            Ok((found, "read from the table"))
        }
        (Backend::Nft, true) => nf
            .with_nft(|session| {
                let generation = session.generation()?;
                let mut kept = Cache::load(cache);
                if let Some(valid) = kept.valid(family, generation, locals) {
                    return Ok((valid.to_vec(), "from the cache"));
                }
                let mut source = Nft { session, family };
                let candidates = walk(&mut source, &any)?;
                kept.put(CacheEntry {
                    family,
                    generation,
                    locals: locals.to_vec(),
                    candidates: candidates.clone(),
                });
                kept.store(cache);
                Ok((candidates, "read over netlink"))
            })
            .map_err(|e| e.to_string()),
        (_, false) => match nf.read_whole(backend, family, NAT) {
            Ok(Some(table)) => {
                let mut source = &table;
                let found = walk(&mut source, &any).unwrap_or_else(|never| match never {});
                Ok((found, "read with *-save"))
            }
            Ok(None) | Err(BackendError::ToolNotFound { .. }) => Ok((Vec::new(), "(no table)")),
            Err(e) => Err(e.to_string()),
        },
    }
}

/// This host's addresses of `family` (the calling thread's network namespace), loopback's
/// included: where a packet to a host port may be addressed.
fn local_addresses(family: Family) -> Vec<IpAddr> {
    let mut addrs: Vec<IpAddr> = nix::ifaddrs::getifaddrs()
        .map(|all| {
            all.filter_map(|ifa| {
                let a = ifa.address?;
                a.as_sockaddr_in()
                    .map(|s| IpAddr::V4(s.ip()))
                    .or_else(|| a.as_sockaddr_in6().map(|s| IpAddr::V6(s.ip())))
            })
            .collect()
        })
        .unwrap_or_default();
    addrs.retain(|a| Family::of(*a) == family);
    let loopback: IpAddr = match family {
        Family::Ipv4 => std::net::Ipv4Addr::LOCALHOST.into(),
        Family::Ipv6 => std::net::Ipv6Addr::LOCALHOST.into(),
    };
    if !addrs.contains(&loopback) {
        addrs.push(loopback);
    }
    addrs.sort();
    addrs.dedup();
    addrs
}

/// An iptables-legacy table blob, decoded chain by chain ([`iptc::render`]).
struct Legacy<'b>(&'b iptc::blob::Blob);

impl Chains for Legacy<'_> {
    type Error = std::convert::Infallible;

    fn rules(
        &mut self,
        chain: &str,
        keep: &mut dyn FnMut(&[String]) -> bool,
    ) -> Result<Option<Kept>, Self::Error> {
        Ok(iptc::render::chain_rules(self.0, chain).map(|rules| {
            rules
                .enumerate()
                .filter(|(_, args)| keep(args))
                .map(|(i, args)| (i + 1, args))
                .collect()
        }))
    }
}

/// An iptables-nft table, read over netlink one chain at a time ([`crate::nftables`]).
struct Nft<'s, 'k> {
    session: &'s mut nftables::Session<'k>,
    family: Family,
}

impl Chains for Nft<'_, '_> {
    type Error = NftError;

    fn rules(
        &mut self,
        chain: &str,
        keep: &mut dyn FnMut(&[String]) -> bool,
    ) -> Result<Option<Kept>, Self::Error> {
        let mut kept = Vec::new();
        let mut position = 0;
        let read = self.session.each_rule(self.family, NAT, chain, |_, args| {
            position += 1;
            if keep(args) {
                kept.push((position, args.to_vec()));
            }
        })?;
        Ok(read.map(|_| kept))
    }
}

/// The iptables-nft generation before natledger's own writes, to carry the candidates over
/// them ([`carry`]); `None` when nothing is cached or the native paths are off.
pub struct Before {
    generation: u32,
    commits: u32,
}

/// Note the generation before natledger writes (only worth it when a cache exists).
pub fn before_writes(nf: &Netfilter, cache: &Path) -> Option<Before> {
    if !nf.native() || !cache.exists() {
        return None;
    }
    let generation = nf.with_nft(|s| s.generation()).ok()?;
    Some(Before {
        generation,
        commits: nf.nft_commits(),
    })
}

/// After natledger's writes: keep the cached candidates valid if the generation moved by
/// exactly natledger's own transactions since [`before_writes`] (its rules are never
/// candidates), else drop them.
pub fn carry(nf: &Netfilter, cache: &Path, before: Option<Before>) {
    let Some(before) = before else {
        return;
    };
    let Ok(after) = nf.with_nft(|s| s.generation()) else {
        return;
    };
    if after == before.generation {
        return;
    }
    let mut kept = Cache::load(cache);
    kept.carry(before.generation, after, nf.nft_commits() - before.commits);
    kept.store(cache);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::portspec::parse_entry;
    use crate::save::parse_dump;

    const LOCALS: [&str; 3] = ["10.78.0.1", "127.0.0.1", "fd78::1"];

    fn locals() -> Vec<IpAddr> {
        LOCALS.iter().map(|a| a.parse().unwrap()).collect()
    }

    fn found(text: &str, spec: &str) -> Vec<String> {
        let table = parse_dump(text).unwrap().remove(0);
        let m = parse_entry(spec).unwrap();
        let packet = probe(Some(&m), Family::Ipv4, &locals());
        let mut t = &table;
        walk(&mut t, &packet)
            .unwrap()
            .iter()
            .map(|c| {
                let r = c.rule();
                format!("{} {}", r.chain, r.position)
            })
            .collect()
    }

    const HOST: &str = "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
        :DOCKER - [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-NODEPORTS - [0:0]\n\
        :KUBE-SVC-A - [0:0]\n:KUBE-SEP-A - [0:0]\n:CNI-HOSTPORT-DNAT - [0:0]\n\
        :CNI-DN-x - [0:0]\n:NATLEDGER-HOSTPORTS - [0:0]\n\
        -A PREROUTING -m addrtype --dst-type LOCAL -m comment --comment natledger -j NATLEDGER-HOSTPORTS\n\
        -A PREROUTING -j KUBE-SERVICES\n\
        -A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT\n\
        -A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER\n\
        -A OUTPUT ! -d 127.0.0.0/8 -m addrtype --dst-type LOCAL -j DOCKER\n\
        -A DOCKER -i docker0 -j RETURN\n\
        -A DOCKER ! -i docker0 -p tcp -m tcp --dport 8080 -j DNAT --to-destination 172.17.0.2:80\n\
        -A KUBE-SERVICES -d 10.96.0.10/32 -p udp -m udp --dport 53 -j KUBE-SVC-A\n\
        -A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n\
        -A KUBE-NODEPORTS -p tcp -m tcp --dport 30080 -j KUBE-SVC-A\n\
        -A KUBE-SVC-A -m statistic --mode random --probability 0.5 -j KUBE-SEP-A\n\
        -A KUBE-SEP-A -p tcp -j DNAT --to-destination 10.244.0.5:80\n\
        -A CNI-HOSTPORT-DNAT -p udp -m multiport --dports 5353,9000:9010 -j CNI-DN-x\n\
        -A CNI-DN-x -p udp -m udp --dport 9005 -j DNAT --to-destination 10.88.0.2:53\n\
        -A NATLEDGER-HOSTPORTS -p tcp -m tcp --dport 8080 -m comment --comment natledger:c1 -j DNAT --to-destination 10.77.0.2:80\n\
        COMMIT\n";

    #[test]
    fn finds_each_owners_forward_of_the_port_and_nothing_else() {
        // Docker's, from PREROUTING and from OUTPUT; natledger's own is not another's.
        assert_eq!(found(HOST, "8080:80"), ["DOCKER 2", "DOCKER 2"]);
        // kube-proxy's NodePort, through KUBE-SERVICES, KUBE-NODEPORTS and the endpoints.
        assert_eq!(found(HOST, "30080:80"), ["KUBE-SEP-A 1"]);
        // CNI portmap's, through the multiport jump.
        assert_eq!(found(HOST, "9005:53/udp"), ["CNI-DN-x 1"]);
        // Nothing: another port, another protocol, kube's ClusterIP (not a host address).
        assert!(found(HOST, "8081:80").is_empty());
        assert!(found(HOST, "8080:80/udp").is_empty());
        assert!(found(HOST, "53:53/udp").is_empty());
        // A host address the rule does not name still may be taken; one it excludes is not.
        let hand = "*nat\n:PREROUTING ACCEPT [0:0]\n\
            -A PREROUTING -d 10.78.0.1/32 -p tcp -j DNAT --to-destination 10.1.1.1\n\
            -A PREROUTING -p tcp -j REDIRECT --to-ports 3128\nCOMMIT\n";
        assert_eq!(found(hand, "10.78.0.1:8080:80"), ["PREROUTING 1"]);
        assert_eq!(found(hand, "127.0.0.1:8080:80"), ["PREROUTING 2"]);
        assert_eq!(found(hand, "8080:80"), ["PREROUTING 1", "PREROUTING 2"]);
    }

    #[test]
    fn candidates_for_any_port_serve_every_port() {
        let table = parse_dump(HOST).unwrap().remove(0);
        let mut t = &table;
        let any = walk(&mut t, &probe(None, Family::Ipv4, &locals())).unwrap();
        for spec in ["8080:80", "30080:80", "9005:53/udp", "8081:80", "53:53/udp"] {
            let m = parse_entry(spec).unwrap();
            let packet = probe(Some(&m), Family::Ipv4, &locals());
            let from_cache: Vec<&Step> = any
                .iter()
                .filter(|c| c.takes(&packet))
                .map(Candidate::rule)
                .collect();
            let direct = walk(&mut t, &packet).unwrap();
            let direct: Vec<&Step> = direct.iter().map(Candidate::rule).collect();
            assert_eq!(from_cache, direct, "{spec}");
        }
    }

    #[test]
    fn the_cache_carries_over_natledgers_own_transactions_only() {
        let entry = |generation| CacheEntry {
            family: Family::Ipv4,
            generation,
            locals: locals(),
            candidates: Vec::new(),
        };
        let mut cache = Cache::default();
        cache.put(entry(7));
        assert!(cache.valid(Family::Ipv4, 7, &locals()).is_some());
        assert!(cache.valid(Family::Ipv4, 8, &locals()).is_none());
        assert!(cache.valid(Family::Ipv4, 7, &locals()[..1]).is_none());
        cache.carry(7, 9, 2);
        assert!(cache.valid(Family::Ipv4, 9, &locals()).is_some());
        // Someone else committed too: dropped.
        cache.carry(9, 12, 2);
        assert!(cache.entries.is_empty());
    }
}
