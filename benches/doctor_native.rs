//! Benchmark: `natledger doctor` over a kube-proxy nftables-mode ruleset of 20,000 set and
//! map elements, live over netlink in a namespace of its own and from the same ruleset saved
//! as `nft list ruleset` text and `nft -j list ruleset` JSON (`--from nftables:FILE`).
//!
//! The ruleset is shaped as kube-proxy's nftables mode writes it (`table ip kube-proxy`, as
//! kubernetes' pkg/proxy/nftables/proxier_test.go expects it; the fixtures'
//! `tests/fixtures/nftables/kube_proxy_*.nft`): per ClusterIP service an element in
//! `cluster-ips` and in the `service-ips` verdict map, a service chain picking one of two
//! endpoint chains by `numgen random mod 2`, each endpoint chain a DNAT; every tenth service
//! also a NodePort (`service-nodeports` element and an external chain); every hundredth
//! without endpoints (`no-endpoint-services`, and for a NodePort `no-endpoint-nodeports`,
//! going to `reject-chain`). Services are added until the elements reach BENCH_ELEMENTS.
//!
//! Prints, per case: elements and rules, findings, the median wall time of BENCH_RUNS runs
//! (default 5) of the bench-profile binary and the peak resident set size of one run
//! (`/usr/bin/time -f %M`), live twice (with the node's address; in a namespace whose only
//! address is lo's, where doctor knows no host address, as from a dump), a run the budget
//! cut short marked; for reference, how long `nft -f` took to load the ruleset and
//! `nft list ruleset` / `nft -j list ruleset` to print it.
//!
//! `cargo bench --bench doctor_native` (env BENCH_ELEMENTS, a comma list, default 20000;
//! BENCH_RUNS; BENCH_TIMEOUT, seconds a doctor run may take, default 300). Needs root (a network namespace of its own; the machine's own ruleset is
//! never read or changed).

mod common;

use std::fmt::Write as _;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{BIN, env_or, median, netns};

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let runs: usize = env_or("BENCH_RUNS", "5").parse().unwrap();
    let sizes: Vec<usize> = env_or("BENCH_ELEMENTS", "20000")
        .split(',')
        .map(|n| n.trim().parse().unwrap())
        .collect();
    println!("natledger doctor over kube-proxy's nftables mode, {runs} runs, median");
    println!(
        "{:>8} {:>6} {:>9} | {:<22} {:>8} {:>10} {:>9}",
        "elements", "rules", "services", "case", "findings", "doctor ms", "peak MiB"
    );
    for target in sizes {
        let (ruleset, elements, rules, services) = kube_ruleset(target);
        let dir = tempfile::tempdir().unwrap();
        let ns = netns(format!("nlbench-nd{}", std::process::id()));
        // The node's address (the one element of @nodeport-ips), as on a real node: doctor
        // sends its packets to the host's own addresses.
        ns.ip(&[
            "link", "add", "eth0", "type", "veth", "peer", "name", "eth1",
        ])
        .and_then(|_| ns.link_up("eth0", &["10.99.0.1/24"]))
        .unwrap_or_else(|e| panic!("{e}"));
        let text_path = dir.path().join("ruleset.nft");
        std::fs::write(&text_path, &ruleset).unwrap();
        let start = Instant::now();
        in_ns(ns.name(), "nft", &["-f", text_path.to_str().unwrap()]);
        let load = start.elapsed();
        // The same ruleset where the only address is lo's: doctor knows no host address, as
        // from a dump.
        let lo_only = netns(format!("nlbench-nl{}", std::process::id()));
        in_ns(lo_only.name(), "nft", &["-f", text_path.to_str().unwrap()]);
        let start = Instant::now();
        let listed = in_ns(ns.name(), "nft", &["list", "ruleset"]);
        let list_text = start.elapsed();
        let start = Instant::now();
        let listed_json = in_ns(ns.name(), "nft", &["-j", "list", "ruleset"]);
        let list_json = start.elapsed();
        let saved_text = dir.path().join("saved.txt");
        let saved_json = dir.path().join("saved.json");
        std::fs::write(&saved_text, listed).unwrap();
        std::fs::write(&saved_json, listed_json).unwrap();
        let state = dir.path().join("state");
        let from_text = format!("nftables:{}", saved_text.display());
        let from_json = format!("nftables:{}", saved_json.display());
        let cases: [(&str, Option<&str>, Vec<&str>); 4] = [
            (
                "live (netlink, netns)",
                Some(ns.name()),
                vec!["doctor", "--json"],
            ),
            (
                "live, only lo",
                Some(lo_only.name()),
                vec!["doctor", "--json"],
            ),
            (
                "--from nft list text",
                None,
                vec!["doctor", "--json", "--from", &from_text],
            ),
            (
                "--from nft -j JSON",
                None,
                vec!["doctor", "--json", "--from", &from_json],
            ),
        ];
        for (name, netns, args) in cases {
            let mut times = Vec::new();
            let mut findings = 0;
            let mut peak_kib = 0;
            let mut cut = false;
            for _ in 0..runs {
                let Some((took, report, kib)) = timed(netns, &state, &args) else {
                    println!(
                        "{elements:>8} {rules:>6} {services:>9} | {name:<22} gave no report within {} s",
                        env_or("BENCH_TIMEOUT", "300")
                    );
                    break;
                };
                times.push(took);
                findings = report["findings"].as_array().map_or(0, Vec::len);
                cut = report["findings"].as_array().is_some_and(|fs| {
                    fs.iter().any(|f| {
                        f["summary"]
                            .as_str()
                            .is_some_and(|s| s.contains("too large"))
                    })
                });
                peak_kib = peak_kib.max(kib);
                let read = report["rules_read"].as_u64().unwrap_or(0) as usize;
                assert!(read >= rules, "{name}: read {read} of {rules} rules");
            }
            if times.is_empty() {
                continue;
            }
            println!(
                "{elements:>8} {rules:>6} {services:>9} | {name:<22} {findings:>8} {:>10.1} {:>9.1}{}",
                median(times),
                peak_kib as f64 / 1024.0,
                if cut {
                    "  (cut short by the budget)"
                } else {
                    ""
                }
            );
        }
        println!(
            "  reference: nft -f {:.0} ms, nft list ruleset {:.0} ms, nft -j list ruleset {:.0} ms",
            ms(load),
            ms(list_text),
            ms(list_json)
        );
    }
}

/// `natledger ARGS` (in `netns`, when given) under `/usr/bin/time -f %M`: the wall time, the
/// JSON report and the peak resident set size in KiB; `None` when it ran past BENCH_TIMEOUT
/// seconds (default 300) and was killed.
fn timed(
    netns: Option<&str>,
    state: &std::path::Path,
    args: &[&str],
) -> Option<(Duration, serde_json::Value, u64)> {
    let mut argv: Vec<String> = Vec::new();
    if let Some(ns) = netns {
        argv.extend(["ip", "netns", "exec", ns].map(String::from));
    }
    let limit = env_or("BENCH_TIMEOUT", "300");
    argv.extend(["timeout", limit.as_str(), "/usr/bin/time", "-f", "%M", BIN].map(String::from));
    argv.extend(args.iter().map(|a| a.to_string()));
    let start = Instant::now();
    let out = Command::new(&argv[0])
        .args(&argv[1..])
        .env("NATLEDGER_STATE_DIR", state)
        .output()
        .expect("run natledger");
    let took = start.elapsed();
    if out.status.code() == Some(124) {
        return None;
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let kib = stderr
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("no peak RSS from /usr/bin/time: {stderr}"));
    let report = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{args:?}: no JSON ({e}): {stderr}"));
    Some((took, report, kib))
}

fn in_ns(ns: &str, program: &str, args: &[&str]) -> Vec<u8> {
    let mut all = vec!["netns", "exec", ns, program];
    all.extend_from_slice(args);
    common::run("ip", &all, None).stdout
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// A kube-proxy nftables-mode ruleset with at least `target` elements: the text, its
/// element, rule and service counts.
fn kube_ruleset(target: usize) -> (String, usize, usize, usize) {
    let mut cluster_ips = Vec::new();
    let mut service_ips = Vec::new();
    let mut service_nodeports = Vec::new();
    let mut no_endpoint_services = Vec::new();
    let mut no_endpoint_nodeports = Vec::new();
    let mut chains = String::new();
    let mut rules = 0;
    let mut i = 0;
    let count = |a: &Vec<String>, b: &Vec<String>, c: &Vec<String>, d, e| {
        a.len() + b.len() + c.len() + d + e
    };
    while count(
        &cluster_ips,
        &service_ips,
        &service_nodeports,
        no_endpoint_services.len(),
        no_endpoint_nodeports.len(),
    ) < target
    {
        let ip = format!("172.30.{}.{}", i / 250, i % 250 + 1);
        let name = format!("ns{}/svc{i}/tcp/p80", i % 50);
        let hash = format!("{:08X}", (i as u64).wrapping_mul(2_654_435_761) as u32);
        let port = [80, 443, 8080, 53, 9090][i % 5];
        let node_port = (i % 10 == 0).then(|| 30_000 + (i / 10) % 2_768);
        cluster_ips.push(ip.clone());
        if i % 100 == 50 {
            no_endpoint_services.push(format!(
                "{ip} . tcp . {port} comment \"{name}\" : goto reject-chain"
            ));
            if let Some(np) = node_port {
                no_endpoint_nodeports
                    .push(format!("tcp . {np} comment \"{name}\" : goto reject-chain"));
            }
            i += 1;
            continue;
        }
        let svc = format!("service-{hash}-{name}");
        let eps: Vec<String> = (0..2)
            .map(|e| format!("10.{}.{}.{}", 180 + e, (i / 250) % 256, i % 250 + 1))
            .collect();
        let ep_chains: Vec<String> = eps
            .iter()
            .map(|ep| format!("endpoint-{hash}-{name}__{ep}/{port}"))
            .collect();
        let _ = writeln!(
            chains,
            "\tchain {svc} {{\n\t\tip daddr {ip} ip saddr != 10.0.0.0/8 jump mark-for-masquerade\n\
             \t\tnumgen random mod 2 vmap {{ 0 : goto {}, 1 : goto {} }}\n\t}}\n",
            ep_chains[0], ep_chains[1]
        );
        rules += 2;
        for (ep, chain) in eps.iter().zip(&ep_chains) {
            let _ = writeln!(
                chains,
                "\tchain {chain} {{\n\t\tip saddr {ep} jump mark-for-masquerade\n\
                 \t\tmeta l4proto tcp dnat to {ep}:{port}\n\t}}\n"
            );
            rules += 2;
        }
        service_ips.push(format!("{ip} . tcp . {port} : goto {svc}"));
        if let Some(np) = node_port {
            let ext = format!("external-{hash}-{name}");
            let _ = writeln!(
                chains,
                "\tchain {ext} {{\n\t\tjump mark-for-masquerade\n\t\tgoto {svc}\n\t}}\n"
            );
            rules += 2;
            service_nodeports.push(format!("tcp . {np} : goto {ext}"));
        }
        i += 1;
    }
    let elements = count(
        &cluster_ips,
        &service_ips,
        &service_nodeports,
        no_endpoint_services.len(),
        no_endpoint_nodeports.len(),
    );
    let elems = |v: &[String]| {
        if v.is_empty() {
            String::new()
        } else {
            format!("\t\telements = {{ {} }}\n", v.join(",\n\t\t\t"))
        }
    };
    let set = |name: &str, ty: &str, v: &[String]| {
        format!("\tset {name} {{\n\t\ttype {ty}\n{}\t}}\n\n", elems(v))
    };
    let map = |name: &str, ty: &str, v: &[String]| {
        format!(
            "\tmap {name} {{\n\t\ttype {ty} : verdict\n{}\t}}\n\n",
            elems(v)
        )
    };
    let base = "\
\tchain filter-input {\n\t\ttype filter hook input priority 0; policy accept;\n\
\t\tct state new jump nodeport-endpoints-check\n\t\tct state new jump service-endpoints-check\n\t}\n\n\
\tchain filter-forward {\n\t\ttype filter hook forward priority 0; policy accept;\n\
\t\tct state new jump service-endpoints-check\n\t}\n\n\
\tchain filter-output {\n\t\ttype filter hook output priority 0; policy accept;\n\
\t\tct state new jump service-endpoints-check\n\t}\n\n\
\tchain nat-prerouting {\n\t\ttype nat hook prerouting priority -100; policy accept;\n\t\tjump services\n\t}\n\n\
\tchain nat-output {\n\t\ttype nat hook output priority -100; policy accept;\n\t\tjump services\n\t}\n\n\
\tchain nat-postrouting {\n\t\ttype nat hook postrouting priority 100; policy accept;\n\t\tjump masquerading\n\t}\n\n\
\tchain mark-for-masquerade {\n\t\tmeta mark set meta mark | 0x00004000\n\t}\n\n\
\tchain masquerading {\n\t\tmeta mark & 0x00004000 == 0x00000000 return\n\
\t\tmeta mark set meta mark ^ 0x00004000\n\t\tmasquerade fully-random\n\t}\n\n\
\tchain nodeport-endpoints-check {\n\
\t\tip daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports\n\t}\n\n\
\tchain service-endpoints-check {\n\
\t\tip daddr . meta l4proto . th dport vmap @no-endpoint-services\n\t}\n\n\
\tchain reject-chain {\n\t\treject\n\t}\n\n\
\tchain services {\n\t\tip daddr . meta l4proto . th dport vmap @service-ips\n\
\t\tip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports\n\t}\n\n";
    rules += 16;
    let text = format!(
        "table ip kube-proxy {{\n\tcomment \"rules for kube-proxy\"\n\n{}{}{}{}{}{}{}{base}{chains}}}\n",
        set("cluster-ips", "ipv4_addr", &cluster_ips),
        set("nodeport-ips", "ipv4_addr", &["10.99.0.1".to_string()]),
        map(
            "service-ips",
            "ipv4_addr . inet_proto . inet_service",
            &service_ips
        ),
        map(
            "service-nodeports",
            "inet_proto . inet_service",
            &service_nodeports
        ),
        map(
            "no-endpoint-services",
            "ipv4_addr . inet_proto . inet_service",
            &no_endpoint_services
        ),
        map(
            "no-endpoint-nodeports",
            "inet_proto . inet_service",
            &no_endpoint_nodeports
        ),
        map("firewall-ips", "ipv4_addr . inet_proto . inet_service", &[]),
    );
    (text, elements + 1, rules, i)
}
