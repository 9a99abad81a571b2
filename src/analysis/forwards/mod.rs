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
//! does ([`crate::analysis::iptables::nat_walk`]), with a packet to the host port
//! ([`nat_walk::probe`](crate::analysis::iptables::nat_walk::probe): its protocol and
//! ports, to an address of this host, or to the mapping's host address): every rule whose
//! conditions may match ([`crate::analysis::iptables::packet`]) is followed through its
//! jumps, and every DNAT or REDIRECT reached is a forward, with the rules on its path.
//! natledger's own chains and jumps are skipped.
//!
//! The rules are read in-process ([`crate::kernel::iptc`] for iptables-legacy, the table's blob;
//! [`crate::kernel::nftables`] for iptables-nft, chain by chain, only the chains the walk enters),
//! or through `*-save` when the native paths are off. Both readers leave undecoded a rule
//! whose destination compare names no address a packet to a host port may have (the entry
//! header's `-d`; iptables-nft's destination load and compare, `nftables::read::skip`): the
//! chains such a packet passes are mostly services of other addresses. When create warns
//! rather than refuses, it checks once its rules are in, and the iptables-legacy nat table it
//! just swapped in (`Netfilter::take_legacy_nat`) is walked as written: the same rules a
//! read would return, without copying the table out of the kernel a second time.
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
//! each time, once per mapping (a packet to one port leaves every other port's branch
//! unread).
//!
//! A walk with a packet to any port follows every branch: kube-proxy's NodePorts lead to
//! one candidate per endpoint (2,768 NodePorts of 10 endpoints: 55,000 candidates, 37 MB of
//! cache, 1.2 s; to one port, 20 candidates). So past [`MAX_CACHED`] candidates, or when the
//! walk to any port is too branched, the cache keeps only that fact for the generation, and
//! each create walks once per mapping over netlink instead. Every walk stops at
//! `MAX_VISITS` rules (`iptables::nat_walk`): chains that branch into one another multiply a
//! walk without any loop, and a walk cut short is no answer (the table counts as unread).
//!
//! From the cache, each mapping gets the candidates its packet may meet, up to the first
//! certain to take it in each hook
//! ([`nat_walk::taken`](crate::analysis::iptables::nat_walk::taken)): never fewer than its own walk finds, and
//! more only when a rule that is not a forward (an ACCEPT, a RETURN) certainly ends the
//! hook for that port first.

mod cache;
mod nftables;
mod sources;
#[cfg(test)]
mod tests;

pub use cache::{Before, Cache, CacheEntry, Cached, Scope, carry};
pub(crate) use cache::{CACHE_FILE, before_writes};
pub use nftables::NFT_CACHE_FILE;
pub use nftables::{LiveNft, NftFound, find_nft, find_nft_live};
use sources::{Legacy, Nft};

use std::path::Path;

use crate::analysis::iptables::matchset::net_contains;
use crate::analysis::iptables::nat_walk::{
    Candidate, Saved, WalkError, probe, taken, walk_counted, walk_each,
};
use crate::analysis::iptables::packet::Packet;
use crate::backend::{Backend, BackendError, Netfilter, Reading, legacy_table_exists};
use crate::kernel::iptc;
use crate::kernel::nftables::NftError;
use crate::model::family::Family;
use crate::model::layout::NAT;
use crate::model::portspec::PortMapping;
use crate::model::rule::IpNet;

/// The most candidates the iptables-nft cache keeps: about 700 bytes each as JSON on a
/// kube-proxy host, and every create loads the file and tests each candidate against each
/// mapping (20,000 made a 13 MB file, 124 ms to load).
pub(crate) const MAX_CACHED: usize = 1_000;
/// A forward found for a mapping: where, and the rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Forward {
    pub backend: Backend,
    pub family: Family,
    pub mapping: PortMapping,
    pub candidate: Candidate,
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
    let trace = log::log_enabled!(log::Level::Debug);
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
        let locals = destinations(family, &wanted);
        let packets: Vec<Packet> = wanted
            .iter()
            .map(|m| probe(Some(m), family, &locals))
            .collect();
        for backend in Backend::iptables() {
            let start = std::time::Instant::now();
            let read = candidates(nf, cache, backend, family, &locals, &packets);
            if trace {
                let ms = start.elapsed().as_secs_f64() * 1000.0;
                match &read {
                    Ok((_, how)) => {
                        log::debug!("forwards: {backend} {family}: {how} in {ms:.1} ms")
                    }
                    Err(e) => log::debug!("forwards: {backend} {family}: {e}"),
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
            for (m, taken) in wanted.iter().zip(candidates) {
                for c in taken {
                    let known = found.iter().any(|f| {
                        f.backend == backend
                            && f.family == family
                            && f.mapping == **m
                            && f.candidate.rule() == c.rule()
                    });
                    if !known {
                        found.push(Forward {
                            backend,
                            family,
                            mapping: (*m).clone(),
                            candidate: c,
                        });
                    }
                }
            }
        }
    }
    (found, unread)
}

/// The forwards each of `packets` (one per mapping) may meet in one backend and family's nat
/// table, a list per packet (empty when the table does not exist), and how they were had:
/// a walk per packet, or the iptables-nft cache of a walk to any port, narrowed ([`taken`]).
fn candidates(
    nf: &Netfilter,
    cache: &Path,
    backend: Backend,
    family: Family,
    locals: &[IpNet],
    packets: &[Packet],
) -> Found {
    match (backend, nf.direct()) {
        // A backend without tools holds nothing natledger did not write there.
        (b, _) if !b.is_iptables() => Ok((none(packets), "natledger's own table".into())),
        (Backend::IptablesLegacy, true) => from_legacy(nf, family, locals, packets),
        (Backend::IptablesNft, true) => nf
            .with_nft(|session| {
                let source = Nft {
                    session,
                    family,
                    dsts: locals,
                };
                from_nft(source, cache, family, locals, packets)
            })
            .map_err(|e| crate::causes::text(&e))
            .and_then(|r| r),
        // Without the native readers (or for another iptables backend): its `*-save`.
        _ => from_save(nf, backend, family, packets),
    }
}

/// What [`candidates`] returns: a list per packet and how they were had, or why the table
/// could not be read.
type Found = Result<(Vec<Vec<Candidate>>, String), String>;

/// No candidate for any of `packets`.
fn none(packets: &[Packet]) -> Vec<Vec<Candidate>> {
    vec![Vec::new(); packets.len()]
}

/// iptables-legacy's candidates, from its table blob: the table as this process just swapped
/// it in, when it did (the same rules a read would return, without a second copy of the table
/// out of the kernel), else as read.
fn from_legacy(nf: &Netfilter, family: Family, locals: &[IpNet], packets: &[Packet]) -> Found {
    let (blob, whence) = match nf.take_legacy_nat(family) {
        Some(blob) => (blob, "the table as written"),
        None => {
            if !legacy_table_exists(family, NAT).map_err(|e| crate::causes::text(&e))? {
                return Ok((none(packets), "no table".into()));
            }
            let blob = iptc::read(family, NAT).map_err(|e| crate::causes::text(&e))?;
            (blob, "the table")
        }
    };
    let mut source = Legacy::new(&blob, locals);
    let found = walk_each(&mut source, packets).map_err(|e| crate::causes::text(&e))?;
    let how = format!("{} candidate(s) read from {whence}", total(&found));
    Ok((found, how))
}

/// iptables-nft's candidates over netlink: the cache's while the generation holds, else a
/// walk to any port kept in the cache, else (too many, or too branched) a walk per packet.
/// The outer error is a read's; the inner one, a walk cut short.
fn from_nft(
    mut source: Nft,
    cache: &Path,
    family: Family,
    locals: &[IpNet],
    packets: &[Packet],
) -> Result<Found, NftError> {
    let generation = source.session.generation()?;
    let scope = Scope::here(locals);
    let mut kept = Cache::load(cache);
    let cached = kept.valid(family, generation, &scope);
    let per_packet = |all: &[Candidate]| packets.iter().map(|p| taken(all, p)).collect();
    if let Some(Cached::Candidates(valid)) = cached {
        let how = format!("{} candidate(s) from the cache", valid.len());
        return Ok(Ok((per_packet(valid), how)));
    }
    if cached.is_none() {
        // Too many candidates, or chains too branched, to walk for any port: the cache says
        // so, and each create walks per mapping.
        let any = probe(None, family, locals);
        let candidates = match walk_counted(&mut source, &any, MAX_CACHED) {
            Ok((c, _)) => Some(c),
            Err(WalkError::Read(e)) => return Err(e),
            Err(_) => None,
        };
        kept.put(CacheEntry {
            family,
            generation,
            scope,
            candidates: candidates.clone(),
        });
        kept.store(cache);
        if let Some(c) = candidates {
            let how = format!("{} candidate(s) read over netlink", c.len());
            return Ok(Ok((per_packet(&c), how)));
        }
    }
    match walk_each(&mut source, packets) {
        Ok(c) => {
            let how = format!(
                "{} candidate(s) read over netlink per mapping (too many to cache)",
                total(&c)
            );
            Ok(Ok((c, how)))
        }
        Err(WalkError::Read(e)) => Err(e),
        Err(cut) => Ok(Err(cut.to_string())),
    }
}

/// An iptables backend's candidates from its `*-save` (the native readers off, or a backend
/// without them).
fn from_save(nf: &Netfilter, backend: Backend, family: Family, packets: &[Packet]) -> Found {
    match backend.driver().read(nf, family, NAT, Reading::Whole) {
        Ok(Some(table)) => {
            let mut source = Saved::new(&table);
            let found = walk_each(&mut source, packets).map_err(|e| crate::causes::text(&e))?;
            let how = format!("{} candidate(s) read with *-save", total(&found));
            Ok((found, how))
        }
        Ok(None) | Err(BackendError::ToolNotFound { .. }) => Ok((none(packets), "no table".into())),
        Err(e) => Err(crate::causes::text(&e)),
    }
}

fn total(lists: &[Vec<Candidate>]) -> usize {
    lists.iter().map(Vec::len).sum()
}

/// Where a packet to a host port of `mappings` may be addressed: this host's addresses
/// ([`local_addresses`]) and every mapping's own host address (one on a local route alone,
/// AnyIP, is not among the interfaces').
fn destinations(family: Family, mappings: &[&PortMapping]) -> Vec<IpNet> {
    let mut nets = local_addresses(family);
    for a in mappings.iter().filter_map(|m| m.host_destination()) {
        let host = IpNet::host(a);
        if Family::of(a) == family && !nets.iter().any(|n| net_contains(n, &host)) {
            nets.push(host);
        }
    }
    nets.sort();
    nets
}

/// This host's addresses of `family` (the calling thread's network namespace), and all of
/// loopback's network (every 127.0.0.0/8 address is local): where a packet to a host port
/// may be addressed. Not known: addresses of a local route alone (AnyIP).
fn local_addresses(family: Family) -> Vec<IpNet> {
    let mut addrs = crate::kernel::netns::interface_addresses().unwrap_or_default();
    addrs.retain(|a| Family::of(*a) == family && !a.is_loopback());
    let mut nets: Vec<IpNet> = addrs.into_iter().map(IpNet::host).collect();
    nets.push(match family {
        Family::Ipv4 => IpNet {
            addr: std::net::Ipv4Addr::new(127, 0, 0, 0).into(),
            prefix: 8,
        },
        Family::Ipv6 => IpNet::host(std::net::Ipv6Addr::LOCALHOST.into()),
    });
    nets.sort();
    nets.dedup();
    nets
}
