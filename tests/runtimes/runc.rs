//! natledger with the real runc: bundles made by `runc spec`, a busybox httpd container, a
//! network hook of the test's own (in the role of a CNI plugin) that runs before natledger's
//! hooks, and `natledger inject` putting natledger's hooks into `config.json`. runc runs with
//! only the network namespace entered (`nsenter --net`): the Topology's node namespace is the
//! "host", so every rule lands there and the machine's own tables are never touched. runc's
//! state lives in a temporary `--root`, and a guard deletes every container a test started.
//! A reused id: a late poststop of an earlier instance leaves the running one's rules and
//! traffic alone.

use std::net::Ipv4Addr;
use std::time::Instant;

use serde_json::{Value, json};

use crate::common::*;

/// runc run -d → the container's httpd answers on the host port on every path; runc kill +
/// runc delete (poststop) → every table (both iptables backends, both families, `nft list
/// ruleset`) is exactly as it was, the manifest is gone and the port is closed. All three
/// backends.
#[test]
fn runc_container_is_forwarded_and_delete_restores_the_tables() {
    let _suite = crate::one_suite_at_a_time(module_path!());
    both(|backend| {
        let host = Host::new(backend);

        let bundle = host.bundle("web", 2);
        let started = Instant::now();
        let c = host.start("web", &bundle);
        let pid = c.state()["pid"]
            .as_u64()
            .expect("pid of a running container");
        assert!(pid > 1, "{backend:?}: pid {pid}");
        host.assert_answers(2);
        eprintln!(
            "{backend:?}: runc run -d to every path answering: {:?}",
            started.elapsed()
        );
        assert!(host.node.manifest_exists(&c.id), "{backend:?}: manifest");
        host.assert_dnat(&c.id, 2, "running");

        let id = c.id.clone();
        c.kill();
        c.delete();
        host.assert_restored(&id, "runc delete (poststop)");
        host.assert_closed("delete");
    });
}

/// Twenty container generations on one host port, each at a new address (10.77.0.10 to
/// .29), in the order a restart produces: the old container dies (SIGKILL; its poststop has
/// not run, so its rule is still there, pointing at a dead address), the new one starts and
/// must answer at once, then the old one's poststop runs and must not disturb the new one.
/// After the last delete the tables are exactly as before the first start.
#[test]
fn twenty_restarts_on_one_port_newest_answers_nothing_accumulates() {
    let _suite = crate::one_suite_at_a_time(module_path!());
    both(|backend| {
        let host = Host::new(backend);
        let ext = host.node.topo.ext().to_string();
        let node = host.node.topo.node().to_string();
        let started = Instant::now();

        let mut previous: Option<Running> = None;
        for n in 10..30u8 {
            let cycle = Instant::now();
            let name = format!("gen{n}");
            let bundle = host.bundle(&name, n);
            if let Some(old) = &previous {
                old.kill();
                let rules = host.rule_lines();
                assert!(
                    rules.iter().any(|l| l.contains(&old.id)),
                    "{backend:?}: {}'s rules stay until its poststop:\n{}",
                    old.id,
                    rules.join("\n")
                );
            }
            let c = host.start(&name, &bundle);
            http_wait(&ext, sock(NODE_V4, HOST_PORT), &body(n), START).unwrap_or_else(|e| {
                panic!(
                    "{backend:?} generation {n}, the previous one dead but not deleted: {e}\n{}",
                    host.rule_lines().join("\n")
                )
            });
            if let Some(old) = previous.take() {
                let old_id = old.id.clone();
                old.delete();
                let rules = host.rule_lines();
                assert!(
                    !rules.iter().any(|l| l.contains(&old_id)),
                    "{backend:?}: {old_id}'s rules stay after its delete:\n{}",
                    rules.join("\n")
                );
            }
            for dst in [sock(NODE_V4, HOST_PORT), sock(NODE_V6, HOST_PORT)] {
                assert_eq!(
                    http_get(&ext, dst, T).ok(),
                    Some(body(n)),
                    "{backend:?} generation {n}: external {dst} after the old one's delete"
                );
            }
            assert_eq!(
                http_get(&node, sock(Ipv4Addr::LOCALHOST, HOST_PORT), T).ok(),
                Some(body(n)),
                "{backend:?} generation {n}: node localhost"
            );
            eprintln!("{backend:?} generation {n}: {:?}", cycle.elapsed());
            previous = Some(c);
        }
        let last = previous.take().expect("twenty generations");
        let last_id = last.id.clone();
        last.kill();
        last.delete();
        eprintln!("{backend:?}: twenty generations in {:?}", started.elapsed());
        host.assert_restored(&last_id, "twenty generations");
    });
}

/// The wrapper runtime in front of runc, with a bundle that asks for ports only through
/// `process.env` (as `docker run -e NATLEDGER_PORTS=... -e NATLEDGER_IP=...` leaves them):
/// `natledger runtime --natledger-runtime RUNC --natledger-hook-env ... --root R run -d`
/// copies them into the annotations, injects the hooks after the network hook and runs runc.
/// Every other command goes through a `natledger-runtime` symlink (finding runc by itself)
/// unchanged, exit status included; its delete restores the tables.
#[test]
fn wrapper_runtime_injects_from_process_env_and_passes_the_rest_through() {
    let _suite = crate::one_suite_at_a_time(module_path!());
    both(|backend| {
        let host = Host::new(backend);
        let node = host.node.topo.node();
        let bundle = host.bundle_dir("wrapped");
        let ips = "10.77.0.3,fd77::3";
        make_bundle(Runtime::Runc, &bundle, &host.net_hook, 3, &body(3), |c| {
            let env = c["process"]["env"]
                .as_array_mut()
                .expect("runc spec: process.env");
            env.push(json!(format!("NATLEDGER_PORTS={PORTS}")));
            env.push(json!(format!("NATLEDGER_IP={ips}")));
        });
        let hook_env = [
            format!("NATLEDGER_STATE_DIR={}", host.node.state_dir().display()),
            format!("NATLEDGER_BACKEND={}", backend.name()),
        ];
        let root = host.root.to_str().expect("utf-8 root");
        let c = host.start_with(
            "wrapped",
            &bundle,
            &[
                BIN,
                "runtime",
                "--natledger-runtime",
                "/usr/sbin/runc",
                "--natledger-hook-env",
                &hook_env[0],
                "--natledger-hook-env",
                &hook_env[1],
                "--root",
                root,
            ],
        );
        let config = read_json(&bundle.join("config.json"));
        assert_eq!(
            config["annotations"]["io.natledger.ports"], PORTS,
            "{backend:?}"
        );
        assert_eq!(config["annotations"]["io.natledger.ip"], ips, "{backend:?}");
        let env: Vec<&str> = hook_env.iter().map(String::as_str).collect();
        assert_eq!(
            config["hooks"]["createRuntime"],
            json!([
                {"path": host.net_hook, "args": ["net-hook", "3"]},
                hook_entry(BIN, "create-runtime", &env),
            ]),
            "{backend:?}: natledger after the network hook"
        );
        assert_eq!(
            config["hooks"]["poststop"],
            json!([hook_entry(BIN, "poststop", &env)]),
            "{backend:?}"
        );
        host.assert_answers(3);

        let wrapper = host.node.dir.path().join("natledger-runtime");
        std::os::unix::fs::symlink(BIN, &wrapper).expect("natledger-runtime symlink");
        let through = |args: &[&str]| {
            output(
                nsenter_net(node, &wrapper)
                    .env_remove("NATLEDGER_RUNTIME")
                    .args(["--root", root])
                    .args(args),
            )
        };
        let state = through(&["state", &c.id]);
        assert_ok(&state, "natledger-runtime state");
        let state: Value = serde_json::from_slice(&state.stdout).expect("state JSON");
        assert_eq!(state["id"], c.id.as_str(), "{backend:?}");
        assert_eq!(state["status"], "running", "{backend:?}");
        let missing = host.id("missing");
        assert_eq!(
            through(&["state", &missing]).status.code(),
            host.run(&["state", &missing]).status.code(),
            "{backend:?}: runc's exit status comes through"
        );
        assert_ok(&through(&["kill", &c.id, "KILL"]), "natledger-runtime kill");
        assert!(
            poll(T, || c.state()["status"] == "stopped"),
            "{backend:?}: stopped"
        );
        let mut c = c;
        let deleted = through(&["delete", &c.id]);
        c.deleted = deleted.status.success();
        assert_ok(&deleted, "natledger-runtime delete");
        host.assert_restored(&c.id, "delete through the wrapper");
    });
}

/// A hook is not stricter than runc about fields it does not use: a `config.json` without
/// `process.user` and `ociVersion`, with fields no spec has, starts under runc, and natledger
/// forwards it and removes its rules at delete.
#[test]
fn runc_config_without_process_user_or_known_fields_is_forwarded() {
    let _suite = crate::one_suite_at_a_time(module_path!());
    let host = Host::new(Backend::IptablesNft);
    let bundle = host.bundle("lenient", 2);
    let path = bundle.join("config.json");
    let mut config = read_json(&path);
    let process = config["process"].as_object_mut().expect("process");
    assert!(
        process.remove("user").is_some(),
        "runc spec sets process.user"
    );
    config.as_object_mut().unwrap().remove("ociVersion");
    config["io.example.unknown"] = json!({"nested": [1, null, "x"]});
    config["linux"]["fieldOfANewerSpec"] = json!(true);
    write_json(&path, &config);

    let c = host.start("lenient", &bundle);
    host.assert_answers(2);
    let id = c.id.clone();
    c.kill();
    c.delete();
    host.assert_restored(&id, "runc delete (poststop)");
}

/// Two runc containers in one network namespace (the second's config names the first's
/// `/proc/PID/ns/net`, as a pod's containers join its sandbox), both asking for [`PORTS`]:
/// the first installs the rules, the second shares them (one DNAT, tagged with the first).
/// A third container in a namespace of its own asking for the port is refused and leaves
/// nothing. The holder (a sleeper) is killed and deleted first: its rules stay, since the
/// second container, the web server, lives in the namespace, and the port still answers;
/// sweep keeps them too and `natledger list` says why. The second's delete takes them.
#[test]
fn runc_containers_in_one_network_namespace_share_the_port_until_the_last_goes() {
    let _suite = crate::one_suite_at_a_time(module_path!());
    both(|backend| {
        let host = Host::new(backend);
        let what = format!("{backend:?}");

        // The holder: a sleeper with the network hook's eth0 at 10.77.0.2.
        let holder_bundle = host.bundle("holder", 2);
        let path = holder_bundle.join("config.json");
        let mut config = read_json(&path);
        config["process"]["args"] = json!(["/bin/sleep", "3600"]);
        write_json(&path, &config);
        let holder = host.start("holder", &holder_bundle);
        let holder_pid = holder.state()["pid"].as_u64().expect("holder pid");

        // The web server joins the holder's network namespace: no network hook of its own.
        let web_bundle = host.bundle("web", 2);
        let path = web_bundle.join("config.json");
        let mut config = read_json(&path);
        for ns in config["linux"]["namespaces"].as_array_mut().unwrap() {
            if ns["type"] == "network" {
                ns["path"] = json!(format!("/proc/{holder_pid}/ns/net"));
            }
        }
        let create = config["hooks"]["createRuntime"].as_array_mut().unwrap();
        create.retain(|h| h["args"][0] != "net-hook");
        write_json(&path, &config);
        let web = host.start("web", &web_bundle);
        host.assert_answers(2);
        let rules = host.rule_lines();
        let dnats: Vec<&String> = rules.iter().filter(|l| is_dnat(l)).collect();
        assert_eq!(
            dnats.len(),
            2,
            "{what}: one DNAT per family, the holder's: {rules:#?}"
        );
        assert!(
            rules.iter().all(|l| l.contains(&holder.id)),
            "{what}: {rules:#?}"
        );
        let shares = host.node.manifest(&web.id)["shares"].clone();
        assert_eq!(shares[0]["holder"], json!(holder.id), "{what}: {shares}");
        let with_pod = host.node.dump();

        // Another namespace asking for the held port is refused and leaves nothing.
        let other_bundle = host.bundle("other", 3);
        let other_id = host.id("other");
        let out = output(
            host.command(&["run", "-d", "--bundle"])
                .arg(&other_bundle)
                .arg(&other_id),
        );
        let _ = host.run(&["delete", "-f", &other_id]);
        let says = stderr(&out);
        assert!(
            !out.status.success()
                && says.contains(&format!("held by live container {}", holder.id))
                && says.contains("in another network namespace"),
            "{what}: {says}"
        );
        assert!(!host.node.manifest_exists(&other_id), "{what}");
        assert_eq!(host.node.dump(), with_pod, "{what}: the refused container");

        // The holder goes first; the web server still serves the port through its rules.
        let holder_id = holder.id.clone();
        holder.kill();
        holder.delete();
        assert_eq!(
            host.node.dump(),
            with_pod,
            "{what}: the holder's delete while a sharer lives"
        );
        assert!(host.node.manifest_exists(&holder_id), "{what}");
        host.assert_answers(2);
        let out = host.node.natledger(&["sweep"], "", &[]);
        let swept = stdout_of(&out, "natledger sweep", "");
        assert!(
            swept.contains(&format!(
                "dead container {holder_id} (pid {holder_pid}): rules kept, shared with live \
                 container(s) {}",
                web.id
            )),
            "{what}: {swept}"
        );
        assert_eq!(host.node.dump(), with_pod, "{what}: sweep keeps them");
        let out = host.node.natledger(&["list"], "", &[]);
        let listed = stdout_of(&out, "natledger list", "");
        assert!(
            listed.contains(&format!("dead (rules kept for {})", web.id)),
            "{what}: {listed}"
        );
        host.assert_answers(2);

        // The last member goes: so do the rules and both manifests.
        let web_id = web.id.clone();
        web.kill();
        web.delete();
        host.assert_restored(&web_id, "the last member's delete");
        assert!(!host.node.manifest_exists(&holder_id), "{what}");
    });
}

/// A reused container id (runc, all three backends): c1's first instance at 10.77.0.2 dies
/// and is deleted without its poststop (its bundle had none, as when runc's state went
/// first); c1 is run again at 10.77.0.3 and answers on every path; then the first
/// instance's poststop arrives late (its state, no pid): it exits 0 with a warning, and the
/// dump, the manifest and every path to the new instance are unchanged. The new instance's
/// own delete (its poststop) restores the tables.
#[test]
fn a_late_poststop_for_a_reused_id_keeps_the_running_instance() {
    let _suite = crate::one_suite_at_a_time(module_path!());
    both(|backend| {
        let host = Host::new(backend);
        let bundle = host.bundle("c1", 2);
        let config = bundle.join("config.json");
        let mut spec = read_json(&config);
        spec["hooks"]["poststop"] = json!([]);
        write_json(&config, &spec);
        let first = host.start("c1", &bundle);
        host.assert_answers(2);
        let id = first.id.clone();
        first.kill();
        first.delete();
        assert!(
            host.node.manifest_exists(&id),
            "{backend:?}: no poststop ran"
        );

        let bundle = host.bundle("c1-again", 3);
        let second = host.start("c1", &bundle);
        assert_eq!(second.id, id);
        let pid = second.state()["pid"].as_u64().expect("pid");
        host.assert_answers(3);
        let live = host.node.dump();
        let manifest = host.node.manifest(&id);
        assert_eq!(manifest["pid"], pid);

        let late = json!({"ociVersion": "1.0.2", "id": id, "status": "stopped", "bundle": bundle});
        let out = host.node.hook_state("poststop", &late);
        assert_ok(&out, "the late poststop");
        let err = stderr(&out);
        assert!(
            err.contains("warning") && err.contains(&id) && err.contains(&format!("pid {pid}")),
            "{backend:?}: {err}"
        );
        assert_eq!(
            host.node.dump(),
            live,
            "{backend:?}: the late poststop changed rules"
        );
        assert_eq!(host.node.manifest(&id), manifest);
        host.assert_answers(3);

        second.kill();
        second.delete();
        host.assert_restored(&id, "the running instance's own delete");
    });
}
