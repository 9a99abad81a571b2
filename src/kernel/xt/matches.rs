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
