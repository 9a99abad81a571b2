//! nft's datatypes as the kernel keeps them for a set (`NFTA_SET_KEY_TYPE`, a concatenation's
//! types 6 bits each, the first field in the highest bits) and values decoded by them: set
//! elements (keys, interval ends, data) and the data a `cmp` compares a loaded field with.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::model::ruleset::{Key, Value};

/// nft's `enum datatypes` (src/datatype.h), the ids natledger names.
pub(super) const VERDICT: u32 = 1;
pub(super) const NFPROTO: u32 = 2;
pub(super) const INTEGER: u32 = 4;
pub(super) const IPADDR: u32 = 7;
pub(super) const IP6ADDR: u32 = 8;
pub(super) const INET_PROTOCOL: u32 = 12;
pub(super) const INET_SERVICE: u32 = 13;
pub(super) const MARK: u32 = 19;
pub(super) const IFINDEX: u32 = 20;
pub(super) const CT_STATE: u32 = 26;
pub(super) const CT_STATUS: u32 = 28;
pub(super) const FIB_ADDR: u32 = 38;
pub(super) const IFNAME: u32 = 41;
/// No datatype known: the bytes as a number (or hex).
pub(super) const RAW: u32 = 0;
/// `NFTA_SET_DATA_TYPE` of a verdict map.
pub(super) const DATA_VERDICT: u32 = 0xffff_ff00;
const TYPE_BITS: u32 = 6;

/// nft's name of a datatype (`ipv4_addr`), as `nft list` prints a set's `type`.
pub(super) fn name(ty: u32) -> String {
    let known = match ty {
        VERDICT => "verdict",
        NFPROTO => "nf_proto",
        3 => "bitmask",
        INTEGER => "integer",
        5 => "string",
        6 => "ll_addr",
        IPADDR => "ipv4_addr",
        IP6ADDR => "ipv6_addr",
        9 => "ether_addr",
        10 => "ether_type",
        11 => "arp_op",
        INET_PROTOCOL => "inet_proto",
        INET_SERVICE => "inet_service",
        14 => "icmp_type",
        15 => "tcp_flag",
        16 => "dccp_pkttype",
        17 => "mh_type",
        18 => "time",
        MARK => "mark",
        IFINDEX => "iface_index",
        21 => "iface_type",
        22 => "realm",
        23 => "classid",
        24 => "uid",
        25 => "gid",
        CT_STATE => "ct_state",
        27 => "ct_dir",
        CT_STATUS => "ct_status",
        29 => "icmpv6_type",
        30 => "ct_label",
        31 => "pkt_type",
        32 => "icmp_code",
        33 => "icmpv6_code",
        34 => "icmpx_code",
        35 => "devgroup",
        36 => "dscp",
        37 => "ecn",
        FIB_ADDR => "fib_addrtype",
        39 => "boolean",
        40 => "ct_event",
        IFNAME => "ifname",
        42 => "igmp_type",
        _ => return format!("type {ty}"),
    };
    known.to_string()
}

/// The datatypes of a (possibly concatenated) key type, first field first.
pub(super) fn split(mut ty: u32) -> Vec<u32> {
    let mut types = Vec::with_capacity(3);
    while ty != 0 {
        types.push(ty & ((1 << TYPE_BITS) - 1));
        ty >>= TYPE_BITS;
    }
    types.reverse();
    types
}

/// The length in bytes of a value of `ty`, where the type fixes it.
pub(super) fn size(ty: u32) -> Option<usize> {
    Some(match ty {
        NFPROTO | INET_PROTOCOL | 14 | 15 | 16 | 17 | 27 | 29 | 31 | 32 | 33 | 34 | 36 | 37
        | 39 | 42 => 1,
        10 | 11 | INET_SERVICE => 2,
        3 | MARK | IFINDEX | 22 | 23 | 24 | 25 | CT_STATE | CT_STATUS | FIB_ADDR | 35 | 40 => 4,
        IPADDR => 4,
        9 => 6,
        18 => 8,
        IP6ADDR | 30 | IFNAME => 16,
        _ => return None,
    })
}

/// The field lengths of a key of `types` and `total` bytes: `declared` (the set's
/// `NFTA_SET_DESC_CONCAT`) when given, else each type's own size (one unknown size is what
/// the others leave of `total`, each field padded to 4 bytes).
pub(super) fn field_lens(types: &[u32], declared: &[u32], total: u32) -> Option<Vec<usize>> {
    if declared.len() == types.len() {
        return Some(declared.iter().map(|l| *l as usize).collect());
    }
    if types.len() == 1 {
        return Some(vec![total as usize]);
    }
    let known: Vec<Option<usize>> = types.iter().map(|t| size(*t)).collect();
    let unknown = known.iter().filter(|s| s.is_none()).count();
    let padded: usize = known.iter().flatten().map(|s| s.next_multiple_of(4)).sum();
    match unknown {
        0 => Some(known.into_iter().flatten().collect()),
        1 => {
            let rest = (total as usize).checked_sub(padded)?;
            Some(known.into_iter().map(|s| s.unwrap_or(rest)).collect())
        }
        _ => None,
    }
}

/// The datatype a loaded field's values have (for the data a `cmp` or `range` compares it
/// with).
pub(super) fn of_key(key: &Key) -> u32 {
    match key {
        Key::Saddr { v4: true } | Key::Daddr { v4: true } => IPADDR,
        Key::Saddr { v4: false } | Key::Daddr { v4: false } => IP6ADDR,
        Key::L4Proto => INET_PROTOCOL,
        Key::Dport(_) | Key::Sport(_) => INET_SERVICE,
        Key::Iifname | Key::Oifname => IFNAME,
        Key::Iif | Key::Oif => IFINDEX,
        Key::NfProto => NFPROTO,
        Key::FibDaddrType => FIB_ADDR,
        Key::CtState => CT_STATE,
        Key::CtStatus => CT_STATUS,
        Key::Mark => MARK,
        Key::Numgen { .. } => INTEGER,
        Key::Other(_) => RAW,
    }
}

fn host_u32(bytes: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(bytes.get(..4)?.try_into().ok()?))
}

fn be_uint(bytes: &[u8]) -> Option<u64> {
    (bytes.len() <= 8).then(|| bytes.iter().fold(0u64, |n, b| n << 8 | u64::from(*b)))
}

/// A value of `ty` from its bytes (exactly its field's bytes, no padding).
pub(super) fn decode(ty: u32, bytes: &[u8]) -> Value {
    decode_known(ty, bytes).unwrap_or_else(|| raw(bytes))
}

fn decode_known(ty: u32, bytes: &[u8]) -> Option<Value> {
    Some(match ty {
        IPADDR => Value::Addr(IpAddr::V4(Ipv4Addr::from(
            <[u8; 4]>::try_from(bytes.get(..4)?).ok()?,
        ))),
        IP6ADDR => Value::Addr(IpAddr::V6(Ipv6Addr::from(
            <[u8; 16]>::try_from(bytes.get(..16)?).ok()?,
        ))),
        INET_PROTOCOL => Value::Proto(*bytes.first()?),
        INET_SERVICE => Value::Int(be_uint(bytes.get(..2)?)?),
        NFPROTO => Value::Word(
            match *bytes.first()? {
                2 => "ipv4",
                10 => "ipv6",
                _ => return None,
            }
            .into(),
        ),
        IFNAME => Value::Word(ifname(bytes)?),
        MARK | IFINDEX | INTEGER if bytes.len() == 4 => Value::Int(u64::from(host_u32(bytes)?)),
        CT_STATE => flag_word(CT_STATE, host_u32(bytes)?)?,
        CT_STATUS => flag_word(CT_STATUS, host_u32(bytes)?)?,
        FIB_ADDR => Value::Word(fib_type(host_u32(bytes)?)?.into()),
        _ => return None,
    })
}

/// Bytes of no known type: a number up to 8 bytes (big-endian), else hex.
fn raw(bytes: &[u8]) -> Value {
    match be_uint(bytes) {
        Some(n) => Value::Int(n),
        None => Value::Word(bytes.iter().map(|b| format!("{b:02x}")).collect()),
    }
}

/// An interface name: up to its NUL; without one, the name is a prefix (`eth*`).
fn ifname(bytes: &[u8]) -> Option<String> {
    let end = bytes.iter().position(|b| *b == 0);
    let name = std::str::from_utf8(&bytes[..end.unwrap_or(bytes.len())]).ok()?;
    Some(match end {
        Some(_) => name.to_string(),
        None => format!("{name}*"),
    })
}

/// The word of one flag of `ct state` / `ct status`; `None` for none or several.
pub(super) fn flag_word(ty: u32, bits: u32) -> Option<Value> {
    flag_words(ty, bits).and_then(|mut w| (w.len() == 1).then(|| w.remove(0)))
}

/// The words of every flag set in `bits`; `None` when a bit has no name.
pub(super) fn flag_words(ty: u32, bits: u32) -> Option<Vec<Value>> {
    let names: &[(u32, &str)] = match ty {
        CT_STATE => &[
            (0x1, "invalid"),
            (0x2, "established"),
            (0x4, "related"),
            (0x8, "new"),
            (0x40, "untracked"),
        ],
        CT_STATUS => &[
            (0x1, "expected"),
            (0x2, "seen-reply"),
            (0x4, "assured"),
            (0x8, "confirmed"),
            (0x10, "snat"),
            (0x20, "dnat"),
            (0x200, "dying"),
        ],
        _ => return None,
    };
    let named: u32 = names.iter().map(|(b, _)| b).fold(0, |a, b| a | b);
    if bits == 0 || bits & !named != 0 {
        return None;
    }
    Some(
        names
            .iter()
            .filter(|(b, _)| bits & b != 0)
            .map(|(_, w)| Value::Word((*w).into()))
            .collect(),
    )
}

fn fib_type(n: u32) -> Option<&'static str> {
    Some(match n {
        0 => "unspec",
        1 => "unicast",
        2 => "local",
        3 => "broadcast",
        4 => "anycast",
        5 => "multicast",
        6 => "blackhole",
        7 => "unreachable",
        8 => "prohibit",
        _ => return None,
    })
}

/// The bytes one less than `bytes` (big-endian); `None` below zero.
pub(super) fn minus_one(bytes: &[u8]) -> Option<Vec<u8>> {
    let mut out = bytes.to_vec();
    for b in out.iter_mut().rev() {
        if *b > 0 {
            *b -= 1;
            return Some(out);
        }
        *b = 0xff;
    }
    None
}

/// The value of the interval `first..=last` of `ty`: one value, a prefix, or a range.
pub(super) fn interval(ty: u32, first: &[u8], last: &[u8]) -> Value {
    let (from, to) = (decode(ty, first), decode(ty, last));
    if from == to {
        return from;
    }
    match (from, to) {
        (Value::Addr(a), Value::Addr(b)) => match prefix_of(first, last) {
            Some(len) => Value::Prefix(a, len),
            None => Value::AddrRange(a, b),
        },
        (Value::Int(a), Value::Int(b)) => Value::IntRange(a, b),
        (Value::Proto(a), Value::Proto(b)) => Value::IntRange(a.into(), b.into()),
        (from, _) => Value::Word(format!("{from:?}-")),
    }
}

/// The prefix length when `first..=last` is exactly one prefix.
fn prefix_of(first: &[u8], last: &[u8]) -> Option<u8> {
    if first.len() != last.len() {
        return None;
    }
    let bits = first.len() * 8;
    let bit = |b: &[u8], i: usize| b[i / 8] >> (7 - i % 8) & 1;
    let len = (0..bits)
        .find(|i| bit(first, *i) != bit(last, *i))
        .unwrap_or(bits);
    let host_ok = (len..bits).all(|i| bit(first, i) == 0 && bit(last, i) == 1);
    host_ok.then_some(len as u8)
}

/// A prefix from a compare of the first `bytes.len()` bytes of an address (nft loads only a
/// byte-aligned prefix's bytes) or a masked compare (`prefix` bits).
pub(super) fn prefix(ty: u32, bytes: &[u8], prefix: usize) -> Option<Value> {
    let full = size(ty)?;
    let mut addr = bytes.get(..full.min(bytes.len()))?.to_vec();
    addr.resize(full, 0);
    let Value::Addr(a) = decode(ty, &addr) else {
        return None;
    };
    Some(if prefix == full * 8 {
        Value::Addr(a)
    } else {
        Value::Prefix(a, prefix as u8)
    })
}

/// The prefix length of a mask of contiguous leading ones.
pub(super) fn mask_prefix(mask: &[u8]) -> Option<usize> {
    let mut ones = 0;
    for b in mask {
        ones += b.leading_ones() as usize;
        if *b != 0xff {
            break;
        }
    }
    let want: Vec<u8> = (0..mask.len())
        .map(|i| match ones.saturating_sub(i * 8).min(8) {
            0 => 0,
            left => 0xffu8 << (8 - left),
        })
        .collect();
    (want == mask).then_some(ones)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concatenated_types_split_first_field_first() {
        let ty = ((IPADDR << 6 | INET_PROTOCOL) << 6) | INET_SERVICE;
        assert_eq!(split(ty), [IPADDR, INET_PROTOCOL, INET_SERVICE]);
        assert_eq!(split(VERDICT), [VERDICT]);
        assert_eq!(
            field_lens(&[IPADDR, INET_PROTOCOL, INET_SERVICE], &[], 12),
            Some(vec![4, 1, 2])
        );
        assert_eq!(field_lens(&[INTEGER], &[], 4), Some(vec![4]));
        assert_eq!(
            field_lens(&[INET_PROTOCOL, INTEGER], &[], 8),
            Some(vec![1, 4])
        );
        assert_eq!(field_lens(&[INTEGER, INTEGER], &[], 8), None);
        assert_eq!(
            field_lens(&[INTEGER, INTEGER], &[4, 2], 8),
            Some(vec![4, 2])
        );
    }

    #[test]
    fn values_decode_by_type() {
        assert_eq!(
            decode(IPADDR, &[10, 0, 0, 1]),
            Value::Addr("10.0.0.1".parse().unwrap())
        );
        assert_eq!(decode(INET_SERVICE, &[0x75, 0x30]), Value::Int(30000));
        assert_eq!(decode(INET_PROTOCOL, &[17]), Value::Proto(17));
        assert_eq!(decode(IFNAME, b"eth0\0\0\0\0"), Value::Word("eth0".into()));
        assert_eq!(decode(IFNAME, b"veth"), Value::Word("veth*".into()));
        assert_eq!(
            decode(CT_STATE, &8u32.to_ne_bytes()),
            Value::Word("new".into())
        );
        assert_eq!(
            decode(FIB_ADDR, &2u32.to_ne_bytes()),
            Value::Word("local".into())
        );
        assert_eq!(decode(NFPROTO, &[10]), Value::Word("ipv6".into()));
        assert_eq!(decode(RAW, &[1, 2]), Value::Int(0x102));
        assert_eq!(
            flag_words(CT_STATE, 6),
            Some(vec![
                Value::Word("established".into()),
                Value::Word("related".into())
            ])
        );
        assert_eq!(flag_words(CT_STATE, 0x80), None);
    }

    #[test]
    fn intervals_become_values_prefixes_or_ranges() {
        let ip = |s: &str| s.parse::<Ipv4Addr>().unwrap().octets();
        let last = minus_one(&ip("11.0.0.0")).unwrap();
        assert_eq!(
            interval(IPADDR, &ip("10.0.0.0"), &last),
            Value::Prefix("10.0.0.0".parse().unwrap(), 8)
        );
        assert_eq!(
            interval(IPADDR, &ip("10.0.0.1"), &ip("10.0.0.1")),
            Value::Addr("10.0.0.1".parse().unwrap())
        );
        assert_eq!(
            interval(IPADDR, &ip("10.0.0.1"), &ip("10.0.0.5")),
            Value::AddrRange("10.0.0.1".parse().unwrap(), "10.0.0.5".parse().unwrap())
        );
        assert_eq!(
            interval(INET_SERVICE, &[0, 80], &[0, 90]),
            Value::IntRange(80, 90)
        );
        assert_eq!(minus_one(&[1, 0]), Some(vec![0, 0xff]));
        assert_eq!(minus_one(&[0, 0]), None);
        assert_eq!(mask_prefix(&[0xff, 0xf0, 0, 0]), Some(12));
        assert_eq!(mask_prefix(&[0xff, 0x0f, 0, 0]), None);
        assert_eq!(mask_prefix(&[0, 0, 0, 0]), Some(0));
        assert_eq!(
            prefix(IPADDR, &[127], 8),
            Some(Value::Prefix("127.0.0.0".parse().unwrap(), 8))
        );
    }
}
