//! Issue 22's CNI refusals: `CNI_PATH` as libcni requires it, an empty `CNI_COMMAND`, one host
//! port mapped to two container ports, a mapping key spelt twice with two values.

use std::ffi::OsString;

use serde_json::json;

use super::{Recorder, call, config, env, mapping};
use crate::model::portspec::Protocol;

#[test]
fn add_del_check_and_gc_need_cni_path() {
    let plugin = Recorder::default();
    for command in ["ADD", "DEL", "CHECK", "GC"] {
        let mut vars = env(command);
        vars.remove("CNI_PATH");
        let mut conf = config();
        conf["cniVersion"] = json!("1.1.0");
        let (out, error) = call(&vars, &conf, &plugin);
        let error = error.unwrap_or_else(|| panic!("{command}: accepted"));
        assert_eq!((out.code, error.code), (1, 4), "{command}");
        assert!(error.details.contains("CNI_PATH"), "{command}: {error:?}");
    }
    // STATUS and VERSION need none (the spec; libcni's skel neither).
    for command in ["STATUS", "VERSION"] {
        let mut vars = env(command);
        vars.remove("CNI_PATH");
        let mut conf = config();
        conf["cniVersion"] = json!("1.1.0");
        let (out, _) = call(&vars, &conf, &plugin);
        assert_eq!(out.code, 0, "{command}: {}", out.stdout);
    }
    assert_eq!(
        plugin.calls.borrow().len(),
        1,
        "only STATUS reached the plugin"
    );
}

#[test]
fn an_empty_cni_command_is_answered_with_an_error_object() {
    let empty = |name: &str| (name == "CNI_COMMAND").then(OsString::new);
    assert!(env::requested(&empty, true), "no argument: a CNI call");
    assert!(
        !env::requested(&empty, false),
        "natledger's own command line"
    );
    assert!(!env::requested(&|_: &str| None, true));
    let mut vars = env("ADD");
    vars.insert("CNI_COMMAND", OsString::new());
    let (out, error) = call(&vars, &config(), &Recorder::default());
    let error = error.unwrap();
    assert_eq!((out.code, error.code), (1, 4));
    assert!(error.details.contains("CNI_COMMAND"), "{error:?}");
}

#[test]
fn one_host_port_to_two_container_ports_is_refused() {
    let plugin = Recorder::default();
    let mut conf = config();
    conf["runtimeConfig"]["portMappings"] = json!([
        {"hostPort": 8080, "containerPort": 80},
        {"hostPort": 8080, "containerPort": 81, "protocol": "TCP"}
    ]);
    let (_, error) = call(&env("ADD"), &conf, &plugin);
    let error = error.expect("refused");
    assert_eq!(error.code, 7);
    assert!(
        error.details.contains("8080:80/tcp and 8080:81/tcp"),
        "{error:?}"
    );
    // Another protocol, or another host address of the same family, is another host port;
    // an entry repeated exactly asks for nothing new and is kept once.
    conf["runtimeConfig"]["portMappings"] = json!([
        {"hostPort": 8080, "containerPort": 80},
        {"hostPort": 8080, "containerPort": 81, "protocol": "udp"},
        {"hostPort": 9090, "containerPort": 80, "hostIP": "127.0.0.1"},
        {"hostPort": 9090, "containerPort": 81, "hostIP": "127.0.0.2"},
        {"hostPort": 8080, "containerPort": 80}
    ]);
    let (out, error) = call(&env("ADD"), &conf, &plugin);
    assert_eq!((out.code, error), (0, None));
    assert_eq!(
        plugin.calls.borrow()[0].2,
        vec![
            mapping(None, 8080, 80, Protocol::Tcp),
            mapping(None, 8080, 81, Protocol::Udp),
            mapping(Some("127.0.0.1"), 9090, 80, Protocol::Tcp),
            mapping(Some("127.0.0.2"), 9090, 81, Protocol::Tcp),
        ]
    );
    // An unspecified host address overlaps every address of its family.
    conf["runtimeConfig"]["portMappings"] = json!([
        {"hostPort": 9090, "containerPort": 80, "hostIP": "0.0.0.0"},
        {"hostPort": 9090, "containerPort": 81, "hostIP": "127.0.0.2"}
    ]);
    let (_, error) = call(&env("ADD"), &conf, &plugin);
    assert_eq!(error.expect("refused").code, 7);
}

#[test]
fn a_key_spelt_twice_with_two_values_is_refused() {
    let plugin = Recorder::default();
    let mut conf = config();
    conf["runtimeConfig"]["portMappings"] =
        json!([{"hostPort": 8080, "HostPort": 9090, "containerPort": 80}]);
    let (_, error) = call(&env("ADD"), &conf, &plugin);
    let error = error.expect("refused");
    assert_eq!(error.code, 7);
    assert!(
        error.details.contains("\"hostPort\" and \"HostPort\""),
        "{error:?}"
    );
    for twice in [
        json!({"HOSTPORT": 8080, "hostport": 8081, "containerPort": 80}),
        json!({"hostPort": 8080, "containerPort": 80, "Protocol": "tcp", "PROTOCOL": "udp"}),
    ] {
        conf["runtimeConfig"]["portMappings"] = json!([twice]);
        let (_, error) = call(&env("ADD"), &conf, &plugin);
        assert_eq!(error.expect("refused").code, 7, "{twice}");
    }
    conf["runtimeConfig"] = json!({
        "portMappings": [{"hostPort": 8080, "containerPort": 80}],
        "PortMappings": [{"hostPort": 8081, "containerPort": 80}]
    });
    let (_, error) = call(&env("ADD"), &conf, &plugin);
    assert_eq!(error.expect("refused").code, 7);
    // The same value twice says one thing.
    conf["runtimeConfig"] = json!({"portMappings": [
        {"hostPort": 8080, "HostPort": 8080, "containerPort": 80, "ContainerPort": 80}
    ]});
    let (out, error) = call(&env("ADD"), &conf, &plugin);
    assert_eq!((out.code, error), (0, None));
    assert!(plugin.calls.borrow().len() == 1);
}
