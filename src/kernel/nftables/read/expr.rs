//! One rule's nf_tables expressions, as iptables-nft 1.8.9 writes them, back into the
//! tokens iptables-nft-save prints (the encodings: the module comment of `read`).

use super::wire::{self, NEQ, NETWORK, NFTA_DATA_VERDICT};
use super::wire::{EQ, GT, GTE, LT, LTE, META_IIFNAME, META_L4PROTO, META_MARK, META_OIFNAME};
use super::wire::{TRANSPORT, u32_attr, value_attr};
use crate::kernel::netlink;
use crate::kernel::xt::{self, Header, IFNAMSIZ, TcpUdp};
use crate::model::family::Family;

/// What a register holds.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    Meta(u32),
    Payload {
        base: u32,
        offset: u32,
        len: u32,
    },
    /// Anything else (immediate data, a shifted value, ...).
    Other,
}

#[derive(Debug, Clone)]
struct Reg {
    number: u32,
    source: Source,
    /// The mask of a `bitwise` (with a zero xor) applied to it.
    mask: Option<Vec<u8>>,
}

pub(super) struct Decoder {
    family: Family,
    header: Header,
    regs: Vec<Reg>,
    /// The matches' tokens, in rule order.
    matches: Vec<String>,
    /// The one tcp/udp match native port and flag compares add up to (iptables-nft-save's
    /// `ctx->tcpudp`): where it goes among `matches`, its name and fields.
    ports: Option<(usize, &'static str, TcpUdp)>,
    target: Vec<String>,
}

/// A compat `match` or `target` expression: the xtables name, revision and info struct.
fn xt_expr(data: &[u8]) -> Option<(&str, u8, &[u8])> {
    let name = netlink::attr(data, 1).and_then(netlink::str_of)?;
    let revision = u8::try_from(u32_attr(data, 2)?).ok()?;
    let info = netlink::attr(data, 3).unwrap_or_default();
    Some((name, revision, info))
}

/// A native statement iptables-nft reads back as a target: its name only (target options
/// never decide what matches).
fn native_target(name: &str, data: &[u8]) -> Option<&'static str> {
    Some(match name {
        "log" => "NFLOG",
        "nat" => match u32_attr(data, 1)? {
            0 => "SNAT",
            1 => "DNAT",
            _ => return None,
        },
        "masq" => "MASQUERADE",
        "redir" => "REDIRECT",
        "reject" => "REJECT",
        "queue" => "NFQUEUE",
        _ => return None,
    })
}

impl Decoder {
    pub(super) fn new(family: Family) -> Decoder {
        Decoder {
            family,
            header: Header::default(),
            regs: Vec::with_capacity(4),
            matches: Vec::with_capacity(16),
            ports: None,
            target: Vec::new(),
        }
    }

    /// An expression not understood. It may have written any register (a `fib`, a `lookup`
    /// with a map, an `rt` loading into the register a `payload` filled), so what every
    /// register holds is unknown from here: a later `cmp` is opaque, never a `-d` it is not.
    pub(super) fn opaque(&mut self, name: &str) {
        self.regs.clear();
        xt::push_opaque_match(&mut self.matches, &format!("nft:{name}"));
    }

    fn set_reg(&mut self, number: u32, source: Source, mask: Option<Vec<u8>>) {
        self.regs.retain(|r| r.number != number);
        self.regs.push(Reg {
            number,
            source,
            mask,
        });
    }

    fn reg(&self, number: u32) -> Option<&Reg> {
        self.regs.iter().find(|r| r.number == number)
    }

    /// One expression; `None` when it is not understood (the caller renders it opaque).
    pub(super) fn expr(&mut self, name: &str, data: &[u8]) -> Option<()> {
        match name {
            "counter" => Some(()),
            "meta" => self.meta(data),
            "payload" => self.payload(data),
            "bitwise" => self.bitwise(data),
            "cmp" => {
                let (sreg, op) = (u32_attr(data, 1)?, u32_attr(data, 2)?);
                let value = value_attr(data, 3)?;
                let reg = self.reg(sreg)?.clone();
                self.cmp(&reg, op, value)
            }
            "range" => self.range(data),
            "immediate" => self.immediate(data),
            "match" => {
                let (name, revision, info) = xt_expr(data)?;
                xt::push_match(&mut self.matches, self.family, name, revision, info);
                Some(())
            }
            "target" => {
                let (name, revision, info) = xt_expr(data)?;
                self.target.clear();
                xt::push_target(&mut self.target, self.family, name, revision, info);
                Some(())
            }
            _ => {
                self.target = vec!["-j".into(), native_target(name, data)?.into()];
                Some(())
            }
        }
    }

    fn meta(&mut self, data: &[u8]) -> Option<()> {
        // A `meta set` is a statement natledger does not model.
        if netlink::attr(data, 3).is_some() {
            return None;
        }
        let dreg = u32_attr(data, 1)?;
        self.set_reg(dreg, Source::Meta(u32_attr(data, 2)?), None);
        Some(())
    }

    fn payload(&mut self, data: &[u8]) -> Option<()> {
        // `payload set` (NFTA_PAYLOAD_SREG) writes the packet.
        if netlink::attr(data, 5).is_some() {
            return None;
        }
        let source = Source::Payload {
            base: u32_attr(data, 2)?,
            offset: u32_attr(data, 3)?,
            len: u32_attr(data, 4)?,
        };
        self.set_reg(u32_attr(data, 1)?, source, None);
        Some(())
    }

    fn bitwise(&mut self, data: &[u8]) -> Option<()> {
        let (sreg, dreg) = (u32_attr(data, 1)?, u32_attr(data, 2)?);
        let op = u32_attr(data, 6).unwrap_or(0);
        let mask = value_attr(data, 4);
        let xor = value_attr(data, 5);
        let loaded = self.reg(sreg).cloned();
        let plain = op == 0
            && xor.is_some_and(|x| x.iter().all(|b| *b == 0))
            && loaded.as_ref().is_some_and(|r| r.mask.is_none());
        match (loaded, mask) {
            (Some(r), Some(mask)) if plain => self.set_reg(dreg, r.source, Some(mask.to_vec())),
            _ => self.set_reg(dreg, Source::Other, None),
        }
        Some(())
    }

    /// A `range` of a port: the tcp/udp match's port range.
    fn range(&mut self, data: &[u8]) -> Option<()> {
        let (sreg, op) = (u32_attr(data, 1)?, u32_attr(data, 2)?);
        let (from, to) = (value_attr(data, 3)?, value_attr(data, 4)?);
        let reg = self.reg(sreg)?.clone();
        let (Source::Payload { base, offset, len }, None) = (reg.source, reg.mask) else {
            return None;
        };
        if base != TRANSPORT || len != 2 || from.len() != 2 || to.len() != 2 || op > NEQ {
            return None;
        }
        let (lo, hi) = (be16(from)?, be16(to)?);
        let (ports, inv_bit) = self.port_field(offset)?;
        let m = self.ports()?;
        let field = if ports == 0 { &mut m.spts } else { &mut m.dpts };
        *field = [lo, hi];
        if op == NEQ {
            m.invflags |= inv_bit;
        }
        Some(())
    }

    /// An `immediate`: a verdict is the rule's target; data fills a register.
    fn immediate(&mut self, data: &[u8]) -> Option<()> {
        let dreg = u32_attr(data, 1)?;
        let Some(verdict) =
            netlink::attr(data, 2).and_then(|d| netlink::attr(d, NFTA_DATA_VERDICT))
        else {
            self.set_reg(dreg, Source::Other, None);
            return Some(());
        };
        self.target = match wire::verdict(verdict)? {
            (1, _) => vec!["-j".into(), "ACCEPT".into()],
            (0, _) => vec!["-j".into(), "DROP".into()],
            (-5, _) => vec!["-j".into(), "RETURN".into()],
            (-3, Some(c)) => vec!["-j".into(), c.into()],
            (-4, Some(c)) => vec!["-g".into(), c.into()],
            // continue, break: what iptables-nft-save prints (nothing).
            (-1 | -2, _) => Vec::new(),
            _ => return None,
        };
        Some(())
    }

    /// A `cmp` of a loaded register.
    fn cmp(&mut self, reg: &Reg, op: u32, value: &[u8]) -> Option<()> {
        let eq_or_neq = op == EQ || op == NEQ;
        let inv = op == NEQ;
        let addr_len = match self.family {
            Family::Ipv4 => 4,
            Family::Ipv6 => 16,
        };
        match (&reg.source, &reg.mask) {
            (Source::Meta(META_L4PROTO), None) if eq_or_neq && value.len() == 1 => {
                // A second protocol compare: one `-p` cannot say both.
                if self.header.proto != 0 {
                    return None;
                }
                self.header.proto = u16::from(value[0]);
                self.invert(xt::INV_PROTO, inv);
            }
            (Source::Meta(key @ (META_IIFNAME | META_OIFNAME)), None)
                if eq_or_neq && !value.is_empty() && value.len() <= IFNAMSIZ =>
            {
                let (mut name, mut mask) = ([0u8; IFNAMSIZ], [0u8; IFNAMSIZ]);
                let mut inv = inv;
                if value == b"INVAL/D\0" && !inv {
                    // iptables-nft's "! -i +".
                    inv = true;
                    name[0] = b'+';
                    mask[..2].fill(0xff);
                } else if let Some(end) = value.iter().position(|b| *b == 0) {
                    if end + 1 != value.len() {
                        return None;
                    }
                    name[..end].copy_from_slice(&value[..end]);
                    mask[..=end].fill(0xff);
                } else {
                    // A prefix: the `+` wildcard (parse_ifname).
                    if value.len() + 1 >= IFNAMSIZ {
                        return None;
                    }
                    name[..value.len()].copy_from_slice(value);
                    name[value.len()] = b'+';
                    mask[..value.len()].fill(0xff);
                }
                let (slot, bit) = if *key == META_IIFNAME {
                    (&mut self.header.iniface, xt::INV_VIA_IN)
                } else {
                    (&mut self.header.outiface, xt::INV_VIA_OUT)
                };
                if slot.is_some() {
                    return None;
                }
                *slot = Some((name, mask));
                self.invert(bit, inv);
            }
            (Source::Meta(META_MARK), mask) if eq_or_neq && value.len() == 4 => {
                // The xt_mark_mtinfo1 iptables-nft-save builds, through the one decoder.
                let mask = match mask {
                    Some(m) => m.get(..4)?.try_into().ok()?,
                    None => [0xff; 4],
                };
                let mut info = Vec::with_capacity(12);
                info.extend_from_slice(value);
                info.extend_from_slice(&mask);
                info.extend([u8::from(inv), 0, 0, 0]);
                xt::push_match(&mut self.matches, self.family, "mark", 1, &info);
            }
            (&Source::Payload { base, offset, len }, mask) if base == NETWORK && eq_or_neq => {
                self.network(offset, len as usize, mask.as_deref(), value, inv, addr_len)?;
            }
            (&Source::Payload { base, offset, len }, mask) if base == TRANSPORT => {
                self.transport(offset, len, mask.as_deref(), op, value)?;
            }
            _ => return None,
        }
        Some(())
    }

    fn invert(&mut self, bit: u8, inv: bool) {
        if inv {
            self.header.invflags |= bit;
        }
    }

    /// A network header compare: addresses, `-p` (older iptables-nft), `-f`.
    fn network(
        &mut self,
        offset: u32,
        len: usize,
        mask: Option<&[u8]>,
        value: &[u8],
        inv: bool,
        addr_len: usize,
    ) -> Option<()> {
        let (src_at, dst_at, proto_at, frag_at) = match self.family {
            Family::Ipv4 => (12, 16, Some(9), Some(6)),
            Family::Ipv6 => (8, 24, Some(6), None),
        };
        if offset == src_at || offset == dst_at {
            if value.len() != len || len == 0 || len > addr_len {
                return None;
            }
            let mut addr = vec![0u8; addr_len];
            addr[..len].copy_from_slice(value);
            let mut m = vec![0u8; addr_len];
            match mask {
                Some(mask) if mask.len() == len => m[..len].copy_from_slice(mask),
                Some(_) => return None,
                None => m[..len].fill(0xff),
            }
            let (slot, bit) = if offset == src_at {
                (&mut self.header.src, xt::INV_SRCIP)
            } else {
                (&mut self.header.dst, xt::INV_DSTIP)
            };
            if slot.is_some() {
                return None;
            }
            *slot = Some((addr, m));
            self.invert(bit, inv);
        } else if Some(offset) == proto_at
            && len == 1
            && mask.is_none()
            && value.len() == 1
            && self.header.proto == 0
        {
            self.header.proto = u16::from(value[0]);
            self.invert(xt::INV_PROTO, inv);
        } else if Some(offset) == frag_at
            && len == 2
            && mask == Some(&[0x1f, 0xff][..])
            && value == [0, 0]
        {
            // Offset != 0 is a fragment: neq is `-f`, eq is `! -f`.
            self.header.frag = true;
            self.invert(xt::INV_FRAG, !inv);
        } else {
            return None;
        }
        Some(())
    }

    /// Which port field a transport offset is: (0 source / 1 destination, its invert bit).
    fn port_field(&self, offset: u32) -> Option<(usize, u8)> {
        match offset {
            0 => Some((0, 1)),
            2 => Some((1, 2)),
            _ => None,
        }
    }

    /// The rule's tcp/udp match, made at its first port compare; `None` unless `-p tcp` or
    /// `-p udp` (not inverted) came before.
    fn ports(&mut self) -> Option<&mut TcpUdp> {
        let name = match self.header.proto {
            6 => "tcp",
            17 => "udp",
            _ => return None,
        };
        if self.header.invflags & xt::INV_PROTO != 0 {
            return None;
        }
        let at = self.matches.len();
        let (_, _, m) = self
            .ports
            .get_or_insert_with(|| (at, name, TcpUdp::default()));
        Some(m)
    }

    /// A transport header compare: ports (one or both), tcp flags.
    fn transport(
        &mut self,
        offset: u32,
        len: u32,
        mask: Option<&[u8]>,
        op: u32,
        value: &[u8],
    ) -> Option<()> {
        if offset == 13 && len == 1 && value.len() == 1 && (op == EQ || op == NEQ) {
            if self.header.proto != 6 {
                return None;
            }
            let flg_mask = match mask {
                Some([m]) => *m,
                None => 0xff,
                Some(_) => return None,
            };
            // ECE and CWR have no name in `--tcp-flags`; one flags compare per rule.
            if (flg_mask | value[0]) & 0xc0 != 0
                || self.ports.as_ref().is_some_and(|(_, _, m)| m.flg_mask != 0)
            {
                return None;
            }
            let m = self.ports()?;
            m.flg_cmp = value[0];
            m.flg_mask = flg_mask;
            if op == NEQ {
                m.invflags |= 4;
            }
            return Some(());
        }
        if mask.is_some() || value.len() != len as usize {
            return None;
        }
        if offset == 0 && len == 4 {
            // Both ports in one compare; `!=` is not "both differ" (see the module doc).
            if op != EQ {
                return None;
            }
            let (sport, dport) = (be16(&value[..2])?, be16(&value[2..])?);
            let m = self.ports()?;
            m.spts = [sport, sport];
            m.dpts = [dport, dport];
            return Some(());
        }
        if len != 2 {
            return None;
        }
        let port = be16(value)?;
        let (field, inv_bit) = self.port_field(offset)?;
        let m = self.ports()?;
        let ports = if field == 0 { &mut m.spts } else { &mut m.dpts };
        // port_match_single_to_range of iptables-nft.
        match op {
            EQ | NEQ => {
                *ports = [port, port];
                if op == NEQ {
                    m.invflags |= inv_bit;
                }
            }
            LT => ports[1] = port.saturating_sub(1).max(1),
            LTE => ports[1] = port,
            GT => ports[0] = port.saturating_add(1),
            GTE => ports[0] = port,
            _ => return None,
        }
        Some(())
    }

    pub(super) fn finish(self, comment: Option<String>, out: &mut Vec<String>) {
        self.header.push(self.family, out);
        let mut matches = self.matches.into_iter();
        if let Some((at, name, m)) = self.ports {
            out.extend(matches.by_ref().take(at));
            out.extend(["-m".to_string(), name.to_string()]);
            m.push(out);
        }
        out.extend(matches);
        if let Some(c) = comment {
            out.extend(["-m".to_string(), "comment".into(), "--comment".into(), c]);
        }
        out.extend(self.target);
    }
}

fn be16(d: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes(d.get(..2)?.try_into().ok()?))
}
