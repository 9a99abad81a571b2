//! Listening sockets from the kernel's sock_diag netlink interface (`NETLINK_SOCK_DIAG`,
//! `SOCK_DIAG_BY_FAMILY` dumps filtered by socket state).
//!
//! Reading `/proc/net/tcp` walks the whole established-connection hash table, which the
//! kernel sizes by memory: several milliseconds per read even in an empty namespace, on the
//! create-runtime path of every container. A dump filtered to listening sockets walks only
//! the listening table. Sockets of the calling thread's network namespace.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::AsRawFd;

use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, recv, sendto, socket,
};

use crate::portspec::Protocol;

const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const TCP_LISTEN: u32 = 10;
/// Unconnected UDP sockets are in TCP_CLOSE.
const TCP_CLOSE: u32 = 7;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const HEADER: usize = 16;
/// `struct inet_diag_msg`: family, state, timer, retrans, sockid (48), expires, rqueue,
/// wqueue, uid, inode.
const MSG_LEN: usize = 72;

/// A socket as the kernel reports it: protocol, local address and port, inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Socket {
    pub protocol: Protocol,
    pub addr: IpAddr,
    pub port: u16,
    pub inode: u64,
}

/// Listening TCP sockets and bound unconnected UDP sockets, both families. `Err` when the
/// kernel does not offer sock_diag (the caller falls back to procfs).
pub fn listening() -> std::io::Result<Vec<Socket>> {
    let fd = socket(
        AddressFamily::Netlink,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkSockDiag,
    )?;
    let mut found = Vec::new();
    let mut seq = 0;
    for (protocol, number, state) in [
        (Protocol::Tcp, IPPROTO_TCP, TCP_LISTEN),
        (Protocol::Udp, IPPROTO_UDP, TCP_CLOSE),
    ] {
        for family in [libc_af(AddressFamily::Inet), libc_af(AddressFamily::Inet6)] {
            seq += 1;
            sendto(
                fd.as_raw_fd(),
                &request(seq, family, number, state),
                &NetlinkAddr::new(0, 0),
                MsgFlags::empty(),
            )?;
            read_dump(fd.as_raw_fd(), protocol, &mut found)?;
        }
    }
    Ok(found)
}

fn libc_af(af: AddressFamily) -> u8 {
    af as i32 as u8
}

/// `nlmsghdr` + `inet_diag_req_v2` asking for every socket of one family, protocol and state.
fn request(seq: u32, family: u8, protocol: u8, state: u32) -> Vec<u8> {
    let len = HEADER + 56;
    let mut m = Vec::with_capacity(len);
    m.extend((len as u32).to_ne_bytes());
    m.extend(SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    m.extend((NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    m.extend(seq.to_ne_bytes());
    m.extend(0u32.to_ne_bytes());
    m.extend([family, protocol, 0, 0]);
    m.extend((1u32 << state).to_ne_bytes());
    m.resize(len, 0); // the socket id: all wildcards
    m
}

fn read_dump(fd: i32, protocol: Protocol, found: &mut Vec<Socket>) -> std::io::Result<()> {
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        let n = recv(fd, &mut buf, MsgFlags::empty())?;
        let mut at = 0;
        while at + HEADER <= n {
            let len = u32::from_ne_bytes(buf[at..at + 4].try_into().unwrap()) as usize;
            let kind = u16::from_ne_bytes(buf[at + 4..at + 6].try_into().unwrap());
            if len < HEADER || at + len > n {
                return Err(std::io::Error::other("truncated sock_diag message"));
            }
            match kind {
                NLMSG_DONE => return Ok(()),
                NLMSG_ERROR => {
                    let code = i32::from_ne_bytes(buf[at + 16..at + 20].try_into().unwrap());
                    return Err(std::io::Error::from_raw_os_error(-code));
                }
                SOCK_DIAG_BY_FAMILY if len >= HEADER + MSG_LEN => {
                    if let Some(s) = parse(&buf[at + HEADER..at + len], protocol) {
                        found.push(s);
                    }
                }
                _ => {}
            }
            at += (len + 3) & !3;
        }
        if n == 0 {
            return Ok(());
        }
    }
}

/// One `inet_diag_msg`: the source port (big-endian) and address of the socket id, inode.
fn parse(msg: &[u8], protocol: Protocol) -> Option<Socket> {
    let family = msg[0];
    let port = u16::from_be_bytes([msg[4], msg[5]]);
    let src = &msg[8..24];
    let addr = if family == libc_af(AddressFamily::Inet) {
        IpAddr::V4(Ipv4Addr::new(src[0], src[1], src[2], src[3]))
    } else {
        let v6 = Ipv6Addr::from(<[u8; 16]>::try_from(src).ok()?);
        v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
    };
    let inode = u32::from_ne_bytes(msg[68..72].try_into().ok()?);
    Some(Socket {
        protocol,
        addr,
        port,
        inode: u64::from(inode),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_listener_of_this_process() {
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let udp = std::net::UdpSocket::bind("[::1]:0").unwrap();
        let found = listening().unwrap();
        let tcp_port = tcp.local_addr().unwrap().port();
        let udp_port = udp.local_addr().unwrap().port();
        assert!(found.iter().any(|s| s.protocol == Protocol::Tcp
            && s.port == tcp_port
            && s.addr == IpAddr::from([127, 0, 0, 1])
            && s.inode > 0));
        assert!(found.iter().any(|s| s.protocol == Protocol::Udp
            && s.port == udp_port
            && s.addr == "::1".parse::<IpAddr>().unwrap()));
    }
}
