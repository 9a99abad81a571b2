//! A netlink socket: requests, dumps and acknowledgements, and a release that does not make
//! the caller wait for the kernel (see [`Socket::close_detached`]).
//!
//! One type for the three protocols natledger speaks: nf_tables and ctnetlink (both
//! `NETLINK_NETFILTER`, so one socket serves both and is released once) and sock_diag.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::Duration;

use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, recv, sendto,
    setsockopt, socket, sockopt,
};
use nix::sys::time::TimeVal;

use super::{Message, NLMSG_DONE, messages};

/// How long the kernel may take to answer before a request gives up (and the caller falls
/// back to its process-based path, or warns).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
/// Receive buffer per `recv`: the kernel fills at most 32 KiB of dump per datagram.
const RECV_BUFFER: usize = 64 * 1024;

/// A netlink socket of one protocol in the calling thread's network namespace.
pub struct Socket {
    fd: OwnedFd,
    seq: u32,
}

impl Socket {
    pub fn open(protocol: SockProtocol) -> io::Result<Socket> {
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            protocol,
        )?;
        let timeout = TimeVal::new(ANSWER_TIMEOUT.as_secs() as _, 0);
        setsockopt(&fd, sockopt::ReceiveTimeout, &timeout)?;
        Ok(Socket { fd, seq: 0 })
    }

    /// A `NETLINK_NETFILTER` socket (nf_tables, ctnetlink).
    pub fn netfilter() -> io::Result<Socket> {
        Socket::open(SockProtocol::NetlinkNetFilter)
    }

    /// The next sequence number.
    pub fn next_seq(&mut self) -> u32 {
        self.seq += 1;
        self.seq
    }

    /// Reserve `n` sequence numbers; returns the first.
    pub fn reserve(&mut self, n: u32) -> u32 {
        let first = self.seq + 1;
        self.seq += n;
        first
    }

    /// Make the send buffer hold a message of `len` bytes: the kernel refuses a netlink
    /// message larger than the socket's send buffer (EMSGSIZE), 208 KiB by default, and an
    /// nf_tables batch of a few thousand deletions is larger. `SO_SNDBUFFORCE` (root, as
    /// natledger runs) passes `net.core.wmem_max`; without the privilege, `SO_SNDBUF` up to
    /// that limit. The kernel doubles the value it is given for its own overhead.
    pub fn make_room_to_send(&self, len: usize) -> io::Result<()> {
        const DEFAULT: usize = 208 * 1024;
        if len + 4096 < DEFAULT {
            return Ok(());
        }
        let want = len + 4096;
        setsockopt(&self.fd, sockopt::SndBufForce, &want)
            .or_else(|_| setsockopt(&self.fd, sockopt::SndBuf, &want))
            .map_err(io::Error::from)
    }

    pub fn send(&self, bytes: &[u8]) -> io::Result<()> {
        let sent = sendto(
            self.fd.as_raw_fd(),
            bytes,
            &NetlinkAddr::new(0, 0),
            MsgFlags::empty(),
        )?;
        if sent != bytes.len() {
            return Err(io::Error::other("short netlink send"));
        }
        Ok(())
    }

    /// Send a dump request numbered `seq` and hand every answer message to `each` until the
    /// kernel says done. An error answer ends the dump as that errno (`ENOENT`: the object
    /// asked about does not exist). Messages of other sequence numbers (late answers to
    /// earlier requests) are skipped.
    pub fn dump(
        &self,
        seq: u32,
        request: &[u8],
        mut each: impl FnMut(Message<'_>) -> io::Result<()>,
    ) -> io::Result<()> {
        self.send(request)?;
        self.receive(
            seq,
            "dump ended without NLMSG_DONE",
            |message| match message.error() {
                Some(0) => Ok(false),
                Some(errno) => Err(io::Error::from_raw_os_error(errno)),
                None if message.kind == NLMSG_DONE => Ok(true),
                None => each(message).map(|()| false),
            },
        )
    }

    /// Send a request numbered `seq` that is answered by one message (not a dump) and hand
    /// it to `each`; an error answer is that errno.
    pub fn answer(
        &self,
        seq: u32,
        request: &[u8],
        mut each: impl FnMut(Message<'_>) -> io::Result<()>,
    ) -> io::Result<()> {
        self.send(request)?;
        self.receive(
            seq,
            "the kernel closed the socket",
            |message| match message.error() {
                Some(0) => Ok(true),
                Some(errno) => Err(io::Error::from_raw_os_error(errno)),
                None => each(message).map(|()| true),
            },
        )
    }

    /// Receive the messages numbered `seq` (others, late answers to earlier requests, are
    /// skipped) and hand each to `on` until it says the exchange is over; `closed` is the
    /// error when the socket ends first.
    fn receive(
        &self,
        seq: u32,
        closed: &str,
        mut on: impl FnMut(Message<'_>) -> io::Result<bool>,
    ) -> io::Result<()> {
        let mut buf = vec![0u8; RECV_BUFFER];
        loop {
            let n = recv(self.fd.as_raw_fd(), &mut buf, MsgFlags::empty())?;
            if n == 0 {
                return Err(io::Error::other(closed.to_string()));
            }
            for message in messages(&buf[..n]) {
                let message = message?;
                if message.seq == seq && on(message)? {
                    return Ok(());
                }
            }
        }
    }

    /// Wait for `expected` answers (acknowledgements or errors) to the requests numbered
    /// `seqs`, handing each to `answer` as (sequence number, 0 or errno); `answer` may end
    /// the wait early with an error. Messages of other sequence numbers are skipped.
    pub fn acks(
        &self,
        seqs: std::ops::RangeInclusive<u32>,
        expected: usize,
        mut answer: impl FnMut(u32, i32) -> io::Result<()>,
    ) -> io::Result<()> {
        let mut left = expected;
        let mut buf = vec![0u8; RECV_BUFFER];
        while left > 0 {
            let n = recv(self.fd.as_raw_fd(), &mut buf, MsgFlags::empty())?;
            if n == 0 {
                return Err(io::Error::other("the kernel closed the socket"));
            }
            for message in messages(&buf[..n]) {
                let message = message?;
                if let Some(code) = message.error()
                    && seqs.contains(&message.seq)
                {
                    left = left.saturating_sub(1);
                    answer(message.seq, code)?;
                }
            }
        }
        Ok(())
    }

    /// Close the socket without waiting for the kernel to free what it deleted through it.
    ///
    /// Releasing a `NETLINK_NETFILTER` socket runs nf_tables' netlink notifier
    /// (`nft_rcv_nl_event`), which takes the namespace's commit mutex and flushes the
    /// pending destroy work; that work frees deleted objects only after an RCU grace period
    /// (10-25 ms on 2 cores). So the last reference goes to a detached grandchild that holds
    /// no other descriptor (not the ledger lock, not the hook's stdout), and neither this
    /// process nor the runtime waiting on it waits for the grace period. If the grandchild
    /// cannot be made, this is a plain close, which waits.
    pub fn close_detached(self) {
        let Socket { fd, .. } = self;
        let release = hand_off(fd.as_raw_fd());
        drop(fd);
        // Closing the pipe after the socket lets the grandchild go: it exits, and its exit
        // drops the last reference.
        drop(release);
    }
}

/// Fork a grandchild that keeps `sock` (and nothing else but the read end of a pipe) until
/// the returned write end is closed, then exits. The middle child exits at once and is
/// reaped here, so the grandchild belongs to init (or the nearest subreaper) and nobody
/// waits for it.
fn hand_off(sock: RawFd) -> Option<OwnedFd> {
    use nix::unistd::{ForkResult, fork, pipe2};
    let (read_end, write_end) = pipe2(nix::fcntl::OFlag::O_CLOEXEC).ok()?;
    let read_fd = read_end.as_raw_fd();
    // SAFETY: between fork and _exit the children call only async-signal-safe functions
    // (fork, close_range/close, read, _exit), so a multi-threaded parent is fine.
    match unsafe { fork() }.ok()? {
        // SAFETY: the child and the grandchild only fork, close, read and _exit (all
        // async-signal-safe), on descriptors they inherited.
        ForkResult::Child => unsafe {
            if let Ok(ForkResult::Child) = fork() {
                keep_only(sock, read_fd);
                let mut byte = 0u8;
                while libc::read(read_fd, (&raw mut byte).cast(), 1) < 0
                    && *libc::__errno_location() == libc::EINTR
                {}
            }
            libc::_exit(0)
        },
        ForkResult::Parent { child } => {
            while let Err(nix::errno::Errno::EINTR) = nix::sys::wait::waitpid(child, None) {}
            drop(read_end);
            Some(write_end)
        }
    }
}

/// Close every descriptor but `a` and `b`. Async-signal-safe.
///
/// # Safety
/// Only in a forked child about to `_exit`: every other descriptor of the process is closed
/// under whoever owns it.
unsafe fn keep_only(a: RawFd, b: RawFd) {
    let (lo, hi) = (a.min(b) as u32, a.max(b) as u32);
    let close_range = |first: u32, last: u32| {
        if first > last {
            return;
        }
        // SAFETY: closing descriptors this (forked) process owns.
        if unsafe { libc::syscall(libc::SYS_close_range, first, last, 0u32) } != 0 {
            // Kernels before 5.9: close the usual range one by one.
            for fd in first..=last.min(1023) {
                // SAFETY: as above; a descriptor not open is EBADF, nothing else.
                unsafe { libc::close(fd as i32) };
            }
        }
    };
    if lo > 0 {
        close_range(0, lo - 1);
    }
    close_range(lo + 1, hi - 1);
    close_range(hi + 1, u32::MAX);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hand-off: the grandchild keeps the socket and nothing else (so the hook's stdout
    /// reaches EOF at once), and lets the socket go when the returned pipe end is dropped.
    #[test]
    fn the_socket_outlives_the_caller_and_nothing_else_is_kept() {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        use std::io::Read;
        use std::os::fd::AsFd;
        use std::os::unix::net::UnixStream;
        let poll_in = |fd: std::os::fd::BorrowedFd, ms: u16| {
            let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
            poll(&mut fds, PollTimeout::from(ms)).unwrap() > 0
        };
        let (stdout_read, stdout_write) = nix::unistd::pipe().unwrap();
        let (sock, mut peer) = UnixStream::pair().unwrap();
        let release = hand_off(sock.as_raw_fd()).expect("forked");
        drop(stdout_write);
        assert!(
            poll_in(stdout_read.as_fd(), 2000),
            "the grandchild kept a copy of stdout"
        );
        drop(sock);
        assert!(
            !poll_in(peer.as_fd(), 200),
            "the socket was released with the caller's copy"
        );
        drop(release);
        assert!(poll_in(peer.as_fd(), 2000), "the socket was never released");
        let mut buf = [0u8; 1];
        assert_eq!(peer.read(&mut buf).unwrap(), 0);
    }
}
