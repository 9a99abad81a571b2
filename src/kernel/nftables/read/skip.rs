//! A rule no packet to this host can match, seen in its raw expressions before anything is
//! decoded: iptables-nft's `-d NET` (a network-header destination load, perhaps a `bitwise`
//! mask, a `cmp eq`) naming no address of the host. The chains a packet to a host port
//! passes are mostly kube-proxy's service rules, one per cluster address; decoding each to
//! tokens only to find its `-d` elsewhere was most of a reader's own cost
//! (`analysis::forwards`, iptables-legacy's [`crate::kernel::iptc::render::may_be_for`]).
//!
//! Sound, not complete: expressions run in order and a failed `cmp` ends the rule, so one
//! compare that cannot hold rules it out. It counts only when the register it reads was
//! loaded with the destination by the expression before it (or masked by a plain `bitwise`
//! in between) and nothing else wrote any register meanwhile; any other expression forgets
//! what was loaded. Every other rule is decoded.

use crate::kernel::netlink;
use crate::kernel::nftables::wire::{self, EQ, NETWORK, NFTA_RULE_EXPRESSIONS, u32_attr};
use crate::kernel::nftables::wire::{NFTA_BITWISE_DREG, NFTA_BITWISE_MASK, NFTA_BITWISE_OP};
use crate::kernel::nftables::wire::{NFTA_BITWISE_SREG, NFTA_BITWISE_XOR, NFTA_CMP_DATA};
use crate::kernel::nftables::wire::{NFTA_CMP_OP, NFTA_CMP_SREG, NFTA_PAYLOAD_BASE};
use crate::kernel::nftables::wire::{NFTA_PAYLOAD_DREG, NFTA_PAYLOAD_LEN, NFTA_PAYLOAD_OFFSET};
use crate::kernel::nftables::wire::{NFTA_PAYLOAD_SREG, value_attr};
use crate::model::family::{Family, IpNet};

/// The destination bytes a register holds: `len` of them, under `mask` when a `bitwise`
/// applied one.
struct Loaded {
    reg: u32,
    len: usize,
    mask: Option<Vec<u8>>,
}

/// Where the destination address of `family` is in the network header, and its length.
struct Daddr {
    at: u32,
    len: usize,
}

/// Whether the rule in `payload` (a NEWRULE message after `nlmsghdr`) provably matches no
/// packet to an address in `dsts`: one of its destination compares names none of them.
pub fn elsewhere(family: Family, payload: &[u8], dsts: &[IpNet]) -> bool {
    let daddr = match family {
        Family::Ipv4 => Daddr { at: 16, len: 4 },
        Family::Ipv6 => Daddr { at: 24, len: 16 },
    };
    let Some(exprs) = payload
        .get(4..)
        .and_then(|body| netlink::attr(body, NFTA_RULE_EXPRESSIONS))
    else {
        return false;
    };
    let mut loaded: Option<Loaded> = None;
    for (name, data) in wire::expressions(exprs) {
        let before = loaded.take();
        loaded = match name {
            "payload" if netlink::attr(data, NFTA_PAYLOAD_SREG).is_none() => {
                destination_load(data, &daddr)
            }
            "bitwise" => before.and_then(|b| masked(data, b)),
            "cmp" => match before.map(|b| compare(data, b, dsts)) {
                Some(Compared::Excludes) => return true,
                // A compare writes no register: what was loaded is still there.
                Some(Compared::Kept(b)) => Some(b),
                Some(Compared::Unreadable) | None => None,
            },
            // Writes no register.
            "counter" => before,
            // Anything else may have written any register.
            _ => None,
        };
    }
    false
}

/// A `payload` load of the destination address (or a prefix of it) into a register.
fn destination_load(data: &[u8], daddr: &Daddr) -> Option<Loaded> {
    let dst = u32_attr(data, NFTA_PAYLOAD_BASE) == Some(NETWORK)
        && u32_attr(data, NFTA_PAYLOAD_OFFSET) == Some(daddr.at);
    let len = u32_attr(data, NFTA_PAYLOAD_LEN).map_or(0, |l| l as usize);
    if !(dst && (1..=daddr.len).contains(&len)) {
        return None;
    }
    Some(Loaded {
        reg: u32_attr(data, NFTA_PAYLOAD_DREG)?,
        len,
        mask: None,
    })
}

/// A plain `bitwise` (a mask, a zero xor) of the loaded destination.
fn masked(data: &[u8], b: Loaded) -> Option<Loaded> {
    let mask = value_attr(data, NFTA_BITWISE_MASK)?;
    let xor = value_attr(data, NFTA_BITWISE_XOR)?;
    let plain = u32_attr(data, NFTA_BITWISE_OP).unwrap_or(0) == 0
        && b.mask.is_none()
        && u32_attr(data, NFTA_BITWISE_SREG) == Some(b.reg)
        && mask.len() == b.len
        && xor.iter().all(|x| *x == 0);
    if !plain {
        return None;
    }
    Some(Loaded {
        reg: u32_attr(data, NFTA_BITWISE_DREG)?,
        len: b.len,
        mask: Some(mask.to_vec()),
    })
}

/// What a `cmp` after a destination load comes to.
enum Compared {
    /// It holds for none of the addresses: the rule matches no packet to them.
    Excludes,
    /// It may hold; the register still has the destination.
    Kept(Loaded),
    /// Its attributes are not all there: what was loaded is forgotten.
    Unreadable,
}

fn compare(data: &[u8], b: Loaded, dsts: &[IpNet]) -> Compared {
    let (Some(sreg), Some(op), Some(v)) = (
        u32_attr(data, NFTA_CMP_SREG),
        u32_attr(data, NFTA_CMP_OP),
        value_attr(data, NFTA_CMP_DATA),
    ) else {
        return Compared::Unreadable;
    };
    if sreg == b.reg && op == EQ && v.len() == b.len {
        let mask = b.mask.clone().unwrap_or_else(|| vec![0xff; b.len]);
        if !crate::kernel::xt::may_hold_any(v, &mask, dsts) {
            return Compared::Excludes;
        }
    }
    Compared::Kept(b)
}

#[cfg(test)]
mod tests {
    use super::super::tests::*;
    use super::*;

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|n| n.parse().unwrap()).collect()
    }

    /// This host: loopback's network and the node's address.
    fn host() -> Vec<IpNet> {
        nets(&["127.0.0.0/8", "10.77.0.1/32"])
    }

    /// Whether the rule is skipped for a packet to `dsts`; a skipped IPv4 rule must also
    /// decode to a `-d` that holds none of them (the tokens the walk would have judged).
    fn skipped(exprs: &[Vec<u8>], dsts: &[IpNet]) -> bool {
        let skip = elsewhere(Family::Ipv4, &message(exprs, None), dsts);
        if skip {
            let text = decode(exprs, None);
            let d = text.split(' ').skip_while(|t| *t != "-d").nth(1);
            let net: IpNet = d.unwrap_or_else(|| panic!("{text}")).parse().unwrap();
            assert!(
                !dsts.iter().any(|h| overlap(&net, h)),
                "{text} skipped for {dsts:?}"
            );
        }
        skip
    }

    /// Whether two IPv4 networks share an address: equal in the bits both fix.
    fn overlap(a: &IpNet, b: &IpNet) -> bool {
        let bits = |n: &IpNet| match n.addr {
            std::net::IpAddr::V4(a) => u32::from(a),
            std::net::IpAddr::V6(_) => panic!("IPv4 only"),
        };
        let fixed = u32::MAX
            .checked_shl(32 - u32::from(a.prefix.min(b.prefix)))
            .unwrap_or(0);
        bits(a) & fixed == bits(b) & fixed
    }

    /// kube-proxy's service rule, as iptables-nft writes `-d ADDR/32 -p tcp --dport 80`.
    fn service(addr: [u8; 4]) -> Vec<Vec<u8>> {
        vec![
            payload(NETWORK, 16, 4),
            cmp(EQ, &addr),
            meta(META_L4PROTO),
            cmp(EQ, &[6]),
            payload(TRANSPORT, 2, 2),
            cmp(EQ, &80u16.to_be_bytes()),
            expr("counter", Vec::new()),
            verdict(-3, Some("KUBE-SVC-X")),
        ]
    }

    #[test]
    fn a_rule_for_another_address_is_skipped_undecoded() {
        assert!(skipped(&service([10, 96, 0, 10]), &host()));
        // Its own address, or one of the node's networks holding it: decoded.
        assert!(!skipped(&service([10, 77, 0, 1]), &host()));
        assert!(!skipped(&service([127, 0, 0, 53]), &host()));
        assert!(!skipped(
            &service([10, 96, 0, 10]),
            &nets(&["10.96.0.0/12"])
        ));
    }

    #[test]
    fn prefixes_masked_or_shortened_are_compared_on_their_bits() {
        // `-d 10.77.0.0/16` as a mask, `-d 10.77.0.0/24` as a shortened load.
        let masked = [
            payload(NETWORK, 16, 4),
            bitwise(&[255, 255, 0, 0]),
            cmp(EQ, &[10, 77, 0, 0]),
        ];
        assert!(!skipped(&masked, &host()));
        assert!(skipped(&masked, &nets(&["10.78.0.1/32"])));
        let short = [payload(NETWORK, 16, 3), cmp(EQ, &[10, 77, 0])];
        assert!(!skipped(&short, &host()));
        assert!(skipped(&short, &nets(&["10.77.1.1/32", "127.0.0.0/8"])));
    }

    #[test]
    fn what_may_match_is_never_skipped() {
        let h = host();
        // `! -d`, `-s`, no address at all, ports and protocols only.
        let negated = [payload(NETWORK, 16, 4), cmp(NEQ, &[10, 96, 0, 10])];
        let source = [payload(NETWORK, 12, 4), cmp(EQ, &[10, 96, 0, 10])];
        let ports = [
            meta(META_L4PROTO),
            cmp(EQ, &[17]),
            payload(TRANSPORT, 2, 2),
            range(EQ, 30000, 32767),
        ];
        let other_protocol = [meta(META_L4PROTO), cmp(EQ, &[132])];
        let no_match = [verdict(-3, Some("KUBE-NODEPORTS"))];
        for rule in [&negated[..], &source, &ports, &other_protocol, &no_match] {
            assert!(!skipped(rule, &h), "{}", decode(rule, None));
        }
        // The destination loaded, then any register rewritten before the compare (an
        // expression not understood, a meta load, a mask with an xor): not a `-d`.
        let fib = expr("fib", u32s(&[(1, 1), (2, 2), (3, 1)]));
        for between in [fib, meta(META_MARK)] {
            let clobbered = [payload(NETWORK, 16, 4), between, cmp(EQ, &[10, 96, 0, 10])];
            assert!(!skipped(&clobbered, &h));
        }
        let mut xor = u32s(&[(1, 1), (2, 1), (3, 4)]);
        xor.extend(value(4, &[255; 4]));
        xor.extend(value(5, &[0, 0, 0, 1]));
        let flipped = [
            payload(NETWORK, 16, 4),
            expr("bitwise", xor),
            cmp(EQ, &[10, 96, 0, 10]),
        ];
        assert!(!skipped(&flipped, &h));
        // Compared from another register than the one loaded.
        let mut other = u32s(&[(1, 2), (2, EQ)]);
        other.extend(value(3, &[10, 96, 0, 10]));
        let elsewhere_reg = [payload(NETWORK, 16, 4), expr("cmp", other)];
        assert!(!skipped(&elsewhere_reg, &h));
    }

    #[test]
    fn ipv6_destinations_too() {
        let mut addr = [0u8; 16];
        addr[..4].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
        addr[15] = 1;
        let rule = message(&[payload(NETWORK, 24, 16), cmp(EQ, &addr)], None);
        assert!(elsewhere(Family::Ipv6, &rule, &nets(&["::1/128"])));
        assert!(!elsewhere(Family::Ipv6, &rule, &nets(&["2001:db8::/32"])));
        // At the IPv4 destination's offset, an IPv6 rule compares something else.
        let v4 = message(&[payload(NETWORK, 16, 4), cmp(EQ, &[10, 96, 0, 10])], None);
        assert!(!elsewhere(Family::Ipv6, &v4, &nets(&["::1/128"])));
    }
}
