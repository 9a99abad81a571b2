//! Being told of every nf_tables commit: a netlink socket subscribed to the multicast group
//! `NFNLGRP_NFTABLES`, as `nft monitor` is. Every committed transaction of any table and
//! family (iptables-nft's, natledger's own, anyone's) ends with an `NFT_MSG_NEWGEN` carrying
//! the new generation. `natledger watch` polls the socket's descriptor and drains it when it
//! is readable: no process, no busy loop.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use nix::errno::Errno;
use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv, socket,
};

use super::subsys;
use super::wire::{NFNLGRP_NFTABLES, NFT_MSG_NEWGEN, NFTA_GEN_ID};
use super::wire::{NFT_MSG_DELCHAIN, NFT_MSG_DELRULE, NFT_MSG_DELTABLE, NFT_MSG_DESTROYCHAIN};
use super::wire::{NFT_MSG_DESTROYRULE, NFT_MSG_DESTROYTABLE, NFT_MSG_NEWCHAIN};
use super::wire::{NFT_MSG_NEWRULE, NFT_MSG_NEWTABLE, NFTA_CHAIN_NAME, NFTA_RULE_CHAIN};
use crate::kernel::netlink;
use crate::model::layout::CHAIN_PREFIX;

/// The receive buffer asked for: room for a burst of commits before the kernel drops
/// messages (then [`Events::overflowed`] says so).
const RCVBUF: libc::c_int = 1 << 20;

/// A subscription to nf_tables' commits in the calling thread's network namespace.
pub struct Monitor {
    fd: OwnedFd,
}

/// natledger's own tables: anything in them counts.
const OWN_TABLE: &str = "natledger";
/// iptables-nft's tables natledger writes in, shared with other owners (kube-proxy, Docker):
/// only what touches natledger's chains or the jumps into them counts.
const SHARED_TABLES: [&str; 2] = ["nat", "filter"];
/// The built-in chains natledger jumps from.
const BUILT_IN: [&str; 5] = ["PREROUTING", "OUTPUT", "POSTROUTING", "INPUT", "FORWARD"];
/// Message types that add or remove a table (`NFT_MSG_NEWTABLE`, `DELTABLE`,
/// `DESTROYTABLE` of Linux 6.3), a chain (`NEWCHAIN`, `DELCHAIN`, `DESTROYCHAIN`) or a rule
/// (`NEWRULE`, `DELRULE`, `DESTROYRULE`), all with the table's name as attribute 1.
const TABLE_KINDS: [u16; 3] = [NFT_MSG_NEWTABLE, NFT_MSG_DELTABLE, NFT_MSG_DESTROYTABLE];
const CHAIN_KINDS: [u16; 3] = [NFT_MSG_NEWCHAIN, NFT_MSG_DELCHAIN, NFT_MSG_DESTROYCHAIN];
const RULE_KINDS: [u16; 3] = [NFT_MSG_NEWRULE, NFT_MSG_DELRULE, NFT_MSG_DESTROYRULE];
/// A table's deletion: `DELTABLE`, `DESTROYTABLE`.
const TABLE_GONE: [u16; 2] = [NFT_MSG_DELTABLE, NFT_MSG_DESTROYTABLE];
/// `AF_UNSPEC`, `AF_INET`, `AF_INET6`: the families of natledger's tables (and of a message
/// for all of them).
const FAMILIES: [u8; 3] = [0, 2, 10];

/// What a drain found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Events {
    /// A commit changed a table, chain or rule of a table natledger writes (or one that may
    /// have: a message without a readable table name counts).
    pub any: bool,
    /// The newest generation announced, if a `NEWGEN` was among them.
    pub generation: Option<u32>,
    /// The kernel dropped messages (`ENOBUFS`): something changed, what is unknown.
    pub overflowed: bool,
}

impl Monitor {
    pub fn open() -> io::Result<Monitor> {
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            SockProtocol::NetlinkNetFilter,
        )?;
        bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0))?;
        set(
            &fd,
            libc::SOL_NETLINK,
            libc::NETLINK_ADD_MEMBERSHIP,
            NFNLGRP_NFTABLES,
        )?;
        // Best effort: the default buffer only makes an overflow likelier.
        let _ = set(&fd, libc::SOL_SOCKET, libc::SO_RCVBUF, RCVBUF);
        Ok(Monitor { fd })
    }

    /// Read every message waiting, without blocking.
    pub fn drain(&self) -> io::Result<Events> {
        let mut events = Events::default();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match recv(self.fd.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT) {
                Ok(0) => return Ok(events),
                Ok(n) => {
                    for message in netlink::messages(&buf[..n]).flatten() {
                        events.any |= touches_ours(message.kind, message.payload);
                        if message.kind != subsys(NFT_MSG_NEWGEN) {
                            continue;
                        }
                        let id = message
                            .payload
                            .get(4..)
                            .and_then(|body| netlink::attr(body, NFTA_GEN_ID))
                            .and_then(|id| Some(u32::from_be_bytes(id.get(..4)?.try_into().ok()?)));
                        if id.is_some() {
                            events.generation = id;
                        }
                    }
                }
                Err(Errno::EAGAIN) => return Ok(events),
                Err(Errno::EINTR) => continue,
                Err(Errno::ENOBUFS) => {
                    events.any = true;
                    events.overflowed = true;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// Whether a message of type `kind` (with `payload`: `nfgenmsg`, then attributes) adds or
/// removes something natledger wrote or needs: anything in its own `natledger` tables; in
/// iptables-nft's `nat` and `filter`, a rule of a NATLEDGER-* chain or of a built-in chain it
/// jumps from, a NATLEDGER-* chain, or the table's deletion. Another owner's table
/// (firewalld's `inet firewalld`, kube-proxy's `ip kube-proxy`) or chain (kube-proxy's
/// `KUBE-*` in `ip nat`) wakes nothing. What cannot be read counts.
fn touches_ours(kind: u16, payload: &[u8]) -> bool {
    let is = |kinds: &[u16]| kinds.iter().any(|t| kind == subsys(*t));
    if !is(&TABLE_KINDS) && !is(&CHAIN_KINDS) && !is(&RULE_KINDS) {
        return false;
    }
    let Some(&family) = payload.first() else {
        return true;
    };
    if !FAMILIES.contains(&family) {
        return false;
    }
    let attrs = payload.get(4..).unwrap_or_default();
    let named = |attr: u16| netlink::attr(attrs, attr).and_then(netlink::str_of);
    let ours = |chain: &str| chain.starts_with(CHAIN_PREFIX);
    match named(1) {
        None => true,
        Some(OWN_TABLE) => true,
        Some(table) if SHARED_TABLES.contains(&table) => {
            if is(&RULE_KINDS) {
                named(NFTA_RULE_CHAIN).is_none_or(|c| ours(c) || BUILT_IN.contains(&c))
            } else if is(&CHAIN_KINDS) {
                named(NFTA_CHAIN_NAME).is_none_or(ours)
            } else {
                is(&TABLE_GONE)
            }
        }
        Some(_) => false,
    }
}

impl AsFd for Monitor {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

fn set(fd: &OwnedFd, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: `value` is a valid c_int for the duration of the call, and its size is passed.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(family: u8, table: Option<&str>, name: Option<(u16, &str)>) -> Vec<u8> {
        let mut payload = vec![family, 0, 0, 0];
        if let Some(table) = table {
            netlink::put_str(&mut payload, 1, table);
        }
        if let Some((attr, name)) = name {
            netlink::put_str(&mut payload, attr, name);
        }
        payload
    }

    #[test]
    fn only_changes_to_natledgers_chains_tables_and_jumps_count() {
        let (newtable, deltable, newchain, delchain, newrule, delrule, gen_, set) =
            (0, 2, 3, 5, 6, 8, 15, 9);
        let rule = |c| Some((NFTA_RULE_CHAIN, c));
        let chain = |c| Some((NFTA_CHAIN_NAME, c));
        let ours = [
            (newrule, 2, Some("nat"), rule("NATLEDGER-HOSTPORTS")),
            (delrule, 2, Some("nat"), rule("PREROUTING")),
            (delrule + 20, 10, Some("filter"), rule("FORWARD")),
            (delchain, 2, Some("nat"), chain("NATLEDGER-MASQ")),
            (newchain, 2, Some("natledger"), chain("anything")),
            (newtable, 0, Some("natledger"), None),
            (deltable, 2, Some("nat"), None),
            (deltable + 24, 10, Some("filter"), None),
            // What cannot be read: counted.
            (deltable, 2, None, None),
            (delrule, 2, Some("nat"), None),
        ];
        for (kind, family, table, name) in ours {
            let payload = payload(family, table, name);
            assert!(
                touches_ours(subsys(kind), &payload),
                "{kind} {family} {table:?} {name:?}"
            );
        }
        let others = [
            (newrule, 1, Some("firewalld"), rule("INPUT")),
            (newrule, 2, Some("kube-proxy"), rule("NATLEDGER-HOSTPORTS")),
            (newrule, 7, Some("nat"), rule("PREROUTING")),
            // kube-proxy's own chains in iptables-nft's nat table.
            (newrule, 2, Some("nat"), rule("KUBE-X")),
            (delrule, 2, Some("nat"), rule("KUBE-X")),
            (newchain, 2, Some("nat"), chain("KUBE-X")),
            (delchain, 2, Some("nat"), chain("KUBE-X")),
            (newchain, 2, Some("nat"), chain("PREROUTING")),
            (newtable, 2, Some("nat"), None),
            (gen_, 0, None, None),
            (set, 2, Some("nat"), None),
        ];
        for (kind, family, table, name) in others {
            let payload = payload(family, table, name);
            assert!(
                !touches_ours(subsys(kind), &payload),
                "{kind} {family} {table:?} {name:?}"
            );
        }
    }
}
