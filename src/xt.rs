//! Rules of any owner as `iptables-save` prints them: the tokens after `-A CHAIN`.
//!
//! Both kernel readers end here: [`crate::iptc::render`] (iptables-legacy, `ipt_entry` /
//! `ip6t_entry` blobs) and [`crate::nftables::read`] (iptables-nft, nf_tables expressions).
//! They fill a [`Header`] (`-s -d -i -o -p -f`, as the entry header or the native
//! expressions hold it) and hand every xtables match and target info struct (an entry's
//! matches, or an nf_tables compat `match`/`target` expression) to [`push_match`] and
//! [`push_target`]: one decoder per struct, serving both backends and both families.
//!
//! Each decoder prints what iptables 1.8.9's `save` function of that extension prints, token
//! for token, so [`crate::matchset::parse_rule`] reads the kernel's rules as it reads
//! `*-save` dumps. What a decoder does not know (an extension, a revision, a flag) is never
//! guessed: a match becomes `-m NAME --natledger-opaque` (matchset: an unknown condition, "may
//! match") and a target `-j NAME` (its options do not decide what matches). A rule is never
//! rendered narrower than the kernel's.

use std::fmt::Write as _;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::OnceLock;

use crate::family::Family;

/// The option that marks a match natledger could not decode.
pub const OPAQUE: &str = "--natledger-opaque";

/// `IPT_INV_*` / `IP6T_INV_*` (the same bits in both families).
pub const INV_VIA_IN: u8 = 0x01;
pub const INV_VIA_OUT: u8 = 0x02;
pub const INV_SRCIP: u8 = 0x08;
pub const INV_DSTIP: u8 = 0x10;
pub const INV_FRAG: u8 = 0x20;
pub const INV_PROTO: u8 = 0x40;
pub const IFNAMSIZ: usize = 16;

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
pub fn iface_text(name: &[u8; IFNAMSIZ], mask: &[u8; IFNAMSIZ]) -> String {
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
pub fn prefix_len(mask: &[u8]) -> Option<u32> {
    let ones: u32 = mask.iter().map(|b| b.count_ones()).sum();
    let contiguous = mask.iter().enumerate().all(|(i, b)| {
        let bits = (ones as usize).saturating_sub(8 * i).min(8);
        *b == (0xffu16 << (8 - bits)) as u8
    });
    contiguous.then_some(ones)
}

/// An address as `inet_ntop` prints it (4 or 16 bytes).
pub fn addr_text(addr: &[u8]) -> String {
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
pub fn proto_name(proto: u16) -> Option<String> {
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
pub fn push_match(out: &mut Vec<String>, family: Family, name: &str, revision: u8, data: &[u8]) {
    let start = out.len();
    if decode_match(out, family, name, revision, &Data(data)).is_none() {
        out.truncate(start);
        push_opaque_match(out, name);
    }
}

/// `-m NAME --natledger-opaque`.
pub fn push_opaque_match(out: &mut Vec<String>, name: &str) {
    out.extend(["-m".to_string(), name.to_string(), OPAQUE.to_string()]);
}

/// A target: `-j NAME` and its options, or `-j NAME` alone when the info struct is not one
/// this module decodes (target options never decide what a rule matches).
pub fn push_target(out: &mut Vec<String>, family: Family, name: &str, revision: u8, data: &[u8]) {
    out.extend(["-j".to_string(), name.to_string()]);
    let start = out.len();
    if decode_target(out, family, name, revision, &Data(data)).is_none() {
        out.truncate(start);
    }
}

fn push_ports(out: &mut Vec<String>, opt: &str, lo: u16, hi: u16, invert: bool) {
    bang(out, invert);
    out.push(opt.into());
    out.push(if lo == hi {
        lo.to_string()
    } else {
        format!("{lo}:{hi}")
    });
}

/// `xt_tcp` / `xt_udp` as their `save` prints them, given the fields. Ports are printed
/// unless they are the full range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpUdp {
    pub spts: [u16; 2],
    pub dpts: [u16; 2],
    /// `XT_TCP_INV_*` / `XT_UDP_INV_*`: source 1, destination 2, flags 4, option 8.
    pub invflags: u8,
    pub option: u8,
    pub flg_mask: u8,
    pub flg_cmp: u8,
}

impl Default for TcpUdp {
    fn default() -> Self {
        TcpUdp {
            spts: [0, u16::MAX],
            dpts: [0, u16::MAX],
            invflags: 0,
            option: 0,
            flg_mask: 0,
            flg_cmp: 0,
        }
    }
}

impl TcpUdp {
    pub fn push(&self, out: &mut Vec<String>) {
        for (opt, p, inv) in [("--sport", self.spts, 1), ("--dport", self.dpts, 2)] {
            if p[0] != 0 || p[1] != u16::MAX {
                push_ports(out, opt, p[0], p[1], self.invflags & inv != 0);
            }
        }
        if self.option != 0 || self.invflags & 8 != 0 {
            bang(out, self.invflags & 8 != 0);
            out.extend(["--tcp-option".to_string(), self.option.to_string()]);
        }
        if self.flg_mask != 0 || self.invflags & 4 != 0 {
            bang(out, self.invflags & 4 != 0);
            out.extend([
                "--tcp-flags".to_string(),
                tcp_flags(self.flg_mask),
                tcp_flags(self.flg_cmp),
            ]);
        }
    }
}

/// `print_tcpf`.
fn tcp_flags(mut flags: u8) -> String {
    // tcp_flag_names also has ALL, after the single bits: print_tcpf never reaches it.
    const NAMES: [(&str, u8); 6] = [
        ("FIN", 0x01),
        ("SYN", 0x02),
        ("RST", 0x04),
        ("PSH", 0x08),
        ("ACK", 0x10),
        ("URG", 0x20),
    ];
    let mut names = Vec::new();
    while flags != 0 {
        match NAMES.iter().find(|(_, f)| flags & f != 0) {
            Some((name, f)) => {
                names.push(*name);
                flags &= !f;
            }
            None => unreachable!("callers refuse ECE and CWR"),
        }
    }
    if names.is_empty() {
        "NONE".into()
    } else {
        names.join(",")
    }
}

/// `rtn_names` of libxt_addrtype, by bit.
const ADDR_TYPES: [&str; 12] = [
    "UNSPEC",
    "UNICAST",
    "LOCAL",
    "BROADCAST",
    "ANYCAST",
    "MULTICAST",
    "BLACKHOLE",
    "UNREACHABLE",
    "PROHIBIT",
    "THROW",
    "NAT",
    "XRESOLVE",
];

fn addr_types(mask: u16) -> Option<String> {
    if mask >> ADDR_TYPES.len() != 0 {
        return None;
    }
    let names: Vec<&str> = (0..ADDR_TYPES.len())
        .filter(|i| mask & (1 << i) != 0)
        .map(|i| ADDR_TYPES[i])
        .collect();
    Some(names.join(","))
}

fn decode_match(
    out: &mut Vec<String>,
    family: Family,
    name: &str,
    revision: u8,
    d: &Data,
) -> Option<()> {
    let head = |out: &mut Vec<String>, shown: &str| {
        out.extend(["-m".to_string(), shown.to_string()]);
    };
    match (name, revision) {
        ("tcp", 0) => {
            let m = TcpUdp {
                spts: [d.u16(0)?, d.u16(2)?],
                dpts: [d.u16(4)?, d.u16(6)?],
                option: d.u8(8)?,
                flg_mask: d.u8(9)?,
                flg_cmp: d.u8(10)?,
                invflags: d.u8(11)?,
            };
            // ECE and CWR have no name in print_tcpf.
            if m.invflags & !0x0f != 0 || (m.flg_mask | m.flg_cmp) & 0xc0 != 0 {
                return None;
            }
            head(out, name);
            m.push(out);
        }
        ("udp", 0) => {
            let m = TcpUdp {
                spts: [d.u16(0)?, d.u16(2)?],
                dpts: [d.u16(4)?, d.u16(6)?],
                invflags: d.u8(8)?,
                ..TcpUdp::default()
            };
            if m.invflags & !0x03 != 0 {
                return None;
            }
            head(out, name);
            m.push(out);
        }
        ("sctp", 0) => {
            // dpts, spts, chunkmap[64], chunk_match_type, flag_info[4] (3 bytes each),
            // flag_count, flags, invflags.
            let (flags, inv) = (d.u32(284)?, d.u32(288)?);
            // Chunk types are not decoded.
            if flags & !0x03 != 0 || inv & !0x03 != 0 {
                return None;
            }
            head(out, name);
            if flags & 1 != 0 {
                push_ports(out, "--sport", d.u16(4)?, d.u16(6)?, inv & 1 != 0);
            }
            if flags & 2 != 0 {
                push_ports(out, "--dport", d.u16(0)?, d.u16(2)?, inv & 2 != 0);
            }
        }
        ("multiport", 0 | 1) => {
            let (flags, count) = (d.u8(0)?, d.u8(1)? as usize);
            let opt = ["--sports", "--dports", "--ports"].get(flags as usize)?;
            if count > 15 {
                return None;
            }
            let ranges = revision == 1;
            let pflag = |i: usize| if ranges { d.u8(32 + i) } else { Some(0) };
            let invert = if ranges { d.u8(47)? } else { 0 };
            if invert > 1 {
                return None;
            }
            head(out, name);
            bang(out, invert != 0);
            out.push(opt.to_string());
            let mut list = Vec::with_capacity(count);
            let mut i = 0;
            while i < count {
                let port = d.u16(2 + 2 * i)?;
                if pflag(i)? != 0 {
                    i += 1;
                    list.push(format!("{port}:{}", d.u16(2 + 2 * i)?));
                } else {
                    list.push(port.to_string());
                }
                i += 1;
            }
            out.push(list.join(","));
        }
        ("addrtype", 0 | 1) => {
            let (source, dest) = (d.u16(0)?, d.u16(2)?);
            let (inv_src, inv_dst, flags) = if revision == 1 {
                let f = d.u32(4)?;
                if f & !0x0f != 0 {
                    return None;
                }
                (f & 1 != 0, f & 2 != 0, f)
            } else {
                (d.u32(4)? != 0, d.u32(8)? != 0, 0)
            };
            head(out, name);
            if source != 0 {
                bang(out, inv_src);
                out.extend(["--src-type".to_string(), addr_types(source)?]);
            }
            if dest != 0 {
                bang(out, inv_dst);
                out.extend(["--dst-type".to_string(), addr_types(dest)?]);
            }
            if flags & 4 != 0 {
                out.push("--limit-iface-in".into());
            }
            if flags & 8 != 0 {
                out.push("--limit-iface-out".into());
            }
        }
        ("comment", 0) => {
            head(out, name);
            out.extend(["--comment".to_string(), d.text(0, 256)?]);
        }
        ("conntrack", 1..=3) => conntrack(out, family, revision, d)?,
        // The old xt_state match (`unsigned int statemask`), as iptables before 1.4.17 wrote.
        ("state", 0) => {
            let states = conntrack_states(u16::try_from(d.u32(0)?).ok()?)?;
            head(out, name);
            out.extend(["--state".to_string(), states]);
        }
        ("mark", 1) => {
            let (mark, mask, invert) = (d.u32(0)?, d.u32(4)?, d.u8(8)?);
            if invert > 1 {
                return None;
            }
            head(out, name);
            bang(out, invert != 0);
            out.push("--mark".into());
            out.push(mark_text(mark, mask));
        }
        ("statistic", 0) => {
            let (mode, flags) = (d.u16(0)?, d.u16(2)?);
            if flags & !1 != 0 {
                return None;
            }
            let inv = flags & 1 != 0;
            head(out, name);
            out.push("--mode".into());
            match mode {
                0 => {
                    out.push("random".into());
                    bang(out, inv);
                    let p = f64::from(d.u32(4)?) / f64::from(0x8000_0000u32);
                    out.extend(["--probability".to_string(), format!("{p:.11}")]);
                }
                1 => {
                    out.push("nth".into());
                    bang(out, inv);
                    let every = d.u32(4)?.wrapping_add(1);
                    out.extend(["--every".to_string(), every.to_string()]);
                    out.extend(["--packet".to_string(), d.u32(8)?.to_string()]);
                }
                _ => return None,
            }
        }
        ("icmp", 0) if family == Family::Ipv4 => {
            let (kind, lo, hi, inv) = (d.u8(0)?, d.u8(1)?, d.u8(2)?, d.u8(3)?);
            if inv & !1 != 0 {
                return None;
            }
            head(out, name);
            bang(out, inv != 0);
            out.push("--icmp-type".into());
            out.push(match kind {
                0xff => "any".to_string(),
                _ if lo != 0 || hi != 0xff => format!("{kind}/{lo}"),
                _ => kind.to_string(),
            });
        }
        _ => return None,
    }
    Some(())
}

/// `0x%x`, with `/0x%x` unless the mask is all ones (`print_mark`).
fn mark_text(mark: u32, mask: u32) -> String {
    if mask == u32::MAX {
        format!("{mark:#x}")
    } else {
        format!("{mark:#x}/{mask:#x}")
    }
}

/// `conntrack_dump` of libxt_conntrack for revisions 1-3 (the `state` alias included).
fn conntrack(out: &mut Vec<String>, family: Family, revision: u8, d: &Data) -> Option<()> {
    const STATE: u16 = 1 << 0;
    const PROTO: u16 = 1 << 1;
    const ADDRS: [(u16, &str); 4] = [
        (1 << 2, "--ctorigsrc"),
        (1 << 3, "--ctorigdst"),
        (1 << 4, "--ctreplsrc"),
        (1 << 5, "--ctrepldst"),
    ];
    const STATUS: u16 = 1 << 6;
    const EXPIRES: u16 = 1 << 7;
    const PORTS: [(u16, &str); 4] = [
        (1 << 8, "--ctorigsrcport"),
        (1 << 9, "--ctorigdstport"),
        (1 << 10, "--ctreplsrcport"),
        (1 << 11, "--ctrepldstport"),
    ];
    const DIRECTION: u16 = 1 << 12;
    const STATE_ALIAS: u16 = 1 << 13;
    let (flags, inv) = (d.u16(146)?, d.u16(148)?);
    if flags & !0x3fff != 0 {
        return None;
    }
    let (state, status) = match revision {
        1 => (u16::from(d.u8(150)?), u16::from(d.u8(151)?)),
        _ => (d.u16(150)?, d.u16(152)?),
    };
    let alias = flags & STATE_ALIAS != 0;
    out.extend([
        "-m".to_string(),
        if alias { "state" } else { "conntrack" }.to_string(),
    ]);
    if flags & STATE != 0 {
        bang(out, inv & STATE != 0);
        out.push(if alias { "--state" } else { "--ctstate" }.into());
        out.push(conntrack_states(state)?);
    }
    if flags & PROTO != 0 {
        bang(out, inv & PROTO != 0);
        out.extend(["--ctproto".to_string(), d.u16(136)?.to_string()]);
    }
    let len = addr_len(family);
    for (k, (bit, opt)) in ADDRS.iter().enumerate() {
        if flags & bit != 0 {
            bang(out, inv & bit != 0);
            let addr = d.bytes(32 * k, len)?;
            let mask = d.bytes(32 * k + 16, len)?;
            let suffix = match prefix_len(mask) {
                Some(l) if l as usize == 8 * len => String::new(),
                Some(l) => format!("/{l}"),
                None => format!("/{}", addr_text(mask)),
            };
            out.extend([opt.to_string(), format!("{}{suffix}", addr_text(addr))]);
        }
    }
    for (k, (bit, opt)) in PORTS.iter().enumerate() {
        if flags & bit != 0 {
            bang(out, inv & bit != 0);
            let (lo, hi) = if revision == 3 {
                (d.u16(138 + 2 * k)?, d.u16(154 + 2 * k)?)
            } else {
                (d.be16(138 + 2 * k)?, 0)
            };
            let text = if hi == 0 || lo == hi {
                lo.to_string()
            } else {
                format!("{lo}:{hi}")
            };
            out.extend([opt.to_string(), text]);
        }
    }
    if flags & STATUS != 0 {
        bang(out, inv & STATUS != 0);
        out.push("--ctstatus".into());
        const NAMES: [(u16, &str); 4] = [
            (1, "EXPECTED"),
            (2, "SEEN_REPLY"),
            (4, "ASSURED"),
            (8, "CONFIRMED"),
        ];
        let names: Vec<&str> = NAMES
            .iter()
            .filter(|(bit, _)| status & bit != 0)
            .map(|(_, n)| *n)
            .collect();
        if status & !0x0f != 0 {
            return None;
        }
        out.push(if names.is_empty() {
            "NONE".to_string()
        } else {
            names.join(",")
        });
    }
    if flags & EXPIRES != 0 {
        bang(out, inv & EXPIRES != 0);
        let (lo, hi) = (d.u32(128)?, d.u32(132)?);
        out.push("--ctexpire".into());
        out.push(if lo == hi {
            lo.to_string()
        } else {
            format!("{lo}:{hi}")
        });
    }
    if flags & DIRECTION != 0 {
        out.push("--ctdir".into());
        out.push(
            if inv & DIRECTION != 0 {
                "REPLY"
            } else {
                "ORIGINAL"
            }
            .into(),
        );
    }
    Some(())
}

/// A conntrack state mask as `print_state` prints it; `None` for an empty mask (which
/// prints no value) or an unnamed bit.
fn conntrack_states(state: u16) -> Option<String> {
    const NAMES: [(u16, &str); 7] = [
        (1 << 0, "INVALID"),
        (1 << 3, "NEW"),
        (1 << 2, "RELATED"),
        (1 << 1, "ESTABLISHED"),
        (1 << 8, "UNTRACKED"),
        (1 << 6, "SNAT"),
        (1 << 7, "DNAT"),
    ];
    let named: u16 = NAMES.iter().map(|(b, _)| b).sum();
    if state == 0 || state & !named != 0 {
        return None;
    }
    let names: Vec<&str> = NAMES
        .iter()
        .filter(|(bit, _)| state & bit != 0)
        .map(|(_, n)| *n)
        .collect();
    Some(names.join(","))
}

/// `NF_NAT_RANGE_*` flags.
const MAP_IPS: u32 = 1;
const PROTO_SPECIFIED: u32 = 2;
const PROTO_RANDOM: u32 = 4;
const PERSISTENT: u32 = 8;
const PROTO_RANDOM_FULLY: u32 = 16;
const PROTO_OFFSET: u32 = 32;

/// `struct nf_nat_range2`, whichever struct the target revision carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatRange {
    pub flags: u32,
    pub min_addr: Vec<u8>,
    pub max_addr: Vec<u8>,
    /// Ports in host order.
    pub min_port: u16,
    pub max_port: u16,
    pub base_port: u16,
}

/// The layouts of nf_nat ranges: `nf_nat_ipv4_multi_range_compat` (IPv4 revision 0),
/// `nf_nat_range` (revision 1, and IPv6 revision 0 of MASQUERADE/REDIRECT) and
/// `nf_nat_range2` (DNAT revision 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NatLayout {
    Ipv4Compat,
    Range,
    Range2,
}

impl NatRange {
    pub fn decode(layout: NatLayout, family: Family, data: &[u8]) -> Option<NatRange> {
        let d = Data(data);
        let len = addr_len(family);
        let r = match layout {
            NatLayout::Ipv4Compat => {
                if family != Family::Ipv4 || d.u32(0)? != 1 {
                    return None; // rangesize: the kernel accepts only 1
                }
                NatRange {
                    flags: d.u32(4)?,
                    min_addr: d.bytes(8, 4)?.to_vec(),
                    max_addr: d.bytes(12, 4)?.to_vec(),
                    min_port: d.be16(16)?,
                    max_port: d.be16(18)?,
                    base_port: 0,
                }
            }
            NatLayout::Range | NatLayout::Range2 => NatRange {
                flags: d.u32(0)?,
                min_addr: d.bytes(4, len)?.to_vec(),
                max_addr: d.bytes(20, len)?.to_vec(),
                min_port: d.be16(36)?,
                max_port: d.be16(38)?,
                base_port: if layout == NatLayout::Range2 {
                    d.be16(40)?
                } else {
                    0
                },
            },
        };
        let known = match layout {
            NatLayout::Range2 => 0x3f,
            _ => 0x1f,
        };
        (r.flags & !known == 0).then_some(r)
    }

    /// `__NAT_print` with `sprint_range`: `opt` (`--to-destination`, `--to-source`,
    /// `--to-ports`), then `--random`, `--random-fully`, `--persistent`.
    pub fn push(&self, out: &mut Vec<String>, family: Family, opt: &str, skip_colon: bool) {
        let brackets = family == Family::Ipv6 && self.flags & PROTO_SPECIFIED != 0;
        let mut s = String::new();
        if self.flags & MAP_IPS != 0 {
            if brackets {
                s.push('[');
            }
            s += &addr_text(&self.min_addr);
            if self.min_addr != self.max_addr {
                s.push('-');
                s += &addr_text(&self.max_addr);
            }
            if brackets {
                s.push(']');
            }
        }
        if self.flags & PROTO_SPECIFIED != 0 {
            s += &format!(":{}", self.min_port);
            if self.max_port != self.min_port {
                s += &format!("-{}", self.max_port);
            }
            if self.flags & PROTO_OFFSET != 0 {
                s += &format!("/{}", self.base_port);
            }
        }
        if !s.is_empty() {
            let s = match s.strip_prefix(':') {
                Some(rest) if skip_colon => rest.to_string(),
                _ => s,
            };
            out.extend([opt.to_string(), s]);
        }
        for (flag, name) in [
            (PROTO_RANDOM, "--random"),
            (PROTO_RANDOM_FULLY, "--random-fully"),
            (PERSISTENT, "--persistent"),
        ] {
            if self.flags & flag != 0 {
                out.push(name.into());
            }
        }
    }
}

fn decode_target(
    out: &mut Vec<String>,
    family: Family,
    name: &str,
    revision: u8,
    d: &Data,
) -> Option<()> {
    use NatLayout::*;
    let nat = |layout, opt, skip_colon, out: &mut Vec<String>| -> Option<()> {
        NatRange::decode(layout, family, d.0)?.push(out, family, opt, skip_colon);
        Some(())
    };
    let v4 = family == Family::Ipv4;
    match (name, revision) {
        ("DNAT", 0) if v4 => nat(Ipv4Compat, "--to-destination", false, out)?,
        ("DNAT", 1) => nat(Range, "--to-destination", false, out)?,
        ("DNAT", 2) => nat(Range2, "--to-destination", false, out)?,
        ("SNAT", 0) if v4 => nat(Ipv4Compat, "--to-source", false, out)?,
        ("SNAT", 1) => nat(Range, "--to-source", false, out)?,
        ("MASQUERADE" | "REDIRECT", 0) => {
            let layout = if v4 { Ipv4Compat } else { Range };
            nat(layout, "--to-ports", true, out)?
        }
        ("MARK", 2) => {
            out.push("--set-xmark".into());
            out.push(format!("{:#x}/{:#x}", d.u32(0)?, d.u32(4)?));
        }
        ("REJECT", 0) => {
            const V4: [&str; 9] = [
                "icmp-net-unreachable",
                "icmp-host-unreachable",
                "icmp-proto-unreachable",
                "icmp-port-unreachable",
                "",
                "icmp-net-prohibited",
                "icmp-host-prohibited",
                "tcp-reset",
                "icmp-admin-prohibited",
            ];
            const V6: [&str; 9] = [
                "icmp6-no-route",
                "icmp6-adm-prohibited",
                "icmp6-not-neighbor",
                "icmp6-addr-unreachable",
                "icmp6-port-unreachable",
                "",
                "tcp-reset",
                "icmp6-policy-fail",
                "icmp6-reject-route",
            ];
            let names = if v4 { V4 } else { V6 };
            let with = names.get(d.u32(0)? as usize).filter(|n| !n.is_empty())?;
            out.extend(["--reject-with".to_string(), with.to_string()]);
        }
        ("LOG", 0) => {
            let (level, flags) = (d.u8(0)?, d.u8(1)?);
            let prefix = d.text(2, 30)?;
            if flags & !0x3f != 0 {
                return None;
            }
            if !prefix.is_empty() {
                out.extend(["--log-prefix".to_string(), prefix]);
            }
            if level != 4 {
                out.extend(["--log-level".to_string(), level.to_string()]);
            }
            for (bit, opt) in [
                (1, "--log-tcp-sequence"),
                (2, "--log-tcp-options"),
                (4, "--log-ip-options"),
                (8, "--log-uid"),
                (0x20, "--log-macdecode"),
            ] {
                if flags & bit != 0 {
                    out.push(opt.into());
                }
            }
        }
        _ => return None,
    }
    Some(())
}

/// Options whose value is free text, which `iptables-save` quotes (`xtables_save_string`).
const FREE_TEXT: [&str; 2] = ["--comment", "--log-prefix"];

/// A free-text value as `xtables_save_string` writes it: bare when it is only letters,
/// digits, `_` and `-`, else in double quotes with `"`, `\` and `'` escaped.
pub fn save_quoted(value: &str) -> String {
    if !value.is_empty()
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return value.to_string();
    }
    let mut s = String::from("\"");
    for c in value.chars() {
        if matches!(c, '"' | '\\' | '\'') {
            s.push('\\');
        }
        s.push(c);
    }
    s.push('"');
    s
}

/// A decoded rule as its `-A CHAIN …` line of `iptables-save`, for warnings.
pub fn save_line(chain: &str, args: &[String]) -> String {
    let mut line = format!("-A {chain}");
    let mut free = false;
    for a in args {
        line.push(' ');
        if free {
            line.push_str(&save_quoted(a));
        } else {
            line.push_str(a);
        }
        free = FREE_TEXT.contains(&a.as_str());
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(family: Family, name: &str, revision: u8, data: &[u8]) -> String {
        let mut out = Vec::new();
        push_match(&mut out, family, name, revision, data);
        out.join(" ")
    }

    fn t(family: Family, name: &str, revision: u8, data: &[u8]) -> String {
        let mut out = Vec::new();
        push_target(&mut out, family, name, revision, data);
        out.join(" ")
    }

    fn ne16(v: &[u16]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }

    const V4: Family = Family::Ipv4;
    const V6: Family = Family::Ipv6;

    #[test]
    fn tcp_and_udp_ports_ranges_inversions_and_flags() {
        let mut tcp = ne16(&[0, 65535, 8080, 8080]);
        tcp.extend([0, 0, 0, 0]);
        assert_eq!(m(V4, "tcp", 0, &tcp), "-m tcp --dport 8080");
        let mut tcp = ne16(&[1, 9, 1000, 2000]);
        tcp.extend([0, 0x17, 0x02, 0x03]);
        assert_eq!(
            m(V4, "tcp", 0, &tcp),
            "-m tcp ! --sport 1:9 ! --dport 1000:2000 --tcp-flags FIN,SYN,RST,ACK SYN"
        );
        let mut tcp = ne16(&[0, 65535, 0, 65535]);
        tcp.extend([0, 0x3f, 0, 0x04]);
        // print_tcpf names bits one by one: ALL is never printed.
        assert_eq!(
            m(V4, "tcp", 0, &tcp),
            "-m tcp ! --tcp-flags FIN,SYN,RST,PSH,ACK,URG NONE"
        );
        let mut udp = ne16(&[53, 53, 0, 65535]);
        udp.push(0x01);
        assert_eq!(m(V6, "udp", 0, &udp), "-m udp ! --sport 53");
        // ECE/CWR, unknown inversion bits, another revision, a short struct: opaque.
        let mut tcp = ne16(&[0, 65535, 0, 65535]);
        tcp.extend([0, 0x40, 0x40, 0]);
        assert_eq!(m(V4, "tcp", 0, &tcp), "-m tcp --natledger-opaque");
        udp[8] = 0x10;
        assert_eq!(m(V4, "udp", 0, &udp), "-m udp --natledger-opaque");
        assert_eq!(m(V4, "udp", 1, &udp[..9]), "-m udp --natledger-opaque");
        assert_eq!(m(V4, "tcp", 0, &tcp[..6]), "-m tcp --natledger-opaque");
    }

    #[test]
    fn multiport_addrtype_mark_statistic_comment() {
        // multiport v1: flags, count, ports[15], pflags[15], invert.
        let mut mp = vec![1u8, 4];
        let mut ports = [0u16; 15];
        ports[..4].copy_from_slice(&[1, 100, 200, 300]);
        mp.extend(ne16(&ports));
        let mut pflags = [0u8; 15];
        pflags[0] = 1;
        mp.extend(pflags);
        mp.push(1);
        assert_eq!(
            m(V4, "multiport", 1, &mp),
            "-m multiport ! --dports 1:100,200,300"
        );
        mp[0] = 3;
        assert_eq!(
            m(V4, "multiport", 1, &mp),
            "-m multiport --natledger-opaque"
        );
        // addrtype v1: source, dest, flags.
        let mut at = ne16(&[0x0024, 0x0002]);
        at.extend(0x5u32.to_ne_bytes());
        assert_eq!(
            m(V4, "addrtype", 1, &at),
            "-m addrtype ! --src-type LOCAL,MULTICAST --dst-type UNICAST --limit-iface-in"
        );
        // mark: mark, mask, invert.
        let mut mark = 0x4000u32.to_ne_bytes().to_vec();
        mark.extend(0x4000u32.to_ne_bytes());
        mark.extend([1, 0, 0, 0]);
        assert_eq!(m(V4, "mark", 1, &mark), "-m mark ! --mark 0x4000/0x4000");
        // statistic: kube-proxy's 1/2 and 1/3.
        let mut st = ne16(&[0, 0]);
        st.extend(0x4000_0000u32.to_ne_bytes());
        st.resize(24, 0);
        assert_eq!(
            m(V4, "statistic", 0, &st),
            "-m statistic --mode random --probability 0.50000000000"
        );
        st[4..8].copy_from_slice(&0x2aaa_aaabu32.to_ne_bytes());
        assert_eq!(
            m(V4, "statistic", 0, &st),
            "-m statistic --mode random --probability 0.33333333349"
        );
        let mut c = b"default/web:http".to_vec();
        c.resize(256, 0);
        assert_eq!(
            m(V4, "comment", 0, &c),
            "-m comment --comment default/web:http"
        );
        c.fill(b'x');
        assert_eq!(m(V4, "comment", 0, &c), "-m comment --natledger-opaque");
    }

    /// `xt_conntrack_mtinfo3` with the given flags, inversions, state and orig dst.
    fn ct3(flags: u16, inv: u16, state: u16) -> Vec<u8> {
        let mut d = vec![0u8; 164];
        d[32..36].copy_from_slice(&[10, 0, 0, 0]); // origdst
        d[48..52].copy_from_slice(&[255, 0, 0, 0]);
        d[140..142].copy_from_slice(&80u16.to_ne_bytes()); // origdst port, host order
        d[146..148].copy_from_slice(&flags.to_ne_bytes());
        d[148..150].copy_from_slice(&inv.to_ne_bytes());
        d[150..152].copy_from_slice(&state.to_ne_bytes());
        d[156..158].copy_from_slice(&90u16.to_ne_bytes()); // origdst port high
        d
    }

    #[test]
    fn conntrack_states_addresses_ports_and_the_state_alias() {
        assert_eq!(
            m(V4, "conntrack", 3, &ct3(1, 0, 0b110)),
            "-m conntrack --ctstate RELATED,ESTABLISHED"
        );
        assert_eq!(
            m(
                V4,
                "conntrack",
                3,
                &ct3(1 | 8 | 0x200 | 0x1000, 1 | 0x200 | 0x1000, 8)
            ),
            "-m conntrack ! --ctstate NEW --ctorigdst 10.0.0.0/8 ! --ctorigdstport 80:90 \
             --ctdir REPLY"
        );
        assert_eq!(
            m(V4, "conntrack", 3, &ct3(1 | 0x2000, 0, 1 | 0x100)),
            "-m state --state INVALID,UNTRACKED"
        );
        // The old state match.
        assert_eq!(
            m(V4, "state", 0, &0b110u32.to_ne_bytes()),
            "-m state --state RELATED,ESTABLISHED"
        );
        // Revision 2 ports are one big-endian port.
        let mut r2 = ct3(0x200, 0, 0);
        r2[140..142].copy_from_slice(&443u16.to_be_bytes());
        assert_eq!(
            m(V4, "conntrack", 2, &r2[..156]),
            "-m conntrack --ctorigdstport 443"
        );
        // An empty state mask prints no value: opaque; so does an unknown flag.
        assert_eq!(
            m(V4, "conntrack", 3, &ct3(1, 0, 0)),
            "-m conntrack --natledger-opaque"
        );
        assert_eq!(
            m(V4, "conntrack", 3, &ct3(0x4000, 0, 0)),
            "-m conntrack --natledger-opaque"
        );
    }

    fn range(flags: u32, min: &[u8], max: &[u8], ports: [u16; 3]) -> Vec<u8> {
        let mut d = flags.to_ne_bytes().to_vec();
        for a in [min, max] {
            let mut b = [0u8; 16];
            b[..a.len()].copy_from_slice(a);
            d.extend(b);
        }
        for p in ports {
            d.extend(p.to_be_bytes());
        }
        d.extend([0, 0]);
        d
    }

    #[test]
    fn nat_ranges_of_every_revision() {
        // DNAT revision 0 (IPv4 multi-range compat): rangesize, flags, min, max, ports.
        let mut compat = 1u32.to_ne_bytes().to_vec();
        compat.extend(3u32.to_ne_bytes());
        compat.extend([172, 17, 0, 2, 172, 17, 0, 2]);
        compat.extend(80u16.to_be_bytes());
        compat.extend(80u16.to_be_bytes());
        assert_eq!(
            t(V4, "DNAT", 0, &compat),
            "-j DNAT --to-destination 172.17.0.2:80"
        );
        compat[..4].copy_from_slice(&2u32.to_ne_bytes());
        assert_eq!(t(V4, "DNAT", 0, &compat), "-j DNAT", "two ranges: opaque");
        // Revision 2 with a base port, an address range, random and persistent.
        let d = range(
            1 | 2 | 4 | 8 | 32,
            &[10, 0, 0, 1],
            &[10, 0, 0, 9],
            [80, 82, 9000],
        );
        assert_eq!(
            t(V4, "DNAT", 2, &d),
            "-j DNAT --to-destination 10.0.0.1-10.0.0.9:80-82/9000 --random --persistent"
        );
        // IPv6: brackets only with ports.
        let a: [u8; 16] = "2001:db8::1".parse::<Ipv6Addr>().unwrap().octets();
        assert_eq!(
            t(V6, "DNAT", 1, &range(3, &a, &a, [80, 80, 0])[..40]),
            "-j DNAT --to-destination [2001:db8::1]:80"
        );
        assert_eq!(
            t(V6, "SNAT", 1, &range(1 | 16, &a, &a, [0, 0, 0])[..40]),
            "-j SNAT --to-source 2001:db8::1 --random-fully"
        );
        // MASQUERADE and REDIRECT: ports without the colon.
        let mut masq = 1u32.to_ne_bytes().to_vec();
        masq.extend(2u32.to_ne_bytes());
        masq.extend([0; 8]);
        masq.extend(1024u16.to_be_bytes());
        masq.extend(2048u16.to_be_bytes());
        assert_eq!(
            t(V4, "MASQUERADE", 0, &masq),
            "-j MASQUERADE --to-ports 1024-2048"
        );
        assert_eq!(
            t(
                V6,
                "REDIRECT",
                0,
                &range(2, &[], &[], [3128, 3128, 0])[..40]
            ),
            "-j REDIRECT --to-ports 3128"
        );
        // An unknown flag, an unknown revision: the name only.
        assert_eq!(t(V4, "DNAT", 2, &range(0x40, &[], &[], [0; 3])), "-j DNAT");
        assert_eq!(t(V4, "DNAT", 3, &d), "-j DNAT");
    }

    #[test]
    fn other_targets() {
        let mut mark = 0x2000u32.to_ne_bytes().to_vec();
        mark.extend(0x2000u32.to_ne_bytes());
        assert_eq!(t(V4, "MARK", 2, &mark), "-j MARK --set-xmark 0x2000/0x2000");
        assert_eq!(t(V4, "MARK", 1, &mark), "-j MARK");
        assert_eq!(
            t(V4, "REJECT", 0, &7u32.to_ne_bytes()),
            "-j REJECT --reject-with tcp-reset"
        );
        assert_eq!(
            t(V6, "REJECT", 0, &1u32.to_ne_bytes()),
            "-j REJECT --reject-with icmp6-adm-prohibited"
        );
        assert_eq!(t(V4, "REJECT", 0, &4u32.to_ne_bytes()), "-j REJECT");
        let mut log = vec![6u8, 8];
        log.extend(b"nat: ");
        log.resize(32, 0);
        assert_eq!(
            t(V4, "LOG", 0, &log),
            "-j LOG --log-prefix nat:  --log-level 6 --log-uid"
        );
        assert_eq!(t(V4, "CT", 0, &[0; 16]), "-j CT");
    }

    #[test]
    fn headers_as_iptables_save_prints_them() {
        let iface = |name: &str, mask_len: usize| {
            let (mut n, mut m) = ([0u8; IFNAMSIZ], [0u8; IFNAMSIZ]);
            n[..name.len()].copy_from_slice(name.as_bytes());
            m[..mask_len].fill(0xff);
            Some((n, m))
        };
        let h = Header {
            src: Some((vec![192, 168, 0, 0], vec![255, 255, 0, 255])),
            dst: Some((vec![10, 0, 0, 0], vec![255, 0, 0, 0])),
            iniface: iface("eth", 3),
            outiface: iface("docker0", 8),
            proto: 47,
            frag: true,
            invflags: INV_DSTIP | INV_VIA_OUT | INV_FRAG,
        };
        let mut out = Vec::new();
        h.push(V4, &mut out);
        assert_eq!(
            out.join(" "),
            "-s 192.168.0.0/255.255.0.255 ! -d 10.0.0.0/8 -i eth+ ! -o docker0 -p gre ! -f"
        );
        let h = Header {
            dst: Some((
                "::a00:1".parse::<Ipv6Addr>().unwrap().octets().to_vec(),
                vec![0xff; 16],
            )),
            proto: 58,
            invflags: INV_PROTO | INV_SRCIP,
            ..Header::default()
        };
        let mut out = Vec::new();
        h.push(V6, &mut out);
        assert_eq!(out.join(" "), "! -s ::/0 -d ::10.0.0.1/128 ! -p ipv6-icmp");
        assert_eq!(proto_name(6).as_deref(), Some("tcp"));
        assert_eq!(proto_name(255), None);
    }

    #[test]
    fn lines_quote_free_text_as_iptables_save_does() {
        let args: Vec<String> = ["-m", "comment", "--comment", "say \"hi\" it's", "-j", "X"]
            .map(String::from)
            .to_vec();
        assert_eq!(
            save_line("C", &args),
            r#"-A C -m comment --comment "say \"hi\" it\'s" -j X"#
        );
        assert_eq!(save_quoted("default/web:http"), "\"default/web:http\"");
        assert_eq!(save_quoted("natledger-c1_x"), "natledger-c1_x");
    }
}
