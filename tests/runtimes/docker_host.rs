//! A host as Docker leaves it: dockerd 20.10 with its own firewall (docker0, its nat and
//! filter chains, FORWARD policy DROP) in the test's node namespace, writing with the backend
//! under test. A container published by natledger (the wrapper runtime, `-e
//! NATLEDGER_PORTS`) answers from outside beside one Docker publishes itself (`-p`), traffic
//! natledger did not forward stays dropped, natledger's jump sits after Docker's rules, and a
//! container asking for a port Docker already forwards is refused when it says so.
//!
//! On natledger's nftables backend (Docker's firewall then written with iptables-nft), by
//! design natledger writes no forward accept (one in its own table could not override
//! Docker's drop): its container answers on the node's own paths and from outside stays
//! dropped, until the host's firewall accepts DNATed connections in DOCKER-USER; the refusal
//! and the removal are the same.

use std::net::SocketAddr;
use std::time::Duration;

use crate::common::*;

const T: Duration = Duration::from_secs(10);
const DROPPED: Duration = Duration::from_millis(800);

/// `docker run -d OPTIONS IMAGE` of busybox httpd answering `name`.
fn httpd(dockerd: &mut Dockerd, options: &[&str], name: &str) -> Result<String, String> {
    let script = format!("echo {name} > /www/index.html && exec /bin/httpd -f -p 80 -h /www");
    let mut args = vec!["run", "-d"];
    args.extend_from_slice(options);
    args.extend_from_slice(&[IMAGE, "/bin/sh", "-c", &script]);
    let out = dockerd.run(&args);
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() {
        return Err(format!("{}{stdout}", String::from_utf8_lossy(&out.stderr)));
    }
    dockerd.own.ids.push(stdout.clone());
    Ok(stdout)
}

fn get(ns: &str, dst: SocketAddr, timeout: Duration) -> Option<String> {
    http_get(ns, dst, timeout)
        .ok()
        .map(|b| b.trim().to_string())
}

#[test]
fn natledger_beside_dockers_own_firewall() {
    let _suite = crate::one_suite_at_a_time(module_path!());
    both(|backend| {
        let node = Node::new(backend);
        let host = node.topo.node().to_string();
        let ext = node.topo.ext().to_string();
        // As on a fresh host: Docker turns forwarding on, and then sets the policy to DROP.
        run_in(&host, "sysctl", &["-qw", "net.ipv4.ip_forward=0"], None);
        let mut dockerd = Dockerd::start(&node, &DockerdOptions { iptables: true });
        let tarball = image_tarball(node.dir.path());
        dockerd.ok(&["import", &tarball.display().to_string(), IMAGE]);

        // Docker's own published container, and natledger's on the same docker0 bridge.
        httpd(&mut dockerd, &["-p", "8081:80"], "docker-published").unwrap();
        let id = httpd(
            &mut dockerd,
            &["--runtime", "natledger", "-e", "NATLEDGER_PORTS=8080:80"],
            "natledger-published",
        )
        .unwrap();
        let address = dockerd.ok(&["inspect", "--format", "{{.NetworkSettings.IPAddress}}", &id]);
        let dump = node.dump();
        assert!(
            dump.contains(":FORWARD DROP"),
            "{backend:?}: Docker's policy\n{dump}"
        );
        let forward = chain_rules(&dump, firewall_backend(backend), Family::V4, "FORWARD");
        // Docker's rules first, natledger's jump after all of them; none on nftables.
        assert_eq!(
            &forward[..2],
            [
                "-A FORWARD -j DOCKER-USER",
                "-A FORWARD -j DOCKER-ISOLATION-STAGE-1",
            ],
            "{backend:?}:\n{dump}"
        );
        let jump = "-A FORWARD -m comment --comment natledger -j NATLEDGER-FORWARD";
        if backend.is_iptables() {
            assert_eq!(forward.last(), Some(&jump), "{backend:?}:\n{dump}");
        } else {
            assert!(!dump.contains("NATLEDGER-FORWARD"), "{backend:?}:\n{dump}");
        }

        // Docker's answers from outside, through the DROP policy.
        assert_eq!(
            get(&ext, sock(NODE_V4, 8081), T).as_deref(),
            Some("docker-published")
        );
        // natledger's: from outside too on iptables; on nftables only once the host's
        // firewall accepts DNATed connections (where Docker wants its users' rules).
        if !backend.is_iptables() {
            assert_eq!(
                get(&ext, sock(NODE_V4, 8080), DROPPED),
                None,
                "{backend:?}: through Docker's DROP policy without an accept"
            );
            for (what, dst) in [
                ("node localhost", sock(std::net::Ipv4Addr::LOCALHOST, 8080)),
                ("node ip", sock(NODE_V4, 8080)),
            ] {
                assert_eq!(
                    get(&host, dst, T).as_deref(),
                    Some("natledger-published"),
                    "{backend:?}: {what}, not forwarded"
                );
            }
            // doctor names it: natledger's nftables DNAT, dropped by Docker's FORWARD, and
            // what to do (natledger writes no accept on that backend). Clients of other
            // networks arrive on the default route's interface, as on a host: without one,
            // doctor cannot tell `-i docker0` rules from the rest and says nothing.
            run_in(
                &host,
                "ip",
                &["route", "add", "default", "via", "10.78.0.2"],
                None,
            );
            let d = node.natledger(&["doctor", "--json"], "", &[]);
            let report: serde_json::Value = serde_json::from_slice(&d.stdout).unwrap();
            let dropped: Vec<&serde_json::Value> = report["findings"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|f| f["kind"] == "forward-dropped" && f["port"] == 8080)
                .collect();
            assert!(
                !dropped.is_empty(),
                "{backend:?}: doctor is silent:\n{report:#}"
            );
            let fix = dropped[0]["fix"].as_str().unwrap_or_default();
            assert!(
                fix.contains("nftables backend writes no forward accept")
                    && fix.contains("--ctstate DNAT")
                    && fix.contains("DOCKER-USER"),
                "{fix}"
            );
            let accept = [
                "-I",
                "DOCKER-USER",
                "-m",
                "conntrack",
                "--ctstate",
                "DNAT",
                "-j",
                "ACCEPT",
            ];
            let tool = iptables_tool(firewall_backend(backend), Family::V4);
            let out = run_in(&host, tool, &accept, None);
            assert_ok(&out, "the host's DNAT accept in DOCKER-USER");
        }
        assert_eq!(
            get(&ext, sock(NODE_V4, 8080), T).as_deref(),
            Some("natledger-published")
        );
        // Straight to natledger's container, not through its forward: still dropped.
        let direct: SocketAddr = format!("{address}:80").parse().unwrap();
        run_in(
            &ext,
            "ip",
            &["route", "add", "172.17.0.0/16", "via", "10.78.0.1"],
            None,
        );
        assert_eq!(
            get(&ext, direct, DROPPED),
            None,
            "{backend:?}: {direct} reached"
        );

        // doctor finds nothing wrong with either forward now (on nftables, the host accepts
        // DNATed connections in DOCKER-USER).
        let d = node.natledger(&["doctor", "--json"], "", &[]);
        let report: serde_json::Value = serde_json::from_slice(&d.stdout).unwrap();
        let dropped: Vec<&serde_json::Value> = report["findings"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["kind"] == "forward-dropped")
            .collect();
        assert!(dropped.is_empty(), "{backend:?}: {dropped:#?}");

        // Docker already forwards 8081: a container that says so is refused, and Docker's
        // port keeps answering.
        let refused = httpd(
            &mut dockerd,
            &[
                "--runtime",
                "natledger",
                "-e",
                "NATLEDGER_PORTS=8081:80",
                "-e",
                "NATLEDGER_PORT_CONFLICT=refuse",
            ],
            "refused",
        );
        let err = refused.expect_err("a start over Docker's forward was refused");
        assert!(
            err.contains("host port 8081:80/tcp is already forwarded by another owner's rule")
                && err.contains("nat chain DOCKER")
                && err.contains("docker-proxy (pid"),
            "{backend:?}: {err}"
        );
        assert_eq!(
            get(&ext, sock(NODE_V4, 8081), T).as_deref(),
            Some("docker-published")
        );

        // docker rm -f: natledger's rules go; Docker's stay.
        dockerd.ok(&["rm", "--force", &id]);
        assert_removed(&node, &id, T);
        let dump = node.dump();
        assert!(!dump.contains("natledger:"), "{dump}");
        assert!(dump.contains("--dport 8081 -j DNAT"), "{dump}");
        assert_eq!(get(&ext, sock(NODE_V4, 8080), DROPPED), None);
        assert_eq!(get(&host, sock(NODE_V4, 8080), DROPPED), None);
    });
}
