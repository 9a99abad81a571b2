//! `natledger selftest`: proof on this host that natledger works here, without touching the
//! host's own rules. It creates three network namespaces (a node, a container and an external
//! client, wired by veth pairs, private addresses), and for each backend runs the real
//! operations in the node namespace, whose filter FORWARD policy it sets to DROP as Docker
//! does: create-runtime installs the rules (IPv4 and IPv6), a forwarded port answers over TCP
//! from the node's address, from 127.0.0.1 and from the external client (through the DROP
//! policy), poststop leaves the nat and filter tables exactly as they were, and
//! `sweep --all` removes the rest. The namespaces and state directories are removed at the
//! end, whatever happened.
//!
//! ```text
//!   natledger-selftest-<pid>-ext        natledger-selftest-<pid>-node               natledger-selftest-<pid>-ctr
//!   eth0 10.253.1.2/30  <--veth-->  nlst1 10.253.1.1/30, fd54::1/64
//!        fd54::2/64                 nlst0 10.253.0.1/30, fd53::1/64  <--veth-->  eth0 10.253.0.2/30, fd53::2/64
//!   TCP client                      rules: host port 18080 -> :80                TCP server on :80
//!                                   FORWARD policy DROP
//! ```

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::backend::{Backend, Detected, Netfilter, Plan, Reading};
use crate::entry::settings::Settings;
use crate::kernel::named_netns::{NamedNetns, NamedNetnsError};
use crate::kernel::netns::in_namespace;
use crate::model::family::Family;
use crate::model::layout::{FILTER, INPUT_CHAIN, TABLES, shared_rules};
use crate::model::oci::{HookInput, IP_ANNOTATION, PORTS_ANNOTATION, State};
use crate::model::rule::Rule;
use crate::model::save::{Batch, Dump, Op, rule_line};
use crate::ops::{self, Context, Created, SweepOptions};
use crate::state::ledger::Ledger;

const NODE_V4: &str = "10.253.0.1";
const CTR_V4: &str = "10.253.0.2";
const NODE_V6: &str = "fd53::1";
const CTR_V6: &str = "fd53::2";
/// The node's addresses towards the external client.
const UPLINK_V4: &str = "10.253.1.1";
const UPLINK_V6: &str = "fd54::1";
const HOST_PORT: u16 = 18080;
const REPLY: &[u8] = b"natledger selftest\n";
const TIMEOUT: Duration = Duration::from_secs(3);

/// One check's outcome: `Ok(what was seen)` or `Err(what went wrong)`.
pub struct Check {
    pub name: String,
    pub result: Result<String, String>,
}

/// Run every check (the tools found and run under `settings`' host root), reporting each as
/// it completes. True when all passed.
pub fn run(settings: &Settings, chosen: &Detected, report: &mut dyn FnMut(&Check)) -> bool {
    let mut ok = true;
    let mut check = |name: String, result: Result<String, String>| {
        ok &= result.is_ok();
        report(&Check { name, result });
    };
    check(
        "backend".into(),
        Ok(format!("{} for new rules: {}", chosen.backend, chosen.how)),
    );
    let pair = match Pair::create() {
        Ok(pair) => {
            check(
                "namespaces".into(),
                Ok(format!(
                    "{}, {} and {}",
                    pair.node.name(),
                    pair.ctr.name(),
                    pair.ext.name()
                )),
            );
            pair
        }
        Err(e) => {
            check("namespaces".into(), Err(e));
            return false;
        }
    };
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let server = s.spawn(|| in_namespace(&pair.ctr.path(), || serve(&stop)));
        // Every backend this host can write: the iptables ones whose tools are installed,
        // and natledger's own nftables tables, which need none.
        let usable = Backend::ALL.into_iter().filter(|b| {
            !b.is_iptables()
                || crate::backend::tool(settings.host(), *b, Family::Ipv4, "restore").is_ok()
        });
        for backend in usable {
            let ext = pair.ext.path();
            let checks = in_namespace(&pair.node.path(), || {
                backend_checks(settings, backend, &ext)
            });
            match checks {
                Ok(list) => list.into_iter().for_each(|(n, r)| check(n, r)),
                Err(e) => check(format!("{backend}"), Err(crate::causes::text(&e))),
            }
        }
        stop.store(true, Ordering::Relaxed);
        match server.join() {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => check("server".into(), Err(e)),
            Ok(Err(e)) => check("server".into(), Err(crate::causes::text(&e))),
            Err(_) => check("server".into(), Err("the server thread panicked".into())),
        }
    });
    ok
}

/// The checks for one backend, run inside the node namespace; `ext` is the external client's
/// namespace.
fn backend_checks(
    settings: &Settings,
    backend: Backend,
    ext: &Path,
) -> Vec<(String, Result<String, String>)> {
    let mut out = Vec::new();
    let state_dir = PathBuf::from(format!(
        "/run/natledger-selftest-{}-{backend}",
        std::process::id()
    ));
    let (runner, machine) = (settings.runner(), settings.machine());
    let ctx = Context::new(
        Ledger::new(&state_dir),
        backend,
        Netfilter::new(&runner),
        &machine,
    );

    // A host with Docker, or a hardened one: forwarded packets are dropped unless accepted.
    // (Not in natledger's own nftables table: it writes no forward accept, see
    // `crate::kernel::nftables::own`, and a drop there would be natledger's own doing.)
    let forward_drop = backend.is_iptables();
    let policy = Family::ALL
        .iter()
        .filter(|_| forward_drop)
        .try_for_each(|f| forward_policy(&ctx, *f, "DROP"));
    // The first container creates the shared chains and jumps, which stay by design.
    let warm = policy
        .and_then(|()| create(&ctx, "selftest-warmup"))
        .and_then(|_| poststop(&ctx, "selftest-warmup"));
    let before = warm.and_then(|()| dump(&ctx));
    let result = before
        .and_then(|before| container_checks(&ctx, backend, ext, forward_drop, &before, &mut out));
    match result {
        Ok(verdict) => out.push((named(backend, "poststop"), verdict)),
        Err(e) => out.push((named(backend, "hooks"), Err(e))),
    }
    // Back to ACCEPT: the kernel runs both backends' FORWARD chains, so a DROP left here
    // would drop what the other backend accepts.
    for f in Family::ALL.iter().filter(|_| forward_drop) {
        let _ = forward_policy(&ctx, *f, "ACCEPT");
    }
    out.push((named(backend, "sweep --all"), sweep_all(&ctx)));
    let _ = std::fs::remove_dir_all(&state_dir);
    out
}

/// A check's name: `BACKEND: WHAT`.
fn named(backend: Backend, what: &str) -> String {
    format!("{backend}: {what}")
}

/// Sets the policy of `family`'s filter FORWARD chain on `backend`.
fn forward_policy(ctx: &Context, family: Family, policy: &str) -> Result<(), String> {
    let mut batch = Batch::new(FILTER);
    batch.ops.push(Op::Policy("FORWARD".into(), policy.into()));
    (ctx.driver)
        .apply_plan(&ctx.netfilter, family, &Plan::batch(&batch))
        .map_err(|e| crate::causes::text(&e))
}

/// One container's life, `before` its tables: create-runtime, the guard, the requests from
/// the node and from outside (each a check in `out`), poststop; the verdict on the tables
/// after, or why the hooks failed.
fn container_checks(
    ctx: &Context,
    backend: Backend,
    ext: &Path,
    forward_drop: bool,
    before: &[Option<Dump>],
    out: &mut Vec<(String, Result<String, String>)>,
) -> Result<Result<String, String>, String> {
    let name = |what: &str| named(backend, what);
    let rules = create(ctx, "selftest")?;
    out.push((
        name("create-runtime"),
        Ok(format!("{rules} rule(s) installed, IPv4 and IPv6")),
    ));
    out.push((name("localhost guard"), guarded(ctx, backend)));
    for addr in [
        format!("{NODE_V4}:{HOST_PORT}"),
        format!("[{NODE_V6}]:{HOST_PORT}"),
        format!("127.0.0.1:{HOST_PORT}"),
    ] {
        out.push((name(&format!("tcp to {addr}")), request(&addr)));
    }
    for addr in [
        format!("{UPLINK_V4}:{HOST_PORT}"),
        format!("[{UPLINK_V6}]:{HOST_PORT}"),
    ] {
        let answer = in_namespace(ext, || request(&addr))
            .unwrap_or_else(|e| Err(crate::causes::text(&e)))
            .map(|a| match forward_drop {
                true => format!("{a}, through FORWARD policy DROP"),
                false => a,
            });
        out.push((name(&format!("tcp from outside to {addr}")), answer));
    }
    poststop(ctx, "selftest")?;
    let after = dump(ctx)?;
    Ok(if after == before {
        Ok("the nat and filter tables are as they were".to_string())
    } else {
        Err("the nat and filter tables differ from before the container".to_string())
    })
}

/// `sweep --all`: natledger's chains and jumps removed.
fn sweep_all(ctx: &Context) -> Result<String, String> {
    let swept = ops::sweep(
        ctx,
        &SweepOptions {
            all: true,
            ..SweepOptions::default()
        },
    );
    match swept {
        Ok(report) if report.ok() => Ok("natledger's chains and jumps removed".into()),
        Ok(report) => Err(report.errors.join("; ")),
        Err(e) => Err(crate::causes::text(&e)),
    }
}

fn create(ctx: &Context, id: &str) -> Result<usize, String> {
    // This process stands for the container's (a createRuntime state always has a pid); its
    // poststop names it, so the rules go while it runs.
    let input = HookInput {
        id: id.parse().map_err(|e| format!("{e}"))?,
        pid: Some(std::process::id() as i32),
        bundle: None,
        annotations: HashMap::from([
            (PORTS_ANNOTATION.to_string(), format!("{HOST_PORT}:80")),
            (IP_ANNOTATION.to_string(), format!("{CTR_V4},{CTR_V6}")),
        ]),
    };
    match ops::create_runtime(ctx, &input).map_err(|e| crate::causes::text(&e))? {
        Created::Installed { rules } => Ok(rules),
        Created::Skipped => Err("create-runtime did nothing".into()),
    }
}

fn poststop(ctx: &Context, id: &str) -> Result<(), String> {
    let state = State {
        id: id.to_string(),
        status: "stopped".into(),
        pid: Some(std::process::id() as i32),
        bundle: None,
        annotations: None,
    };
    ops::poststop(ctx, &state)
        .map(drop)
        .map_err(|e| crate::causes::text(&e))
}

/// Whether the localhost guard is in force: the first rule of IPv4 filter INPUT is
/// natledger's jump to its chain, which holds the guard.
fn guarded(ctx: &Context, backend: Backend) -> Result<String, String> {
    let family = Family::Ipv4;
    let table = (ctx.driver)
        .read(&ctx.netfilter, family, FILTER, Reading::Ours)
        .map_err(|e| crate::causes::text(&e))?
        .ok_or("no ipv4 filter table")?;
    let shared = shared_rules(backend, FILTER, family);
    // Each chain starts with its shared rules (the INPUT jump; the guard, which on nftables
    // is two rules), in whatever order they went in.
    for (chain, rule) in shared.iter().filter(|(c, _)| *c != "FORWARD") {
        let count = shared.iter().filter(|(c, _)| c == chain).count();
        let found = table
            .rules_in(chain)
            .take(count)
            .any(|r| Rule::parse_args(&r.args).ok().as_ref() == Some(rule));
        if !found {
            return Err(format!(
                "{chain} does not start with natledger's {}",
                rule_line(chain, &rule.to_args())
            ));
        }
    }
    Ok(format!(
        "filter INPUT jumps first to {INPUT_CHAIN}, which drops packets to 127.0.0.0/8 from \
         outside the host (route_localnet)"
    ))
}

/// Both families' nat and filter tables of one backend.
fn dump(ctx: &Context) -> Result<Vec<Option<Dump>>, String> {
    let mut tables = Vec::new();
    for family in Family::ALL {
        for table in TABLES {
            tables.push(
                (ctx.driver)
                    .read(&ctx.netfilter, family, table, Reading::Ours)
                    .map_err(|e| crate::causes::text(&e))?,
            );
        }
    }
    Ok(tables)
}

fn request(addr: &str) -> Result<String, String> {
    let addr: SocketAddr = addr.parse().map_err(|e| format!("{e}"))?;
    let mut stream =
        TcpStream::connect_timeout(&addr, TIMEOUT).map_err(|e| crate::causes::text(&e))?;
    stream
        .set_read_timeout(Some(TIMEOUT))
        .map_err(|e| crate::causes::text(&e))?;
    let mut reply = Vec::new();
    stream
        .read_to_end(&mut reply)
        .map_err(|e| crate::causes::text(&e))?;
    if reply == REPLY {
        Ok("answered by the container".into())
    } else {
        Err(format!(
            "unexpected reply {:?}",
            String::from_utf8_lossy(&reply)
        ))
    }
}

/// The container's server: answers every connection on port 80 (both families) until `stop`.
fn serve(stop: &AtomicBool) -> Result<(), String> {
    // A typed address, not a string: binding "[::]:80" would link glibc's getaddrinfo (NSS)
    // into the static release build (README, "Speed"); `scripts/build-release.sh` checks.
    let any = SocketAddr::from((Ipv6Addr::UNSPECIFIED, 80));
    let listener = TcpListener::bind(any).map_err(|e| format!("bind {any}: {e}"))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| crate::causes::text(&e))?;
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((mut conn, _)) => {
                let _ = conn.set_nonblocking(false);
                let _ = conn.write_all(REPLY);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(crate::causes::text(&e)),
        }
    }
    Ok(())
}

/// The three namespaces; deleted on drop.
struct Pair {
    node: NamedNetns,
    ctr: NamedNetns,
    ext: NamedNetns,
}

impl Pair {
    fn create() -> Result<Pair, String> {
        let prefix = format!("natledger-selftest-{}", std::process::id());
        let made = |what: &str| NamedNetns::create(format!("{prefix}-{what}"));
        let pair = Pair {
            node: made("node").map_err(|e| crate::causes::text(&e))?,
            ctr: made("ctr").map_err(|e| crate::causes::text(&e))?,
            ext: made("ext").map_err(|e| crate::causes::text(&e))?,
        };
        pair.wire().map_err(|e| crate::causes::text(&e))?;
        Ok(pair)
    }

    /// Forwarding on in the node, and the drawing at the top of this file.
    fn wire(&self) -> Result<(), NamedNetnsError> {
        let (node, ctr, ext) = (&self.node, &self.ctr, &self.ext);
        node.set_sysctls(&[
            ("net/ipv4/ip_forward", "1"),
            ("net/ipv6/conf/all/forwarding", "1"),
        ])?;
        for (link, peer, cidrs, peer_cidrs, gateways) in [
            (
                "nlst1",
                ext,
                ["10.253.1.1/30", "fd54::1/64"],
                ["10.253.1.2/30", "fd54::2/64"],
                [UPLINK_V4, UPLINK_V6],
            ),
            (
                "nlst0",
                ctr,
                ["10.253.0.1/30", "fd53::1/64"],
                ["10.253.0.2/30", "fd53::2/64"],
                [NODE_V4, NODE_V6],
            ),
        ] {
            node.veth_to(link, peer, "eth0")?;
            node.link_up(link, &cidrs)?;
            peer.link_up("eth0", &peer_cidrs)?;
            peer.default_routes(&gateways)?;
        }
        Ok(())
    }
}
