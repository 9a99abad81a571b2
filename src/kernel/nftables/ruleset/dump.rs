//! The dumps of one read (tables, chains, sets, each set's elements, rules) and each message
//! decoded into the model: pure functions of a message's body, tested on captured bytes.

use std::collections::HashMap;
use std::io;

use super::SetInfo;
use super::expr;
use super::types;
use crate::kernel::netlink;
use crate::kernel::nftables::wire::{NFTA_DATA_VALUE, NFTA_DATA_VERDICT, NFTA_LIST_ELEM};
use crate::kernel::nftables::wire::{be32, be64};
use crate::kernel::nftables::{Session, comment_match, genmsg, subsys};
use crate::model::ruleset::{
    Base, Chain, ChainKind, Element, ElementData, Hook, Policy, Rule, Set, SetData, TableFamily,
    Value,
};

/// `nfgenmsg.nfgen_family` of each table family.
pub(super) fn af(family: TableFamily) -> u8 {
    match family {
        TableFamily::Ip => 2,
        TableFamily::Ip6 => 10,
        TableFamily::Inet => 1,
        TableFamily::Arp => 3,
        TableFamily::Bridge => 7,
        TableFamily::Netdev => 5,
    }
}

pub(super) fn family_of(af: u8) -> Option<TableFamily> {
    Some(match af {
        2 => TableFamily::Ip,
        10 => TableFamily::Ip6,
        1 => TableFamily::Inet,
        3 => TableFamily::Arp,
        7 => TableFamily::Bridge,
        5 => TableFamily::Netdev,
        _ => return None,
    })
}

impl Session<'_> {
    /// Dump `get` (a GET message) of `family` with the attributes `attrs` puts in the
    /// request, handing each answer's family and body (after `nfgenmsg`) to `each`.
    pub(super) fn dump_each(
        &mut self,
        get: u16,
        family: u8,
        attrs: impl FnOnce(&mut Vec<u8>),
        mut each: impl FnMut(u8, &[u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        let seq = self.sock.next_seq();
        let mut request = Vec::with_capacity(64);
        let flags = netlink::NLM_F_REQUEST | netlink::NLM_F_DUMP;
        let start = netlink::begin(&mut request, subsys(get), flags, seq);
        genmsg(&mut request, family, 0);
        attrs(&mut request);
        netlink::finish(&mut request, start);
        self.sock.dump(seq, &request, |message| {
            if message.kind != subsys(get - 1) {
                return Ok(());
            }
            match (message.payload.first(), message.payload.get(4..)) {
                (Some(af), Some(body)) => each(*af, body),
                _ => Err(io::Error::other("message without nfgenmsg")),
            }
        })
    }
}

fn malformed(what: &str) -> io::Error {
    io::Error::other(format!("malformed {what} message"))
}

fn string(body: &[u8], kind: u16) -> Option<String> {
    netlink::attr(body, kind)
        .and_then(netlink::str_of)
        .map(str::to_string)
}

/// The record `kind` of libnftnl's user data (type, length, value records): comments.
pub(super) fn udata(data: &[u8], kind: u8) -> Option<&[u8]> {
    let mut at = 0;
    while let [k, len, ..] = *data.get(at..)? {
        let value = data.get(at + 2..at + 2 + len as usize)?;
        if k == kind {
            return Some(value);
        }
        at += 2 + len as usize;
    }
    None
}

fn comment(body: &[u8], attr: u16, record: u8) -> Option<String> {
    let text = udata(netlink::attr(body, attr)?, record)?;
    netlink::str_of(text).map(str::to_string)
}

/// A NEWTABLE body: name, handle, comment.
pub(super) fn table(body: &[u8]) -> io::Result<(String, Option<u64>, Option<String>)> {
    let name = string(body, 1).ok_or_else(|| malformed("table"))?;
    let handle = netlink::attr(body, 4).and_then(be64);
    Ok((name, handle, comment(body, 6, 0)))
}

/// A NEWCHAIN body: its table and the chain (without rules).
pub(super) fn chain(family: TableFamily, body: &[u8]) -> io::Result<(String, Chain)> {
    let table = string(body, 1).ok_or_else(|| malformed("chain"))?;
    let name = string(body, 3).ok_or_else(|| malformed("chain"))?;
    let base = match netlink::attr(body, 4) {
        None => None,
        Some(hook) => {
            let number = netlink::attr(hook, 1).and_then(be32);
            let priority = netlink::attr(hook, 2).and_then(be32).unwrap_or(0) as i32;
            let kind = match string(body, 7).as_deref() {
                Some("nat") => ChainKind::Nat,
                Some("route") => ChainKind::Route,
                _ => ChainKind::Filter,
            };
            let policy = match netlink::attr(body, 5).and_then(be32) {
                Some(0) => Policy::Drop,
                _ => Policy::Accept,
            };
            number.and_then(|n| hook_of(family, n)).map(|hook| Base {
                kind,
                hook,
                priority,
                policy,
            })
        }
    };
    let chain = Chain {
        name,
        handle: netlink::attr(body, 2).and_then(be64),
        base,
        rules: Vec::new(),
    };
    Ok((table, chain))
}

fn hook_of(family: TableFamily, number: u32) -> Option<Hook> {
    Some(match (family, number) {
        (TableFamily::Netdev, 0) => Hook::Ingress,
        (TableFamily::Netdev, 1) => Hook::Egress,
        (TableFamily::Arp, 0) => Hook::Input,
        (TableFamily::Arp, 1) => Hook::Output,
        (TableFamily::Arp, 2) => Hook::Forward,
        (_, 0) => Hook::Prerouting,
        (_, 1) => Hook::Input,
        (_, 2) => Hook::Forward,
        (_, 3) => Hook::Output,
        (_, 4) => Hook::Postrouting,
        (_, 5) => Hook::Ingress,
        _ => return None,
    })
}

const SET_ANONYMOUS: u32 = 0x1;
const SET_INTERVAL: u32 = 0x4;
const SET_MAP: u32 = 0x8;
const SET_OBJECT: u32 = 0x40;

/// A NEWSET body: its table and the set (without elements), with what decoding its
/// elements and lookups needs.
pub(super) fn set(body: &[u8]) -> io::Result<(String, SetInfo)> {
    let table = string(body, 1).ok_or_else(|| malformed("set"))?;
    let name = string(body, 2).ok_or_else(|| malformed("set"))?;
    let u32_of = |kind| netlink::attr(body, kind).and_then(be32);
    let flags = u32_of(3).unwrap_or(0);
    let key_types = types::split(u32_of(4).unwrap_or(0));
    let declared: Vec<u32> = netlink::attr(body, 9)
        .and_then(|desc| netlink::attr(desc, 2))
        .map(|concat| {
            netlink::attrs(concat)
                .filter(|(k, _)| *k == NFTA_LIST_ELEM)
                .filter_map(|(_, field)| netlink::attr(field, 1).and_then(be32))
                .collect()
        })
        .unwrap_or_default();
    let key_len = u32_of(5).unwrap_or(0);
    // Fields whose lengths neither the kernel nor their types tell (`typeof meta mark . ct
    // mark`): the key is one opaque value, and a lookup's key "may match".
    let (key_types, key_lens, opaque) = match types::field_lens(&key_types, &declared, key_len) {
        Some(lens) => (key_types, lens, false),
        None => (vec![types::RAW], vec![key_len as usize], true),
    };
    let (data, data_types, data_lens) = match (flags & (SET_MAP | SET_OBJECT), u32_of(6)) {
        (0, _) | (_, None) => (None, Vec::new(), Vec::new()),
        (_, Some(types::DATA_VERDICT)) => (Some(SetData::Verdict), vec![types::VERDICT], vec![]),
        (_, Some(ty)) => {
            let split = types::split(ty);
            let names = split.iter().map(|t| types::name(*t)).collect();
            let total = u32_of(7).unwrap_or(0);
            match types::field_lens(&split, &[], total) {
                Some(lens) => (Some(SetData::Typed(names)), split, lens),
                None => (
                    Some(SetData::Typed(names)),
                    vec![types::RAW],
                    vec![total as usize],
                ),
            }
        }
    };
    let set = Set {
        name,
        handle: netlink::attr(body, 16).and_then(be64),
        key: types::split(u32_of(4).unwrap_or(0))
            .iter()
            .map(|t| types::name(*t))
            .collect(),
        data,
        interval: flags & SET_INTERVAL != 0,
        comment: comment(body, 13, 7),
        elements: Vec::new(),
    };
    let info = SetInfo {
        set,
        anonymous: flags & SET_ANONYMOUS != 0,
        opaque,
        key_types,
        key_lens,
        data_types,
        data_lens,
    };
    Ok((table, info))
}

/// One element as the kernel has it, before intervals are paired.
pub(super) struct RawElement {
    key: Vec<u8>,
    key_end: Option<Vec<u8>>,
    interval_end: bool,
    catchall: bool,
    data: Option<ElementData>,
    comment: Option<String>,
}

/// The elements of a NEWSETELEM body, appended to `out`.
pub(super) fn elements(set: &SetInfo, body: &[u8], out: &mut Vec<RawElement>) -> io::Result<()> {
    let Some(list) = netlink::attr(body, 3) else {
        return Ok(());
    };
    for (kind, elem) in netlink::attrs(list) {
        if kind != NFTA_LIST_ELEM {
            continue;
        }
        let bytes = |kind| {
            netlink::attr(elem, kind)
                .and_then(|k| netlink::attr(k, NFTA_DATA_VALUE))
                .map(<[u8]>::to_vec)
        };
        let flags = netlink::attr(elem, 3).and_then(be32).unwrap_or(0);
        let data = match netlink::attr(elem, 2) {
            None => None,
            Some(d) => Some(match netlink::attr(d, NFTA_DATA_VERDICT) {
                Some(v) => ElementData::Verdict(
                    expr::verdict(v).ok_or_else(|| malformed("element verdict"))?,
                ),
                None => {
                    let value = netlink::attr(d, NFTA_DATA_VALUE)
                        .ok_or_else(|| malformed("element data"))?;
                    ElementData::Value(fields(&set.data_types, &set.data_lens, value))
                }
            }),
        };
        out.push(RawElement {
            key: bytes(1).unwrap_or_default(),
            key_end: bytes(10),
            interval_end: flags & 1 != 0,
            catchall: flags & 2 != 0,
            data,
            comment: netlink::attr(elem, 6)
                .and_then(|u| udata(u, 0))
                .and_then(netlink::str_of)
                .map(str::to_string),
        });
    }
    Ok(())
}

/// A value of fields `types` of `lens` bytes, each padded to 4 bytes in `bytes`.
fn fields(types: &[u32], lens: &[usize], bytes: &[u8]) -> Value {
    each_field(types, lens, bytes, bytes, |ty, first, _| {
        types::decode(ty, first)
    })
}

fn each_field(
    tys: &[u32],
    lens: &[usize],
    first: &[u8],
    last: &[u8],
    value: impl Fn(u32, &[u8], &[u8]) -> Value,
) -> Value {
    let mut at = 0;
    let mut values = Vec::with_capacity(tys.len());
    for (ty, len) in tys.iter().zip(lens) {
        let (Some(a), Some(b)) = (first.get(at..at + len), last.get(at..at + len)) else {
            return Value::Word("a malformed element".into());
        };
        values.push(value(*ty, a, b));
        at += len.next_multiple_of(4);
    }
    match values.len() {
        1 => values.remove(0),
        _ => Value::Concat(values),
    }
}

/// The set's elements from the kernel's: keys decoded by the set's types; an interval set's
/// start and end elements paired into prefixes and ranges (an end is the first value past
/// the interval; a start without one runs to the top); a concatenation's ranges field by
/// field.
pub(super) fn assemble(set: &SetInfo, mut raw: Vec<RawElement>) -> Vec<Element> {
    let (tys, lens) = (&set.key_types, &set.key_lens);
    let whole = |e: RawElement, key: Value| Element {
        key,
        data: e.data,
        comment: e.comment,
    };
    if !set.set.interval || raw.iter().any(|e| e.key_end.is_some()) {
        return raw
            .into_iter()
            .filter(|e| !e.interval_end)
            .map(|e| {
                let key = if e.catchall {
                    Value::Word("*".into())
                } else {
                    match &e.key_end {
                        Some(end) => each_field(tys, lens, &e.key, end, types::interval),
                        None => fields(tys, lens, &e.key),
                    }
                };
                whole(e, key)
            })
            .collect();
    }
    // Ends sort before starts of the same value (adjacent intervals).
    raw.sort_by(|a, b| (&a.key, !a.interval_end).cmp(&(&b.key, !b.interval_end)));
    let mut out = Vec::with_capacity(raw.len() / 2 + 1);
    let mut raw = raw.into_iter().peekable();
    while let Some(e) = raw.next() {
        if e.interval_end {
            continue;
        }
        if e.catchall {
            out.push(whole(e, Value::Word("*".into())));
            continue;
        }
        let last = match raw.peek() {
            Some(end) if end.interval_end => types::minus_one(&end.key),
            _ => Some(vec![0xff; e.key.len()]),
        };
        let key = match last {
            Some(last) => each_field(tys, lens, &e.key, &last, types::interval),
            None => fields(tys, lens, &e.key),
        };
        out.push(whole(e, key));
    }
    out
}

/// A NEWRULE body: its table, chain and the rule decoded with the table's sets.
pub(super) fn rule(
    family: TableFamily,
    sets: &HashMap<String, SetInfo>,
    body: &[u8],
) -> io::Result<(String, String, Rule)> {
    let table = string(body, 1).ok_or_else(|| malformed("rule"))?;
    let chain = string(body, 2).ok_or_else(|| malformed("rule"))?;
    let expressions = netlink::attr(body, 4);
    let stmts = expressions
        .map(|e| expr::decode(family, sets, e))
        .unwrap_or_default();
    let rule = Rule {
        handle: netlink::attr(body, 3).and_then(be64),
        // nft's in the user data; iptables-nft's (before 1.8.10) an xtables `comment` match.
        comment: comment(body, 7, 0).or_else(|| expressions.and_then(comment_match)),
        stmts,
    };
    Ok((table, chain, rule))
}
