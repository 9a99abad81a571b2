//! The network configuration: decoding failures (6), invalid values (7), portmap options
//! natledger cannot honour (2), keys as runtimes spell them, DEL's and GC's views.

use super::*;

#[test]
fn gc_reads_valid_attachments() {
    let mut conf = config();
    conf["cniVersion"] = json!("1.1.0");
    conf["cni.dev/valid-attachments"] =
        json!([{"containerID": ID, "ifname": "eth0"}, {"containerID": "b", "ifname": "net1"}]);
    let text = serde_json::to_vec(&conf).unwrap();
    let parsed = NetConf::from_value(spec::decode_object(&text).unwrap()).unwrap();
    let valid = parsed.valid_attachments.unwrap();
    assert_eq!(valid.len(), 2);
    assert_eq!(valid[1].container_id, "b");
    assert_eq!(valid[1].ifname, "net1");
}

#[test]
fn decoding_failures_are_code_6() {
    let plugin = Recorder::default();
    for stdin in [&b"{"[..], b"[]", b"\"x\"", b""] {
        let (_, error) = call_raw(&env("ADD"), stdin, &plugin);
        assert_eq!(
            error.unwrap().code,
            6,
            "{:?}",
            String::from_utf8_lossy(stdin)
        );
    }
    for (key, value) in [
        ("runtimeConfig", json!({"portMappings": "6667:80"})),
        (
            "runtimeConfig",
            json!({"portMappings": [{"hostPort": "80"}]}),
        ),
        ("prevResult", json!([1])),
        ("name", json!(7)),
    ] {
        let mut conf = config();
        conf[key] = value.clone();
        let (_, error) = call(&env("ADD"), &conf, &plugin);
        assert_eq!(error.unwrap().code, 6, "{key}: {value}");
    }
    let mut conf = config();
    conf["prevResult"]["ips"][1]["address"] = json!("10.88.0.7");
    let lookup_vars = env("ADD");
    let lookup = |name: &str| lookup_vars.get(name).cloned();
    let request = Request {
        env: Env::read(&lookup).unwrap(),
        conf: NetConf::from_value(conf).unwrap(),
    };
    assert_eq!(
        request.container_addresses().unwrap_err().code,
        Code::Decode
    );
    assert!(plugin.calls.borrow().is_empty());
}

#[test]
fn invalid_configs_are_code_7_unsupported_portmap_options_code_2() {
    let plugin = Recorder::default();
    let cases: Vec<(&str, Value, u32, &str)> = vec![
        ("name", json!(""), 7, "name"),
        ("name", json!("bad name"), 7, "name"),
        ("name", json!("-x"), 7, "name"),
        ("type", json!(""), 7, "type"),
        ("type", json!("../natledger"), 7, "type"),
        ("stateDir", json!("run/natledger"), 7, "stateDir"),
        ("backend", json!("ebpf"), 7, "backend"),
        ("portConflict", json!("maybe"), 7, "portConflict"),
        ("snat", json!(false), 2, "snat: false"),
        ("masqAll", json!(true), 2, "masqAll: true"),
        ("conditionsV4", json!(["-s", "1.2.3.4"]), 2, "conditionsV4"),
        ("conditionsV6", json!(["ip6 saddr ::1"]), 2, "conditionsV6"),
    ];
    for (key, value, code, named) in cases {
        let mut conf = config();
        conf[key] = value.clone();
        let (_, error) = call(&env("ADD"), &conf, &plugin);
        let error = error.unwrap();
        assert_eq!(error.code, code, "{key}: {value}: {error:?}");
        assert!(
            error.msg.contains(named) || error.details.contains(named),
            "{key}: {value}: {error:?}"
        );
    }
    for entry in [
        json!({"hostPort": 0, "containerPort": 80}),
        json!({"hostPort": 65536, "containerPort": 80}),
        json!({"hostPort": 80, "containerPort": -1}),
        json!({"hostPort": 80, "containerPort": 80, "protocol": "icmp"}),
        json!({"hostPort": 80, "containerPort": 80, "hostIP": "localhost"}),
        json!({"hostPort": 80, "containerPort": 80, "hostIP": "10.0.0.1/8"}),
    ] {
        let mut conf = config();
        conf["runtimeConfig"]["portMappings"] = json!([entry.clone()]);
        let (_, error) = call(&env("ADD"), &conf, &plugin);
        assert_eq!(error.unwrap().code, 7, "{entry}");
    }
    assert!(plugin.calls.borrow().is_empty());
}

#[test]
fn portmap_configs_as_users_write_them_are_accepted() {
    let mut conf = config();
    let extra = json!({
        "capabilities": {"portMappings": true},
        "snat": true,
        "markMasqBit": 13,
        "externalSetMarkChain": "KUBE-MARK-MASQ",
        "conditionsV4": [],
        "backend": "iptables",
        "someOtherPluginKey": {"x": 1},
        "stateDir": "/run/natledger-cni",
        "portConflict": "refuse"
    });
    for (k, v) in extra.as_object().unwrap() {
        conf[k] = v.clone();
    }
    conf["runtimeConfig"]["portMappings"] = json!([
        {"hostPort": 8080, "containerPort": 80, "protocol": "TCP", "hostIP": ""},
        {"hostPort": 8443, "containerPort": 443},
        {"hostPort": 9000, "containerPort": 9000, "protocol": "sctp", "hostIP": "::1"},
        {"hostPort": 5353, "containerPort": 53, "protocol": "udp", "hostIP": "0.0.0.0"}
    ]);
    let parsed = NetConf::from_value(conf).unwrap();
    assert_eq!(parsed.backend, Some(BackendChoice::Auto));
    assert_eq!(
        parsed.state_dir.as_deref(),
        Some(std::path::Path::new("/run/natledger-cni"))
    );
    assert_eq!(parsed.refuse_conflicts, Some(true));
    assert_eq!(
        parsed.mappings,
        vec![
            mapping(None, 8080, 80, Protocol::Tcp),
            mapping(None, 8443, 443, Protocol::Tcp),
            mapping(Some("::1"), 9000, 9000, Protocol::Sctp),
            mapping(Some("0.0.0.0"), 5353, 53, Protocol::Udp),
        ]
    );
    for (name, choice) in [
        (
            "legacy",
            BackendChoice::Named(crate::backend::Backend::IptablesLegacy),
        ),
        (
            "nft",
            BackendChoice::Named(crate::backend::Backend::IptablesNft),
        ),
        (
            "nftables",
            BackendChoice::Named(crate::backend::Backend::OwnNftables),
        ),
        ("auto", BackendChoice::Auto),
    ] {
        let mut conf = config();
        conf["backend"] = json!(name);
        assert_eq!(NetConf::from_value(conf).unwrap().backend, Some(choice));
    }
}

#[test]
fn errors_quote_input_cut_to_a_readable_length() {
    let mut conf = config();
    conf["name"] = json!(format!("x{}", " ".repeat(10_000)));
    let (out, error) = call(&env("ADD"), &conf, &Recorder::default());
    assert_eq!(error.unwrap().code, 7);
    assert!(out.stdout.len() < 1024, "{}", out.stdout.len());
}

/// containerd's CRI passes go-cni's `PortMapping` (no JSON tags: Go field names), which Go
/// plugins read case-insensitively; so does natledger, every key it reads there.
#[test]
fn port_mappings_keys_are_read_case_insensitively_as_go_plugins_do() {
    let mut conf = config();
    conf["RuntimeConfig"] = conf["runtimeConfig"].take();
    conf.as_object_mut().unwrap().remove("runtimeConfig");
    conf["RuntimeConfig"] = json!({"PortMappings": [
        {"HostPort": 8087, "ContainerPort": 80, "Protocol": "tcp", "HostIP": ""},
        {"hostport": 5353, "CONTAINERPORT": 53, "protocol": "UDP", "hostIp": "::1"},
        // Two spellings of one key that agree (with two values it is refused:
        // `validate::a_key_spelt_twice_with_two_values_is_refused`).
        {"hostPort": 9000, "HostPort": 9000, "containerPort": 90}
    ]});
    // `runtimeConfig` itself is libcni's exact key; only its contents are folded.
    assert!(
        NetConf::from_value(conf.clone())
            .unwrap()
            .mappings
            .is_empty()
    );
    conf["runtimeConfig"] = conf["RuntimeConfig"].take();
    assert_eq!(
        NetConf::from_value(conf).unwrap().mappings,
        vec![
            mapping(None, 8087, 80, Protocol::Tcp),
            mapping(Some("::1"), 5353, 53, Protocol::Udp),
            mapping(None, 9000, 90, Protocol::Tcp),
        ]
    );
}

/// DEL is best-effort: whatever made ADD refuse the configuration (a portmap option, a bad
/// mapping, a bad natledger key, prevResult of the wrong kind) never fails the DEL, which
/// libcni would otherwise stop at, leaving the bridge's and IPAM's DEL unrun. `stateDir` and
/// `backend` are used when valid.
#[test]
fn del_never_fails_on_what_add_refuses() {
    let plugin = Recorder::default();
    let cases: Vec<(&str, Value)> = vec![
        ("snat", json!(false)),
        ("masqAll", json!(true)),
        ("conditionsV4", json!(["-s", "1.2.3.4"])),
        ("backend", json!("ebpf")),
        ("stateDir", json!("run/natledger")),
        ("portConflict", json!("maybe")),
        ("prevResult", json!("not an object")),
        (
            "runtimeConfig",
            json!({"portMappings": [{"hostPort": "x"}]}),
        ),
        ("name", json!("")),
    ];
    for (key, value) in cases {
        let mut conf = config();
        conf[key] = value.clone();
        let (out, error) = call(&env("DEL"), &conf, &plugin);
        assert_eq!((out.code, error), (0, None), "{key}: {value}");
    }
    assert_eq!(plugin.calls.borrow().len(), 9);
    let mut conf = config();
    conf["stateDir"] = json!("/run/natledger-test");
    conf["backend"] = json!("legacy");
    let text = serde_json::to_vec(&conf).unwrap();
    let del = NetConf::for_del(spec::decode_object(&text).unwrap()).unwrap();
    assert_eq!(
        del.state_dir.as_deref(),
        Some(std::path::Path::new("/run/natledger-test"))
    );
    assert_eq!(
        del.backend,
        Some(crate::backend::BackendChoice::Named(
            crate::backend::Backend::IptablesLegacy
        ))
    );
}

/// `"cni.dev/valid-attachments": null` (libcni's nil slice: no live attachment) is the empty
/// list, so GC collects every attachment of the network; only an absent key is refused.
#[test]
fn gc_reads_a_null_list_as_empty() {
    let mut conf = config();
    conf["cniVersion"] = json!("1.1.0");
    conf["cni.dev/valid-attachments"] = Value::Null;
    let text = serde_json::to_vec(&conf).unwrap();
    let parsed = NetConf::from_value(spec::decode_object(&text).unwrap()).unwrap();
    assert_eq!(parsed.valid_attachments, Some(Vec::new()));
    conf.as_object_mut()
        .unwrap()
        .remove("cni.dev/valid-attachments");
    let text = serde_json::to_vec(&conf).unwrap();
    let parsed = NetConf::from_value(spec::decode_object(&text).unwrap()).unwrap();
    assert_eq!(parsed.valid_attachments, None);
}
