//! How much one container may ask for (issue 22, item 2), with the real binary in private
//! network namespaces, every backend, full dumps before and after, TCP to the container:
//!
//! - `cni_add_of_every_port_one_by_one_is_one_range`: a CNI ADD of 65,535 consecutive
//!   `portMappings` is recorded as one range mapping (a small manifest), forwards, passes
//!   CHECK (the same mappings; other ones are named), and DEL restores the dumps, each step
//!   within seconds;
//! - `cni_add_of_65535_scattered_mappings_is_refused`: the same count with nothing to merge,
//!   and 900 dual-stack mappings (4,500 rules or more), are refused with an error object (code 7)
//!   naming the limit, writing nothing;
//! - `annotation_of_every_port_is_one_range_and_scattered_ones_are_refused`: the same through
//!   `io.natledger.ports` (create-runtime, `list`, poststop);
//! - `the_largest_container_allowed_does_not_hold_up_another`: 1,025 mappings refused; 1,024
//!   (4,096 rules on iptables) created, checked and deleted while another container is
//!   created and deleted: each step's time printed, the other waits at most a few seconds.

use std::process::Output;
use std::time::Duration;

use crate::common::*;
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(3);
const CID: &str = "b0a1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1";

fn error_object(out: &Output) -> Value {
    assert!(!out.status.success(), "expected a failure: {}", stderr(out));
    serde_json::from_slice(&out.stdout).expect("an error object on stdout")
}

#[test]
fn cni_add_of_every_port_one_by_one_is_one_range() {
    let _suite = crate::one_suite_at_a_time(module_path!());
    both(|backend| {
        let mut node = Node::new(backend);
        let c = node.topo.add_container(2);
        let _server = serve_tcp(&c.ns, c.sock_v4(80), "c2");
        node.warm_up();
        let before = node.dump();
        let config = bounds_config(&node, &c, port_mappings(|p| p, 1..=65535, None));

        let (out, add) = cni_timed(&node, "ADD", CID, &c, &config, 60);
        assert_ok(&out, "ADD of 65,535 mappings");
        let id = format!("{CID}+eth0");
        let manifest = node.manifest(&id);
        assert_eq!(
            manifest["mappings"],
            json!([{"host_ports": {"start": 1, "end": 65535},
                    "container_ports": {"start": 1, "end": 65535}, "protocol": "tcp"}]),
            "{backend:?}: one range mapping"
        );
        let size = manifest_size(&node, &id);
        assert!(size < 64 << 10, "{backend:?}: a manifest of {size} bytes");
        let ext = node.topo.ext().to_string();
        assert_eq!(
            tcp_request(&ext, sock(NODE_V4, 80), T).ok().as_deref(),
            Some("c2"),
            "{backend:?}: port 80 of the range forwards"
        );

        let (out, check) = cni_timed(&node, "CHECK", CID, &c, &config, 60);
        assert_ok(&out, "CHECK with the mappings of the ADD");
        let mut other = config.clone();
        other["runtimeConfig"]["portMappings"] = json!(port_mappings(|p| p, 1..=65534, None));
        let (out, _) = cni_timed(&node, "CHECK", CID, &c, &other, 60);
        let error = error_object(&out);
        let details = error["details"].as_str().unwrap();
        assert!(
            details.contains("1-65535:1-65535/tcp installed, CHECK asks for 1-65534:1-65534/tcp"),
            "{details}"
        );

        let (out, del) = cni_timed(&node, "DEL", CID, &c, &config, 60);
        assert_ok(&out, "DEL");
        println!(
            "{backend:?}: 65,535 consecutive mappings: ADD {:.2} s, manifest {size} B, CHECK \
             {:.2} s, DEL {:.2} s",
            add.as_secs_f64(),
            check.as_secs_f64(),
            del.as_secs_f64()
        );
        for (step, took) in [("ADD", add), ("CHECK", check), ("DEL", del)] {
            assert!(
                took < Duration::from_secs(20),
                "{backend:?}: {step} took {took:?}"
            );
        }
        assert!(node.manifests().is_empty());
        assert_eq!(node.dump(), before, "{backend:?}: DEL restores the tables");
    });
}

#[test]
fn cni_add_of_65535_scattered_mappings_is_refused() {
    let _suite = crate::one_suite_at_a_time(module_path!());
    both(|backend| {
        let mut node = Node::new(backend);
        let c = node.topo.add_container(2);
        node.warm_up();
        let before = node.dump();
        for (what, mappings, says) in [
            (
                "65,535 mappings, none consecutive",
                port_mappings(|p| 65535 - p + 1, 1..=65535, None),
                "65535 port mappings are 65535 once consecutive ports are merged into \
                 ranges, more than the 1024",
            ),
            (
                // 6,300 rules on iptables, 4,500 on nftables.
                "900 dual-stack mappings",
                port_mappings(|p| p + 1, (1..=900).map(|p| p * 2), None),
                "900 port mapping(s) need",
            ),
        ] {
            let config = bounds_config(&node, &c, mappings);
            let (out, took) = cni_timed(&node, "ADD", CID, &c, &config, 60);
            let error = error_object(&out);
            assert_eq!(error["code"], 7, "{backend:?} {what}: {error}");
            assert_eq!(error["msg"], "too many port mappings", "{error}");
            let details = error["details"].as_str().unwrap();
            assert!(details.contains(says), "{backend:?} {what}: {details}");
            println!(
                "{backend:?}: {what}: refused in {:.2} s",
                took.as_secs_f64()
            );
            assert!(took < Duration::from_secs(10), "{what}: {took:?}");
            assert!(node.manifests().is_empty(), "{what}: no manifest");
            assert_eq!(node.dump(), before, "{backend:?} {what}: nothing written");
        }
    });
}

#[test]
fn annotation_of_every_port_is_one_range_and_scattered_ones_are_refused() {
    let _suite = crate::one_suite_at_a_time(module_path!());
    both(|backend| {
        let mut node = Node::new(backend);
        let c = node.topo.add_container(2);
        let _server = serve_tcp(&c.ns, c.sock_v4(80), "c2");
        let pid = node.topo.spawn_sleeper(&c.ns);
        node.warm_up();
        let before = node.dump();
        let hook = |id: &str, spec: &str| {
            let bundle = node.bundle(id, &[("io.natledger.ports", spec)]);
            let state = json!({"ociVersion": "1.0.2", "id": id, "status": "creating",
                               "pid": pid, "bundle": bundle});
            timed(
                &node,
                &["hook", "create-runtime"],
                &state.to_string(),
                &[],
                60,
            )
        };

        let scattered: Vec<String> = (1..=65535u32)
            .map(|p| format!("{p}:{}", 65536 - p))
            .collect();
        let (out, took) = hook("c1", &scattered.join(","));
        assert!(!out.status.success(), "{backend:?}: scattered accepted");
        let err = stderr(&out);
        assert!(
            err.contains("container c1 asks for more than natledger records per container")
                && err.contains("65535 port mappings are 65535 once consecutive ports are merged"),
            "{err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
        println!(
            "{backend:?}: annotation of 65,535 scattered: refused in {:.2} s",
            took.as_secs_f64()
        );
        assert!(took < Duration::from_secs(10), "{took:?}");
        assert!(node.manifests().is_empty());
        assert_eq!(node.dump(), before, "{backend:?}: nothing written");

        let every: Vec<String> = (1..=65535u32).map(|p| format!("{p}:{p}")).collect();
        let (out, create) = hook("c1", &every.join(","));
        assert_ok(&out, "create of 65,535 consecutive mappings");
        let size = manifest_size(&node, "c1");
        assert!(size < 64 << 10, "{backend:?}: a manifest of {size} bytes");
        let list = node.natledger(&["list"], "", &[]);
        assert_ok(&list, "list");
        assert!(
            String::from_utf8_lossy(&list.stdout).contains("1-65535:1-65535/tcp"),
            "{}",
            String::from_utf8_lossy(&list.stdout)
        );
        let ext = node.topo.ext().to_string();
        assert_eq!(
            tcp_request(&ext, sock(NODE_V4, 80), T).ok().as_deref(),
            Some("c2"),
            "{backend:?}: port 80 of the range forwards"
        );
        let bundle = node.dir.path().join("bundles").join("c1");
        // The poststop of the container created with `pid`, which still runs here (a stale
        // poststop, naming no pid, would change nothing).
        let state = json!({"ociVersion": "1.0.2", "id": "c1", "status": "stopped",
                           "pid": pid, "bundle": bundle});
        let (out, stop) = timed(&node, &["hook", "poststop"], &state.to_string(), &[], 60);
        assert_ok(&out, "poststop");
        println!(
            "{backend:?}: annotation of 65,535 consecutive: create {:.2} s, manifest {size} B, \
             poststop {:.2} s",
            create.as_secs_f64(),
            stop.as_secs_f64()
        );
        assert!(create < Duration::from_secs(20) && stop < Duration::from_secs(20));
        assert!(node.manifests().is_empty());
        assert_eq!(
            node.dump(),
            before,
            "{backend:?}: poststop restores the tables"
        );
    });
}

#[test]
fn the_largest_container_allowed_does_not_hold_up_another() {
    let _suite = crate::one_suite_at_a_time(module_path!());
    both(|backend| {
        let mut node = Node::new(backend);
        let big = node.topo.add_container(2);
        let small = node.topo.add_container(3);
        let _server = serve_tcp(&small.ns, small.sock_v4(80), "c3");
        node.warm_up();
        let before = node.dump();
        // 1,024 mappings on IPv4 only, none consecutive: 4,096 rules on iptables (3,072 on
        // nftables, which writes no forward accept).
        let ports = |n: u16| (1..=n).map(|p| p * 2 + 10000);
        let one_more = bounds_config(
            &node,
            &big,
            port_mappings(|p| p + 1, ports(1025), Some("0.0.0.0")),
        );
        let (out, _) = cni_timed(&node, "ADD", CID, &big, &one_more, 60);
        assert_eq!(
            error_object(&out)["code"],
            7,
            "{backend:?}: 1,025 mappings refused"
        );
        assert_eq!(node.dump(), before);
        let mappings = port_mappings(|p| p + 1, ports(1024), Some("0.0.0.0"));
        let big_config = bounds_config(&node, &big, mappings);
        let small_config = bounds_config(
            &node,
            &small,
            port_mappings(|_| 80, [8080].into_iter(), None),
        );
        let (add, small_add) = std::thread::scope(|s| {
            let add = s.spawn(|| cni_timed(&node, "ADD", CID, &big, &big_config, 60));
            std::thread::sleep(Duration::from_millis(100));
            let small_add = cni_timed(&node, "ADD", "small", &small, &small_config, 60);
            (add.join().unwrap(), small_add)
        });
        assert_ok(&add.0, "ADD of the largest container");
        assert_ok(&small_add.0, "ADD of another container meanwhile");
        let id = format!("{CID}+eth0");
        let rules = node.manifest(&id)["rules"].as_array().unwrap().len();
        assert_eq!(rules, if backend.is_iptables() { 4096 } else { 3072 });
        let size = manifest_size(&node, &id);
        let ext = node.topo.ext().to_string();
        assert_eq!(
            tcp_request(&ext, sock(NODE_V4, 8080), T).ok().as_deref(),
            Some("c3")
        );

        let (out, check) = cni_timed(&node, "CHECK", CID, &big, &big_config, 60);
        assert_ok(&out, "CHECK");
        let (del, small_again) = std::thread::scope(|s| {
            let del = s.spawn(|| cni_timed(&node, "DEL", CID, &big, &big_config, 60));
            std::thread::sleep(Duration::from_millis(50));
            let small_del = cni_timed(&node, "DEL", "small", &small, &small_config, 60);
            assert_ok(&small_del.0, "DEL of the other container");
            let small_add = cni_timed(&node, "ADD", "small", &small, &small_config, 60);
            (del.join().unwrap(), small_add)
        });
        assert_ok(&del.0, "DEL of the largest container");
        assert_ok(&small_again.0, "ADD of the other container again");
        println!(
            "{backend:?}: {rules} rules, manifest {size} B: ADD {:.2} s (another ADD meanwhile \
             {:.2} s), CHECK {:.2} s, DEL {:.2} s (another DEL + ADD meanwhile {:.2} s)",
            add.1.as_secs_f64(),
            small_add.1.as_secs_f64(),
            check.as_secs_f64(),
            del.1.as_secs_f64(),
            small_again.1.as_secs_f64()
        );
        assert!(size < 4 << 20, "{backend:?}: a manifest of {size} bytes");
        for (step, took) in [
            ("ADD", add.1),
            ("CHECK", check),
            ("DEL", del.1),
            ("the other ADD", small_add.1),
        ] {
            assert!(
                took < Duration::from_secs(10),
                "{backend:?}: {step} took {took:?}"
            );
        }
        let (out, _) = cni_timed(&node, "DEL", "small", &small, &small_config, 60);
        assert_ok(&out, "DEL");
        assert!(node.manifests().is_empty());
        assert_eq!(node.dump(), before, "{backend:?}: the tables restored");
    });
}
