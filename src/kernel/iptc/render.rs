//! Any entry of a legacy table, of any owner, as the tokens `iptables-legacy-save` prints
//! after `-A CHAIN`, and the table's chains as its `:CHAIN POLICY` lines.
//!
//! The header (`-s -d -i -o -p -f`) is read here from the entry; matches and targets go to
//! the decoders shared with iptables-nft ([`crate::kernel::xt`]); standard targets (verdicts, jumps,
//! gotos, fall-through) are resolved against the blob. Nothing is refused: what is not
//! decoded renders opaque ([`crate::kernel::xt::OPAQUE`]).

use super::blob::{Blob, HOOKS};
use super::entry::{STANDARD, i32_at, u16_at, xt_at};
use crate::kernel::xt::{self, Header, IFNAMSIZ};

/// A jump whose offset is not the start of a user chain (no table libiptc writes has one).
pub const UNKNOWN_JUMP: &str = "natledger-unknown-jump";

/// The table's chains as `iptables-legacy-save` lists them: the built-in ones in hook order
/// with their policies, then the user chains by name with `-`.
pub fn chains(t: &Blob) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (h, name) in HOOKS.iter().enumerate() {
        if t.info.valid_hooks & (1 << h) == 0 {
            continue;
        }
        let policy = t.chain(name).and_then(|span| {
            let e = t.entry_at(span.tail);
            let (target, _) = xt_at(e, t.layout.target_offset(e))?;
            (target.name == STANDARD).then(|| verdict_name(i32_at(target.data, 0)))?
        });
        out.push((name.to_string(), policy.unwrap_or("-").to_string()));
    }
    let mut users: Vec<&str> = t.user_chains().collect();
    users.sort_unstable();
    out.extend(users.into_iter().map(|n| (n.to_string(), "-".to_string())));
    out
}

/// The standard verdicts by name (libiptc's `standard_target_map`).
fn verdict_name(verdict: i32) -> Option<&'static str> {
    Some(match verdict {
        -2 => "ACCEPT",
        -1 => "DROP",
        -4 => "QUEUE",
        -5 => "RETURN",
        _ => return None,
    })
}

/// The rules of `chain` as argument tokens, in order; `None` if there is no such chain.
pub fn chain_rules<'t>(t: &'t Blob, chain: &str) -> Option<impl Iterator<Item = Vec<String>> + 't> {
    let span = t.chain(chain)?;
    Some(t.rules(span).map(|(at, e)| {
        let mut out = Vec::with_capacity(16);
        rule_args(t, at, e, &mut out);
        out
    }))
}

/// Whether the entry `e` may match a packet to an address in one of `dsts`, judged from its
/// header's destination alone (no match decoded, nothing allocated): false only when the
/// entry names a destination, not inverted, that shares no address with any of them. A reader
/// looking for what a packet to this host meets skips, at this price, the thousands of rules
/// for other addresses (kube-proxy's service addresses).
pub fn may_be_for(t: &Blob, e: &[u8], dsts: &[crate::model::rule::IpNet]) -> bool {
    /// `IPT_INV_DSTIP`, `IP6T_INV_DSTIP`
    const INV_DSTIP: u8 = 0x10;
    let l = t.layout;
    let n = l.addr_len;
    let (addr, mask) = (&e[n..2 * n], &e[3 * n..4 * n]);
    if e[l.invflags_at] & INV_DSTIP != 0 || mask.iter().all(|b| *b == 0) {
        return true;
    }
    xt::may_hold_any(addr, mask, dsts)
}

/// Append the tokens of the entry `e` at offset `at` (from [`Blob::rules`]) to `out`.
pub fn rule_args(t: &Blob, at: usize, e: &[u8], out: &mut Vec<String>) {
    let l = t.layout;
    let family = l.family;
    let n = l.addr_len;
    let flags = e[l.flags_at];
    let net = |a: usize, m: usize| {
        let mask = &e[m..m + n];
        let addr = &e[a..a + n];
        (mask.iter().chain(addr).any(|b| *b != 0)).then(|| (addr.to_vec(), mask.to_vec()))
    };
    let iface = |k: usize| {
        let r = l.interfaces();
        let name_at = r.start + k * IFNAMSIZ;
        let mask_at = r.start + (k + 2) * IFNAMSIZ;
        let mut name = [0u8; IFNAMSIZ];
        let mut mask = [0u8; IFNAMSIZ];
        name.copy_from_slice(&e[name_at..name_at + IFNAMSIZ]);
        mask.copy_from_slice(&e[mask_at..mask_at + IFNAMSIZ]);
        Some((name, mask))
    };
    // ip6tables compares the protocol only with IP6T_F_PROTO set (ip6_packet_match); without
    // it the rule takes every protocol, whatever the field holds.
    let proto_checked = l.proto_flag == 0 || flags & l.proto_flag != 0;
    let mut invflags = e[l.invflags_at];
    if !proto_checked {
        invflags &= !xt::INV_PROTO;
    }
    Header {
        src: net(0, 2 * n),
        dst: net(n, 3 * n),
        iniface: iface(0),
        outiface: iface(1),
        proto: if proto_checked {
            u16_at(e, l.proto_at)
        } else {
            0
        },
        frag: l.frag_flag != 0 && flags & l.frag_flag != 0,
        invflags,
    }
    .push(family, out);

    let target_at = l.target_offset(e);
    let mut m = l.entry_size;
    while m < target_at {
        let Some((mt, size)) = xt_at(e, m) else {
            // Blob::parse checked the entry's bounds; a match that does not fit is opaque.
            xt::push_opaque_match(out, "?");
            break;
        };
        xt::push_match(out, family, mt.name, mt.revision, mt.data);
        m += size;
    }
    let Some((tg, _)) = xt_at(e, target_at) else {
        return;
    };
    if tg.name != STANDARD {
        xt::push_target(out, family, tg.name, tg.revision, tg.data);
        return;
    }
    let Some(verdict) = tg.data.get(..4).map(|_| i32_at(tg.data, 0)) else {
        return;
    };
    if verdict < 0 {
        out.push("-j".into());
        out.push(verdict_name(verdict).unwrap_or(UNKNOWN_JUMP).into());
        return;
    }
    // A jump to the next entry is libiptc's "no target".
    if verdict as usize == at + l.next_offset(e) && tg.data.len() >= 4 {
        return;
    }
    let goto = flags & l.goto_flag != 0;
    out.push(if goto { "-g" } else { "-j" }.into());
    out.push(
        t.chain_starting_at(verdict as usize)
            .unwrap_or(UNKNOWN_JUMP)
            .into(),
    );
}
