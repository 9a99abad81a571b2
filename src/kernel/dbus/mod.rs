//! A subscription to one signal on the system bus, without libdbus or a crate: a unix socket,
//! SASL `EXTERNAL` (the kernel tells the bus who we are), `Hello`, one `AddMatch`, then the
//! signals the bus routes to us, read when the descriptor is readable. Nothing is sent after
//! the match; nothing but the header of a message is decoded ([`wire`]). Why natledger talks
//! D-Bus itself: docs/design.md.
//!
//! Used by `natledger watch` for firewalld's `Reloaded` signal ([`Subscription::firewalld`]).

pub mod wire;

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::model::echo::Echo;
use wire::{Call, Header, Kind, WireError};

/// The system bus where `DBUS_SYSTEM_BUS_ADDRESS` names none.
pub const SYSTEM_BUS: &str = "/run/dbus/system_bus_socket";

/// firewalld's object, interface and signal after a reload (firewalld's D-Bus API,
/// `firewalld.dbus(5)`): its rules, and every iptables table it flushed, are new.
pub const FIREWALLD_PATH: &str = "/org/fedoraproject/FirewallD1";
pub const FIREWALLD_INTERFACE: &str = "org.fedoraproject.FirewallD1";
pub const RELOADED: &str = "Reloaded";

const BUS_NAME: &str = "org.freedesktop.DBus";
const BUS_PATH: &str = "/org/freedesktop/DBus";
/// The serial of our `AddMatch` (`Hello` is 1).
const ADD_MATCH: u32 = 2;
/// The most one [`Subscription::drain`] reads.
const DRAIN: usize = 256 * 1024;

/// The socket path of a D-Bus server address (`unix:path=/run/dbus/system_bus_socket`, or
/// several `;`-separated, the first `unix:path=` taken; values `%`-escaped). Other
/// transports (`unix:abstract=`, `tcp:`) are not spoken: `None`.
pub fn socket_path(address: &str) -> Option<PathBuf> {
    address.split(';').find_map(|entry| {
        let keys = entry.strip_prefix("unix:")?;
        let path = keys.split(',').find_map(|kv| kv.strip_prefix("path="))?;
        unescape(path).map(PathBuf::from)
    })
}

fn unescape(value: &str) -> Option<String> {
    let mut out = Vec::with_capacity(value.len());
    let mut bytes = value.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let hex = [bytes.next()?, bytes.next()?];
            out.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
        } else {
            out.push(b);
        }
    }
    String::from_utf8(out).ok().filter(|s| !s.is_empty())
}

#[derive(Debug, thiserror::Error)]
pub enum BusError {
    #[error("connecting to the system bus at {path}")]
    Connect { path: PathBuf, source: io::Error },
    #[error("talking to the system bus at {path}")]
    Io { path: PathBuf, source: io::Error },
    #[error("the system bus at {path} answered nothing within {} ms", .within.as_millis())]
    Timeout { path: PathBuf, within: Duration },
    #[error("the system bus at {path} refused SASL EXTERNAL: {reply}")]
    Auth { path: PathBuf, reply: Echo },
    #[error("the system bus at {path} refused the match rule: {name}")]
    Match { path: PathBuf, name: Echo },
    #[error("reading the system bus at {path}")]
    Wire { path: PathBuf, source: WireError },
    #[error("the system bus at {path} closed the connection")]
    Closed { path: PathBuf },
}

/// A connection to a bus, subscribed to one signal.
pub struct Subscription {
    stream: UnixStream,
    path: PathBuf,
    /// Bytes read and not yet a whole message.
    buf: Vec<u8>,
    signal: (&'static str, &'static str, &'static str),
}

impl Subscription {
    /// Subscribed to firewalld's `Reloaded` signal on the bus at `path`, the handshake
    /// bounded by `within`.
    pub fn firewalld(path: &Path, within: Duration) -> Result<Subscription, BusError> {
        Subscription::open(
            path,
            (FIREWALLD_PATH, FIREWALLD_INTERFACE, RELOADED),
            within,
        )
    }

    fn open(
        path: &Path,
        signal: (&'static str, &'static str, &'static str),
        within: Duration,
    ) -> Result<Subscription, BusError> {
        let stream = connect(path).map_err(|source| BusError::Connect {
            path: path.to_path_buf(),
            source,
        })?;
        let mut sub = Subscription {
            stream,
            path: path.to_path_buf(),
            buf: Vec::new(),
            signal,
        };
        sub.handshake(Instant::now() + within, within)?;
        sub.stream
            .set_nonblocking(true)
            .map_err(|source| sub.io(source))?;
        Ok(sub)
    }

    fn io(&self, source: io::Error) -> BusError {
        BusError::Io {
            path: self.path.clone(),
            source,
        }
    }

    /// SASL EXTERNAL, then `Hello` and `AddMatch` in one write, then the messages up to the
    /// match's reply.
    fn handshake(&mut self, deadline: Instant, within: Duration) -> Result<(), BusError> {
        let uid = nix::unistd::geteuid().as_raw();
        self.send(auth(uid).as_bytes(), deadline, within)?;
        let line = loop {
            if let Some(end) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line = String::from_utf8_lossy(&self.buf[..end]).into_owned();
                self.buf.drain(..end + 2);
                break line;
            }
            if self.buf.len() > 512 {
                break String::from_utf8_lossy(&self.buf).into_owned();
            }
            self.fill(deadline, within)?;
        };
        if !line.starts_with("OK ") {
            return Err(BusError::Auth {
                path: self.path.clone(),
                reply: Echo::new(line),
            });
        }
        let (object, interface, member) = self.signal;
        let rule =
            format!("type='signal',path='{object}',interface='{interface}',member='{member}'");
        let mut out = b"BEGIN\r\n".to_vec();
        for (serial, member, arg) in [(1, "Hello", None), (ADD_MATCH, "AddMatch", Some(&*rule))] {
            let call = Call {
                serial,
                destination: BUS_NAME,
                path: BUS_PATH,
                interface: BUS_NAME,
                member,
                arg,
            };
            out.extend_from_slice(&call.encode());
        }
        self.send(&out, deadline, within)?;
        loop {
            while let Some(h) = self.next_message()? {
                if h.reply_serial != Some(ADD_MATCH) {
                    continue;
                }
                return match h.kind {
                    Kind::MethodReturn => Ok(()),
                    _ => Err(BusError::Match {
                        path: self.path.clone(),
                        name: Echo::new(h.error_name.unwrap_or_default()),
                    }),
                };
            }
            self.fill(deadline, within)?;
        }
    }

    fn timeout(&self, within: Duration) -> BusError {
        BusError::Timeout {
            path: self.path.clone(),
            within,
        }
    }

    fn send(&mut self, bytes: &[u8], deadline: Instant, within: Duration) -> Result<(), BusError> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(self.timeout(within));
        }
        self.stream
            .set_write_timeout(Some(left))
            .and_then(|()| self.stream.write_all(bytes))
            .map_err(|e| match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => self.timeout(within),
                _ => self.io(e),
            })
    }

    /// One blocking read before `deadline`, appended to the buffer.
    fn fill(&mut self, deadline: Instant, within: Duration) -> Result<(), BusError> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(self.timeout(within));
        }
        let mut chunk = [0u8; 4096];
        let read = self
            .stream
            .set_read_timeout(Some(left))
            .and_then(|()| self.stream.read(&mut chunk));
        match read {
            Ok(0) => Err(BusError::Closed {
                path: self.path.clone(),
            }),
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(()),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Err(self.timeout(within))
            }
            Err(e) => Err(self.io(e)),
        }
    }

    /// The first whole message of the buffer, taken out of it.
    fn next_message(&mut self) -> Result<Option<Header>, BusError> {
        let wire = |source| BusError::Wire {
            path: self.path.clone(),
            source,
        };
        let Some(len) = wire::frame(&self.buf).map_err(wire)? else {
            return Ok(None);
        };
        if self.buf.len() < len {
            return Ok(None);
        }
        let header = wire::header(&self.buf[..len]).map_err(wire);
        self.buf.drain(..len);
        header.map(Some)
    }

    /// What the bus sent since the last call, without blocking, up to [`DRAIN`] bytes (a
    /// sender quicker than the reader leaves the rest for the next call): whether the
    /// signal subscribed to was among it. An error (the bus closed the connection, or sent
    /// what is not D-Bus) ends the subscription.
    pub fn drain(&mut self) -> Result<bool, BusError> {
        let mut seen = false;
        let mut chunk = [0u8; 4096];
        for _ in 0..DRAIN / chunk.len() {
            match self.stream.read(&mut chunk) {
                Ok(0) => {
                    return Err(BusError::Closed {
                        path: self.path.clone(),
                    });
                }
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(seen),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.io(e)),
            }
            let (object, interface, member) = self.signal;
            while let Some(h) = self.next_message()? {
                seen |= h.is_signal(object, interface, member);
            }
        }
        Ok(seen)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl AsFd for Subscription {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.stream.as_fd()
    }
}

/// A stream connected to `path` without waiting: a bus whose backlog is full (a daemon
/// stopped, not dead) is `EAGAIN`, tried again later, never a hung watch. Blocking once
/// connected (the handshake sets its own timeouts).
fn connect(path: &Path) -> io::Result<UnixStream> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, UnixAddr, connect, socket};
    use std::os::fd::AsRawFd;
    let fd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )?;
    connect(fd.as_raw_fd(), &UnixAddr::new(path)?)?;
    let stream = UnixStream::from(fd);
    stream.set_nonblocking(false)?;
    Ok(stream)
}

/// The SASL opening: the nul byte the protocol starts with, then `AUTH EXTERNAL` with the
/// user id as decimal digits, hex-encoded.
fn auth(uid: u32) -> String {
    let hex: String = uid
        .to_string()
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("\0AUTH EXTERNAL {hex}\r\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_socket_path_is_the_first_unix_path_of_the_address() {
        let path = |a: &str| socket_path(a).map(|p| p.display().to_string());
        assert_eq!(
            path("unix:path=/run/dbus/system_bus_socket").as_deref(),
            Some(SYSTEM_BUS)
        );
        assert_eq!(
            path("unix:guid=0123,path=/tmp/a%20b%2cc").as_deref(),
            Some("/tmp/a b,c")
        );
        assert_eq!(
            path("tcp:host=localhost,port=1;unix:path=/x").as_deref(),
            Some("/x")
        );
        for unspoken in [
            "unix:abstract=/tmp/dbus-x",
            "tcp:host=localhost,port=1",
            "unix:path=",
            "unix:path=/a%2",
            "/run/dbus/system_bus_socket",
            "",
        ] {
            assert_eq!(path(unspoken), None, "{unspoken}");
        }
    }

    #[test]
    fn external_authentication_sends_the_uid_in_hex_digits() {
        assert_eq!(auth(0), "\0AUTH EXTERNAL 30\r\n");
        assert_eq!(auth(1000), "\0AUTH EXTERNAL 31303030\r\n");
    }

    /// A scripted bus on a socket pair: the handshake, then a signal of another member and
    /// firewalld's, cut in two; then the bus closes.
    #[test]
    fn the_handshake_and_signals_over_a_socket_pair() {
        let (client, mut bus) = UnixStream::pair().unwrap();
        let mut sub = Subscription {
            stream: client,
            path: PathBuf::from("/test/bus"),
            buf: Vec::new(),
            signal: (FIREWALLD_PATH, FIREWALLD_INTERFACE, RELOADED),
        };
        let server = std::thread::spawn(move || {
            let mut seen = Vec::new();
            let mut chunk = [0u8; 4096];
            while !seen.ends_with(b"\r\n") {
                let n = bus.read(&mut chunk).unwrap();
                seen.extend_from_slice(&chunk[..n]);
            }
            assert!(seen.starts_with(b"\0AUTH EXTERNAL "));
            bus.write_all(b"OK 0123456789abcdef\r\n").unwrap();
            // BEGIN, Hello and AddMatch, then the replies.
            let mut seen = Vec::new();
            while !String::from_utf8_lossy(&seen).contains("member='Reloaded'") {
                let n = bus.read(&mut chunk).unwrap();
                seen.extend_from_slice(&chunk[..n]);
            }
            assert!(seen.starts_with(b"BEGIN\r\n"));
            bus.write_all(&reply(1, 1)).unwrap();
            bus.write_all(&reply(2, 2)).unwrap();
            bus
        });
        sub.handshake(
            Instant::now() + Duration::from_secs(5),
            Duration::from_secs(5),
        )
        .unwrap();
        let mut bus = server.join().unwrap();
        sub.stream.set_nonblocking(true).unwrap();
        assert!(!sub.drain().unwrap());
        let other = signal("Changed");
        bus.write_all(&other).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert!(!sub.drain().unwrap());
        let reloaded = signal(RELOADED);
        bus.write_all(&reloaded[..10]).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert!(!sub.drain().unwrap());
        bus.write_all(&reloaded[10..]).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert!(sub.drain().unwrap());
        drop(bus);
        assert!(matches!(sub.drain(), Err(BusError::Closed { .. })));
    }

    /// A refused authentication, a refused match and a silent bus each end the handshake
    /// with an error naming the bus; none waits past its bound.
    #[test]
    fn refusals_and_silence_end_the_handshake() {
        let try_with = |answer: fn(&mut UnixStream), within: Duration| {
            let (client, mut bus) = UnixStream::pair().unwrap();
            let mut sub = Subscription {
                stream: client,
                path: PathBuf::from("/test/bus"),
                buf: Vec::new(),
                signal: (FIREWALLD_PATH, FIREWALLD_INTERFACE, RELOADED),
            };
            let server = std::thread::spawn(move || {
                answer(&mut bus);
                bus
            });
            let started = Instant::now();
            let result = sub.handshake(Instant::now() + within, within);
            assert!(started.elapsed() < within + Duration::from_millis(500));
            drop(server.join().unwrap());
            result.err().map(|e| e.to_string())
        };
        let rejected = try_with(
            |bus| bus.write_all(b"REJECTED EXTERNAL\r\n").unwrap(),
            Duration::from_secs(5),
        );
        assert_eq!(
            rejected.as_deref(),
            Some("the system bus at /test/bus refused SASL EXTERNAL: \"REJECTED EXTERNAL\"")
        );
        let no_match = try_with(
            |bus| {
                bus.write_all(b"OK 0123\r\n").unwrap();
                let mut error = reply(2, 2);
                error[1] = 3;
                bus.write_all(&error).unwrap();
                // Hold the connection until the client has read the reply.
                std::thread::sleep(Duration::from_millis(200));
            },
            Duration::from_secs(5),
        );
        assert_eq!(
            no_match.as_deref(),
            Some("the system bus at /test/bus refused the match rule: \"\"")
        );
        let silent = try_with(
            |_| std::thread::sleep(Duration::from_millis(400)),
            Duration::from_millis(100),
        );
        assert_eq!(
            silent.as_deref(),
            Some("the system bus at /test/bus answered nothing within 100 ms")
        );
    }

    /// A method return to `serial`, as the bus sends it.
    fn reply(serial: u32, to: u32) -> Vec<u8> {
        let mut m = vec![b'l', 2, 1, 1, 0, 0, 0, 0];
        m.extend_from_slice(&serial.to_le_bytes());
        m.extend_from_slice(&8u32.to_le_bytes());
        m.extend_from_slice(&[5, 1, b'u', 0]);
        m.extend_from_slice(&to.to_le_bytes());
        m
    }

    /// A signal of firewalld's interface: a method call re-kinded (same layout).
    fn signal(member: &str) -> Vec<u8> {
        let mut m = Call {
            serial: 7,
            destination: ":1.1",
            path: FIREWALLD_PATH,
            interface: FIREWALLD_INTERFACE,
            member,
            arg: None,
        }
        .encode();
        m[1] = 4;
        m
    }
}
