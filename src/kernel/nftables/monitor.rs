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

/// What a drain found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Events {
    /// Messages arrived (some commit happened).
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
                    events.any = true;
                    for message in netlink::messages(&buf[..n]).flatten() {
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
