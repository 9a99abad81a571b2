//! natledger's typed [`Rule`] as nf_tables expressions, encoded exactly as `nft` 1.0.6
//! encodes the equivalent nft syntax (so `nft list ruleset` prints it readably and `nft -j`
//! parses it), and the strict inverse.
//!
//! # The shapes, in natledger's canonical order (nft keeps the order written)
//! | field | nft syntax | expressions |
//! |---|---|---|
//! | `source`, `destination` | `ip saddr 10.1.0.0/24`, `ip6 daddr fd00::1` | `payload` network header (IPv4 +12/+16, IPv6 +8/+24) then `cmp eq`: a host address loads the whole address; a byte-aligned prefix loads only its bytes (`/8`: 1 byte); any other prefix, `/0` included, loads the whole address, then `bitwise` `& MASK ^ 0`, then `cmp eq` the network |
//! | `not_in_interface` | `iifname != "lo"` | `meta iifname`, `cmp neq` the name NUL-padded to 16 bytes |
//! | `protocol`, `dports` | `meta l4proto tcp tcp dport 80`, `… dport 80-82` | `meta l4proto`, `cmp eq` 1 byte; `payload` transport header +2, 2 bytes; `cmp eq`, or `cmp gte` + `cmp lte` for a range |
//! | `dst_local` | `fib daddr type local` | `fib` flags daddr, result type; `cmp eq` RTN_LOCAL (host order) |
//! | `not_dnatted` | `ct status & dnat == 0` (printed `ct status ! dnat`) | `ct status`, `bitwise & 0x20 ^ 0` (with an explicit op), `cmp eq 0` |
//! | `untracked` | `ct state invalid,untracked` | `ct state`, `bitwise & 0x41 ^ 0` (no op attribute), `cmp neq 0` |
//! | `dnatted` (a `Masquerade` only) | `ct status dnat ct original protocol tcp [ct original ip daddr H] ct reply ip saddr A ct original proto-dst 8080 ct reply proto-src 80` | `ct status`, `bitwise & 0x20 ^ 0` (no op), `cmp neq 0`; then per key `ct` with its direction (protocol, dst_ip/dst_ip6 original; src_ip/src_ip6 reply; proto_dst original; proto_src reply) and `cmp eq` (1 byte, the address, 2 bytes), or `cmp gte` + `cmp lte` for a port range |
//! | `Jump`, `Accept`, `Drop` | `jump X`, `accept`, `drop` | `immediate` reg 0 verdict |
//! | `Masquerade` | `masquerade` | `masq`, no attributes |
//! | `Dnat` | `dnat to 10.1.0.2:80` | `immediate` reg 1 address, `immediate` reg 2 port (2 bytes), `nat dnat` family, addr_min 1, proto_min 2, flags 0x2 (PROTO_SPECIFIED) |
//! | `Dnat`, same host and container range | `dnat to 10.1.0.2` | `immediate` reg 1 address, `nat dnat` family, addr_min 1: no port, so nf_nat keeps it |
//!
//! A range forwarded to *other* ports (`8000-8010` to `80-90`) has no encoding: nft_nat takes
//! no base port (net/netfilter/nft_nat.c: its attributes are type, family, address and port
//! registers and flags; `nf_nat_range2.base_proto` stays zeroed, so even the
//! `NF_NAT_RANGE_PROTO_OFFSET` flag it accepts offsets from port 0, not from the first host
//! port). natledger's forward accept (`dnatted` with ACCEPT) is not written by the nftables
//! backend; its hairpin masquerade's conntrack match is.
//!
//! # Decoding
//! [`decode`] reads what natledger sent and what the kernel dumps back, which differ only
//! where the kernel fills in defaults: `nat` gets `addr_max = addr_min`, `proto_max =
//! proto_min` and the flags `MAP_IPS` (0x1) and `PROTO_SPECIFIED` it implies; `bitwise` may
//! carry its op (0, a mask-and-xor) either way. Both are normalised, then the rule read is
//! encoded again and must give the same expressions: anything [`encode`] would not write is
//! `None`.

use std::net::IpAddr;

use super::super::wire::{EQ, GTE, LTE, META_IIFNAME, META_L4PROTO, NEQ, NETWORK, TRANSPORT};
use super::super::wire::{NFT_GOTO, NFT_JUMP, NFTA_RULE_EXPRESSIONS};
use crate::kernel::netlink;
use crate::model::family::Family;
use crate::model::portspec::{PortRange, Protocol};
use crate::model::rule::{DnatTo, IpNet, Rule, Target, is_interface_name, is_user_chain_name};

/// Registers as nft numbers them (the 16-byte ones; 0 is the verdict).
const REG_VERDICT: u32 = 0;
const REG_1: u32 = 1;
const REG_2: u32 = 2;
/// `meta`/`ct` keys, `fib` flags and results, verdicts, `nat` types and flags.
const CT_STATE: u32 = 0;
const CT_STATUS: u32 = 2;
/// `ct state` bits: invalid (no conntrack entry) and untracked (`NF_CT_STATE_UNTRACKED_BIT`).
const CT_STATE_INVALID_OR_UNTRACKED: u32 = 0x01 | 0x40;
const FIB_F_DADDR: u32 = 2;
const FIB_RESULT_ADDRTYPE: u32 = 3;
const RTN_LOCAL: u32 = 2;
/// `IPS_DST_NAT`: conntrack's "a DNAT rewrote this flow".
const IPS_DST_NAT: u32 = 0x20;
const NF_ACCEPT: i32 = 1;
const NF_DROP: i32 = 0;
const NAT_DNAT: u32 = 1;
const NAT_MAP_IPS: u32 = 0x1;
const NAT_PROTO_SPECIFIED: u32 = 0x2;
/// Interface names are compared as `IFNAMSIZ` bytes.
const IFNAMSIZ: usize = 16;

/// Why a rule cannot be written as nf_tables expressions.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    #[error(
        "the forwarded-connection accept (conntrack DNAT match) is not written by the nftables \
         backend, which has no filter rules; only a masquerade has the match there"
    )]
    Dnatted,
    #[error("{what} {addr} is not an {family} address, but the rule is for the {family} table")]
    WrongFamily {
        what: &'static str,
        addr: IpAddr,
        family: Family,
    },
    #[error(
        "{what} {net} has bits set past its prefix length; nft would match its network \
         instead: write the network address"
    )]
    HostBits { what: &'static str, net: IpNet },
    #[error(
        "interface name {0:?} cannot be compared exactly (1 to 15 bytes, no '*', '+', '/' or ':')"
    )]
    Interface(String),
    #[error("{what} {ports} without a protocol: nft needs tcp, udp or sctp to name a port")]
    PortsWithoutProtocol {
        what: &'static str,
        ports: PortRange,
    },
    #[error("chain name {0:?} is not one natledger jumps to")]
    ChainName(String),
    #[error(
        "host ports {} cannot be forwarded to container ports {container} with nftables: \
         nf_tables' nat expression has no port offset, so a port range forwards only to the \
         same ports; map single ports or equal host and container ranges, or use an iptables \
         backend (legacy or nft)",
        host.map_or("(none)".to_string(), |h| h.to_string())
    )]
    PortShift {
        host: Option<PortRange>,
        container: PortRange,
    },
    #[error(
        "a DNAT to the port range {0} without a base port would spread connections over the \
         range; natledger maps ranges port by port"
    )]
    RangeWithoutBase(PortRange),
}

/// Append one NFTA_RULE_EXPRESSIONS attribute (nested, NFTA_LIST_ELEM per expression) for
/// `rule`. The comment is not an expression (see [`comment_udata`]).
pub fn encode(buf: &mut Vec<u8>, family: Family, rule: &Rule) -> Result<(), EncodeError> {
    let exprs = exprs(family, rule)?;
    let list = netlink::begin_nest(buf, NFTA_RULE_EXPRESSIONS);
    for expr in &exprs {
        put(buf, expr);
    }
    netlink::end_nest(buf, list);
    Ok(())
}

/// The rule these expressions (the *contents* of NFTA_RULE_EXPRESSIONS, as natledger sends
/// them or the kernel dumps them) encode, `comment: None`; `None` for any list [`encode`]
/// would not produce.
pub fn decode(family: Family, expressions: &[u8]) -> Option<Rule> {
    let parsed: Vec<Expr> = parse_list(expressions)?.into_iter().map(normal).collect();
    let rule = candidate(family, &parsed)?;
    let again: Vec<Expr> = exprs(family, &rule).ok()?.into_iter().map(normal).collect();
    (again == parsed).then_some(rule)
}

/// The chain an expression list jumps to (`false`) or goes to (`true`), whatever else it
/// holds: what a rule natledger does not decode still references.
pub fn chain_verdict(expressions: &[u8]) -> Option<(bool, String)> {
    parse_list(expressions)?.into_iter().find_map(|e| match e {
        Expr::Immediate {
            dreg: REG_VERDICT,
            data:
                Data::Verdict {
                    code,
                    chain: Some(chain),
                },
        } if code == NFT_JUMP || code == NFT_GOTO => Some((code == NFT_GOTO, chain)),
        _ => None,
    })
}

/// NFTA_RULE_USERDATA for a comment, as nft stores it: TLV type 0
/// (`NFTNL_UDATA_RULE_COMMENT`), length including the NUL, the text, NUL. The length is one
/// byte: a comment is cut at 254 bytes (on a character boundary); natledger's are at most
/// 138 (`natledger:` and a 128-byte id).
pub fn comment_udata(comment: &str) -> Vec<u8> {
    let mut end = comment.len().min(254);
    while !comment.is_char_boundary(end) {
        end -= 1;
    }
    let text = &comment.as_bytes()[..end];
    let mut udata = Vec::with_capacity(text.len() + 3);
    udata.push(0);
    udata.push(text.len() as u8 + 1);
    udata.extend(text);
    udata.push(0);
    udata
}

/// A test of conntrack bits as nft writes it: `ct KEY`, `bitwise & MASK ^ 0` (with `op` when
/// nft sends one), `cmp OP 0`.
fn ct_bits(out: &mut Vec<Expr>, key: u32, mask: u32, op: Option<u32>, cmp_op: u32) {
    out.push(Expr::Ct {
        key,
        dreg: REG_1,
        dir: None,
    });
    out.push(Expr::Bitwise {
        sreg: REG_1,
        dreg: REG_1,
        mask: mask.to_ne_bytes().to_vec(),
        xor: vec![0; 4],
        op,
    });
    out.push(cmp(cmp_op, vec![0; 4]));
}

/// The expressions of `rule`, in nft's order and form.
pub(super) fn exprs(family: Family, rule: &Rule) -> Result<Vec<Expr>, EncodeError> {
    let mut out = Vec::with_capacity(12);
    let (saddr, daddr) = family.header_addresses();
    if let Some(net) = rule.source {
        address(&mut out, family, "source", net, saddr)?;
    }
    if let Some(net) = rule.destination {
        address(&mut out, family, "destination", net, daddr)?;
    }
    if let Some(name) = &rule.not_in_interface {
        if !is_interface_name(name) || name.contains('*') {
            return Err(EncodeError::Interface(name.clone()));
        }
        let mut padded = name.as_bytes().to_vec();
        padded.resize(IFNAMSIZ, 0);
        out.push(meta(META_IIFNAME));
        out.push(cmp(NEQ, padded));
    }
    match (rule.protocol, rule.dports) {
        (Some(protocol), ports) => {
            out.push(meta(META_L4PROTO));
            out.push(cmp(EQ, vec![protocol.number()]));
            if let Some(ports) = ports {
                out.push(payload(TRANSPORT, 2, 2));
                port_cmp(&mut out, ports);
            }
        }
        (None, Some(ports)) => {
            let what = "destination ports";
            return Err(EncodeError::PortsWithoutProtocol { what, ports });
        }
        (None, None) => {}
    }
    if rule.dst_local {
        let (flags, result) = (FIB_F_DADDR, FIB_RESULT_ADDRTYPE);
        out.push(Expr::Fib {
            flags,
            result,
            dreg: REG_1,
        });
        out.push(cmp(EQ, RTN_LOCAL.to_ne_bytes().to_vec()));
    }
    if let Some(ct) = &rule.dnatted {
        if rule.target != Target::Masquerade {
            return Err(EncodeError::Dnatted);
        }
        ct::dnatted(&mut out, family, ct)?;
    }
    if rule.not_dnatted {
        // `ct status & dnat == 0`: nft writes this `&` with an explicit op.
        ct_bits(&mut out, CT_STATUS, IPS_DST_NAT, Some(0), EQ);
    }
    if rule.untracked {
        // `ct state invalid,untracked`: this `&` without one.
        ct_bits(&mut out, CT_STATE, CT_STATE_INVALID_OR_UNTRACKED, None, NEQ);
    }
    match &rule.target {
        Target::Jump(chain) if is_user_chain_name(chain) => {
            out.push(verdict(NFT_JUMP, Some(chain.clone())))
        }
        Target::Jump(chain) => return Err(EncodeError::ChainName(chain.clone())),
        Target::Accept => out.push(verdict(NF_ACCEPT, None)),
        Target::Drop => out.push(verdict(NF_DROP, None)),
        Target::Masquerade => out.push(Expr::Masq),
        Target::Dnat(to) => dnat(&mut out, family, rule, to)?,
    }
    Ok(out)
}

/// `ip saddr NET` / `ip daddr NET` (and ip6), optimised as nft does.
fn address(
    out: &mut Vec<Expr>,
    family: Family,
    what: &'static str,
    net: IpNet,
    offset: u32,
) -> Result<(), EncodeError> {
    let addr = octets(family, what, net.addr)?;
    let full = addr.len();
    let prefix = usize::from(net.prefix);
    let mask = prefix_mask(prefix, full);
    if addr.iter().zip(&mask).any(|(a, m)| a & !m != 0) {
        return Err(EncodeError::HostBits { what, net });
    }
    if prefix == full * 8 || (prefix % 8 == 0 && prefix > 0) {
        let len = prefix / 8;
        out.push(payload(NETWORK, offset, len as u32));
        out.push(cmp(EQ, addr[..len].to_vec()));
    } else {
        out.push(payload(NETWORK, offset, full as u32));
        let (sreg, dreg, xor) = (REG_1, REG_1, vec![0; full]);
        out.push(Expr::Bitwise {
            sreg,
            dreg,
            mask,
            xor,
            op: None,
        });
        out.push(cmp(EQ, addr));
    }
    Ok(())
}

/// `cmp eq` a port, or `cmp gte` + `cmp lte` a range.
fn port_cmp(out: &mut Vec<Expr>, ports: PortRange) {
    if ports.is_single() {
        out.push(cmp(EQ, ports.start.to_be_bytes().to_vec()));
    } else {
        out.push(cmp(GTE, ports.start.to_be_bytes().to_vec()));
        out.push(cmp(LTE, ports.end.to_be_bytes().to_vec()));
    }
}

/// `dnat to ADDR:PORT`, or `dnat to ADDR` for a range mapped to the same ports.
fn dnat(out: &mut Vec<Expr>, family: Family, rule: &Rule, to: &DnatTo) -> Result<(), EncodeError> {
    let port = match (to.base, rule.dports) {
        (None, _) if to.ports.is_single() => Some(to.ports.start),
        (None, _) => return Err(EncodeError::RangeWithoutBase(to.ports)),
        (Some(base), Some(host)) if !host.is_single() && host == to.ports && base == host.start => {
            None
        }
        (Some(_), host) => {
            return Err(EncodeError::PortShift {
                host,
                container: to.ports,
            });
        }
    };
    if let (Some(port), None) = (port, rule.protocol) {
        let (what, ports) = ("DNAT port", PortRange::single(port));
        return Err(EncodeError::PortsWithoutProtocol { what, ports });
    }
    let addr = octets(family, "DNAT address", to.addr)?;
    out.push(Expr::Immediate {
        dreg: REG_1,
        data: Data::Value(addr),
    });
    if let Some(port) = port {
        let data = Data::Value(port.to_be_bytes().to_vec());
        out.push(Expr::Immediate { dreg: REG_2, data });
    }
    out.push(Expr::Nat {
        kind: NAT_DNAT,
        family: u32::from(family.af()),
        addr_min: Some(REG_1),
        addr_max: None,
        proto_min: port.map(|_| REG_2),
        proto_max: None,
        flags: port.map(|_| NAT_PROTO_SPECIFIED),
    });
    Ok(())
}

fn octets(family: Family, what: &'static str, addr: IpAddr) -> Result<Vec<u8>, EncodeError> {
    if Family::of(addr) != family {
        return Err(EncodeError::WrongFamily { what, addr, family });
    }
    Ok(match addr {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    })
}

fn prefix_mask(prefix: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            let bits = prefix.saturating_sub(i * 8).min(8);
            (0xff00u16 >> bits) as u8
        })
        .collect()
}

fn payload(base: u32, offset: u32, len: u32) -> Expr {
    Expr::Payload {
        base,
        offset,
        len,
        dreg: REG_1,
    }
}

fn cmp(op: u32, data: Vec<u8>) -> Expr {
    Expr::Cmp {
        sreg: REG_1,
        op,
        data,
    }
}

fn meta(key: u32) -> Expr {
    Expr::Meta { key, dreg: REG_1 }
}

fn verdict(code: i32, chain: Option<String>) -> Expr {
    Expr::Immediate {
        dreg: REG_VERDICT,
        data: Data::Verdict { code, chain },
    }
}

/// What the kernel's dump adds to what nft sends, taken off (see the file comment).
fn normal(expr: Expr) -> Expr {
    match expr {
        Expr::Bitwise {
            sreg,
            dreg,
            mask,
            xor,
            op: Some(0),
        } => Expr::Bitwise {
            sreg,
            dreg,
            mask,
            xor,
            op: None,
        },
        Expr::Nat {
            kind,
            family,
            addr_min,
            addr_max,
            proto_min,
            proto_max,
            flags,
        } => {
            let mut flags = flags.unwrap_or(0);
            if addr_min.is_some() {
                flags &= !NAT_MAP_IPS;
            }
            Expr::Nat {
                kind,
                family,
                addr_min,
                addr_max: addr_max.filter(|r| Some(*r) != addr_min),
                proto_min,
                proto_max: proto_max.filter(|r| Some(*r) != proto_min),
                flags: (flags != 0).then_some(flags),
            }
        }
        other => ct::normal(other),
    }
}

/// The rule the expressions seem to say, read loosely: [`decode`] checks it by encoding it
/// again.
fn candidate(family: Family, exprs: &[Expr]) -> Option<Rule> {
    let mut rule = Rule::unconditional(Target::Accept);
    let mut target = None;
    let (mut nat_addr, mut nat_port) = (None, None);
    let mut ct = ct::Parts::default();
    let mut it = exprs.iter().peekable();
    while let Some(expr) = it.next() {
        if read_match(family, &mut rule, &mut ct, expr, &mut it)? {
            continue;
        }
        match expr {
            Expr::Immediate {
                data: Data::Verdict { code, chain },
                ..
            } => {
                target = Some(match (*code, chain) {
                    (NF_ACCEPT, None) => Target::Accept,
                    (NF_DROP, None) => Target::Drop,
                    (NFT_JUMP, Some(chain)) => Target::Jump(chain.clone()),
                    _ => return None,
                });
            }
            Expr::Immediate {
                dreg: REG_1,
                data: Data::Value(v),
            } => nat_addr = Some(ip_of(v)?),
            Expr::Immediate {
                dreg: REG_2,
                data: Data::Value(v),
            } => nat_port = Some(be16(v)?),
            Expr::Masq => target = Some(Target::Masquerade),
            Expr::Nat { .. } => {
                let (ports, base) = match nat_port {
                    Some(port) => (PortRange::single(port), None),
                    None => (rule.dports?, rule.dports.map(|p| p.start)),
                };
                let addr = nat_addr?;
                target = Some(Target::Dnat(DnatTo { addr, ports, base }));
            }
            _ => return None,
        }
    }
    rule.target = target?;
    rule.dnatted = ct.finish()?;
    Some(rule)
}

/// The expressions still to read.
type Rest<'a> = std::iter::Peekable<std::slice::Iter<'a, Expr>>;

/// A match starting at `expr` (a load and the compares after it) into `rule`: `Some(false)`
/// when `expr` starts no match, `None` when the match is not one natledger writes.
fn read_match(
    family: Family,
    rule: &mut Rule,
    ct: &mut ct::Parts,
    expr: &Expr,
    it: &mut Rest,
) -> Option<bool> {
    let (saddr, daddr) = family.header_addresses();
    match expr {
        Expr::Payload {
            base, offset, len, ..
        } if *base == NETWORK => {
            let mask = match it.peek() {
                Some(Expr::Bitwise { mask, .. }) => {
                    it.next();
                    Some(mask.clone())
                }
                _ => None,
            };
            let value = next_cmp(it)?;
            let net = network(family, *len as usize, mask, value)?;
            match *offset {
                o if o == saddr => rule.source = Some(net),
                o if o == daddr => rule.destination = Some(net),
                _ => return None,
            }
        }
        Expr::Meta { key, .. } if *key == META_IIFNAME => {
            let name = next_cmp(it)?;
            let end = name.iter().position(|b| *b == 0)?;
            rule.not_in_interface = Some(String::from_utf8(name[..end].to_vec()).ok()?);
        }
        Expr::Meta { key, .. } if *key == META_L4PROTO => {
            rule.protocol = Some(Protocol::from_number(*next_cmp(it)?.first()?)?);
        }
        Expr::Payload { base, .. } if *base == TRANSPORT => {
            rule.dports = Some(next_ports(it)?);
        }
        Expr::Fib { .. } => {
            next_cmp(it)?;
            rule.dst_local = true;
        }
        Expr::Ct { key, dir: None, .. } if *key != ct::PROTOCOL => ct_flag(rule, ct, *key, it)?,
        Expr::Ct { key, dir, .. } => ct.read(family, *key, *dir, it)?,
        _ => return Some(false),
    }
    Some(true)
}

/// `ct status`/`ct state` bits and the compare after them: the guard's conditions.
fn ct_flag(rule: &mut Rule, ct: &mut ct::Parts, key: u32, it: &mut Rest) -> Option<()> {
    it.next();
    let op = match it.peek() {
        Some(Expr::Cmp { op, .. }) => *op,
        _ => return None,
    };
    next_cmp(it)?;
    match (key, op) {
        (CT_STATUS, EQ) => rule.not_dnatted = true,
        (CT_STATUS, _) => ct.state = true,
        (CT_STATE, _) => rule.untracked = true,
        _ => return None,
    }
    Some(())
}

/// A port (`cmp eq`) or a range (`cmp gte`, `cmp lte`) compared next.
fn next_ports(it: &mut Rest) -> Option<PortRange> {
    let start = be16(&next_cmp(it)?)?;
    let end = match it.peek() {
        Some(Expr::Cmp { data, .. }) => {
            it.next();
            be16(data)?
        }
        _ => start,
    };
    Some(PortRange { start, end })
}

/// The value of the `cmp` that comes next.
fn next_cmp(it: &mut Rest) -> Option<Vec<u8>> {
    match it.next() {
        Some(Expr::Cmp { data, .. }) => Some(data.clone()),
        _ => None,
    }
}

/// An address compare: `len` bytes loaded, an optional mask, the value.
fn network(family: Family, len: usize, mask: Option<Vec<u8>>, value: Vec<u8>) -> Option<IpNet> {
    let full = usize::from(family.host_prefix() / 8);
    if len > full || value.len() != len {
        return None;
    }
    let prefix = match mask {
        Some(mask) => mask.iter().map(|b| b.leading_ones()).sum::<u32>(),
        None => len as u32 * 8,
    };
    let mut addr = value;
    addr.resize(full, 0);
    Some(IpNet {
        addr: ip_of(&addr)?,
        prefix: u8::try_from(prefix).ok()?,
    })
}

fn ip_of(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => Some(IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?)),
        16 => Some(IpAddr::from(<[u8; 16]>::try_from(bytes).ok()?)),
        _ => None,
    }
}

fn be16(d: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes(d.try_into().ok()?))
}

mod ct;
mod wire;

use wire::put;
pub(super) use wire::{Data, Expr, parse_list};

#[cfg(test)]
mod pins;
#[cfg(test)]
mod pins_ct;
#[cfg(test)]
mod tests;
