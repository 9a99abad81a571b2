//! Containers of one network namespace sharing ports (`natledger::state::sharing`) when
//! consecutive ports are recorded as one range (`portspec::bounds::coalesce`), end to end
//! with the real binary on all three backends, real TCP and full dumps:
//! - `a_pod_member_shares_one_port_of_the_sandboxs_range`: the sandbox holds 8080-8081, a
//!   member asking 8081 and 8082 shares 8081 and holds 8082 itself; each port answers
//!   through its rules, the sandbox's stop keeps 8081, the member's takes everything.

use std::time::Duration;

use crate::common::*;

const T: Duration = Duration::from_secs(3);
const POD: (&str, &str) = ("io.kubernetes.cri.sandbox-id", "pod-1");

/// A pod's sandbox asks for `8080:8080,8081:8081` (recorded as the range 8080-8081); an app
/// container of the pod, in its network namespace, asks for `8081:8081,8082:8082` (merged
/// 8081-8082 before the claims are judged). The app shares 8081 (no rule of its own for it)
/// and holds 8082; from outside, 8080 and 8081 reach the pod through the sandbox's rules and
/// 8082 through the app's. The sandbox's poststop keeps its rules while the app lives (8081
/// still answers); the app's poststop, the last member's, leaves the tables as before.
#[test]
fn a_pod_member_shares_one_port_of_the_sandboxs_range() {
    both(|backend| {
        let what = format!("{backend:?}");
        let mut node = Node::new(backend);
        let c = node.topo.add_container(2);
        let _servers: Vec<_> = [8080, 8081, 8082]
            .into_iter()
            .map(|p| serve_tcp(&c.ns, c.sock_v4(p), &format!("p{p}")))
            .collect();
        node.warm_up();
        let before = node.dump();
        let ext = node.topo.ext().to_string();
        let reach = |port: u16| tcp_request(&ext, sock(NODE_V4, port), T).ok();

        let sandbox = node.topo.spawn_sleeper(&c.ns);
        let ports = ("io.natledger.ports", "8080:8080,8081:8081");
        node.create("sandbox", Some(sandbox), &[ports, POD]);
        let held = node.manifest("sandbox")["mappings"].clone();
        assert_eq!(held.as_array().map(Vec::len), Some(1), "{what}: {held}");
        let with_sandbox = node.dump();

        let app = node.topo.spawn_sleeper(&c.ns);
        let ports = ("io.natledger.ports", "8081:8081,8082:8082");
        node.create("app", Some(app), &[ports, POD]);
        let manifest = node.manifest("app");
        assert_eq!(
            manifest["shares"][0]["holder"], "sandbox",
            "{what}: {manifest}"
        );
        let tagged = |dump: &str, port: &str| {
            dump.lines()
                .filter(|l| l.contains("natledger:app") && l.contains(port))
                .count()
        };
        let with_app = node.dump();
        assert_eq!(tagged(&with_app, "8081"), 0, "{what}: {with_app}");
        assert!(tagged(&with_app, "8082") > 0, "{what}: {with_app}");
        // The sandbox's rules are as they were: only the app's 8082 was added.
        let added: Vec<&str> = with_app
            .lines()
            .filter(|l| !with_sandbox.lines().any(|s| s == *l))
            .collect();
        assert!(
            added.iter().all(|l| !l.contains("natledger:sandbox")),
            "{what}: {added:#?}"
        );
        for port in [8080, 8081, 8082] {
            assert_eq!(reach(port), Some(format!("p{port}")), "{what}: {port}");
        }
        let out = node.natledger(&["list"], "", &[]);
        let listed = stdout_of(&out, "natledger list", "");
        assert!(
            listed.contains("shares 8081:8081/tcp with sandbox"),
            "{what}: {listed}"
        );

        // The sandbox goes first: its rules stay for the app, and so does 8081.
        kill_pid(sandbox);
        assert_ok(&node.poststop("sandbox"), "poststop sandbox");
        assert_eq!(node.dump(), with_app, "{what}: kept for the app");
        assert_ok(&node.sweep(&[]), "sweep");
        assert_eq!(node.dump(), with_app, "{what}: sweep keeps them");
        assert_eq!(reach(8081).as_deref(), Some("p8081"), "{what}");
        assert_eq!(reach(8082).as_deref(), Some("p8082"), "{what}");

        kill_pid(app);
        assert_ok(&node.poststop("app"), "poststop app");
        assert_eq!(node.dump(), before, "{what}: the last member removed them");
        assert!(
            node.manifests().is_empty(),
            "{what}: {:?}",
            node.manifests()
        );
        for port in [8080, 8081, 8082] {
            assert_eq!(reach(port), None, "{what}: {port} closed");
        }
    });
}
