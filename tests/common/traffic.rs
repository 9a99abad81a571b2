//! Reply servers and one-shot clients, each running inside a namespace.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use nix::sys::socket::{
    self, AddressFamily, Backlog, SockFlag, SockType, SockaddrStorage, sockopt,
};

use super::netns::{enter_netns, in_netns, try_in_netns};

/// Servers stop by themselves after this long.
pub const SERVER_LIFETIME: Duration = Duration::from_secs(300);

#[derive(Clone, Copy, Debug)]
enum Proto {
    Tcp,
    Udp,
}

/// A TCP or UDP reply server running in a namespace. Dropping it stops it
/// (within ~100 ms) and joins its thread; it also stops by itself after
/// [`SERVER_LIFETIME`].
pub struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Server {
    /// The bound address (with the real port if 0 was requested).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops the server and waits for it (same as dropping it).
    pub fn stop(self) {}
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(handle) = self.handle.take()
            && handle.join().is_err()
        {
            eprintln!("warning: server thread for {} panicked", self.addr);
        }
    }
}

/// Creates a bound (and for TCP listening) socket. IPv6 sockets are V6ONLY so
/// that `0.0.0.0:p` and `[::]:p` servers can coexist.
fn bind_socket(addr: SocketAddr, proto: Proto) -> io::Result<OwnedFd> {
    let family = if addr.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    let ty = match proto {
        Proto::Tcp => SockType::Stream,
        Proto::Udp => SockType::Datagram,
    };
    let fd = socket::socket(family, ty, SockFlag::SOCK_CLOEXEC, None)?;
    socket::setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    if addr.is_ipv6() {
        socket::setsockopt(&fd, sockopt::Ipv6V6Only, &true)?;
    }
    socket::bind(fd.as_raw_fd(), &SockaddrStorage::from(addr))?;
    if let Proto::Tcp = proto {
        socket::listen(&fd, Backlog::new(128)?)?;
    }
    Ok(fd)
}

fn answer_tcp(mut stream: TcpStream, reply: &[u8]) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_write_timeout(Some(Duration::from_secs(2)));
    if stream.write_all(reply).is_err() {
        return;
    }
    let _ = stream.shutdown(Shutdown::Write);
    // Drain whatever the client sent so that closing does not turn into a RST
    // that could destroy the reply in flight.
    let _ = stream.set_read_timeout(Some(Duration::from_millis(100)));
    let until = Instant::now() + Duration::from_secs(1);
    let mut buf = [0u8; 4096];
    while Instant::now() < until {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
}

fn tcp_loop(listener: TcpListener, reply: &[u8], stop: &AtomicBool, deadline: Instant) {
    if let Err(e) = listener.set_nonblocking(true) {
        eprintln!("serve_tcp: set_nonblocking: {e}");
        return;
    }
    while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
        match listener.accept() {
            Ok((stream, _)) => answer_tcp(stream, reply),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                if e.kind() != io::ErrorKind::WouldBlock {
                    eprintln!("serve_tcp: accept: {e}");
                }
                thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

fn udp_loop(sock: UdpSocket, reply: &[u8], stop: &AtomicBool, deadline: Instant) {
    if let Err(e) = sock.set_read_timeout(Some(Duration::from_millis(100))) {
        eprintln!("serve_udp: set_read_timeout: {e}");
        return;
    }
    let mut buf = vec![0u8; 65536];
    while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
        match sock.recv_from(&mut buf) {
            Ok((_, peer)) => {
                if let Err(e) = sock.send_to(reply, peer) {
                    eprintln!("serve_udp: send_to {peer}: {e}");
                }
            }
            Err(e) if is_timeout(&e) => {}
            // e.g. ECONNREFUSED left over from an earlier reply's ICMP error.
            Err(_) => thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// A socket read that timed out (or was interrupted): try again.
fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

fn spawn_server(ns: &str, addr: SocketAddr, reply: &str, proto: Proto) -> Server {
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel::<io::Result<SocketAddr>>();
    let thread_ns = ns.to_string();
    let thread_stop = Arc::clone(&stop);
    let reply = reply.as_bytes().to_vec();
    let handle = thread::Builder::new()
        .name(format!("{proto:?}-server-{ns}-{addr}"))
        .spawn(move || {
            let deadline = Instant::now() + SERVER_LIFETIME;
            let fd = match enter_netns(&thread_ns).and_then(|()| bind_socket(addr, proto)) {
                Ok(fd) => fd,
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            match proto {
                Proto::Tcp => {
                    let listener = TcpListener::from(fd);
                    let _ = tx.send(listener.local_addr());
                    tcp_loop(listener, &reply, &thread_stop, deadline);
                }
                Proto::Udp => {
                    let sock = UdpSocket::from(fd);
                    let _ = tx.send(sock.local_addr());
                    udp_loop(sock, &reply, &thread_stop, deadline);
                }
            }
        })
        .unwrap_or_else(|e| panic!("cannot spawn server thread: {e}"));
    let what = match proto {
        Proto::Tcp => "serve_tcp",
        Proto::Udp => "serve_udp",
    };
    match rx.recv() {
        Ok(Ok(bound)) => Server {
            addr: bound,
            stop,
            handle: Some(handle),
        },
        Ok(Err(e)) => {
            let _ = handle.join();
            panic!("{what}({ns}, {addr}): {e}");
        }
        Err(_) => {
            let _ = handle.join();
            panic!("{what}({ns}, {addr}): server thread died during setup");
        }
    }
}

/// TCP server in `ns` on `addr` answering every connection with `reply`, then
/// closing. Listening when this returns.
pub fn serve_tcp(ns: &str, addr: SocketAddr, reply: &str) -> Server {
    spawn_server(ns, addr, reply, Proto::Tcp)
}

/// UDP server in `ns` on `addr` answering every datagram with `reply`. Bound
/// when this returns.
pub fn serve_udp(ns: &str, addr: SocketAddr, reply: &str) -> Server {
    spawn_server(ns, addr, reply, Proto::Udp)
}

fn nonzero(d: Duration) -> Duration {
    d.max(Duration::from_millis(1))
}

/// From namespace `ns`: connects to `dst` and reads until EOF. `timeout`
/// bounds the connect and each read.
pub fn tcp_request(ns: &str, dst: SocketAddr, timeout: Duration) -> io::Result<String> {
    try_in_netns(ns, move || {
        let deadline = Instant::now() + timeout;
        let mut stream = TcpStream::connect_timeout(&dst, nonzero(timeout))?;
        stream.set_read_timeout(Some(nonzero(
            deadline.saturating_duration_since(Instant::now()),
        )))?;
        let mut out = String::new();
        stream.read_to_string(&mut out)?;
        Ok(out)
    })
}

/// From namespace `ns`: sends "ping" to `dst` and returns the first reply.
/// Resends (from a fresh socket, hence a fresh source port and conntrack
/// entry) a few times within `timeout`; returns `TimedOut` if nothing came
/// back, or the socket error at once (e.g. `ConnectionRefused` on an ICMP
/// port-unreachable).
pub fn udp_request(ns: &str, dst: SocketAddr, timeout: Duration) -> io::Result<String> {
    try_in_netns(ns, move || {
        let deadline = Instant::now() + timeout;
        let attempt = (timeout / 5).clamp(Duration::from_millis(100), Duration::from_secs(1));
        let local: SocketAddr = if dst.is_ipv4() {
            (Ipv4Addr::UNSPECIFIED, 0).into()
        } else {
            (Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let mut buf = vec![0u8; 65536];
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no UDP reply from {dst} within {timeout:?}"),
                ));
            }
            let sock = UdpSocket::bind(local)?;
            sock.connect(dst)?;
            sock.send(b"ping")?;
            sock.set_read_timeout(Some(nonzero(attempt.min(deadline - now))))?;
            match sock.recv(&mut buf) {
                Ok(n) => return Ok(String::from_utf8_lossy(&buf[..n]).into_owned()),
                Err(e) if is_timeout(&e) => {}
                Err(e) => return Err(e),
            }
        }
    })
}

/// A UDP client thread in a namespace: sends "ping" from one fixed source every 100 ms and
/// records each reply with the time it came. Stopped (and joined) by [`UdpClient::stop`] or
/// when dropped; it also gives up by itself after a minute.
pub struct UdpClient {
    stop: Arc<AtomicBool>,
    replies: Arc<Mutex<Vec<(Instant, String)>>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl UdpClient {
    pub fn start(ns: &str, src: SocketAddr, dst: SocketAddr) -> UdpClient {
        let stop = Arc::new(AtomicBool::new(false));
        let replies = Arc::new(Mutex::new(Vec::new()));
        let (ns, flag, log) = (ns.to_string(), stop.clone(), replies.clone());
        let (ready_tx, ready) = std::sync::mpsc::channel::<io::Result<()>>();
        let thread = thread::spawn(move || {
            let sock = match in_netns_socket(&ns, src, dst) {
                Ok(sock) => {
                    let _ = ready_tx.send(Ok(()));
                    sock
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let give_up = Instant::now() + Duration::from_secs(60);
            let mut buf = [0u8; 512];
            while !flag.load(Ordering::SeqCst) && Instant::now() < give_up {
                let tick = Instant::now() + Duration::from_millis(100);
                let _ = sock.send(b"ping");
                while let Some(left) = tick.checked_duration_since(Instant::now()) {
                    let _ = sock.set_read_timeout(Some(left.max(Duration::from_millis(1))));
                    match sock.recv(&mut buf) {
                        Ok(n) => {
                            let reply = String::from_utf8_lossy(&buf[..n]).into_owned();
                            log.lock().unwrap().push((Instant::now(), reply));
                        }
                        Err(_) => break,
                    }
                }
                if let Some(left) = tick.checked_duration_since(Instant::now()) {
                    thread::sleep(left);
                }
            }
        });
        ready
            .recv()
            .expect("client thread started")
            .unwrap_or_else(|e| panic!("client socket: {e}"));
        UdpClient {
            stop,
            replies,
            thread: Some(thread),
        }
    }

    pub fn replies(&self) -> Vec<(Instant, String)> {
        self.replies.lock().unwrap().clone()
    }

    pub fn replies_since(&self, t: Instant) -> Vec<String> {
        let all = self.replies();
        all.into_iter()
            .filter(|(at, _)| *at >= t)
            .map(|(_, r)| r)
            .collect()
    }

    /// When the first reply `want` at or after `since` came, waiting up to `timeout`.
    pub fn wait_for(&self, want: &str, since: Instant, timeout: Duration) -> Option<Instant> {
        let deadline = since + timeout;
        loop {
            let first = self
                .replies()
                .into_iter()
                .find(|(at, r)| *at >= since && r == want)
                .map(|(at, _)| at);
            if first.is_some() || Instant::now() >= deadline {
                return first;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for UdpClient {
    fn drop(&mut self) {
        self.halt();
    }
}

/// A UDP socket bound to `src` and connected to `dst`, made inside `ns` (the socket stays in
/// that namespace whichever thread uses it).
pub fn in_netns_socket(ns: &str, src: SocketAddr, dst: SocketAddr) -> io::Result<UdpSocket> {
    let ns = ns.to_string();
    in_netns(&ns, move || {
        let sock = UdpSocket::bind(src)?;
        sock.connect(dst)?;
        Ok(sock)
    })
}
