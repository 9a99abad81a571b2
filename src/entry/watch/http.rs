//! `--metrics-address ADDR:PORT`: watch's counters served as `GET /metrics` (the Prometheus
//! text format, version 0.0.4) for deployments where no textfile collector reads a file (a
//! container). HTTP/1.0 by hand, one request per connection, on a thread of its own that
//! answers from a snapshot the loop publishes after each reconcile ([`Served`]): the loop
//! never waits for a client. Each exchange is bounded by [`EXCHANGE`], so a slow or idle
//! client delays only the requests behind it.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long one client may take to send its request and read the answer.
pub const EXCHANGE: Duration = Duration::from_millis(250);
/// The longest request head read.
const HEAD: usize = 8 * 1024;

/// The exposition as last published by the loop, read by the serving thread.
pub type Served = Arc<Mutex<String>>;

/// Listen on `address` and answer `GET /metrics` from the returned snapshot, on a thread of
/// its own (it inherits the caller's blocked signals: they stay the loop's).
pub fn spawn(address: SocketAddr) -> io::Result<Served> {
    let listener = TcpListener::bind(address)?;
    let served: Served = Arc::default();
    let snapshot = served.clone();
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || serve(&listener, &snapshot))?;
    Ok(served)
}

/// Answer the connections on `listener`, one after another, for as long as the process runs.
fn serve(listener: &TcpListener, served: &Mutex<String>) {
    let body = || match served.lock() {
        Ok(text) => text.clone(),
        Err(poisoned) => poisoned.into_inner().clone(),
    };
    for stream in listener.incoming() {
        match stream {
            Ok(stream) => {
                let peer = stream.peer_addr().ok();
                if let Err(e) = exchange(stream, &body) {
                    log::debug!("metrics request from {peer:?}: {e}");
                }
            }
            Err(e) => {
                log::debug!("accepting a metrics request: {e}");
                // EMFILE and the like: not a busy loop.
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

fn exchange(mut stream: TcpStream, body: &impl Fn() -> String) -> io::Result<()> {
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
