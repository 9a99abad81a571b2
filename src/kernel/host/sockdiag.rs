//! Listening sockets from the kernel's sock_diag netlink interface (`NETLINK_SOCK_DIAG`,
//! `SOCK_DIAG_BY_FAMILY` dumps filtered by socket state).
//!
//! Reading `/proc/net/tcp` walks the whole established-connection hash table, which the
//! kernel sizes by memory: several milliseconds per read even in an empty namespace, on the
//! create-runtime path of every container. A dump filtered to listening sockets walks only
//! the listening table. Sockets of the calling thread's network namespace.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use nix::sys::socket::{AddressFamily, SockProtocol};

use crate::kernel::netlink::{self, HEADER, NLM_F_DUMP, NLM_F_REQUEST};
use crate::model::portspec::Protocol;

const SOCK_DIAG_BY_FAMILY: u16 = 20;
const TCP_LISTEN: u32 = 10;
/// Unconnected UDP sockets are in TCP_CLOSE.
const TCP_CLOSE: u32 = 7;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
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
    let mut sock = netlink::Socket::open(SockProtocol::NetlinkSockDiag)?;
    let mut found = Vec::new();
    for (protocol, number, state) in [
        (Protocol::Tcp, IPPROTO_TCP, TCP_LISTEN),
        (Protocol::Udp, IPPROTO_UDP, TCP_CLOSE),
    ] {
        for family in [libc_af(AddressFamily::Inet), libc_af(AddressFamily::Inet6)] {
            let seq = sock.next_seq();
            sock.dump(seq, &request(seq, family, number, state), |message| {
                if message.kind == SOCK_DIAG_BY_FAMILY
                    && message.payload.len() >= MSG_LEN
                    && let Some(s) = parse(message.payload, protocol)
                {
                    found.push(s);
                }
                Ok(())
            })?;
        }
    }
    Ok(found)
}

fn libc_af(af: AddressFamily) -> u8 {
    af as i32 as u8
}

/// `nlmsghdr` + `inet_diag_req_v2` asking for every socket of one family, protocol and state.
fn request(seq: u32, family: u8, protocol: u8, state: u32) -> Vec<u8> {
    let mut m = Vec::with_capacity(HEADER + 56);
    let start = netlink::begin(&mut m, SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, seq);
    m.extend([family, protocol, 0, 0]);
    m.extend((1u32 << state).to_ne_bytes());
    m.resize(HEADER + 56, 0); // the socket id: all wildcards
    netlink::finish(&mut m, start);
    m
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
