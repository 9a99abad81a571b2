//! One rule's expressions into the model's statements, following what each 32-bit register
//! holds: loads (`payload`, `meta`, `ct`, `fib`, `numgen`, `immediate` data, a map's data)
//! put a field or data in registers; `bitwise` masks it (an address prefix, flags); `cmp`,
//! `range` and `lookup` turn what a register holds into a match, a verdict map or a map's
//! data; `nat`, `masq` and `redir` read addresses and ports from registers.
//!
//! The protocol dependencies nft adds (`meta l4proto tcp` before `tcp dport`, `meta nfproto
//! ipv4` before `ip daddr` in an inet table) are folded into the key they guard
//! (`Key::Dport(Some(6))`, `Key::Daddr { v4: true }`), as `nft list` prints them. Whatever is
//! not understood is `Stmt::Other`, and a register it may have written holds nothing known:
//! a later compare on it is `Stmt::Other` too, never a match on the field loaded before.

mod compare;

use std::collections::HashMap;

use super::SetInfo;
use super::types;
use crate::kernel::netlink;
use crate::kernel::nftables::wire::{self, META_IIF, META_IIFNAME, META_L4PROTO, META_MARK};
use crate::kernel::nftables::wire::{META_NFPROTO, META_OIF, META_OIFNAME, NETWORK, TRANSPORT};
use crate::kernel::nftables::wire::{NFTA_DATA_VALUE, NFTA_DATA_VERDICT, u32_attr, value_attr};
use crate::model::ruleset::{
    Key, Match, Nat, NatAddr, NatKind, NatPort, Op, Operand, SetRef, Stmt, TableFamily, Verdict,
};

/// 32-bit registers (`NFT_REG32_00` .. `_15`, the four 16-byte ones overlaid).
const UNITS: usize = 16;
/// `ct` keys.
const CT_STATE: u32 = 0;
const CT_STATUS: u32 = 2;
/// `fib`: flags and result.
const FIB_F_DADDR: u32 = 2;
const FIB_RESULT_ADDRTYPE: u32 = 3;
const NFPROTO_IPV4: u32 = 2;
const NFPROTO_IPV6: u32 = 10;

/// What a register holds.
#[derive(Clone, Debug)]
enum Content {
    /// A field of the packet or its metadata, `len` bytes of it.
    Field {
        key: Key,
        len: usize,
    },
    /// An address masked to a prefix of `bits`.
    Prefix {
        key: Key,
        bits: usize,
    },
    /// A field under a mask the model has no key for (`meta mark & 0x4000`): values of
    /// type `ty`.
    Masked {
        name: String,
        ty: u32,
        len: usize,
    },
    /// Flags masked (`ct state & (established|related)`).
    Flags {
        key: Key,
        mask: u32,
    },
    Data(Vec<u8>),
    /// Field `field` of the data a map gives for `key`.
    FromMap {
        key: Vec<Key>,
        map: SetRef,
        field: usize,
    },
}

/// A rule's statements from its `NFTA_RULE_EXPRESSIONS`, in a table of `family` whose sets
/// (anonymous ones included) are `sets`.
pub(super) fn decode(
    family: TableFamily,
    sets: &HashMap<String, SetInfo>,
    expressions: &[u8],
) -> Vec<Stmt> {
    let mut d = Decoder {
        family,
        sets,
        regs: Default::default(),
        stmts: Vec::new(),
        l4: None,
        nf: None,
        implied: Vec::new(),
    };
    for (name, data) in wire::expressions(expressions) {
        if d.expr(name, data).is_none() {
            d.regs = Default::default();
            d.stmts.push(Stmt::Other(name.to_string()));
        }
    }
    let implied = d.implied;
    d.stmts
        .into_iter()
        .enumerate()
        .filter(|(i, _)| !implied.contains(i))
        .map(|(_, s)| s)
        .collect()
}

struct Decoder<'a> {
    family: TableFamily,
    sets: &'a HashMap<String, SetInfo>,
    regs: [Option<Content>; UNITS],
    stmts: Vec<Stmt>,
    /// The protocol of a `meta l4proto == P` match, and where it is: a transport field
    /// loaded after it is that protocol's (and the match is implied by it).
    l4: Option<(u8, usize)>,
    /// The same for `meta nfproto == ipv4|ipv6` and network header fields.
    nf: Option<(bool, usize)>,
    /// Statements implied by a key read after them.
    implied: Vec<usize>,
}

/// The first 32-bit register of register number `reg` (1-4: the 16-byte ones; 8-23).
fn unit(reg: u32) -> Option<usize> {
    match reg {
        1..=4 => Some((reg as usize - 1) * 4),
        8..=23 => Some(reg as usize - 8),
        _ => None,
    }
}

fn units(len: usize) -> usize {
    len.div_ceil(4).max(1)
}

/// A verdict (`NFTA_DATA_VERDICT`'s content); `None` for one the model has no word for.
pub(super) fn verdict(data: &[u8]) -> Option<Verdict> {
    let (code, chain) = wire::verdict(data)?;
    let chain = || chain.map(str::to_string);
    Some(match code {
        1 => Verdict::Accept,
        0 => Verdict::Drop,
        -1 => Verdict::Continue,
        -3 => Verdict::Jump(chain()?),
        -4 => Verdict::Goto(chain()?),
        -5 => Verdict::Return,
        _ => return None,
    })
}

fn op(code: u32) -> Option<Op> {
    Some(match code {
        0 => Op::Eq,
        1 => Op::Ne,
        2 => Op::Lt,
        3 => Op::Le,
        4 => Op::Gt,
        5 => Op::Ge,
        _ => return None,
    })
}

fn is_addr(key: &Key) -> bool {
    matches!(key, Key::Saddr { .. } | Key::Daddr { .. })
}

impl Decoder<'_> {
    fn store(&mut self, reg: u32, len: usize, content: Content) -> Option<()> {
        let at = unit(reg)?;
        for u in at..(at + units(len)).min(UNITS) {
            self.regs[u] = None;
        }
        *self.regs.get_mut(at)? = Some(content);
        Some(())
    }

    fn load(&mut self, data: &[u8], key: Key, len: usize) -> Option<()> {
        self.store(u32_attr(data, 1)?, len, Content::Field { key, len })
    }

    fn read(&self, reg: u32) -> Option<&Content> {
        self.regs.get(unit(reg)?)?.as_ref()
    }

    /// The fields of a key of `lens` (each padded to 4 bytes) from register `reg` on; a
    /// field not loaded there is `Key::Other`.
    fn keys(&self, reg: u32, lens: &[usize]) -> Vec<Key> {
        let mut at = unit(reg);
        lens.iter()
            .map(|len| {
                let here = at.and_then(|u| self.regs.get(u)?.as_ref());
                at = at.map(|u| u + units(*len));
                match here {
                    Some(Content::Field { key, .. }) => key.clone(),
                    Some(Content::Masked { name, .. }) => Key::Other(name.clone()),
                    _ => Key::Other("an unknown register".into()),
                }
            })
            .collect()
    }

    fn push(&mut self, stmt: Stmt) {
        self.stmts.push(stmt);
    }

    /// One expression; `None` when not understood.
    fn expr(&mut self, name: &str, data: &[u8]) -> Option<()> {
        match name {
            "payload" => self.payload(data),
            "meta" => self.meta(data),
            "ct" => self.ct(data),
            "fib" => {
                let (result, flags) = (u32_attr(data, 2)?, u32_attr(data, 3)?);
                let key = if (result, flags) == (FIB_RESULT_ADDRTYPE, FIB_F_DADDR) {
                    Key::FibDaddrType
                } else {
                    Key::Other(format!("fib flags {flags:#x} result {result}"))
                };
                self.load(data, key, 16)
            }
            "numgen" => {
                let modulus = u32_attr(data, 2)?;
                let key = match u32_attr(data, 4).unwrap_or(0) {
                    0 => Key::Numgen { modulus },
                    offset => Key::Other(format!("numgen mod {modulus} offset {offset}")),
                };
                self.load(data, key, 4)
            }
            "immediate" => self.immediate(data),
            "bitwise" => self.bitwise(data),
            "cmp" => {
                let (sreg, code) = (u32_attr(data, 1)?, u32_attr(data, 2)?);
                let stmt = self.cmp(sreg, op(code)?, value_attr(data, 3)?);
                self.matched(stmt);
                Some(())
            }
            "range" => self.range(data),
            "lookup" => self.lookup(data),
            "nat" => self.nat(data),
            "masq" | "redir" => self.masq_or_redir(name, data),
            _ => self.statement(name, data),
        }
    }

    /// The expressions that are statements of their own, read by name.
    fn statement(&mut self, name: &str, data: &[u8]) -> Option<()> {
        match name {
            "reject" => self.push(Stmt::Reject),
            "counter" | "log" | "notrack" | "last" | "dup" => {
                self.push(Stmt::Effect(name.to_string()))
            }
            // A named counter; any other object (a quota, a limit) may decide.
            "objref" if u32_attr(data, 1) == Some(1) => self.push(Stmt::Effect("counter".into())),
            "match" | "target" => {
                let xt = netlink::attr(data, 1)
                    .and_then(netlink::str_of)
                    .unwrap_or("?");
                if (name, xt) == ("match", "comment") {
                    // iptables-nft's comment: matches every packet (the rule's comment).
                    return Some(());
                }
                self.regs = Default::default();
                self.push(Stmt::Other(format!("xt {name} {xt}")));
            }
            _ => return None,
        }
        Some(())
    }

    fn payload(&mut self, data: &[u8]) -> Option<()> {
        if netlink::attr(data, 5).is_some() {
            // `payload set`: the packet is rewritten.
            return None;
        }
        let (base, offset, len) = (u32_attr(data, 2)?, u32_attr(data, 3)?, u32_attr(data, 4)?);
        let key = self.payload_key(base, offset, len);
        self.load(data, key, len as usize)
    }

    fn meta(&mut self, data: &[u8]) -> Option<()> {
        let key = u32_attr(data, 2)?;
        if netlink::attr(data, 3).is_some() {
            self.push(Stmt::Effect(format!("meta {} set", meta_word(key))));
            return Some(());
        }
        let (key, len) = match key {
            META_L4PROTO => (Key::L4Proto, 1),
            META_NFPROTO => (Key::NfProto, 1),
            META_IIFNAME => (Key::Iifname, 16),
            META_OIFNAME => (Key::Oifname, 16),
            META_IIF => (Key::Iif, 4),
            META_OIF => (Key::Oif, 4),
            META_MARK => (Key::Mark, 4),
            other => (Key::Other(format!("meta {}", meta_word(other))), 16),
        };
        self.load(data, key, len)
    }

    fn ct(&mut self, data: &[u8]) -> Option<()> {
        let key = u32_attr(data, 2)?;
        if netlink::attr(data, 4).is_some() {
            self.push(Stmt::Effect(format!("ct key {key} set")));
            return Some(());
        }
        let (key, len) = match key {
            CT_STATE => (Key::CtState, 4),
            CT_STATUS => (Key::CtStatus, 4),
            other => (Key::Other(format!("ct key {other}")), 16),
        };
        self.load(data, key, len)
    }

    /// An `immediate`: a verdict statement, or data into a register.
    fn immediate(&mut self, data: &[u8]) -> Option<()> {
        let dreg = u32_attr(data, 1)?;
        let value = netlink::attr(data, 2)?;
        if let Some(v) = netlink::attr(value, NFTA_DATA_VERDICT) {
            self.push(match verdict(v) {
                Some(v) => Stmt::Verdict(v),
                None => Stmt::Other("a verdict".into()),
            });
        } else {
            let bytes = netlink::attr(value, NFTA_DATA_VALUE)?;
            self.store(dreg, bytes.len(), Content::Data(bytes.to_vec()))?;
        }
        Some(())
    }

    fn range(&mut self, data: &[u8]) -> Option<()> {
        let (sreg, code) = (u32_attr(data, 1)?, u32_attr(data, 2)?);
        let (from, to) = (value_attr(data, 3)?, value_attr(data, 4)?);
        let stmt = match (self.read(sreg), op(code)?) {
            (Some(Content::Field { key, .. }), op @ (Op::Eq | Op::Ne)) => {
                let ty = types::of_key(key);
                Stmt::Match(Match {
                    key: vec![key.clone()],
                    op,
                    right: Operand::Values(vec![types::interval(ty, from, to)]),
                })
            }
            _ => Stmt::Other("range".into()),
        };
        self.push(stmt);
        Some(())
    }

    fn nat(&mut self, data: &[u8]) -> Option<()> {
        let kind = match u32_attr(data, 1)? {
            0 => NatKind::Snat,
            1 => NatKind::Dnat,
            _ => return None,
        };
        let v4 = match u32_attr(data, 2)? {
            NFPROTO_IPV4 => true,
            NFPROTO_IPV6 => false,
            _ => return None,
        };
        let ty = if v4 { types::IPADDR } else { types::IP6ADDR };
        let addr = match u32_attr(data, 3) {
            None => None,
            Some(min) => Some(self.nat_addr(ty, min, u32_attr(data, 4))?),
        };
        let port = self.nat_port(u32_attr(data, 5), u32_attr(data, 6))?;
        let v4 = matches!(self.family, TableFamily::Inet).then_some(v4);
        self.push(Stmt::Nat(Nat {
            kind,
            v4,
            addr,
            port,
        }));
        Some(())
    }

    fn masq_or_redir(&mut self, name: &str, data: &[u8]) -> Option<()> {
        let (kind, min, max) = match name {
            "masq" => (NatKind::Masquerade, 2, 3),
            _ => (NatKind::Redirect, 1, 2),
        };
        let port = self.nat_port(u32_attr(data, min), u32_attr(data, max))?;
        self.push(Stmt::Nat(Nat {
            kind,
            v4: None,
            addr: None,
            port,
        }));
        Some(())
    }

    fn payload_key(&mut self, base: u32, offset: u32, len: u32) -> Key {
        let other = || Key::Other(format!("payload base {base} offset {offset} length {len}"));
        match base {
            NETWORK => {
                let v4 = match self.family {
                    TableFamily::Ip => true,
                    TableFamily::Ip6 => false,
                    _ => match self.nf {
                        Some((v4, at)) => {
                            self.implied.push(at);
                            v4
                        }
                        None => return other(),
                    },
                };
                match (v4, offset, len) {
                    (true, 12, 1..=4) | (false, 8, 1..=16) => Key::Saddr { v4 },
                    (true, 16, 1..=4) | (false, 24, 1..=16) => Key::Daddr { v4 },
                    (true, 9, 1) | (false, 6, 1) => Key::L4Proto,
                    _ => other(),
                }
            }
            TRANSPORT if len == 2 && (offset == 0 || offset == 2) => {
                let proto = self.l4.map(|(p, at)| {
                    self.implied.push(at);
                    p
                });
                if offset == 0 {
                    Key::Sport(proto)
                } else {
                    Key::Dport(proto)
                }
            }
            _ => other(),
        }
    }

    fn lookup(&mut self, data: &[u8]) -> Option<()> {
        let name = netlink::attr(data, 1).and_then(netlink::str_of)?;
        let sreg = u32_attr(data, 2)?;
        let inverted = u32_attr(data, 5).unwrap_or(0) & 1 == 1;
        let Some(set) = self.sets.get(name) else {
            self.push(Stmt::Other(format!("lookup @{name}")));
            return Some(());
        };
        let key = match set.opaque {
            true => vec![Key::Other(format!("the key of @{name}"))],
            false => self.keys(sreg, &set.key_lens),
        };
        let map = || match set.anonymous {
            true => SetRef::Inline(set.set.elements.clone()),
            false => SetRef::Named(name.to_string()),
        };
        match u32_attr(data, 3) {
            None => {
                let right = match set.anonymous {
                    true => {
                        Operand::Values(set.set.elements.iter().map(|e| e.key.clone()).collect())
                    }
                    false => Operand::Set(name.to_string()),
                };
                let op = if inverted { Op::Ne } else { Op::Eq };
                self.matched(Stmt::Match(Match { key, op, right }));
            }
            Some(0) => {
                let map = map();
                self.push(Stmt::Vmap { key, map });
            }
            Some(dreg) => {
                let (map, lens) = (map(), set.data_lens.clone());
                let mut at = unit(dreg)?;
                for (field, len) in lens.iter().enumerate() {
                    let content = Content::FromMap {
                        key: key.clone(),
                        map: map.clone(),
                        field,
                    };
                    self.store((at + 8) as u32, *len, content)?;
                    at += units(*len);
                }
            }
        }
        Some(())
    }

    fn nat_addr(&self, ty: u32, min: u32, max: Option<u32>) -> Option<NatAddr> {
        match (self.read(min)?, max.and_then(|m| self.read(m))) {
            (Content::Data(a), Some(Content::Data(b))) if a != b => {
                Some(NatAddr::Fixed(types::interval(ty, a, b)))
            }
            (Content::Data(a), _) => Some(NatAddr::Fixed(types::decode(ty, a))),
            (Content::FromMap { key, map, field: 0 }, _) => Some(NatAddr::Map {
                key: key.clone(),
                map: map.clone(),
            }),
            _ => None,
        }
    }

    /// The port of a nat statement: `Some(None)` without one, `None` when unreadable.
    fn nat_port(&self, min: Option<u32>, max: Option<u32>) -> Option<Option<NatPort>> {
        let Some(min) = min else {
            return Some(None);
        };
        let port = |c: &Content| match c {
            Content::Data(d) => Some(u16::from_be_bytes(d.get(..2)?.try_into().ok()?)),
            _ => None,
        };
        Some(Some(match self.read(min)? {
            Content::FromMap { .. } => NatPort::FromMap,
            low => {
                let lo = port(low)?;
                match max.and_then(|m| self.read(m)).and_then(port) {
                    Some(hi) if hi != lo => NatPort::Range(lo, hi),
                    _ => NatPort::Fixed(lo),
                }
            }
        }))
    }
}

fn meta_word(key: u32) -> String {
    match key {
        0 => "length".into(),
        1 => "protocol".into(),
        2 => "priority".into(),
        META_MARK => "mark".into(),
        10 => "skuid".into(),
        11 => "skgid".into(),
        19 => "pkttype".into(),
        other => format!("key {other}"),
    }
}
