//! `--metrics-address ADDR:PORT`: watch's counters served as `GET /metrics` (the Prometheus
//! text format, version 0.0.4) for deployments where no textfile collector reads a file (a
//! container), and `GET /healthz` for a liveness probe: 200 while the loop has ticked within
//! [`Served`]'s bound, 503 once it has not (a wedged loop). HTTP/1.0 by hand, one request per
//! connection, on a thread of its own that answers from a snapshot the loop publishes after
//! each reconcile and the time of its last tick: the loop never waits for a client. Each
//! exchange is bounded by [`EXCHANGE`], so a slow or idle client delays only the requests
//! behind it.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long one client may take to send its request and read the answer.
pub const EXCHANGE: Duration = Duration::from_millis(250);
/// The longest request head read.
const HEAD: usize = 8 * 1024;

/// What the loop publishes and the serving thread reads: the exposition as last published,
/// and when the loop last ticked.
#[derive(Debug)]
pub struct Served {
    metrics: Mutex<String>,
    start: Instant,
    /// Milliseconds from `start` to the loop's last tick.
    tick: AtomicU64,
    /// A loop silent longer than this is wedged.
    bound: Duration,
}

impl Served {
    pub fn new(bound: Duration) -> Served {
        Served {
            metrics: Mutex::default(),
            start: Instant::now(),
            tick: AtomicU64::new(0),
            bound,
        }
    }

    /// The exposition the next `GET /metrics` answers.
    pub fn show(&self, text: String) {
        match self.metrics.lock() {
            Ok(mut snapshot) => *snapshot = text,
            Err(poisoned) => *poisoned.into_inner() = text,
        }
    }

    /// The loop is alive now.
    pub fn tick(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.tick.store(ms, Ordering::Relaxed);
    }

    fn body(&self) -> String {
        match self.metrics.lock() {
            Ok(text) => text.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn health(&self) -> Health {
        let ticked = Duration::from_millis(self.tick.load(Ordering::Relaxed));
        let silent = self.start.elapsed().saturating_sub(ticked);
        Health {
            silent,
            bound: self.bound,
        }
    }
}

/// How long the loop has been silent, against its bound.
#[derive(Clone, Copy, Debug)]
pub struct Health {
    pub silent: Duration,
    pub bound: Duration,
}

impl Health {
    fn ok(&self) -> bool {
        self.silent <= self.bound
    }
}

/// Listen on `address` and answer from `served`, on a thread of its own (it inherits the
/// caller's blocked signals: they stay the loop's).
pub fn spawn(address: SocketAddr, served: Arc<Served>) -> io::Result<()> {
    let listener = TcpListener::bind(address)?;
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || serve(&listener, &served))?;
    Ok(())
}

/// Answer the connections on `listener`, one after another, for as long as the process runs.
fn serve(listener: &TcpListener, served: &Served) {
    for stream in listener.incoming() {
        match stream {
            Ok(stream) => {
                let peer = stream.peer_addr().ok();
                if let Err(e) = exchange(stream, served) {
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

fn exchange(mut stream: TcpStream, served: &Served) -> io::Result<()> {
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
    let answer = respond(&String::from_utf8_lossy(&head), &|| served.body(), &|| {
        served.health()
    });
    stream.set_write_timeout(Some(left()))?;
    stream.write_all(&answer)?;
    stream.flush()
}

/// The whole answer to a request whose head is `head`.
pub fn respond(head: &str, body: &impl Fn() -> String, health: &impl Fn() -> Health) -> Vec<u8> {
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
        ("GET" | "HEAD", "/healthz") => {
            let h = health();
            let (status, text) = if h.ok() {
                ("200 OK", "ok: the watch loop ticked".to_string())
            } else {
                (
                    "503 Service Unavailable",
                    "the watch loop is stuck: no tick".into(),
                )
            };
            let text = format!(
                "{text} {} ms ago (bound {} ms)\n",
                h.silent.as_millis(),
                h.bound.as_millis()
            );
            (status, "text/plain", text, false)
        }
        ("GET" | "HEAD", _) => (
            "404 Not Found",
            "text/plain",
            "natledger watch serves /metrics and /healthz\n".into(),
            false,
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "GET /metrics or /healthz\n".into(),
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
        let health = || Health {
            silent: Duration::from_millis(400),
            bound: Duration::from_secs(65),
        };
        String::from_utf8(respond(head, &|| "natledger_x 1\n".to_string(), &health)).unwrap()
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
        assert!(answer("POST /healthz HTTP/1.1\r\n\r\n").starts_with("HTTP/1.0 405"));
    }

    #[test]
    fn healthz_is_200_while_the_loop_ticked_within_its_bound_503_after() {
        let ask = |silent_ms: u64| {
            let health = || Health {
                silent: Duration::from_millis(silent_ms),
                bound: Duration::from_secs(65),
            };
            let got = respond("GET /healthz HTTP/1.1\r\n\r\n", &String::new, &health);
            String::from_utf8(got).unwrap()
        };
        let ok = ask(400);
        assert!(ok.starts_with("HTTP/1.0 200 OK\r\n"), "{ok}");
        assert!(
            ok.ends_with("ok: the watch loop ticked 400 ms ago (bound 65000 ms)\n"),
            "{ok}"
        );
        assert!(ask(65_000).starts_with("HTTP/1.0 200"));
        let stuck = ask(65_001);
        assert!(
            stuck.starts_with("HTTP/1.0 503 Service Unavailable\r\n"),
            "{stuck}"
        );
        assert!(stuck.contains("stuck"), "{stuck}");
    }

    #[test]
    fn served_health_follows_the_ticks() {
        let served = Served::new(Duration::from_millis(30));
        served.tick();
        assert!(served.health().ok());
        std::thread::sleep(Duration::from_millis(60));
        assert!(!served.health().ok(), "{:?}", served.health());
        served.tick();
        assert!(served.health().ok());
        served.show("x 1\n".into());
        assert_eq!(served.body(), "x 1\n");
    }
}
