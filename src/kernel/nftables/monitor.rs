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

use super::{NFT_MSG_NEWGEN, NFTA_GEN_ID, subsys};
use crate::kernel::netlink;

/// `NFNLGRP_NFTABLES` (linux/netfilter/nfnetlink.h).
const NFNLGRP_NFTABLES: libc::c_int = 7;
/// The receive buffer asked for: room for a burst of commits before the kernel drops
/// messages (then [`Events::overflowed`] says so).
const RCVBUF: libc::c_int = 1 << 20;

/// A subscription to nf_tables' commits in the calling thread's network namespace.
pub struct Monitor {
    fd: OwnedFd,
}

/// The tables natledger writes: iptables-nft's `nat` and `filter`, and its own `natledger`.
const TABLES: [&str; 3] = ["nat", "filter", "natledger"];
/// Message types that add or remove a table, chain or rule (`NFT_MSG_NEWTABLE`,
/// `DELTABLE`, `NEWCHAIN`, `DELCHAIN`, `NEWRULE`, `DELRULE`, and the `DESTROY…` ones of
/// Linux 6.3), all with the table's name as attribute 1.
const TOUCHING: [u16; 9] = [0, 2, 3, 5, 6, 8, 26, 27, 28];
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
/// removes something in a table natledger writes. Another owner's table (firewalld's `inet
/// firewalld`, Docker's, kube-proxy's `ip kube-proxy`) wakes nothing.
fn touches_ours(kind: u16, payload: &[u8]) -> bool {
    if !TOUCHING.iter().any(|t| kind == subsys(*t)) {
        return false;
    }
    let Some(&family) = payload.first() else {
        return true;
    };
    if !FAMILIES.contains(&family) {
        return false;
    }
    let name = payload
        .get(4..)
        .and_then(|attrs| netlink::attr(attrs, 1))
        .and_then(netlink::str_of);
    name.is_none_or(|name| TABLES.contains(&name))
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

    fn payload(family: u8, table: Option<&str>) -> Vec<u8> {
        let mut payload = vec![family, 0, 0, 0];
        if let Some(table) = table {
            netlink::put_str(&mut payload, 1, table);
        }
        payload
    }

    #[test]
    fn only_changes_to_natledgers_tables_count() {
        let (rule, chain, table, gen_, set) = (6, 3, 2, 15, 9);
        let ours = [
            (rule, 2, Some("nat")),
            (rule + 2, 10, Some("filter")),
            (chain + 2, 2, Some("natledger")),
            (table, 0, Some("natledger")),
            // A table name that cannot be read: counted.
            (table, 2, None),
        ];
        for (kind, family, name) in ours {
            let payload = payload(family, name);
            assert!(
                touches_ours(subsys(kind), &payload),
                "{kind} {family} {name:?}"
            );
        }
        let others = [
            (rule, 1, Some("firewalld")),
            (rule, 2, Some("kube-proxy")),
            (rule, 7, Some("nat")),
            (gen_, 0, None),
            (set, 2, Some("nat")),
        ];
        for (kind, family, name) in others {
            let payload = payload(family, name);
            assert!(
                !touches_ours(subsys(kind), &payload),
                "{kind} {family} {name:?}"
            );
        }
    }
}
