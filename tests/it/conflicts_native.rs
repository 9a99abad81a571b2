//! Another owner forwards the port in a native nftables table: create-runtime reads other
//! owners' native tables (here netavark's `inet netavark` and kube-proxy's nftables mode
//! `ip kube-proxy`, shaped as they write them) and warns naming the table, chain and rule
//! handle or map element, or with the refuse policy fails and writes nothing, on every
//! backend. Real traffic shows the conflict (netavark's port answers from its container
//! until natledger's rule comes first), and that a refused start leaves it working; a port
//! no one forwards starts without a word. Tables holding more sets than a create reads (512)
//! are not checked, said at info level.

use std::time::Duration;

use crate::common::*;

const T: Duration = Duration::from_secs(3);

/// netavark's nftables driver for `-p 8080:80` to 10.77.0.3, and kube-proxy's nftables
/// mode NodePort 30081/tcp to the Service's endpoint 10.77.0.3:80.
const RULESET: &str = "table inet netavark {
  chain PREROUTING {
    type nat hook prerouting priority dstnat; policy accept;
    fib daddr type local jump NETAVARK-HOSTPORT-DNAT
  }
  chain OUTPUT {
    type nat hook output priority -100; policy accept;
    fib daddr type local jump NETAVARK-HOSTPORT-DNAT
  }
  chain NETAVARK-HOSTPORT-DNAT {
    tcp dport 8080 jump nv_2f259bab_10_77_0_0_nm24_dnat
  }
  chain nv_2f259bab_10_77_0_0_nm24_dnat {
    ip daddr != 127.0.0.0/8 tcp dport 8080 dnat ip to 10.77.0.3:80 comment \"podman web\"
  }
}
table ip kube-proxy {
  map service-nodeports {
    type inet_proto . inet_service : verdict
    elements = { tcp . 30081 : goto external-web }
  }
  chain nat-prerouting {
    type nat hook prerouting priority dstnat; policy accept;
    jump services
  }
  chain services {
    fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports
  }
  chain external-web {
    goto endpoint-web
  }
  chain endpoint-web {
    meta l4proto tcp dnat to 10.77.0.3:80
  }
}
";

fn create_env(node: &Node, id: &str, ports: &str, env: &[(&str, &str)]) -> std::process::Output {
    let bundle = node.bundle(
        id,
        &[
            ("io.natledger.ports", ports),
            ("io.natledger.ip", "10.77.0.2"),
        ],
    );
    node.hook_env("create-runtime", id, None, &bundle, env)
}

#[test]
fn native_owners_forwards_are_named_or_refused() {
    both(|backend| {
        let mut node = Node::new(backend);
        let host = node.topo.node().to_string();
        let ext = node.topo.ext().to_string();
        let mine = node.topo.add_container(2);
        let theirs = node.topo.add_container(3);
        let _servers = [
            serve_tcp(&mine.ns, mine.sock_v4(80), "natledger's"),
            serve_tcp(&theirs.ns, theirs.sock_v4(80), "netavark's"),
        ];
        node.warm_up();
        load_nft(&host, RULESET);
        assert_eq!(
            tcp_request(&ext, sock(NODE_V4, 8080), T).ok().as_deref(),
            Some("netavark's")
        );
        assert_eq!(
            tcp_request(&ext, sock(NODE_V4, 30081), T).ok().as_deref(),
            Some("netavark's"),
            "kube-proxy's NodePort answers from its endpoint"
        );
        let before = node.dump();

        // Refused: nothing written, and netavark's port still answers.
        let refuse = [("NATLEDGER_PORT_CONFLICT", "refuse")];
        let out = create_env(&node, "c1", "8080:80", &refuse);
        let err = stderr(&out);
        assert!(!out.status.success(), "{backend:?}: {err}");
        assert!(
            err.contains("host port 8080:80/tcp is already forwarded by another owner's rule")
                && err.contains("inet netavark")
                && err.contains("nv_2f259bab_10_77_0_0_nm24_dnat")
                && err.contains("handle")
                && err.contains("owner netavark")
                && err.contains("dnat to 10.77.0.3:80"),
            "{backend:?}: {err}"
        );
        assert_eq!(
            node.dump(),
            before,
            "{backend:?}: a refused start writes nothing"
        );
        assert!(!node.manifest_exists("c1"));
        assert_eq!(
            tcp_request(&ext, sock(NODE_V4, 8080), T).ok().as_deref(),
            Some("netavark's")
        );

        // Warned: the start goes on, each other owner's forward named once.
        let out = create_env(&node, "c1", "8080:80,30081:81", &[]);
        assert_ok(&out, "create with warnings");
        let err = stderr(&out);
        assert!(
            err.contains("warning: host port 8080/tcp is already forwarded by another owner's native nftables rule")
                && err.contains("owner netavark"),
            "{backend:?}: {err}"
        );
        assert!(
            err.contains("warning: host port 30081/tcp is already forwarded")
                && err.contains("ip kube-proxy chain endpoint-web")
                && err.contains("owner kube-proxy"),
            "{backend:?}: {err}"
        );
        assert_ok(&node.poststop("c1"), "poststop");

        // A port no one forwards: no word about forwards, also at an unchanged generation
        // (the answers kept in the state directory).
        for id in ["c2", "c3"] {
            let out = create_env(&node, id, "9001:80", &refuse);
            assert_ok(&out, "no conflict");
            assert!(!stderr(&out).contains("forwarded"), "{}", stderr(&out));
            assert_ok(&node.poststop(id), "poststop");
        }
        assert_eq!(
            tcp_request(&ext, sock(NODE_V4, 8080), T).ok().as_deref(),
            Some("netavark's"),
            "{backend:?}: netavark's port as before"
        );
    });
}

/// Other owners' tables with more sets than a create reads (kube-proxy's nftables mode keeps
/// an anonymous verdict map per Service; each set's elements cost a dump the kernel answers
/// after a walk of the table's sets): create does not check them, says so at info level,
/// and starts, even under `refuse` and with a forward of its port among them (doctor
/// examines them whole).
#[test]
fn too_many_sets_are_not_checked_at_create() {
    let node = Node::new(Backend::IptablesLegacy);
    let host = node.topo.node().to_string();
    let mut script = String::from(RULESET);
    script.push_str("table ip many {\n");
    for i in 0..600 {
        script.push_str(&format!(
            "  chain s{i} {{\n    numgen random mod 2 vmap {{ 0 : goto e{i}, 1 : goto e{i} }}\n  }}\n  chain e{i} {{\n    meta l4proto tcp dnat to 10.244.{}.{}:80\n  }}\n",
            i / 250,
            i % 250 + 1
        ));
    }
    script.push_str("}\n");
    load_nft(&host, &script);
    let env = [
        ("NATLEDGER_PORT_CONFLICT", "refuse"),
        ("NATLEDGER_LOG", "info"),
    ];
    let out = create_env(&node, "c1", "8080:80", &env);
    assert_ok(&out, "create beside too many sets");
    let err = stderr(&out);
    assert!(
        err.contains("other owners' native nftables forwards not checked")
            && err.contains("more than the 512 read at once"),
        "{err}"
    );
    assert_ok(&node.poststop("c1"), "poststop");
}
