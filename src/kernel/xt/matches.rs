//! The match info structs: tcp, udp, sctp, multiport, addrtype, comment, conntrack and
//! state, mark, statistic, icmp.

use super::{Data, addr_len, addr_text, bang, prefix_len};
use crate::model::family::Family;

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

pub(super) fn decode_match(
    out: &mut Vec<String>,
    family: Family,
    name: &str,
    revision: u8,
    d: &Data,
) -> Option<()> {
    match (name, revision) {
        ("tcp", 0) => tcp_match(out, d),
        ("udp", 0) => udp_match(out, d),
        ("sctp", 0) => sctp_match(out, d),
        ("multiport", 0 | 1) => multiport_match(out, revision, d),
        ("addrtype", 0 | 1) => addrtype_match(out, revision, d),
        ("comment", 0) => {
            head(out, "comment");
            out.extend(["--comment".to_string(), d.text(0, 256)?]);
            Some(())
        }
        ("conntrack", 1..=3) => conntrack(out, family, revision, d),
        ("state", 0) => state_match(out, d),
        ("mark", 1) => mark_match(out, d),
        ("statistic", 0) => statistic_match(out, d),
        ("icmp", 0) if family == Family::Ipv4 => icmp_match(out, d),
        _ => None,
    }
}

/// `-m NAME`.
fn head(out: &mut Vec<String>, shown: &str) {
    out.extend(["-m".to_string(), shown.to_string()]);
}

/// `-m tcp` (`xt_tcp`).
fn tcp_match(out: &mut Vec<String>, d: &Data) -> Option<()> {
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
    head(out, "tcp");
    m.push(out);
    Some(())
}

/// `-m udp` (`xt_udp`).
fn udp_match(out: &mut Vec<String>, d: &Data) -> Option<()> {
    let m = TcpUdp {
        spts: [d.u16(0)?, d.u16(2)?],
        dpts: [d.u16(4)?, d.u16(6)?],
        invflags: d.u8(8)?,
        ..TcpUdp::default()
    };
    if m.invflags & !0x03 != 0 {
        return None;
    }
    head(out, "udp");
    m.push(out);
    Some(())
}

/// `-m sctp` (`xt_sctp_info`): ports only.
fn sctp_match(out: &mut Vec<String>, d: &Data) -> Option<()> {
    // dpts, spts, chunkmap[64], chunk_match_type, flag_info[4] (3 bytes each),
    // flag_count, flags, invflags.
    let (flags, inv) = (d.u32(284)?, d.u32(288)?);
    // Chunk types are not decoded.
    if flags & !0x03 != 0 || inv & !0x03 != 0 {
        return None;
    }
    head(out, "sctp");
    if flags & 1 != 0 {
        push_ports(out, "--sport", d.u16(4)?, d.u16(6)?, inv & 1 != 0);
    }
    if flags & 2 != 0 {
        push_ports(out, "--dport", d.u16(0)?, d.u16(2)?, inv & 2 != 0);
    }
    Some(())
}

/// `-m multiport`, revision 0 (ports) or 1 (ranges, inversion).
fn multiport_match(out: &mut Vec<String>, revision: u8, d: &Data) -> Option<()> {
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
    head(out, "multiport");
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
    Some(())
}

/// `-m addrtype`, revision 0 or 1 (flags).
fn addrtype_match(out: &mut Vec<String>, revision: u8, d: &Data) -> Option<()> {
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
    head(out, "addrtype");
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
    Some(())
}

/// The old xt_state match (`unsigned int statemask`), as iptables before 1.4.17 wrote.
fn state_match(out: &mut Vec<String>, d: &Data) -> Option<()> {
    let states = conntrack_states(u16::try_from(d.u32(0)?).ok()?)?;
    head(out, "state");
    out.extend(["--state".to_string(), states]);
    Some(())
}

/// `-m mark` revision 1.
fn mark_match(out: &mut Vec<String>, d: &Data) -> Option<()> {
    let (mark, mask, invert) = (d.u32(0)?, d.u32(4)?, d.u8(8)?);
    if invert > 1 {
        return None;
    }
    head(out, "mark");
    bang(out, invert != 0);
    out.push("--mark".into());
    out.push(mark_text(mark, mask));
    Some(())
}

/// `-m statistic`: random or nth.
fn statistic_match(out: &mut Vec<String>, d: &Data) -> Option<()> {
    let (mode, flags) = (d.u16(0)?, d.u16(2)?);
    if flags & !1 != 0 {
        return None;
    }
    let inv = flags & 1 != 0;
    head(out, "statistic");
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
    Some(())
}

/// `-m icmp` (IPv4).
fn icmp_match(out: &mut Vec<String>, d: &Data) -> Option<()> {
    let (kind, lo, hi, inv) = (d.u8(0)?, d.u8(1)?, d.u8(2)?, d.u8(3)?);
    if inv & !1 != 0 {
        return None;
    }
    head(out, "icmp");
    bang(out, inv != 0);
    out.push("--icmp-type".into());
    out.push(match kind {
        0xff => "any".to_string(),
        _ if lo != 0 || hi != 0xff => format!("{kind}/{lo}"),
        _ => kind.to_string(),
    });
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

/// `xt_conntrack_mtinfo` match flags (`XT_CONNTRACK_*`).
const CT_STATE: u16 = 1 << 0;
const CT_PROTO: u16 = 1 << 1;
const CT_ADDRS: [(u16, &str); 4] = [
    (1 << 2, "--ctorigsrc"),
    (1 << 3, "--ctorigdst"),
    (1 << 4, "--ctreplsrc"),
    (1 << 5, "--ctrepldst"),
];
const CT_STATUS: u16 = 1 << 6;
const CT_EXPIRES: u16 = 1 << 7;
const CT_PORTS: [(u16, &str); 4] = [
    (1 << 8, "--ctorigsrcport"),
    (1 << 9, "--ctorigdstport"),
    (1 << 10, "--ctreplsrcport"),
    (1 << 11, "--ctrepldstport"),
];
const CT_DIRECTION: u16 = 1 << 12;
const CT_STATE_ALIAS: u16 = 1 << 13;

/// The match flags and inversions of a conntrack match.
#[derive(Clone, Copy)]
struct CtFlags {
    flags: u16,
    inv: u16,
}

impl CtFlags {
    /// Whether `bit` is matched; when it is, its `!` goes out first.
    fn on(self, out: &mut Vec<String>, bit: u16) -> bool {
        let on = self.flags & bit != 0;
        if on {
            bang(out, self.inv & bit != 0);
        }
        on
    }
}

/// `conntrack_dump` of libxt_conntrack for revisions 1-3 (the `state` alias included).
fn conntrack(out: &mut Vec<String>, family: Family, revision: u8, d: &Data) -> Option<()> {
    let f = CtFlags {
        flags: d.u16(146)?,
        inv: d.u16(148)?,
    };
    if f.flags & !0x3fff != 0 {
        return None;
    }
    let (state, status) = match revision {
        1 => (u16::from(d.u8(150)?), u16::from(d.u8(151)?)),
        _ => (d.u16(150)?, d.u16(152)?),
    };
    let alias = f.flags & CT_STATE_ALIAS != 0;
    head(out, if alias { "state" } else { "conntrack" });
    if f.on(out, CT_STATE) {
        out.push(if alias { "--state" } else { "--ctstate" }.into());
        out.push(conntrack_states(state)?);
    }
    if f.on(out, CT_PROTO) {
        out.extend(["--ctproto".to_string(), d.u16(136)?.to_string()]);
    }
    conntrack_addrs(out, family, f, d)?;
    conntrack_ports(out, revision, f, d)?;
    if f.on(out, CT_STATUS) {
        out.push("--ctstatus".into());
        out.push(conntrack_status(status)?);
    }
    if f.on(out, CT_EXPIRES) {
        let (lo, hi) = (d.u32(128)?, d.u32(132)?);
        out.push("--ctexpire".into());
        out.push(if lo == hi {
            lo.to_string()
        } else {
            format!("{lo}:{hi}")
        });
    }
    if f.flags & CT_DIRECTION != 0 {
        let reply = f.inv & CT_DIRECTION != 0;
        out.push("--ctdir".into());
        out.push(if reply { "REPLY" } else { "ORIGINAL" }.into());
    }
    Some(())
}

/// `--ctorigsrc` .. `--ctrepldst`: address and mask of each tuple direction.
fn conntrack_addrs(out: &mut Vec<String>, family: Family, f: CtFlags, d: &Data) -> Option<()> {
    let len = addr_len(family);
    for (k, (bit, opt)) in CT_ADDRS.iter().enumerate() {
        if f.on(out, *bit) {
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
    Some(())
}

/// `--ctorigsrcport` .. `--ctrepldstport`: a port (revisions 1-2) or a range (3).
fn conntrack_ports(out: &mut Vec<String>, revision: u8, f: CtFlags, d: &Data) -> Option<()> {
    for (k, (bit, opt)) in CT_PORTS.iter().enumerate() {
        if f.on(out, *bit) {
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
    Some(())
}

/// A `--ctstatus` mask as libxt_conntrack prints it; `None` for an unnamed bit.
fn conntrack_status(status: u16) -> Option<String> {
    const NAMES: [(u16, &str); 4] = [
        (1, "EXPECTED"),
        (2, "SEEN_REPLY"),
        (4, "ASSURED"),
        (8, "CONFIRMED"),
    ];
    if status & !0x0f != 0 {
        return None;
    }
    let names: Vec<&str> = NAMES
        .iter()
        .filter(|(bit, _)| status & bit != 0)
        .map(|(_, n)| *n)
        .collect();
    Some(if names.is_empty() {
        "NONE".to_string()
    } else {
        names.join(",")
    })
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
