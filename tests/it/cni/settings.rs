//! The plugin's settings from its environment (`NATLEDGER_*`, read once): a refused value
//! stops what writes rules and never what removes them; an empty value is unset.
//!
//! - `a_bad_setting_refuses_add_and_never_stops_del`: per backend, an ADD with
//!   `NATLEDGER_PORT_CONFLICT=allow` is the error object of code 4 with nothing written (full
//!   dump unchanged); an ADD with the variable empty forwards real TCP; a DEL with the bad
//!   value removes every rule and the manifest (full dump as before), warning on stderr that
//!   it ignored the variable.

use std::time::Duration;

use crate::common::*;
use serde_json::{Value, json};

#[test]
fn a_bad_setting_refuses_add_and_never_stops_del() {
    both(|backend| {
        let mut node = Node::new(backend);
        let c = node.topo.add_container(2);
        let netns = format!("/run/netns/{}", c.ns);
        let _server = serve_tcp(&c.ns, c.sock_v4(80), "c2 tcp");
        node.warm_up();
        let before = node.dump();
        let config = json!({
            "cniVersion": "1.0.0",
            "name": "testnet",
            "type": "natledger",
            "backend": backend.name(),
            "stateDir": node.state_dir(),
            "runtimeConfig": {"portMappings": [
                {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}
            ]},
            "prevResult": cni_prev_result(&c, &netns)
        })
        .to_string();
        let call = |command: &str, conflict: &str| {
            let env = [
                ("CNI_COMMAND", command),
                ("CNI_CONTAINERID", "settings1"),
                ("CNI_IFNAME", "eth0"),
                ("CNI_PATH", "/opt/cni/bin"),
                ("CNI_NETNS", netns.as_str()),
                ("NATLEDGER_PORT_CONFLICT", conflict),
            ];
            node.natledger(&[], &config, &env)
        };

        let refused = call("ADD", "allow");
        assert!(!refused.status.success(), "{}", stderr(&refused));
        let error: Value = serde_json::from_slice(&refused.stdout).expect("an error object");
        assert_eq!(error["code"], 4, "{error}");
        assert_eq!(
            node.dump(),
            before,
            "{backend:?}: a refused ADD writes nothing"
        );

        let added = call("ADD", "");
        assert!(added.status.success(), "{}", stderr(&added));
        let ext = node.topo.ext().to_string();
        assert_eq!(
            tcp_request(&ext, sock(NODE_V4, 8080), Duration::from_secs(3))
                .ok()
                .as_deref(),
            Some("c2 tcp"),
            "{backend:?}: forwarded"
        );

        let deleted = call("DEL", "allow");
        assert!(deleted.status.success(), "{}", stderr(&deleted));
        assert!(
            stderr(&deleted).contains("NATLEDGER_PORT_CONFLICT ignored"),
            "{}",
            stderr(&deleted)
        );
        assert!(!node.manifest_exists("settings1+eth0"));
        assert_eq!(node.dump(), before, "{backend:?}: DEL removes every rule");
    });
}
