//! `NATLEDGER_HOST_ROOT`: natledger run as from an image that has no iptables tools (a private
//! mount namespace whose `/usr/sbin` is an empty tmpfs, the real root bind-mounted at DIR, as
//! the DaemonSet mounts the host's `/` at `/host`). Without the variable the iptables-nft
//! backend's create fails naming the missing tool (a poststop under the host root removes
//! what it recorded) and `--backend auto` finds no iptables; with
//! `NATLEDGER_HOST_ROOT=DIR` the tools are found under DIR and run chrooted into it: a forward
//! is written, answers TCP and UDP from outside, and poststop leaves the dump as it was;
//! `auto` decides as on the host. `NATLEDGER_HOST_ROOT=/` in the node's own mount namespace
//! works the same; a missing DIR is refused naming it, and one without the tools is named in
//! the error. A `sweep --repair` that cannot see `/run/netns` judges a live CNI attachment
//! dead; under the host root it keeps and repairs it (it answers) and sweeps only the one
//! whose namespace is gone.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::common::*;

const T: Duration = Duration::from_secs(3);

/// In a private mount namespace: the real root at `$1`, an empty tmpfs over `/usr/sbin` (the
/// iptables tools gone, as in an image), then `ip netns exec $2 ARGV...` (`ip` from `$1`).
const NO_TOOLS: &str = r#"set -e
host=$1; ns=$2; shift 2
mount --rbind / "$host"
mount -t tmpfs -o size=1m natledger-test-no-tools /usr/sbin
exec "$host/usr/sbin/ip" netns exec "$ns" "$@""#;

/// `natledger ARGS` on `node`, in an image-like root (no tools) with the real root at `host`,
/// with `env` and `stdin`.
fn without_tools(
    node: &Node,
    host: &Path,
    env: &[(&str, String)],
    args: &[&str],
    stdin: &str,
) -> Output {
    let mut argv: Vec<String> = vec![
        "--mount".into(),
        "--propagation".into(),
        "private".into(),
        "sh".into(),
        "-c".into(),
        NO_TOOLS.into(),
        "sh".into(),
        host.display().to_string(),
        node.topo.node().to_string(),
        "env".into(),
        format!("NATLEDGER_STATE_DIR={}", node.state_dir().display()),
    ];
    argv.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
    argv.push(BIN.into());
    argv.extend(args.iter().map(|a| a.to_string()));
    let mut child = Command::new("unshare")
        .args(&argv)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("unshare");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// The OCI state a runtime sends for container `id` at `status`.
fn state(node: &Node, id: &str, status: &str, pid: u32) -> String {
    let bundle = node.dir.path().join("bundles").join(id);
    serde_json::json!({
        "ociVersion": "1.0.2", "id": id, "status": status, "bundle": bundle, "pid": pid,
    })
    .to_string()
}

fn answers(ext: &str, c_port: u16) {
    assert_eq!(
        tcp_request(ext, sock(NODE_V4, c_port), T).ok().as_deref(),
        Some("tcp")
    );
    assert_eq!(
        udp_request(ext, sock(NODE_V4, c_port + 1), T)
            .ok()
            .as_deref(),
        Some("udp")
    );
    assert_eq!(
        tcp_request(ext, sock(NODE_V6, c_port), T).ok().as_deref(),
        Some("tcp6")
    );
}

#[test]
fn tools_are_found_and_run_under_the_host_root() {
    let mut node = Node::new(Backend::IptablesNft);
    let ext = node.topo.ext().to_string();
    let c = node.topo.add_container(2);
    let _servers = [
        serve_tcp(&c.ns, c.sock_v4(80), "tcp"),
        serve_udp(&c.ns, c.sock_v4(81), "udp"),
        serve_tcp(&c.ns, c.sock_v6(80), "tcp6"),
    ];
    node.warm_up();
    let before = node.dump();
    let host = node.dir.path().join("host");
    std::fs::create_dir(&host).unwrap();
    let annotations = [
        ("io.natledger.ports", "8080:80,8081:81/udp"),
        ("io.natledger.ip", "10.77.0.2,fd77::2"),
    ];
    node.bundle("c2", &annotations);
    let pid = node.stand_in("c2");
    let nft = ("NATLEDGER_BACKEND", "nft".to_string());
    let root = ("NATLEDGER_HOST_ROOT", host.display().to_string());

    // The image alone: no tool, so the iptables-nft create fails; what it recorded is left
    // for a poststop, which under the host root finishes it.
    node.bundle("c1", &annotations);
    let pid1 = node.stand_in("c1");
    let out = without_tools(
        &node,
        &host,
        std::slice::from_ref(&nft),
        &["hook", "create-runtime"],
        &state(&node, "c1", "creating", pid1),
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("not found in /usr/sbin, /sbin"),
        "{}",
        stderr(&out)
    );
    let out = without_tools(
        &node,
        &host,
        &[nft.clone(), root.clone()],
        &["hook", "poststop"],
        &state(&node, "c1", "stopped", pid1),
    );
    assert_ok(&out, "poststop of the failed create under the host root");
    assert_eq!(node.dump(), before);
    assert!(node.manifests().is_empty(), "{:?}", node.manifests());
    let out = without_tools(&node, &host, &[], &["list"], "");
    assert_ok(&out, "list without tools");
    let alone = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        alone.starts_with("backend for new rules: nftables (no iptables tool"),
        "{alone}"
    );

    // With the host's root: the tools run chrooted there, one restore per family.
    let out = without_tools(
        &node,
        &host,
        &[nft.clone(), root.clone(), ("NATLEDGER_TRACE", "1".into())],
        &["hook", "create-runtime"],
        &state(&node, "c2", "creating", pid),
    );
    assert_ok(&out, "create-runtime under the host root");
    let chrooted = format!("(in {})", host.display());
    let said = stderr(&out);
    let execs: Vec<&str> = said.lines().filter(|l| l.contains("exec /")).collect();
    assert!(
        !execs.is_empty() && execs.iter().all(|l| l.ends_with(&chrooted)),
        "{execs:?}"
    );
    answers(&ext, 8080);
    let out = without_tools(
        &node,
        &host,
        &[nft.clone(), root.clone()],
        &["hook", "poststop"],
        &state(&node, "c2", "stopped", pid),
    );
    assert_ok(&out, "poststop under the host root");
    assert_eq!(
        node.dump(),
        before,
        "poststop leaves the tables as they were"
    );
    assert!(tcp_request(&ext, sock(NODE_V4, 8080), Duration::from_millis(500)).is_err());

    // `auto` reads the host's iptables symlinks under the root, as natledger on the host does.
    let out = without_tools(&node, &host, std::slice::from_ref(&root), &["list"], "");
    assert_ok(&out, "list under the host root");
    let on_host = node.natledger(&["list"], "", &[("NATLEDGER_BACKEND", "")]);
    let first = |out: &Output| {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .map(String::from)
    };
    assert_eq!(first(&out), first(&on_host));
    assert_ne!(first(&out), alone.lines().next().map(String::from));

    // NATLEDGER_HOST_ROOT=/ on the node itself: the same forward, written and removed.
    let slash = [("NATLEDGER_HOST_ROOT", "/")];
    let bundle = node.bundle("c2", &annotations);
    assert_ok(
        &node.hook_env("create-runtime", "c2", Some(pid), &bundle, &slash),
        "create /",
    );
    answers(&ext, 8080);
    assert_ok(
        &node.hook_env("poststop", "c2", Some(pid), &bundle, &slash),
        "poststop /",
    );
    assert_eq!(node.dump(), before);
    assert!(node.manifests().is_empty(), "{:?}", node.manifests());
}

/// A missing DIR is refused naming it (exit 2, nothing run); a DIR without the tools is named
/// where the tool was looked for.
#[test]
fn a_missing_host_root_is_refused_and_an_empty_one_named() {
    let node = Node::new(Backend::IptablesNft);
    let missing = node.dir.path().join("no-such-root");
    let missing = missing.display().to_string();
    let out = node.natledger(&["list"], "", &[("NATLEDGER_HOST_ROOT", &missing)]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!(
            "invalid value '{missing}' for 'NATLEDGER_HOST_ROOT': host root {missing}: No such file"
        )),
        "{}",
        stderr(&out)
    );

    let empty = node.dir.path().join("empty-root");
    std::fs::create_dir(&empty).unwrap();
    let empty = empty.display().to_string();
    let before = node.dump();
    let bundle = node.bundle(
        "c1",
        &[
            ("io.natledger.ports", "8080:80"),
            ("io.natledger.ip", "10.77.0.2"),
        ],
    );
    let pid = node.stand_in("c1");
    let out = node.hook_env(
        "create-runtime",
        "c1",
        Some(pid),
        &bundle,
        &[("NATLEDGER_HOST_ROOT", &empty)],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains(&format!(
            "not found in /usr/sbin, /sbin, /usr/local/sbin, /usr/bin, /bin under host root {empty}"
        )),
        "{}",
        stderr(&out)
    );
    // What the failed create recorded, a poststop with the tools removes.
    assert_ok(
        &node.hook_env("poststop", "c1", Some(pid), &bundle, &[]),
        "poststop",
    );
    assert_eq!(node.dump(), before);
    assert!(node.manifests().is_empty(), "{:?}", node.manifests());
}

/// In a private mount namespace: the real root at `$1`, an empty tmpfs over `/run/netns` (a
/// watch container that does not mount the runtime's netns directory), then `ARGV...` in the
/// network namespace `$2` (entered through the real root's `/run/netns`).
const NO_NETNS_DIR: &str = r#"set -e
host=$1; ns=$2; shift 2
mount --rbind / "$host"
mount -t tmpfs -o size=1m natledger-test-no-netns /run/netns
exec nsenter --net="$host/run/netns/$ns" "$@""#;

/// `sweep --repair` (what `watch` runs) on `node` where `/run/netns` shows nothing, the real
/// root at `host`, with `env`.
fn sweep_without_netns_dir(
    node: &Node,
    host: &Path,
    env: &[(&str, String)],
    more: &[&str],
) -> Output {
    let mut argv: Vec<String> = ["--mount", "--propagation", "private", "sh", "-c"]
        .map(String::from)
        .to_vec();
    argv.extend([NO_NETNS_DIR.into(), "sh".into(), host.display().to_string()]);
    argv.extend([node.topo.node().to_string(), "env".into()]);
    argv.push(format!(
        "NATLEDGER_STATE_DIR={}",
        node.state_dir().display()
    ));
    argv.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
    argv.extend([BIN.to_string(), "sweep".into(), "--repair".into()]);
    argv.extend(more.iter().map(|a| a.to_string()));
    Command::new("unshare")
        .args(&argv)
        .output()
        .expect("unshare")
}

/// A sweep that cannot see the runtime's `/run/netns` (a watch container without that mount)
/// judges every CNI attachment dead; under `NATLEDGER_HOST_ROOT` the recorded namespace paths
/// are read under the host's root: the live pod keeps its forward (it answers after a wipe is
/// repaired) and only the attachment whose namespace is really gone is swept.
#[test]
fn cni_namespaces_are_judged_under_the_host_root() {
    let mut node = Node::new(Backend::IptablesNft);
    let ext = node.topo.ext().to_string();
    let (att, gone) = (node.topo.add_container(5), node.topo.add_container(6));
    let _servers = [
        serve_tcp(&att.ns, att.sock_v4(80), "att"),
        serve_tcp(&gone.ns, gone.sock_v4(80), "gone"),
    ];
    let answers = |port: u16| tcp_request(&ext, sock(NODE_V4, port), T).ok();
    assert_ok(&cni_add(&node, "testnet", "att", &att, 8090), "ADD att");
    let before = node.dump();
    assert_ok(&cni_add(&node, "testnet", "gone", &gone, 8091), "ADD gone");
    assert_eq!(answers(8091).as_deref(), Some("gone"));
    node.topo.delete_ns_now(&gone.ns.clone());
    let host = node.dir.path().join("host");
    std::fs::create_dir(&host).unwrap();

    // Without a host root: the live attachment looks dead (a dry run, to show it).
    let out = sweep_without_netns_dir(&node, &host, &[], &["--dry-run"]);
    let said = String::from_utf8_lossy(&out.stdout).into_owned() + &stderr(&out);
    assert!(said.contains("dead container att+eth0"), "{said}");

    // Under the host root, after a wipe: att repaired, gone swept, the tables as before.
    run_in(
        node.topo.node(),
        "iptables-nft",
        &["-t", "nat", "-F", "NATLEDGER-HOSTPORTS"],
        None,
    );
    assert!(answers(8090).is_none());
    let root = [("NATLEDGER_HOST_ROOT", host.display().to_string())];
    let out = sweep_without_netns_dir(&node, &host, &root, &[]);
    assert_ok(&out, "sweep --repair under the host root");
    assert_eq!(answers(8090).as_deref(), Some("att"));
    assert!(answers(8091).is_none());
    let manifests = node.manifests();
    assert!(
        manifests.iter().all(|m| !m.starts_with("gone")),
        "{manifests:?}"
    );
    assert!(
        manifests.iter().any(|m| m.starts_with("att")),
        "{manifests:?}"
    );
    assert_eq!(node.dump(), before);
}
