//! The target info structs: every nf_nat range layout (DNAT, SNAT, MASQUERADE, REDIRECT),
//! MARK, REJECT, LOG.

use super::{Data, addr_len, addr_text};
use crate::model::family::Family;

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

pub(super) fn decode_target(
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
        ("REJECT", 0) => reject(out, v4, d)?,
        ("LOG", 0) => log(out, d)?,
        _ => return None,
    }
    Some(())
}

/// `--reject-with` of `ipt_reject_info`/`ip6t_reject_info`.
fn reject(out: &mut Vec<String>, v4: bool, d: &Data) -> Option<()> {
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
    Some(())
}

/// `xt_log_info`: prefix, level and flags.
fn log(out: &mut Vec<String>, d: &Data) -> Option<()> {
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
    Some(())
}
