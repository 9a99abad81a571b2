//! DEL, CHECK and GC of attachments natledger has no manifest of (its state directory lost:
//! a tmpfs at reboot, a runtime's DEL after a crash recovery, an operator's `rm`), on every
//! backend: CHECK finds the rules ADD wrote, in the configured backend or another one (and
//! names one deleted by hand), DEL removes every rule tagged with the attachment's ledger id
//! (full dumps as before its ADD, TCP refused and a UDP client that keeps sending
//! unanswered), a second DEL succeeds, and a DEL or a sweep keeps the rules a live hook
//! container's manifest says it shares (a sweep removes them once it is gone); GC leaves every
//! unrecorded attachment's rules, of its network and of another (their DEL removes them),
//! and still removes a recorded stale one. A CNI DEL naming a hook container whose id has an
//! attachment's form changes nothing. A foreign rule in natledger's own chain and another
//! attachment's rules stay throughout.

use std::io::ErrorKind;
use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(3);
const CID: &str = "0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9";

/// A foreign DNAT in natledger's own `NATLEDGER-HOSTPORTS` (untagged: never natledger's) and
/// one in PREROUTING (iptables) or natledger's table's base chain (nftables).
fn load_foreign(node: &Node) {
    if node.backend.is_iptables() {
        let foreign = "*nat\n\
            -A NATLEDGER-HOSTPORTS -p tcp -m tcp --dport 7777 -j DNAT --to-destination 10.77.0.9:80\n\
            -A PREROUTING -p tcp -m tcp --dport 7778 -j DNAT --to-destination 10.77.0.9:80\n\
            COMMIT\n";
        load_rules(node.topo.node(), node.backend, Family::V4, foreign);
    } else {
        let foreign = "add rule ip natledger NATLEDGER-HOSTPORTS tcp dport 7777 dnat to 10.77.0.9:80\n\
            add rule ip natledger PREROUTING tcp dport 7778 dnat to 10.77.0.9:80\n";
        load_nft(node.topo.node(), foreign);
    }
}

fn call(node: &Node, command: &str, id: &str, netns: Option<&str>, config: &Value) -> Value {
    let out = cni_call(node, command, id, netns, config);
    if out.status.success() {
        return Value::Null;
    }
    serde_json::from_slice(&out.stdout).expect("an error object on stdout")
}

/// The config without what a runtime that lost its cache has: no runtimeConfig, no prevResult.
fn bare(config: &Value) -> Value {
    let mut bare = config.clone();
    let object = bare.as_object_mut().unwrap();
    object.remove("runtimeConfig");
    object.remove("prevResult");
    bare
}

fn gc(node: &Node, network: &str, valid: &[&str]) -> std::process::Output {
    let valid: Vec<Value> = valid
        .iter()
        .map(|c| json!({"containerID": c, "ifname": "eth0"}))
        .collect();
    let config = json!({
        "cniVersion": "1.1.0", "name": network, "type": "natledger",
        "backend": node.backend.name(), "stateDir": node.state_dir(),
        "cni.dev/valid-attachments": valid,
    });
    node.natledger(
        &[],
        &config.to_string(),
        &[("CNI_COMMAND", "GC"), ("CNI_PATH", "/opt/cni/bin")],
    )
}

/// The manifest lost two ways (the file alone, the whole state directory): CHECK succeeds
/// saying natledger has no manifest, fails naming a rule deleted by hand; DEL without
/// runtimeConfig or prevResult restores the full dumps (the other attachment's rules and the
/// foreign ones stay), TCP is refused and a UDP client that keeps sending gets no reply; a
/// second DEL succeeds; every backend.
#[test]
fn del_and_check_without_a_manifest_act_on_the_attachments_tagged_rules() {
    both(|backend| {
        let mut node = Node::new(backend);
        let c2 = node.topo.add_container(2);
        let c3 = node.topo.add_container(3);
        let netns = format!("/run/netns/{}", c2.ns);
        let _servers = [
            serve_tcp(&c2.ns, c2.sock_v4(80), "c2 tcp"),
            serve_udp(&c2.ns, c2.sock_v4(53), "c2 udp"),
            serve_tcp(&c3.ns, c3.sock_v4(80), "c3"),
        ];
        node.warm_up();
        load_foreign(&node);
        let pristine = node.dump();
        assert_ok(
            &cni_add(&node, "testnet", "other1", &c3, 8081),
            "ADD other1",
        );
        let before = node.dump();
        let mut config = cni_config(&node, "testnet", &c2, 8080);
        config["runtimeConfig"]["portMappings"] = json!([
            {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},
            {"hostPort": 5353, "containerPort": 53, "protocol": "udp"}
        ]);
        let id = format!("{CID}+eth0");
        let ext = node.topo.ext().to_string();
        let other_answers = |when: &str| {
            assert_eq!(
                tcp_request(&ext, sock(NODE_V4, 8081), T).ok().as_deref(),
                Some("c3"),
                "{backend:?}: the other attachment {when}"
            );
        };

        for (round, lose) in ["the manifest", "the state directory"].iter().enumerate() {
            assert_eq!(call(&node, "ADD", CID, Some(&netns), &config), Value::Null);
            let added = node.dump();
            assert!(added.contains(&format!("natledger:{id}")), "{added}");
            assert_eq!(
                tcp_request(&ext, sock(NODE_V4, 8080), T).ok().as_deref(),
                Some("c2 tcp"),
                "{backend:?} {lose}: tcp after ADD"
            );
            let client = UdpClient::start(
                &ext,
                sock(EXT_V4, 40200 + round as u16),
                sock(NODE_V4, 5353),
            );
            assert!(
                client.wait_for("c2 udp", Instant::now(), T).is_some(),
                "{backend:?} {lose}: udp after ADD"
            );
            let manifest = node.manifest(&id);
            let total = manifest["rules"].as_array().unwrap().len();
            if round == 0 {
                std::fs::remove_file(node.state_dir().join(format!("containers/{id}.json")))
                    .unwrap();
            } else {
                std::fs::remove_dir_all(node.state_dir()).unwrap();
            }

            // CHECK: every rule in place, though no manifest says so.
            let out = cni_call(&node, "CHECK", CID, Some(&netns), &config);
            assert_ok(&out, &format!("{backend:?} {lose}: CHECK"));
            assert!(out.stdout.is_empty());
            assert!(stderr(&out).contains("no manifest"), "{}", stderr(&out));
            // Configured for another backend (an earlier ADD had this one): found here.
            for other in Backend::ALL.into_iter().filter(|b| *b != backend) {
                let mut elsewhere = config.clone();
                elsewhere["backend"] = other.name().into();
                let out = cni_call(&node, "CHECK", CID, Some(&netns), &elsewhere);
                assert_ok(
                    &out,
                    &format!("{backend:?} {lose}: CHECK configured {other:?}"),
                );
                let found = format!("{total} rule(s) are in place in {}", backend.name());
                assert!(stderr(&out).contains(&found), "{}", stderr(&out));
            }
            // Someone deletes the IPv4 DNAT: CHECK names it.
            let dnat = manifest["rules"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["family"] == "ipv4" && r["chain"] == "NATLEDGER-HOSTPORTS")
                .expect("an ipv4 DNAT record");
            delete_recorded_rule(node.topo.node(), backend, dnat);
            let error = call(&node, "CHECK", CID, Some(&netns), &config);
            assert_eq!(error["code"], 100, "{error}");
            let details = error["details"].as_str().unwrap();
            for needle in [
                "no manifest".to_string(),
                format!("1 of {total} rule(s) of attachment {id} missing"),
                format!(
                    "first in {} ipv4 nat: -A NATLEDGER-HOSTPORTS",
                    backend.name()
                ),
                "--dport 8080".to_string(),
            ] {
                assert!(details.contains(&needle), "{backend:?}: {details}");
            }
            // Configured for another backend: that one's missing rules are named.
            let other = Backend::ALL.into_iter().find(|b| *b != backend).unwrap();
            let mut elsewhere = config.clone();
            elsewhere["backend"] = other.name().into();
            let error = call(&node, "CHECK", CID, Some(&netns), &elsewhere);
            let details = error["details"].as_str().unwrap();
            assert!(
                details.contains(&format!("first in {} ", other.name())),
                "{backend:?}: {details}"
            );

            // DEL as a runtime that lost its cache sends it: every tagged rule goes.
            assert_eq!(call(&node, "DEL", CID, None, &bare(&config)), Value::Null);
            assert_eq!(node.dump(), before, "{backend:?} {lose}: DEL by tag");
            assert!(!node.manifest_exists(&id), "DEL writes no manifest");
            let refused = tcp_request(&ext, sock(NODE_V4, 8080), T).unwrap_err();
            assert_eq!(refused.kind(), ErrorKind::ConnectionRefused, "{backend:?}");
            let t = Instant::now();
            std::thread::sleep(Duration::from_millis(500));
            assert!(
                client.replies_since(t).is_empty(),
                "{backend:?} {lose}: the UDP client still gets replies after DEL"
            );
            client.stop();
            other_answers(&format!("after DEL ({lose})"));
            // Again: nothing left, success.
            assert_eq!(call(&node, "DEL", CID, Some(&netns), &config), Value::Null);
            assert_eq!(node.dump(), before);
        }
        // The other attachment's manifest went with the state directory: its DEL too.
        let other = cni_config(&node, "testnet", &c3, 8081);
        assert_eq!(
            call(&node, "DEL", "other1", None, &bare(&other)),
            Value::Null
        );
        assert_eq!(node.dump(), pristine, "{backend:?}: only the foreign rules");
    });
}

/// GC without manifests acts on none: the tag `natledger:<containerID>+<ifname>` names an
/// attachment, not its network, so GC of testnet (whatever its valid list) leaves the rules
/// of its own unrecorded attachment a and of net2's unrecorded b (both answering), and
/// still removes d, a stale testnet attachment with a manifest; the DELs of a and b (by
/// tag) then remove theirs; every backend.
#[test]
fn gc_without_manifests_leaves_the_tagged_rules_for_their_del() {
    both(|backend| {
        let mut node = Node::new(backend);
        let c2 = node.topo.add_container(2);
        let c3 = node.topo.add_container(3);
        let c4 = node.topo.add_container(4);
        let _servers = [&c2, &c3, &c4].map(|c| serve_tcp(&c.ns, c.sock_v4(80), &c.ns));
        node.warm_up();
        load_foreign(&node);
        let pristine = node.dump();
        assert_ok(&cni_add(&node, "net2", "bbbb2", &c3, 8081), "ADD b");
        let only_b = node.dump();
        assert_ok(&cni_add(&node, "testnet", "aaaa1", &c2, 8080), "ADD a");
        let both_added = node.dump();
        std::fs::remove_dir_all(node.state_dir()).unwrap();
        let ext = node.topo.ext().to_string();
        let answer = |port: u16| tcp_request(&ext, sock(NODE_V4, port), T);
        let both_answer = |when: &str| {
            assert_eq!(
                answer(8080).ok().as_deref(),
                Some(c2.ns.as_str()),
                "{backend:?} {when}"
            );
            assert_eq!(
                answer(8081).ok().as_deref(),
                Some(c3.ns.as_str()),
                "{backend:?} {when}"
            );
        };

        for (network, valid) in [("testnet", &["aaaa1"][..]), ("testnet", &[]), ("net2", &[])] {
            assert_ok(
                &gc(&node, network, valid),
                &format!("GC {network} {valid:?}"),
            );
            assert_eq!(
                node.dump(),
                both_added,
                "{backend:?}: GC {network} {valid:?}"
            );
            both_answer(&format!("after GC {network} {valid:?}"));
        }

        // A recorded attachment of testnet that is not valid: GC removes it, by its manifest.
        assert_ok(&cni_add(&node, "testnet", "dddd4", &c4, 8082), "ADD d");
        assert_ok(&gc(&node, "testnet", &[]), "GC, d stale");
        assert_eq!(
            node.dump(),
            both_added,
            "{backend:?}: d's rules gone, a's and b's kept"
        );
        assert!(node.manifests().is_empty(), "{:?}", node.manifests());
        assert_eq!(
            answer(8082).unwrap_err().kind(),
            ErrorKind::ConnectionRefused,
            "{backend:?}"
        );
        both_answer("after GC of d");

        let a = cni_config(&node, "testnet", &c2, 8080);
        assert_eq!(call(&node, "DEL", "aaaa1", None, &bare(&a)), Value::Null);
        assert_eq!(node.dump(), only_b, "{backend:?}: a's rules gone by tag");
        assert_eq!(
            answer(8080).unwrap_err().kind(),
            ErrorKind::ConnectionRefused,
            "{backend:?}"
        );
        let b = cni_config(&node, "net2", &c3, 8081);
        assert_eq!(call(&node, "DEL", "bbbb2", None, &bare(&b)), Value::Null);
        assert_eq!(node.dump(), pristine, "{backend:?}: only the foreign rules");
    });
}

/// A hook container h4 in attachment k's namespace shares k's 8080 (k's rules, no new
/// one); k's manifest is lost; k's DEL keeps the rules while h4 lives (TCP and a UDP
/// client that keeps sending still answered, dump unchanged), as it would with the
/// manifest, and so does a sweep; once h4 is gone (its poststop), a sweep removes them;
/// every backend.
#[test]
fn del_without_a_manifest_keeps_the_rules_a_live_hook_container_shares() {
    both(|backend| {
        let mut node = Node::new(backend);
        let c = node.topo.add_container(2);
        let netns = format!("/run/netns/{}", c.ns);
        let _servers = [
            serve_tcp(&c.ns, c.sock_v4(80), "c2 tcp"),
            serve_udp(&c.ns, c.sock_v4(53), "c2 udp"),
        ];
        node.warm_up();
        load_foreign(&node);
        let before = node.dump();
        let mut config = cni_config(&node, "testnet", &c, 8400);
        config["runtimeConfig"]["portMappings"] = json!([
            {"hostPort": 8400, "containerPort": 80, "protocol": "tcp"},
            {"hostPort": 8453, "containerPort": 53, "protocol": "udp"}
        ]);
        assert_eq!(call(&node, "ADD", "k", Some(&netns), &config), Value::Null);
        let added = node.dump();
        let pid = node.topo.spawn_sleeper(&c.ns);
        node.create(
            "h4",
            Some(pid),
            &[("io.natledger.ports", "8400:80,8453:53/udp")],
        );
        assert_eq!(node.dump(), added, "{backend:?}: shared, no new rule");
        assert_eq!(node.manifest("h4")["shares"][0]["holder"], "k+eth0");
        std::fs::remove_file(node.state_dir().join("containers/k+eth0.json")).unwrap();

        let ext = node.topo.ext().to_string();
        let client = UdpClient::start(&ext, sock(EXT_V4, 40300), sock(NODE_V4, 8453));
        assert!(
            client.wait_for("c2 udp", Instant::now(), T).is_some(),
            "{backend:?}"
        );
        let out = cni_call(&node, "DEL", "k", None, &bare(&config));
        assert_ok(&out, &format!("{backend:?}: DEL k"));
        assert!(stderr(&out).contains("h4"), "{}", stderr(&out));
        assert_eq!(node.dump(), added, "{backend:?}: kept for h4");
        assert_eq!(
            tcp_request(&ext, sock(NODE_V4, 8400), T).ok().as_deref(),
            Some("c2 tcp"),
            "{backend:?}: tcp after DEL"
        );
        let t = Instant::now();
        assert!(
            client.wait_for("c2 udp", t, T).is_some(),
            "{backend:?}: udp after DEL"
        );
        client.stop();
        assert!(!node.manifest_exists("k+eth0"), "DEL writes no manifest");
        // A sweep while h4 lives keeps them too.
        assert_ok(&node.sweep(&[]), "sweep, h4 alive");
        assert_eq!(node.dump(), added, "{backend:?}: a sweep kept them for h4");
        assert_eq!(
            tcp_request(&ext, sock(NODE_V4, 8400), T).ok().as_deref(),
            Some("c2 tcp"),
            "{backend:?}: tcp after the sweep"
        );

        kill_pid(pid);
        assert_ok(&node.poststop("h4"), "poststop h4");
        // The ledger now records nothing: a sweep cannot tell a lost manifest from a
        // mistyped or emptied state directory, and keeps k's tagged rules, saying so.
        let k_left = node.dump();
        let out = node.sweep(&[]);
        assert_ok(&out, "sweep");
        assert!(
            stderr(&out).contains("holds no manifest"),
            "{}",
            stderr(&out)
        );
        assert_eq!(
            node.dump(),
            k_left,
            "{backend:?}: an empty ledger's sweep kept them"
        );
        // Nothing lives: `sweep --boot` takes them.
        assert_ok(&node.sweep(&["--boot"]), "sweep --boot");
        assert_eq!(node.dump(), before, "{backend:?}: swept once h4 is gone");
        assert!(node.manifests().is_empty(), "{:?}", node.manifests());
    });
}

/// A hook container whose id has an attachment's form (`w+eth0`): a CNI DEL with
/// CNI_CONTAINERID=w, CNI_IFNAME=eth0 and a GC of any network leave its manifest and rules
/// (its port still answers), the DEL saying why; its poststop removes them; every backend.
#[test]
fn a_cni_del_leaves_a_hook_container_whose_id_has_an_attachments_form() {
    both(|backend| {
        let mut node = Node::new(backend);
        let c = node.topo.add_container(2);
        let _server = serve_tcp(&c.ns, c.sock_v4(80), "c2");
        node.warm_up();
        let before = node.dump();
        let pid = node.topo.spawn_sleeper(&c.ns);
        node.create("w+eth0", Some(pid), &[("io.natledger.ports", "8090:80")]);
        let created = node.dump();
        assert!(created.contains("natledger:w+eth0"), "{created}");
        let manifest = node.manifest("w+eth0");
        let ext = node.topo.ext().to_string();
        let answers = || tcp_request(&ext, sock(NODE_V4, 8090), T).ok();
        assert_eq!(answers().as_deref(), Some("c2"), "{backend:?}");

        let config = cni_config(&node, "testnet", &c, 8090);
        let out = cni_call(&node, "DEL", "w", None, &bare(&config));
        assert_ok(&out, &format!("{backend:?}: DEL w"));
        assert!(stderr(&out).contains("hook container"), "{}", stderr(&out));
        assert_ok(&gc(&node, "testnet", &[]), "GC");
        assert_eq!(node.dump(), created, "{backend:?}: untouched");
        assert_eq!(node.manifest("w+eth0"), manifest);
        assert_eq!(answers().as_deref(), Some("c2"), "{backend:?} after DEL");

        kill_pid(pid);
        assert_ok(&node.poststop("w+eth0"), "poststop");
        assert_eq!(node.dump(), before, "{backend:?}: poststop removed them");
    });
}
