//! Rules of any owner as `iptables-save` prints them: the tokens after `-A CHAIN`.
//!
//! Both kernel readers end here: iptables-legacy's (`ipt_entry` / `ip6t_entry` blobs) and
//! iptables-nft's (nf_tables expressions). They fill a [`Header`] (`-s -d -i -o -p -f`, as
//! the entry header or the native expressions hold it) and hand every xtables match and
//! target info struct (an entry's matches, or an nf_tables compat `match`/`target`
//! expression) to [`push_match`] and [`push_target`]: one decoder per struct, serving both
//! backends and both families.
//!
//! Each decoder prints what iptables 1.8.9's `save` function of that extension prints, token
//! for token, so the analysis that reads `*-save` dumps reads the kernel's rules the same
//! way. What a decoder does not know (an extension, a revision, a flag) is never guessed: a
//! match becomes `-m NAME --natledger-opaque` (matchset: an unknown condition, "may match")
//! and a target `-j NAME` (its options do not decide what matches). A rule is never rendered
//! narrower than the kernel's.

mod matches;
mod targets;
#[cfg(test)]
mod tests;

pub use matches::TcpUdp;
pub use targets::{NatLayout, NatRange};

use std::fmt::Write as _;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::OnceLock;

use crate::model::family::Family;

/// The option that marks a match natledger could not decode.
pub const OPAQUE: &str = "--natledger-opaque";

/// `IPT_INV_*` / `IP6T_INV_*` (the same bits in both families).
pub(crate) const INV_VIA_IN: u8 = 0x01;
pub(crate) const INV_VIA_OUT: u8 = 0x02;
pub(crate) const INV_SRCIP: u8 = 0x08;
pub(crate) const INV_DSTIP: u8 = 0x10;
pub(crate) const INV_FRAG: u8 = 0x20;
pub(crate) const INV_PROTO: u8 = 0x40;
pub(crate) const IFNAMSIZ: usize = 16;

/// Whether a destination compare of the address's first `addr.len()` bytes, under `mask`
/// (as long), may hold for an address in one of `dsts`: false only when each of them differs
/// from `addr` in a bit both fix. What both readers skip undecoded, looking for the rules a
/// packet to this host may meet (`iptc::render::may_be_for`, `nftables::read`'s `skip`).
pub fn may_hold_any(addr: &[u8], mask: &[u8], dsts: &[crate::model::family::IpNet]) -> bool {
    dsts.iter().any(|net| {
        let octets = match net.addr {
            std::net::IpAddr::V4(a) => a.octets().to_vec(),
            std::net::IpAddr::V6(a) => a.octets().to_vec(),
        };
        if octets.len() < addr.len() || mask.len() != addr.len() {
            return true; // not comparable: never a reason to skip
        }
        (0..addr.len()).all(|i| {
            let bits = usize::from(net.prefix).saturating_sub(8 * i).min(8) as u32;
            let net_mask = (0xffu16 << (8 - bits)) as u8;
            let both = mask[i] & net_mask;
            octets[i] & both == addr[i] & both
        })
    })
}

/// The part of a rule before its matches, as both backends describe it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Header {
    /// Address and mask bytes (4 or 16 each).
    pub src: Option<(Vec<u8>, Vec<u8>)>,
    pub dst: Option<(Vec<u8>, Vec<u8>)>,
    /// Name and mask bytes as `ipt_entry` holds them (`IFNAMSIZ` each).
    pub iniface: Option<([u8; IFNAMSIZ], [u8; IFNAMSIZ])>,
    pub outiface: Option<([u8; IFNAMSIZ], [u8; IFNAMSIZ])>,
    pub proto: u16,
    /// `-f` (IPv4 only).
    pub frag: bool,
    /// `INV_*` bits.
    pub invflags: u8,
}

impl Header {
    /// `save_ipv4_addr`/`save_ipv6_addr`, then `save_rule_details` of iptables 1.8.9.
    pub fn push(&self, family: Family, out: &mut Vec<String>) {
        for (letter, net, inv) in [("-s", &self.src, INV_SRCIP), ("-d", &self.dst, INV_DSTIP)] {
            let invert = self.invflags & inv != 0;
            let (addr, mask) = match net {
                Some((a, m)) => (a.as_slice(), m.as_slice()),
                None if invert => (
                    &[0u8; 16][..addr_len(family)],
                    &[0u8; 16][..addr_len(family)],
                ),
                None => continue,
            };
            let zero = |b: &[u8]| b.iter().all(|x| *x == 0);
            let shown = match family {
                Family::Ipv4 => !(zero(mask) && zero(addr)) || invert,
                Family::Ipv6 => !zero(mask) || invert,
            };
            if !shown {
                continue;
            }
            bang(out, invert);
            out.push(letter.into());
            let mut text = String::with_capacity(24);
            push_addr(&mut text, addr);
            text.push('/');
            match prefix_len(mask) {
                Some(l) => {
                    let _ = write!(text, "{l}");
                }
                None => push_addr(&mut text, mask),
            }
            out.push(text);
        }
        for (letter, iface, inv) in [
            ("-i", &self.iniface, INV_VIA_IN),
            ("-o", &self.outiface, INV_VIA_OUT),
        ] {
            if let Some((name, mask)) = iface
                && mask[0] != 0
            {
                bang(out, self.invflags & inv != 0);
                out.push(letter.into());
                out.push(iface_text(name, mask));
            }
        }
        if self.proto > 0 {
            bang(out, self.invflags & INV_PROTO != 0);
            out.push("-p".into());
            out.push(proto_name(self.proto).unwrap_or_else(|| self.proto.to_string()));
        }
        if self.frag {
            bang(out, self.invflags & INV_FRAG != 0);
            out.push("-f".into());
        }
    }
}

fn addr_len(family: Family) -> usize {
    match family {
        Family::Ipv4 => 4,
        Family::Ipv6 => 16,
    }
}

fn bang(out: &mut Vec<String>, invert: bool) {
    if invert {
        out.push("!".into());
    }
}

/// `save_iface`: the name up to its mask; a mask ending before the name's NUL is a `+`.
pub(crate) fn iface_text(name: &[u8; IFNAMSIZ], mask: &[u8; IFNAMSIZ]) -> String {
    let mut s = String::new();
    for i in 0..IFNAMSIZ {
        if mask[i] != 0 {
            if name[i] != 0 {
                s.push(name[i] as char);
            }
        } else {
            if i > 0 && name[i - 1] != 0 {
                s.push('+');
            }
            break;
        }
    }
    s
}

/// The prefix length of a contiguous mask.
pub(crate) fn prefix_len(mask: &[u8]) -> Option<u32> {
    let ones: u32 = mask.iter().map(|b| b.count_ones()).sum();
    let contiguous = mask.iter().enumerate().all(|(i, b)| {
        let bits = (ones as usize).saturating_sub(8 * i).min(8);
        *b == (0xffu16 << (8 - bits)) as u8
    });
    contiguous.then_some(ones)
}

/// An address as `inet_ntop` prints it (4 or 16 bytes).
pub(crate) fn addr_text(addr: &[u8]) -> String {
    let mut s = String::with_capacity(16);
    push_addr(&mut s, addr);
    s
}

fn push_addr(s: &mut String, addr: &[u8]) {
    match addr.len() {
        4 => {
            let _ = write!(s, "{}.{}.{}.{}", addr[0], addr[1], addr[2], addr[3]);
        }
        _ => {
            let mut a = [0u8; 16];
            a.copy_from_slice(&addr[..16]);
            s.push_str(&ntop6(Ipv6Addr::from(a)));
        }
    }
}

/// glibc's `inet_ntop(AF_INET6)`: as Rust prints it, except an IPv4-compatible address
/// (`::a.b.c.d`), which glibc still writes with a dotted tail.
fn ntop6(a: Ipv6Addr) -> String {
    let w = a.segments();
    if w[..6].iter().all(|x| *x == 0) && w[6] != 0 {
        let o = a.octets();
        return format!("::{}", Ipv4Addr::new(o[12], o[13], o[14], o[15]));
    }
    a.to_string()
}

/// `-p` as iptables prints it: `xtables_chain_protos`, then `/etc/protocols`.
pub(crate) fn proto_name(proto: u16) -> Option<String> {
    // The first name of each number in libxtables' `xtables_chain_protos`.
    const CHAIN_PROTOS: [(&str, u16); 10] = [
        ("tcp", 6),
        ("sctp", 132),
        ("udp", 17),
        ("udplite", 136),
        ("icmp", 1),
        ("ipv6-icmp", 58),
        ("esp", 50),
        ("ah", 51),
        ("mobility-header", 135),
        ("all", 0),
    ];
    if let Some((name, _)) = CHAIN_PROTOS.iter().find(|(_, n)| *n == proto) {
        return Some(name.to_string());
    }
    // A cache, not a setting (OnceLock kept): `/etc/protocols` read once per process, the same
    // for every caller, so nothing is there to pass.
    static PROTOCOLS: OnceLock<Vec<(u16, String)>> = OnceLock::new();
    PROTOCOLS
        .get_or_init(|| {
            let text = std::fs::read_to_string("/etc/protocols").unwrap_or_default();
            text.lines()
                .filter_map(|l| {
                    let mut words = l.split('#').next()?.split_whitespace();
                    let name = words.next()?;
                    let number = words.next()?.parse().ok()?;
                    Some((number, name.to_string()))
                })
                .collect()
        })
        .iter()
        .find(|(n, _)| *n == proto)
        .map(|(_, name)| name.clone())
}

/// Bounds-checked reads from an info struct (host byte order unless named `be`).
struct Data<'a>(&'a [u8]);

impl Data<'_> {
    fn u8(&self, at: usize) -> Option<u8> {
        self.0.get(at).copied()
    }
    fn u16(&self, at: usize) -> Option<u16> {
        Some(u16::from_ne_bytes(self.0.get(at..at + 2)?.try_into().ok()?))
    }
    fn be16(&self, at: usize) -> Option<u16> {
        Some(u16::from_be_bytes(self.0.get(at..at + 2)?.try_into().ok()?))
    }
    fn u32(&self, at: usize) -> Option<u32> {
        Some(u32::from_ne_bytes(self.0.get(at..at + 4)?.try_into().ok()?))
    }
    fn bytes(&self, at: usize, len: usize) -> Option<&[u8]> {
        self.0.get(at..at + len)
    }
    /// A NUL-terminated string within `len` bytes.
    fn text(&self, at: usize, len: usize) -> Option<String> {
        let raw = self
            .0
            .get(at..at + len.min(self.0.len().saturating_sub(at)))?;
        let end = raw.iter().position(|b| *b == 0)?;
        String::from_utf8(raw[..end].to_vec()).ok()
    }
}

/// A match: `-m NAME` and its options, or `-m NAME --natledger-opaque` when the info struct
/// is not one this module decodes.
pub(crate) fn push_match(
    out: &mut Vec<String>,
    family: Family,
    name: &str,
    revision: u8,
    data: &[u8],
) {
    let start = out.len();
    if matches::decode_match(out, family, name, revision, &Data(data)).is_none() {
        out.truncate(start);
        push_opaque_match(out, name);
    }
}

/// `-m NAME --natledger-opaque`.
pub(crate) fn push_opaque_match(out: &mut Vec<String>, name: &str) {
    out.extend(["-m".to_string(), name.to_string(), OPAQUE.to_string()]);
}

/// A target: `-j NAME` and its options, or `-j NAME` alone when the info struct is not one
/// this module decodes (target options never decide what a rule matches).
pub(crate) fn push_target(
    out: &mut Vec<String>,
    family: Family,
    name: &str,
    revision: u8,
    data: &[u8],
) {
    out.extend(["-j".to_string(), name.to_string()]);
    let start = out.len();
    if targets::decode_target(out, family, name, revision, &Data(data)).is_none() {
        out.truncate(start);
    }
}

/// A decoded rule as its `-A CHAIN …` line of `iptables-save`, for warnings.
pub(crate) fn save_line(chain: &str, args: &[String]) -> String {
    crate::model::save::rule_line(chain, args)
        .as_saved()
        .to_string()
}
