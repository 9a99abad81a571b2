//! `--metrics-address ADDR:PORT`: watch's counters served as `GET /metrics` (the Prometheus
//! text format, version 0.0.4) for deployments where no textfile collector reads a file (a
//! container). HTTP/1.0 by hand, one request per connection, answered inside watch's loop:
//! the listener is one more descriptor of its `poll(2)`, and each exchange is bounded by
//! [`EXCHANGE`], so a slow client delays a signal by at most that.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// How long one client may take to send its request and read the answer.
pub const EXCHANGE: Duration = Duration::from_millis(250);
/// The longest request head read.
const HEAD: usize = 8 * 1024;
/// At most this many connections answered per wake-up.
const PER_WAKE: usize = 16;

/// The listening socket, non-blocking.
pub fn listen(address: SocketAddr) -> io::Result<TcpListener> {
    let listener = TcpListener::bind(address)?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Answer the connections waiting on `listener` with `body()` for `GET /metrics`.
pub fn serve(listener: &TcpListener, body: impl Fn() -> String) {
    for _ in 0..PER_WAKE {
        match listener.accept() {
            Ok((stream, peer)) => {
                if let Err(e) = exchange(stream, &body) {
                    log::debug!("metrics request from {peer}: {e}");
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) => {
                log::debug!("accepting a metrics request: {e}");
                return;
            }
        }
    }
}

fn exchange(mut stream: TcpStream, body: &impl Fn() -> String) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    let deadline = Instant::now() + EXCHANGE;
    let left = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        stream.set_read_timeout(Some(left()))?;
        let n = stream.read(&mut buf)?;
        if n == 0 || head.len() + n > HEAD {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let answer = respond(&String::from_utf8_lossy(&head), body);
    stream.set_write_timeout(Some(left()))?;
    stream.write_all(&answer)?;
    stream.flush()
}

/// The whole answer to a request whose head is `head`.
pub fn respond(head: &str, body: &impl Fn() -> String) -> Vec<u8> {
    let line = head.lines().next().unwrap_or("");
    let mut words = line.split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, kind, text, allow) = match (method, path) {
        ("GET" | "HEAD", "/metrics") => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            body(),
            false,
        ),
        ("GET" | "HEAD", _) => (
            "404 Not Found",
            "text/plain",
            "natledger watch serves /metrics\n".into(),
            false,
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "GET /metrics\n".into(),
            true,
        ),
    };
    let mut out = format!(
        "HTTP/1.0 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n",
        text.len()
    );
    if allow {
        out.push_str("Allow: GET, HEAD\r\n");
    }
    out.push_str("\r\n");
    if method != "HEAD" {
        out.push_str(&text);
    }
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(head: &str) -> String {
        String::from_utf8(respond(head, &|| "natledger_x 1\n".to_string())).unwrap()
    }

    #[test]
    fn get_metrics_is_the_exposition_and_anything_else_is_refused() {
        let ok = answer("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.0 200 OK\r\n"), "{ok}");
        assert!(ok.contains("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
        assert!(ok.contains("Content-Length: 14\r\n"), "{ok}");
        assert!(ok.ends_with("\r\n\r\nnatledger_x 1\n"), "{ok}");
        assert!(answer("GET /metrics?x=1 HTTP/1.0\r\n\r\n").starts_with("HTTP/1.0 200"));
        let head = answer("HEAD /metrics HTTP/1.1\r\n\r\n");
        assert!(head.ends_with("Connection: close\r\n\r\n"), "{head}");
        assert!(answer("GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.0 404"));
        let post = answer("POST /metrics HTTP/1.1\r\n\r\n");
        assert!(post.starts_with("HTTP/1.0 405") && post.contains("Allow: GET, HEAD"));
        assert!(answer("").starts_with("HTTP/1.0 405"));
    }
}
