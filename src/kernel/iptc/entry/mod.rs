//! One rule as the legacy kernel table holds it: `ipt_entry` / `ip6t_entry`, its matches and
//! its target, encoded from and decoded to natledger's [`Rule`].
//!
//! ```text
//! entry:  ip header (84 / 136 bytes) | nfcache | target_offset | next_offset | comefrom | counters
//!         matches: [match_size u16 | name[29] | revision u8 | data, padded to 8] ...
//!         target:   target_size u16 | name[29] | revision u8 | data, padded to 8
//! ```
//!
//! Only what natledger writes is encoded or decoded: `-s`/`-d` with a prefix, `-p tcp|udp`
//! with `-m tcp|udp --dport`, `-m addrtype --dst-type LOCAL` (revision 1), natledger's
//! `-m conntrack --ctstate DNAT …` (revision 3), `-m comment`, and the targets DNAT
//! (revision 2), MASQUERADE (revision 0), ACCEPT and a jump. Anything else decodes
//! to `None` and makes the direct path step aside for iptables-legacy-restore. The encoding is
//! byte-for-byte what iptables-legacy 1.8 writes (pinned by `tests/it/iptc.rs`).

use std::net::IpAddr;

use crate::model::family::Family;
use crate::model::portspec::{PortRange, Protocol};
use crate::model::rule::{DnatTo, IpNet, Rule, Target};

mod conntrack;

use conntrack::{conntrack_info, conntrack_of, not_dnatted_info};

/// The per-family layout of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub family: Family,
    /// `sizeof(struct ipt_entry)` / `sizeof(struct ip6t_entry)`: where matches begin.
    pub entry_size: usize,
    pub addr_len: usize,
    /// Offsets of `proto`, `flags` and `invflags`. `flags` holds `-f` and `-g` (never
    /// natledger's) and, for ip6t only, `IP6T_F_PROTO` with `-p`.
    pub proto_at: usize,
    pub flags_at: usize,
    pub proto_flag: u8,
    /// `IPT_F_GOTO` / `IP6T_F_GOTO`, and `IPT_F_FRAG` (IPv4 only; 0 for IPv6).
    pub goto_flag: u8,
    pub frag_flag: u8,
    pub invflags_at: usize,
    pub target_offset_at: usize,
    pub counters_at: usize,
}

impl Layout {
    pub fn of(family: Family) -> Layout {
        match family {
            Family::Ipv4 => Layout {
                family,
                entry_size: 112,
                addr_len: 4,
                proto_at: 80,
                flags_at: 82,
                proto_flag: 0,
                goto_flag: 0x02,
                frag_flag: 0x01,
                invflags_at: 83,
                target_offset_at: 88,
                counters_at: 96,
            },
            Family::Ipv6 => Layout {
                family,
                entry_size: 168,
                addr_len: 16,
                proto_at: 128,
                flags_at: 131,
                proto_flag: IP6T_F_PROTO,
                goto_flag: 0x04,
                frag_flag: 0,
                invflags_at: 132,
                target_offset_at: 140,
                counters_at: 152,
            },
        }
    }

    pub fn target_offset(&self, e: &[u8]) -> usize {
        u16_at(e, self.target_offset_at) as usize
    }

    pub fn next_offset(&self, e: &[u8]) -> usize {
        u16_at(e, self.target_offset_at + 2) as usize
    }

    /// The interface names and masks: between the four addresses and `proto`.
    pub fn interfaces(&self) -> std::ops::Range<usize> {
        4 * self.addr_len..self.proto_at
    }

    /// `iniface`, then (after `outiface`) `iniface_mask`: `IFNAMSIZ` bytes each.
    fn iniface(&self) -> (usize, usize) {
        let at = self.interfaces().start;
        (at, at + 2 * IFNAMSIZ)
    }
}

pub const XT_HEADER: usize = 32;
const IFNAMSIZ: usize = 16;
/// `IPT_INV_VIA_IN` / `IP6T_INV_VIA_IN`: `! -i`.
const INV_VIA_IN: u8 = 0x01;
const NAME_LEN: usize = 29;
/// `XT_STANDARD_TARGET`: a verdict, or the offset of a jump.
pub const STANDARD: &str = "";
pub const ERROR: &str = "ERROR";
const COMMENT_LEN: usize = 256;
/// `XT_ADDRTYPE_LOCAL`
const ADDRTYPE_LOCAL: u16 = 4;
const NF_NAT_RANGE_MAP_IPS: u32 = 1;
const NF_NAT_RANGE_PROTO_SPECIFIED: u32 = 2;
const NF_NAT_RANGE_PROTO_OFFSET: u32 = 0x20;
const IP6T_F_PROTO: u8 = 1;
/// The standard target's verdicts for ACCEPT and DROP: `-NF_ACCEPT - 1`, `-NF_DROP - 1`.
const VERDICT_ACCEPT: i32 = -2;
const VERDICT_DROP: i32 = -1;

pub fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([b[at], b[at + 1]])
}

pub fn i32_at(b: &[u8], at: usize) -> i32 {
    i32::from_ne_bytes(b[at..at + 4].try_into().unwrap())
}

pub fn align8(n: usize) -> usize {
    (n + 7) & !7
}

/// A match or target: header (size, name, revision) and data.
pub struct Xt<'a> {
    pub name: &'a str,
    pub revision: u8,
    pub data: &'a [u8],
}

/// The match or target starting at `at` in `e`, and its size.
pub fn xt_at(e: &[u8], at: usize) -> Option<(Xt<'_>, usize)> {
    let size = u16_at(e, at) as usize;
    if size < XT_HEADER || at + size > e.len() {
        return None;
    }
    let raw = &e[at + 2..at + 2 + NAME_LEN];
    let end = raw.iter().position(|b| *b == 0).unwrap_or(NAME_LEN);
    let xt = Xt {
        name: std::str::from_utf8(&raw[..end]).ok()?,
        revision: e[at + 2 + NAME_LEN],
        data: &e[at + XT_HEADER..at + size],
    };
    Some((xt, size))
}

fn push_xt(out: &mut Vec<u8>, name: &str, revision: u8, data: &[u8]) {
    let size = align8(XT_HEADER + data.len());
    out.extend((size as u16).to_ne_bytes());
    let mut n = [0u8; NAME_LEN];
    n[..name.len()].copy_from_slice(name.as_bytes());
    out.extend(n);
    out.push(revision);
    out.extend(data);
    out.resize(out.len() + size - XT_HEADER - data.len(), 0);
}

/// The target of a rule as the table holds it: a jump is a verdict naming an offset, which
/// only the table knows ([`super::blob`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Encoded {
    /// A complete entry.
    Entry(Vec<u8>),
    /// An entry whose standard target's verdict must be set to the jump's offset; the
    /// verdict is the entry's last 8 bytes (4 of verdict, 4 of padding).
    Jump { entry: Vec<u8>, to: String },
}

/// Encode `rule` for `family`, or `None` if it uses something this module does not write
/// (SCTP, an address of the other family).
pub fn encode(rule: &Rule, family: Family) -> Option<Encoded> {
    let layout = Layout::of(family);
    let mut e = vec![0u8; layout.entry_size];
    encode_header(&mut e, rule, family, layout)?;
    encode_matches(&mut e, rule, family)?;
    let target_offset = e.len() as u16;
    let jump = encode_target(&mut e, rule, family)?;
    let next_offset = e.len() as u16;
    let at = layout.target_offset_at;
    e[at..at + 2].copy_from_slice(&target_offset.to_ne_bytes());
    e[at + 2..at + 4].copy_from_slice(&next_offset.to_ne_bytes());
    Some(match jump {
        Some(to) => Encoded::Jump { entry: e, to },
        None => Encoded::Entry(e),
    })
}

/// The entry's fixed part: addresses, the inbound interface, the protocol.
fn encode_header(e: &mut [u8], rule: &Rule, family: Family, layout: Layout) -> Option<()> {
    let put_net = |e: &mut [u8], net: IpNet, at: usize, mask_at: usize| -> Option<()> {
        let (addr, mask) = addr_and_mask(net, family)?;
        e[at..at + addr.len()].copy_from_slice(&addr);
        e[mask_at..mask_at + mask.len()].copy_from_slice(&mask);
        Some(())
    };
    let n = layout.addr_len;
    if let Some(s) = rule.source {
        put_net(e, s, 0, 2 * n)?;
    }
    if let Some(d) = rule.destination {
        put_net(e, d, n, 3 * n)?;
    }
    if let Some(name) = &rule.not_in_interface {
        // As iptables parses a name without `+`: the name, and a mask over it and its NUL.
        if name.is_empty() || name.len() >= IFNAMSIZ {
            return None;
        }
        let (at, mask_at) = layout.iniface();
        e[at..at + name.len()].copy_from_slice(name.as_bytes());
        e[mask_at..mask_at + name.len() + 1].fill(0xff);
        e[layout.invflags_at] |= INV_VIA_IN;
    }
    if let Some(p) = rule.protocol {
        let number: u16 = match p {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
            Protocol::Sctp => return None,
        };
        e[layout.proto_at..layout.proto_at + 2].copy_from_slice(&number.to_ne_bytes());
        e[layout.flags_at] = layout.proto_flag;
    }
    Some(())
}

/// The matches, in the order iptables writes them.
fn encode_matches(e: &mut Vec<u8>, rule: &Rule, family: Family) -> Option<()> {
    if let (Some(p), Some(ports)) = (rule.protocol, rule.dports) {
        let mut data = Vec::with_capacity(12);
        for v in [0, u16::MAX, ports.start, ports.end] {
            data.extend(v.to_ne_bytes());
        }
        // tcp: option, flg_mask, flg_cmp, invflags; udp: invflags.
        data.extend(match p {
            Protocol::Tcp => &[0u8, 0, 0, 0][..],
            _ => &[0u8][..],
        });
        push_xt(e, p.as_str(), 0, &data);
    }
    if rule.dst_local {
        let mut data = Vec::with_capacity(8);
        data.extend(0u16.to_ne_bytes());
        data.extend(ADDRTYPE_LOCAL.to_ne_bytes());
        data.extend(0u32.to_ne_bytes());
        push_xt(e, "addrtype", 1, &data);
    }
    if let Some(ct) = &rule.dnatted {
        push_xt(e, "conntrack", 3, &conntrack_info(ct, family)?);
    }
    if rule.not_dnatted {
        push_xt(e, "conntrack", 3, &not_dnatted_info());
    }
    // Only the nftables backend's second guard rule: never written here.
    if rule.untracked {
        return None;
    }
    if let Some(c) = &rule.comment {
        if c.len() >= COMMENT_LEN {
            return None;
        }
        let mut data = vec![0u8; COMMENT_LEN];
        data[..c.len()].copy_from_slice(c.as_bytes());
        push_xt(e, "comment", 0, &data);
    }
    Some(())
}

/// The target; `Some(chain)` for a jump whose offset the table fills in.
fn encode_target(e: &mut Vec<u8>, rule: &Rule, family: Family) -> Option<Option<String>> {
    match &rule.target {
        Target::Jump(chain) => {
            push_xt(e, STANDARD, 0, &0i32.to_ne_bytes());
            return Some(Some(chain.clone()));
        }
        Target::Accept => push_xt(e, STANDARD, 0, &VERDICT_ACCEPT.to_ne_bytes()),
        Target::Drop => push_xt(e, STANDARD, 0, &VERDICT_DROP.to_ne_bytes()),
        Target::Dnat(to) => push_xt(e, "DNAT", 2, &nat_range2(to, family)?),
        Target::Masquerade => push_xt(e, "MASQUERADE", 0, &masquerade_info(family)),
    }
    Some(None)
}

/// A MASQUERADE target without options: for IPv4 `nf_nat_ipv4_multi_range_compat` with
/// rangesize 1 and one empty range, for IPv6 an all-zero `nf_nat_range`.
fn masquerade_info(family: Family) -> Vec<u8> {
    match family {
        Family::Ipv4 => {
            let mut d = vec![0u8; 20];
            d[..4].copy_from_slice(&1u32.to_ne_bytes());
            d
        }
        Family::Ipv6 => vec![0u8; 40],
    }
}

/// `struct nf_nat_range2` for `--to-destination`.
fn nat_range2(to: &DnatTo, family: Family) -> Option<Vec<u8>> {
    if Family::of(to.addr) != family {
        return None;
    }
    let mut flags = NF_NAT_RANGE_MAP_IPS | NF_NAT_RANGE_PROTO_SPECIFIED;
    if to.base.is_some() {
        flags |= NF_NAT_RANGE_PROTO_OFFSET;
    }
    let mut addr = [0u8; 16];
    let octets = ip_octets(to.addr);
    addr[..octets.len()].copy_from_slice(&octets);
    let mut d = Vec::with_capacity(44);
    d.extend(flags.to_ne_bytes());
    d.extend(addr);
    d.extend(addr);
    d.extend(to.ports.start.to_be_bytes());
    d.extend(to.ports.end.to_be_bytes());
    d.extend(to.base.unwrap_or(0).to_be_bytes());
    d.extend([0, 0]);
    Some(d)
}

fn ip_octets(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

fn addr_and_mask(net: IpNet, family: Family) -> Option<(Vec<u8>, Vec<u8>)> {
    if Family::of(net.addr) != family || net.prefix > family.host_prefix() {
        return None;
    }
    let addr = ip_octets(net.addr);
    let mut mask = vec![0u8; addr.len()];
    for bit in 0..net.prefix as usize {
        mask[bit / 8] |= 0x80 >> (bit % 8);
    }
    Some((addr, mask))
}

fn net_of(addr: &[u8], mask: &[u8]) -> Option<Option<IpNet>> {
    if mask.iter().all(|b| *b == 0) {
        return Some(None);
    }
    let ip = match addr.len() {
        4 => IpAddr::from(<[u8; 4]>::try_from(addr).ok()?),
        _ => IpAddr::from(<[u8; 16]>::try_from(addr).ok()?),
    };
    let prefix = mask.iter().map(|b| b.count_ones()).sum::<u32>() as u8;
    let net = IpNet { addr: ip, prefix };
    // Only a contiguous mask is a prefix.
    let (_, contiguous) = addr_and_mask(net, Family::of(ip))?;
    (contiguous == mask).then_some(Some(net))
}

/// The interfaces and their inversion of an entry: `Some(None)` without any, `Some(name)`
/// for exactly the `! -i NAME` natledger writes, `None` for anything else.
fn not_in_interface(e: &[u8], layout: Layout) -> Option<Option<String>> {
    let fields = &e[layout.interfaces()];
    let invflags = e[layout.invflags_at];
    if invflags == 0 && fields.iter().all(|b| *b == 0) {
        return Some(None);
    }
    if invflags != INV_VIA_IN {
        return None;
    }
    let (at, mask_at) = layout.iniface();
    let raw = &e[at..at + IFNAMSIZ];
    let len = raw.iter().position(|b| *b == 0)?;
    let name = std::str::from_utf8(&raw[..len]).ok()?.to_string();
    // Encoding the name again must give these very bytes (outiface and its mask empty).
    let mut expected = vec![0u8; fields.len()];
    let base = layout.interfaces().start;
    expected[at - base..at - base + len].copy_from_slice(name.as_bytes());
    expected[mask_at - base..mask_at - base + len + 1].fill(0xff);
    (crate::model::rule::is_interface_name(&name) && expected == fields).then_some(Some(name))
}

/// How a decoded rule's target looks before the table resolves a jump's offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded {
    Rule(Rule),
    /// A standard-target jump to this offset; the rule's target is filled in by the caller.
    Jump {
        rule: Rule,
        offset: u32,
    },
}

/// Decode an entry into a natledger-shaped rule, or `None` if it is anything else.
pub fn decode(e: &[u8], family: Family) -> Option<Decoded> {
    let layout = Layout::of(family);
    let mut rule = decode_header(e, layout)?;
    let target_at = layout.target_offset(e);
    let mut at = layout.entry_size;
    while at < target_at {
        let (m, size) = xt_at(e, at)?;
        decode_match(&mut rule, &m, family)?;
        at += size;
    }
    let (t, size) = xt_at(e, target_at)?;
    if target_at + size != layout.next_offset(e) {
        return None;
    }
    match (t.name, t.revision) {
        (STANDARD, 0) if i32_at(t.data, 0) == VERDICT_ACCEPT => rule.target = Target::Accept,
        (STANDARD, 0) if i32_at(t.data, 0) == VERDICT_DROP => rule.target = Target::Drop,
        (STANDARD, 0) => {
            let verdict = i32_at(t.data, 0);
            let offset = u32::try_from(verdict).ok()?;
            return Some(Decoded::Jump { rule, offset });
        }
        ("DNAT", 2) => rule.target = Target::Dnat(dnat_of(t.data, family)?),
        ("MASQUERADE", 0) if is_plain_masquerade(t.data, family)? => {}
        _ => return None,
    }
    Some(Decoded::Rule(rule))
}

/// The entry's fixed part (addresses, interface, protocol) as a rule with no match or
/// target yet.
fn decode_header(e: &[u8], layout: Layout) -> Option<Rule> {
    let n = layout.addr_len;
    let not_in_interface = not_in_interface(e, layout)?;
    let proto = u16_at(e, layout.proto_at);
    let flags = if proto != 0 { layout.proto_flag } else { 0 };
    if e[layout.flags_at] != flags {
        return None;
    }
    Some(Rule {
        source: net_of(&e[0..n], &e[2 * n..3 * n])?,
        destination: net_of(&e[n..2 * n], &e[3 * n..4 * n])?,
        protocol: match proto {
            0 => None,
            6 => Some(Protocol::Tcp),
            17 => Some(Protocol::Udp),
            _ => return None,
        },
        dports: None,
        not_in_interface,
        dst_local: false,
        not_dnatted: false,
        untracked: false,
        dnatted: None,
        comment: None,
        target: Target::Masquerade,
    })
}

/// One match of the entry into `rule`; `None` for a match natledger does not write (or a
/// second one of a kind).
fn decode_match(rule: &mut Rule, m: &Xt, family: Family) -> Option<()> {
    match (m.name, m.revision) {
        ("tcp" | "udp", 0) if Some(m.name) == rule.protocol.map(|p| p.as_str()) => {
            let d = m.data;
            let ok_tail = match m.name {
                "tcp" => d.get(8..12)? == [0, 0, 0, 0],
                _ => d.get(8)? == &0,
            };
            if rule.dports.is_some() || u16_at(d, 0) != 0 || u16_at(d, 2) != u16::MAX || !ok_tail {
                return None;
            }
            rule.dports = Some(PortRange {
                start: u16_at(d, 4),
                end: u16_at(d, 6),
            });
        }
        ("addrtype", 1)
            if !rule.dst_local
                && u16_at(m.data, 0) == 0
                && u16_at(m.data, 2) == ADDRTYPE_LOCAL
                && i32_at(m.data, 4) == 0 =>
        {
            rule.dst_local = true;
        }
        ("conntrack", 3) if rule.dnatted.is_none() && !rule.not_dnatted => {
            let fresh = not_dnatted_info();
            if m.data.get(..fresh.len()) == Some(fresh.as_slice()) {
                rule.not_dnatted = true;
            } else {
                rule.dnatted = Some(conntrack_of(m.data, family)?);
            }
        }
        ("comment", 0) if rule.comment.is_none() => {
            let raw = m.data.get(..COMMENT_LEN)?;
            let end = raw.iter().position(|b| *b == 0)?;
            rule.comment = Some(std::str::from_utf8(&raw[..end]).ok()?.to_string());
        }
        _ => return None,
    }
    Some(())
}

/// A DNAT revision 2 target (`nf_nat_range2`) to one address and a port range.
fn dnat_of(d: &[u8], family: Family) -> Option<DnatTo> {
    let flags = u32::from_ne_bytes(d.get(0..4)?.try_into().ok()?);
    let base_flag = flags & NF_NAT_RANGE_PROTO_OFFSET != 0;
    if flags & !NF_NAT_RANGE_PROTO_OFFSET != NF_NAT_RANGE_MAP_IPS | NF_NAT_RANGE_PROTO_SPECIFIED
        || d.get(4..20)? != d.get(20..36)?
    {
        return None;
    }
    let addr: IpAddr = match family {
        Family::Ipv4 => <[u8; 4]>::try_from(&d[4..8]).ok()?.into(),
        Family::Ipv6 => <[u8; 16]>::try_from(&d[4..20]).ok()?.into(),
    };
    let be = |at: usize| u16::from_be_bytes([d[at], d[at + 1]]);
    Some(DnatTo {
        addr,
        ports: PortRange {
            start: be(36),
            end: be(38),
        },
        base: base_flag.then(|| be(40)),
    })
}

/// Whether a MASQUERADE target has no options (`None` when its data is too short).
fn is_plain_masquerade(data: &[u8], family: Family) -> Option<bool> {
    let expected = masquerade_info(family);
    Some(data.get(..expected.len())? == expected.as_slice())
}

#[cfg(test)]
mod tests;
