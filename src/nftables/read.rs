//! Reading iptables-nft rules of any owner as the tokens `iptables-nft-save` prints after
//! `-A CHAIN`, one chain at a time, without a process.
//!
//! A table is read chain by chain: [`Session::chains`] (one small `NFT_MSG_GETCHAIN` dump:
//! names, and hook and policy of base chains) and [`Session::each_rule`] (an
//! `NFT_MSG_GETRULE` dump of one chain, each rule decoded and handed to the caller while the
//! dump streams, so a 10,000-rule chain is never held). A whole-table dump would cost far
//! more: the kernel restarts a dump for every 32 KiB it sends, and each restart walks the
//! table from its first rule.
//!
//! # The encodings decoded (those iptables-nft 1.8.9 writes)
//! - `meta l4proto` + `cmp` eq/neq: `-p` (`! -p`).
//! - `payload` network header saddr/daddr, `bitwise` mask or a shortened load for
//!   byte-aligned prefixes, `cmp` eq/neq: `-s`/`-d`; frag_off & 0x1fff: `-f`.
//! - `meta iifname/oifname` + `cmp`: `-i`/`-o`; a compare without the trailing NUL is the
//!   `+` wildcard (`INVAL/D` is iptables-nft's `! -i +`).
//! - transport header ports, native for `-m tcp`/`-m udp` without options: a 2-byte load
//!   with `cmp` eq/neq/lte/gt/gte or `range` eq/neq, or one 4-byte load of both ports;
//!   tcp flags as a 1-byte load, `bitwise`, `cmp`. They become the `tcp`/`udp` match
//!   iptables-nft-save prints.
//! - `meta mark` (+ `bitwise`) + `cmp`: `-m mark --mark`.
//! - compat `match` / `target` expressions: the xtables info structs, decoded by
//!   [`crate::xt`] exactly as for iptables-legacy.
//! - `immediate` verdicts: ACCEPT, DROP, RETURN, `-j CHAIN`, `-g CHAIN`; `counter` is skipped.
//! - the comment in the rule's user data: `-m comment --comment`, after the other matches
//!   (where iptables-nft-save puts it).
//!
//! Anything else is `-m nft:NAME --natledger-opaque` (NAME the expression), never a
//! narrower rule than the kernel's. One encoding iptables-nft 1.8.9 writes is read wider
//! than iptables-nft-save prints it, on purpose: `! --sport A ! --dport B` with single ports
//! is written as one 4-byte compare `!= (A, B)`, which the kernel matches when *either* port
//! differs; iptables-nft-save prints it as both differing (narrower), natledger as opaque.

use std::io;

use super::{NFT_MSG_NEWRULE, NFTA_RULE_USERDATA, af, dump_request, genmsg, subsys};
use super::{NFTA_EXPR_DATA, NFTA_EXPR_NAME, NFTA_LIST_ELEM, NftError, Session, comment_udata};
use super::{NFTA_RULE_CHAIN, NFTA_RULE_EXPRESSIONS, NFTA_RULE_HANDLE, NFTA_RULE_TABLE};
use crate::family::Family;
use crate::netlink::{self, NLM_F_DUMP, NLM_F_REQUEST};
use crate::xt::{self, Header, IFNAMSIZ, TcpUdp};

const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_GETCHAIN: u16 = 4;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_POLICY: u16 = 5;
const NFTA_HOOK_HOOKNUM: u16 = 1;

const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;

/// `meta` keys.
const META_MARK: u32 = 3;
const META_IIFNAME: u32 = 6;
const META_OIFNAME: u32 = 7;
const META_L4PROTO: u32 = 16;
/// Payload bases.
const NETWORK: u32 = 1;
const TRANSPORT: u32 = 2;
/// `cmp` operators (`range` uses the first two).
const EQ: u32 = 0;
const NEQ: u32 = 1;
const LT: u32 = 2;
const LTE: u32 = 3;
const GT: u32 = 4;
const GTE: u32 = 5;

/// The built-in chains by hook number, the order iptables-nft-save lists base chains in.
const HOOKS: [&str; 5] = ["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"];

/// One chain of a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftChain {
    pub name: String,
    /// The hook number of a base chain (`NF_INET_*`).
    pub hook: Option<u32>,
    /// A base chain's policy (`ACCEPT`, `DROP`).
    pub policy: Option<String>,
}

impl NftChain {
    /// `iptables-nft-save`'s policy column: the policy, or `-` for a user chain.
    pub fn policy_text(&self) -> &str {
        self.policy.as_deref().unwrap_or("-")
    }
}

impl Session<'_> {
    /// The chains of `table` as iptables-nft-save lists them: base chains by hook, then the
    /// others by name. Empty when the table does not exist.
    pub fn chains(&mut self, family: Family, table: &str) -> Result<Vec<NftChain>, NftError> {
        let err = |source| NftError::Read {
            family,
            what: format!("the chains of {table}"),
            source,
        };
        let seq = self.sock.next_seq();
        let mut request = Vec::with_capacity(48);
        let start = netlink::begin(
            &mut request,
            subsys(NFT_MSG_GETCHAIN),
            NLM_F_REQUEST | NLM_F_DUMP,
            seq,
        );
        genmsg(&mut request, af(family), 0);
        netlink::put_str(&mut request, NFTA_CHAIN_TABLE, table);
        netlink::finish(&mut request, start);
        let mut chains = Vec::new();
        let answer = self.sock.dump(seq, &request, |message| {
            if message.kind != subsys(NFT_MSG_NEWCHAIN) {
                return Ok(());
            }
            let body = message.payload.get(4..).unwrap_or_default();
            let name_of = |kind| netlink::attr(body, kind).and_then(netlink::str_of);
            // Dumps of every table of the family: keep this table's.
            if name_of(NFTA_CHAIN_TABLE) != Some(table) {
                return Ok(());
            }
            let name =
                name_of(NFTA_CHAIN_NAME).ok_or_else(|| io::Error::other("chain without a name"))?;
            let hook = netlink::attr(body, NFTA_CHAIN_HOOK)
                .and_then(|h| netlink::attr(h, NFTA_HOOK_HOOKNUM))
                .and_then(be32);
            let policy = netlink::attr(body, NFTA_CHAIN_POLICY)
                .and_then(be32)
                .map(|p| match p {
                    0 => "DROP".to_string(),
                    1 => "ACCEPT".to_string(),
                    other => other.to_string(),
                });
            chains.push(NftChain {
                name: name.to_string(),
                hook,
                policy: policy.filter(|_| hook.is_some()),
            });
            Ok(())
        });
        match answer {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(Vec::new()),
            Err(e) => return Err(err(e)),
        }
        chains.sort_by(|a, b| {
            let key = |c: &NftChain| {
                let builtin = c.hook.map(|_| HOOKS.iter().position(|h| *h == c.name));
                (c.hook.is_none(), builtin, c.hook)
            };
            key(a).cmp(&key(b)).then_with(|| a.name.cmp(&b.name))
        });
        Ok(chains)
    }

    /// Decode every rule of `chain` in `table`, in order, handing each to `each` with its
    /// handle while the dump streams. Returns how many there were, or `None` when the table
    /// or chain does not exist.
    pub fn each_rule(
        &mut self,
        family: Family,
        table: &str,
        chain: &str,
        mut each: impl FnMut(u64, &[String]),
    ) -> Result<Option<usize>, NftError> {
        let err = |source| NftError::Read {
            family,
            what: format!("chain {chain} of {table}"),
            source,
        };
        let seq = self.sock.next_seq();
        let mut count = 0;
        let mut args = Vec::with_capacity(32);
        let answer = self
            .sock
            .dump(seq, &dump_request(seq, family, table, chain), |message| {
                if message.kind != subsys(NFT_MSG_NEWRULE) {
                    return Ok(());
                }
                args.clear();
                let (in_table, on, handle) = decode_rule(family, message.payload, &mut args)
                    .ok_or_else(|| io::Error::other("malformed rule message"))?;
                if in_table == table && on == chain {
                    count += 1;
                    each(handle, &args);
                }
                Ok(())
            });
        match answer {
            Ok(()) => Ok(Some(count)),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(err(e)),
        }
    }
}

fn be32(d: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(d.get(..4)?.try_into().ok()?))
}

/// A NEWRULE message (after `nlmsghdr`): appends its tokens to `out` and returns its table,
/// chain and handle.
pub fn decode_rule<'p>(
    family: Family,
    payload: &'p [u8],
    out: &mut Vec<String>,
) -> Option<(&'p str, &'p str, u64)> {
    let body = payload.get(4..)?;
    let table = netlink::attr(body, NFTA_RULE_TABLE).and_then(netlink::str_of)?;
    let chain = netlink::attr(body, NFTA_RULE_CHAIN).and_then(netlink::str_of)?;
    let handle = u64::from_be_bytes(netlink::attr(body, NFTA_RULE_HANDLE)?.try_into().ok()?);
    let mut d = Decoder::new(family);
    if let Some(exprs) = netlink::attr(body, NFTA_RULE_EXPRESSIONS) {
        for (kind, expr) in netlink::attrs(exprs) {
            if kind != NFTA_LIST_ELEM {
                continue;
            }
            let name = netlink::attr(expr, NFTA_EXPR_NAME)
                .and_then(netlink::str_of)
                .unwrap_or("?");
            let data = netlink::attr(expr, NFTA_EXPR_DATA).unwrap_or_default();
            if d.expr(name, data).is_none() {
                d.opaque(name);
            }
        }
    }
    let comment = netlink::attr(body, NFTA_RULE_USERDATA).and_then(comment_udata);
    d.finish(comment, out);
    Some((table, chain, handle))
}

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

struct Decoder {
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

/// The first attribute of `kind` as a big-endian u32.
fn u32_attr(data: &[u8], kind: u16) -> Option<u32> {
    netlink::attr(data, kind).and_then(be32)
}

/// The value of an `NFTA_DATA_VALUE` nested in attribute `kind`.
fn value_attr(data: &[u8], kind: u16) -> Option<&[u8]> {
    netlink::attr(netlink::attr(data, kind)?, NFTA_DATA_VALUE)
}

impl Decoder {
    fn new(family: Family) -> Decoder {
        Decoder {
            family,
            header: Header::default(),
            regs: Vec::with_capacity(4),
            matches: Vec::with_capacity(16),
            ports: None,
            target: Vec::new(),
        }
    }

    fn opaque(&mut self, name: &str) {
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
    fn expr(&mut self, name: &str, data: &[u8]) -> Option<()> {
        match name {
            "counter" => {}
            "meta" => {
                // A `meta set` is a statement natledger does not model.
                if netlink::attr(data, 3).is_some() {
                    return None;
                }
                let dreg = u32_attr(data, 1)?;
                self.set_reg(dreg, Source::Meta(u32_attr(data, 2)?), None);
            }
            "payload" => {
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
            }
            "bitwise" => {
                let (sreg, dreg) = (u32_attr(data, 1)?, u32_attr(data, 2)?);
                let op = u32_attr(data, 6).unwrap_or(0);
                let mask = value_attr(data, 4);
                let xor = value_attr(data, 5);
                let loaded = self.reg(sreg).cloned();
                let plain = op == 0
                    && xor.is_some_and(|x| x.iter().all(|b| *b == 0))
                    && loaded.as_ref().is_some_and(|r| r.mask.is_none());
                match (loaded, mask) {
                    (Some(r), Some(mask)) if plain => {
                        self.set_reg(dreg, r.source, Some(mask.to_vec()))
                    }
                    _ => self.set_reg(dreg, Source::Other, None),
                }
            }
            "cmp" => {
                let (sreg, op) = (u32_attr(data, 1)?, u32_attr(data, 2)?);
                let value = value_attr(data, 3)?;
                let reg = self.reg(sreg)?.clone();
                self.cmp(&reg, op, value)?;
            }
            "range" => {
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
            }
            "immediate" => {
                let dreg = u32_attr(data, 1)?;
                let Some(verdict) =
                    netlink::attr(data, 2).and_then(|d| netlink::attr(d, NFTA_DATA_VERDICT))
                else {
                    self.set_reg(dreg, Source::Other, None);
                    return Some(());
                };
                let code = be32(netlink::attr(verdict, NFTA_VERDICT_CODE)?)? as i32;
                let chain = netlink::attr(verdict, NFTA_VERDICT_CHAIN).and_then(netlink::str_of);
                self.target = match (code, chain) {
                    (1, _) => vec!["-j".into(), "ACCEPT".into()],
                    (0, _) => vec!["-j".into(), "DROP".into()],
                    (-5, _) => vec!["-j".into(), "RETURN".into()],
                    (-3, Some(c)) => vec!["-j".into(), c.into()],
                    (-4, Some(c)) => vec!["-g".into(), c.into()],
                    // continue, break: what iptables-nft-save prints (nothing).
                    (-1 | -2, _) => Vec::new(),
                    _ => return None,
                };
            }
            "match" => {
                let name = netlink::attr(data, 1).and_then(netlink::str_of)?;
                let revision = u8::try_from(u32_attr(data, 2)?).ok()?;
                let info = netlink::attr(data, 3).unwrap_or_default();
                xt::push_match(&mut self.matches, self.family, name, revision, info);
            }
            "target" => {
                let name = netlink::attr(data, 1).and_then(netlink::str_of)?;
                let revision = u8::try_from(u32_attr(data, 2)?).ok()?;
                let info = netlink::attr(data, 3).unwrap_or_default();
                self.target.clear();
                xt::push_target(&mut self.target, self.family, name, revision, info);
            }
            // Native statements iptables-nft reads back as targets: their name only (target
            // options never decide what matches).
            "log" => self.target = vec!["-j".into(), "NFLOG".into()],
            "nat" => {
                let kind = match u32_attr(data, 1)? {
                    0 => "SNAT",
                    1 => "DNAT",
                    _ => return None,
                };
                self.target = vec!["-j".into(), kind.into()];
            }
            "masq" => self.target = vec!["-j".into(), "MASQUERADE".into()],
            "redir" => self.target = vec!["-j".into(), "REDIRECT".into()],
            "reject" => self.target = vec!["-j".into(), "REJECT".into()],
            "queue" => self.target = vec!["-j".into(), "NFQUEUE".into()],
            _ => return None,
        }
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
        } else if Some(offset) == proto_at && len == 1 && mask.is_none() && value.len() == 1 {
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

    fn finish(self, comment: Option<String>, out: &mut Vec<String>) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn nested(kind: u16, inner: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        netlink::put_attr(&mut b, kind, inner);
        b
    }

    fn u32s(pairs: &[(u16, u32)]) -> Vec<u8> {
        let mut b = Vec::new();
        for (k, v) in pairs {
            netlink::put_attr(&mut b, *k, &v.to_be_bytes());
        }
        b
    }

    fn value(kind: u16, bytes: &[u8]) -> Vec<u8> {
        nested(kind, &nested(NFTA_DATA_VALUE, bytes))
    }

    fn expr(name: &str, data: Vec<u8>) -> Vec<u8> {
        let mut e = Vec::new();
        netlink::put_str(&mut e, NFTA_EXPR_NAME, name);
        netlink::put_attr(&mut e, NFTA_EXPR_DATA, &data);
        e
    }

    fn meta(key: u32) -> Vec<u8> {
        expr("meta", u32s(&[(1, 1), (2, key)]))
    }

    fn payload(base: u32, offset: u32, len: u32) -> Vec<u8> {
        expr("payload", u32s(&[(1, 1), (2, base), (3, offset), (4, len)]))
    }

    fn cmp(op: u32, bytes: &[u8]) -> Vec<u8> {
        let mut d = u32s(&[(1, 1), (2, op)]);
        d.extend(value(3, bytes));
        expr("cmp", d)
    }

    fn bitwise(mask: &[u8]) -> Vec<u8> {
        let mut d = u32s(&[(1, 1), (2, 1), (3, mask.len() as u32)]);
        d.extend(value(4, mask));
        d.extend(value(5, &vec![0; mask.len()]));
        expr("bitwise", d)
    }

    fn range(op: u32, from: u16, to: u16) -> Vec<u8> {
        let mut d = u32s(&[(1, 1), (2, op)]);
        d.extend(value(3, &from.to_be_bytes()));
        d.extend(value(4, &to.to_be_bytes()));
        expr("range", d)
    }

    fn verdict(code: i32, chain: Option<&str>) -> Vec<u8> {
        let mut v = Vec::new();
        netlink::put_attr(&mut v, NFTA_VERDICT_CODE, &code.to_be_bytes());
        if let Some(c) = chain {
            netlink::put_str(&mut v, NFTA_VERDICT_CHAIN, c);
        }
        let mut d = u32s(&[(1, 0)]);
        d.extend(nested(2, &nested(NFTA_DATA_VERDICT, &v)));
        expr("immediate", d)
    }

    fn decode(exprs: &[Vec<u8>], comment: Option<&str>) -> String {
        let mut p = Vec::new();
        genmsg(&mut p, libc::AF_INET as u8, 0);
        netlink::put_str(&mut p, NFTA_RULE_TABLE, "nat");
        netlink::put_str(&mut p, NFTA_RULE_CHAIN, "C");
        netlink::put_attr(&mut p, NFTA_RULE_HANDLE, &7u64.to_be_bytes());
        let mut list = Vec::new();
        for e in exprs {
            netlink::put_attr(&mut list, NFTA_LIST_ELEM, e);
        }
        netlink::put_attr(&mut p, NFTA_RULE_EXPRESSIONS, &list);
        if let Some(c) = comment {
            let mut u = vec![0u8, c.len() as u8 + 1];
            u.extend(c.as_bytes());
            u.push(0);
            netlink::put_attr(&mut p, NFTA_RULE_USERDATA, &u);
        }
        let mut out = Vec::new();
        let (table, chain, handle) = decode_rule(Family::Ipv4, &p, &mut out).unwrap();
        assert_eq!((table, chain, handle), ("nat", "C", 7));
        out.join(" ")
    }

    const TCP: u32 = 6;

    #[test]
    fn header_fields_ports_comment_and_goto() {
        let rule = [
            meta(META_IIFNAME),
            cmp(EQ, b"eth"),
            meta(META_L4PROTO),
            cmp(EQ, &[TCP as u8]),
            payload(NETWORK, 12, 4),
            bitwise(&[255, 240, 0, 0]),
            cmp(EQ, &[10, 16, 0, 0]),
            payload(NETWORK, 16, 1),
            cmp(NEQ, &[127]),
            payload(TRANSPORT, 0, 4),
            cmp(EQ, &[0, 1, 0, 2]),
            expr("counter", Vec::new()),
            verdict(-4, Some("X")),
        ];
        assert_eq!(
            decode(&rule, Some("say hi")),
            "-s 10.16.0.0/12 ! -d 127.0.0.0/8 -i eth+ -p tcp -m tcp --sport 1 --dport 2 \
             -m comment --comment say hi -g X"
        );
    }

    #[test]
    fn port_compares_add_up_to_one_match() {
        let rule = [
            meta(META_OIFNAME),
            cmp(NEQ, b"docker0\0"),
            meta(META_L4PROTO),
            cmp(EQ, &[17]),
            payload(TRANSPORT, 0, 2),
            range(NEQ, 1000, 2000),
            payload(TRANSPORT, 2, 2),
            cmp(GT, &1000u16.to_be_bytes()),
            verdict(1, None),
        ];
        assert_eq!(
            decode(&rule, None),
            "! -o docker0 -p udp -m udp ! --sport 1000:2000 --dport 1001:65535 -j ACCEPT"
        );
        let flags = [
            meta(META_L4PROTO),
            cmp(EQ, &[TCP as u8]),
            payload(TRANSPORT, 13, 1),
            bitwise(&[0x17]),
            cmp(EQ, &[0x02]),
            payload(TRANSPORT, 2, 2),
            cmp(LTE, &1023u16.to_be_bytes()),
        ];
        assert_eq!(
            decode(&flags, None),
            "-p tcp -m tcp --dport 0:1023 --tcp-flags FIN,SYN,RST,ACK SYN"
        );
    }

    #[test]
    fn what_is_not_understood_is_opaque_never_narrower() {
        // `! --sport 1 ! --dport 2` as iptables-nft writes it: either port may differ.
        let both = [
            meta(META_L4PROTO),
            cmp(EQ, &[TCP as u8]),
            payload(TRANSPORT, 0, 4),
            cmp(NEQ, &[0, 1, 0, 2]),
            verdict(-5, None),
        ];
        assert_eq!(
            decode(&both, None),
            "-p tcp -m nft:cmp --natledger-opaque -j RETURN"
        );
        // Ports without `-p tcp|udp`, an inverted protocol, an unknown expression.
        let loose = [
            payload(TRANSPORT, 2, 2),
            cmp(EQ, &80u16.to_be_bytes()),
            expr("lookup", u32s(&[(1, 1)])),
            meta(META_L4PROTO),
            cmp(NEQ, &[TCP as u8]),
            payload(TRANSPORT, 2, 2),
            cmp(EQ, &80u16.to_be_bytes()),
        ];
        assert_eq!(
            decode(&loose, None),
            "! -p tcp -m nft:cmp --natledger-opaque -m nft:lookup --natledger-opaque \
             -m nft:cmp --natledger-opaque"
        );
        // A mark with a mask goes through the xt_mark decoder.
        let mark = [
            meta(META_MARK),
            bitwise(&0x4000u32.to_ne_bytes()),
            cmp(NEQ, &0x4000u32.to_ne_bytes()),
        ];
        assert_eq!(decode(&mark, None), "-m mark ! --mark 0x4000/0x4000");
    }
}
