use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::OsString;

use serde_json::{Value, json};

mod attachment;
mod netconf;
mod settings;
mod validate;

use super::spec::{ErrorResult, VersionResult};
use super::*;
use crate::backend::BackendChoice;
use crate::model::portspec::{PortMapping, PortRange, Protocol};

/// Records what it was asked; answers `fail` when set. It stands in for the rule work, which
/// is not what these tests are about (the parsing and dispatch are).
/// One call: the command, its attachment, its mappings.
type Call = (Command, Option<Attachment>, Vec<PortMapping>);

#[derive(Default)]
struct Recorder {
    calls: RefCell<Vec<Call>>,
    fail: Option<CniError>,
}

impl Recorder {
    fn record(&self, r: &Request) -> Result<(), CniError> {
        self.calls.borrow_mut().push((
            r.env.command,
            r.env.attachment.clone(),
            r.conf.mappings.clone(),
        ));
        self.fail.clone().map_or(Ok(()), Err)
    }
}

impl Plugin for Recorder {
    fn add(&self, r: &Request) -> Result<(), CniError> {
        self.record(r)
    }
    fn del(&self, r: &Request) -> Result<(), CniError> {
        self.record(r)
    }
    fn check(&self, r: &Request) -> Result<(), CniError> {
        self.record(r)
    }
    fn gc(&self, r: &Request) -> Result<(), CniError> {
        self.record(r)
    }
    fn status(&self, r: &Request) -> Result<(), CniError> {
        self.record(r)
    }
}

const ID: &str = "3f1c0a9d2b7e4c5f8a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f6071";

fn env(command: &str) -> HashMap<&'static str, OsString> {
    let mut vars = HashMap::from([
        ("CNI_COMMAND", OsString::from(command)),
        ("CNI_CONTAINERID", OsString::from(ID)),
        ("CNI_NETNS", OsString::from("/run/netns/cni-1234")),
        ("CNI_IFNAME", OsString::from("eth0")),
        ("CNI_PATH", OsString::from("/opt/cni/bin")),
    ]);
    if command == "GC" || command == "STATUS" || command == "VERSION" {
        vars.retain(|k, _| *k == "CNI_COMMAND" || *k == "CNI_PATH");
    }
    vars
}

fn prev_result() -> Value {
    json!({
        "cniVersion": "1.0.0",
        "interfaces": [
            {"name": "cni0", "mac": "0a:58:0a:58:00:01"},
            {"name": "veth1234", "mac": "0a:58:0a:58:00:02"},
            {"name": "eth0", "mac": "0a:58:0a:58:00:03", "sandbox": "/run/netns/cni-1234"}
        ],
        "ips": [
            {"address": "10.88.0.1/16", "interface": 0},
            {"address": "10.88.0.7/16", "gateway": "10.88.0.1", "interface": 2},
            {"address": "fd00::7/64", "gateway": "fd00::1", "interface": 2}
        ],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dns": {}
    })
}

fn config() -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": "podman",
        "type": "natledger",
        "runtimeConfig": {"portMappings": [
            {"hostPort": 6667, "containerPort": 80, "protocol": "tcp"},
            {"hostPort": 5353, "containerPort": 53, "protocol": "udp", "hostIP": "127.0.0.1"}
        ]},
        "prevResult": prev_result()
    })
}

fn call(
    vars: &HashMap<&'static str, OsString>,
    stdin: &Value,
    plugin: &Recorder,
) -> (Output, Option<ErrorResult>) {
    let text = serde_json::to_vec(stdin).unwrap();
    call_raw(vars, &text, plugin)
}

fn call_raw(
    vars: &HashMap<&'static str, OsString>,
    stdin: &[u8],
    plugin: &Recorder,
) -> (Output, Option<ErrorResult>) {
    let lookup = |name: &str| vars.get(name).cloned();
    let out = run(stdin, &lookup, plugin);
    let error = if out.code != 0 {
        Some(serde_json::from_str(&out.stdout).expect("an error object on stdout"))
    } else {
        None
    };
    (out, error)
}

fn mapping(host_ip: Option<&str>, host: u16, container: u16, protocol: Protocol) -> PortMapping {
    PortMapping {
        host_ip: host_ip.map(|ip| ip.parse().unwrap()),
        host_ports: PortRange::single(host),
        container_ports: PortRange::single(container),
        protocol,
    }
}

#[test]
fn add_passes_prev_result_through_and_acts_on_the_mappings() {
    let plugin = Recorder::default();
    let mut conf = config();
    conf["prevResult"]["someFutureKey"] = json!({"z": 1, "a": [1.5, null]});
    let (out, error) = call(&env("ADD"), &conf, &plugin);
    assert_eq!(error, None);
    assert_eq!(out.code, 0);
    let printed: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(printed, conf["prevResult"]);
    // Key order kept too (serde_json's preserve_order): the text is the input's.
    assert_eq!(
        out.stdout.trim_end(),
        serde_json::to_string(&conf["prevResult"]).unwrap()
    );
    let calls = plugin.calls.borrow();
    assert_eq!(calls.len(), 1);
    let (command, attachment, mappings) = &calls[0];
    assert_eq!(*command, Command::Add);
    assert_eq!(
        attachment.as_ref().unwrap(),
        &Attachment {
            container_id: ID.into(),
            ifname: "eth0".into()
        }
    );
    assert_eq!(
        mappings,
        &vec![
            mapping(None, 6667, 80, Protocol::Tcp),
            mapping(Some("127.0.0.1"), 5353, 53, Protocol::Udp),
        ]
    );
}

#[test]
fn add_without_prev_result_is_an_invalid_config_and_nothing_is_done() {
    let plugin = Recorder::default();
    let mut conf = config();
    conf.as_object_mut().unwrap().remove("prevResult");
    let (_, error) = call(&env("ADD"), &conf, &plugin);
    let error = error.unwrap();
    assert_eq!(error.code, 7);
    assert_eq!(error.cni_version, "1.0.0");
    assert!(error.msg.contains("chained"), "{error:?}");
    assert!(plugin.calls.borrow().is_empty());
}

#[test]
fn a_plugin_failure_is_the_error_object_and_exit_1() {
    let plugin = Recorder {
        fail: Some(CniError::new(Code::Failed, "could not install", "why")),
        ..Default::default()
    };
    let (out, error) = call(&env("ADD"), &config(), &plugin);
    assert_eq!(out.code, 1);
    assert_eq!(
        error.unwrap(),
        ErrorResult {
            cni_version: "1.0.0".into(),
            code: 100,
            msg: "could not install".into(),
            details: "why".into(),
        }
    );
}

#[test]
fn del_works_without_runtime_config_or_prev_result_or_netns() {
    let plugin = Recorder::default();
    let mut vars = env("DEL");
    vars.remove("CNI_NETNS");
    let conf = json!({"cniVersion": "1.1.0", "name": "podman", "type": "natledger"});
    let (out, error) = call(&vars, &conf, &plugin);
    assert_eq!(error, None);
    assert_eq!(out.stdout, "");
    let calls = plugin.calls.borrow();
    assert_eq!(calls[0].0, Command::Del);
    assert!(calls[0].2.is_empty());
}

#[test]
fn version_answers_with_the_input_version_and_needs_nothing_else() {
    let plugin = Recorder::default();
    let vars = HashMap::from([("CNI_COMMAND", OsString::from("VERSION"))]);
    for (stdin, version) in [
        (&br#"{"cniVersion":"1.0.0"}"#[..], "1.0.0"),
        (b"", "1.1.0"),
        (b"not json", "1.1.0"),
        (br#"{"cniVersion":"0.3.1"}"#, "0.3.1"),
    ] {
        let (out, error) = call_raw(&vars, stdin, &plugin);
        assert_eq!(error, None);
        let answer: VersionResult = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(
            answer,
            VersionResult {
                cni_version: version.into(),
                supported_versions: ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]
                    .map(String::from)
                    .to_vec(),
            }
        );
    }
    assert!(plugin.calls.borrow().is_empty());
}

#[test]
fn versions_unknown_are_code_1_malformed_code_6() {
    let plugin = Recorder::default();
    for (version, code) in [
        (json!("0.2.0"), 1),
        (json!("0.1.0"), 1),
        (json!("0.3.2"), 1),
        (json!("2.0.0"), 1),
        (json!(null), 1), // missing is 0.1.0
        (json!(""), 1),
        (json!("1.0"), 6),
        (json!("v1.0.0"), 6),
        (json!(1), 6),
    ] {
        let mut conf = config();
        conf["cniVersion"] = version.clone();
        let (out, error) = call(&env("ADD"), &conf, &plugin);
        assert_eq!(out.code, 1);
        assert_eq!(error.unwrap().code, code, "cniVersion {version}");
    }
    assert!(plugin.calls.borrow().is_empty());
}

#[test]
fn gc_and_status_need_1_1_0_check_runs_from_0_4_0() {
    let plugin = Recorder::default();
    for (command, version, code) in [
        ("CHECK", "0.3.0", Some(1)),
        ("CHECK", "0.3.1", Some(1)),
        ("GC", "0.3.1", Some(1)),
        ("GC", "1.0.0", Some(1)),
        ("STATUS", "0.4.0", Some(1)),
        ("GC", "1.1.0", None),
        ("STATUS", "1.1.0", None),
        ("CHECK", "0.4.0", None),
    ] {
        let mut conf = config();
        conf["cniVersion"] = json!(version);
        let (_, error) = call(&env(command), &conf, &plugin);
        assert_eq!(error.map(|e| e.code), code, "{command} {version}");
    }
    assert_eq!(plugin.calls.borrow().len(), 3);
}

/// A 0.3.1 conflist as flannel's and older Kubernetes ones are written, with the result a
/// 0.3.1 bridge plugin hands on (`ips[].version`, `interface` indices).
fn config_0_3_1() -> Value {
    json!({
        "cniVersion": "0.3.1",
        "name": "cbr0",
        "type": "natledger",
        "capabilities": {"portMappings": true},
        "runtimeConfig": {"portMappings": [
            {"hostPort": 6667, "containerPort": 80, "protocol": "tcp"}
        ]},
        "prevResult": {
            "cniVersion": "0.3.1",
            "interfaces": [
                {"name": "cni0", "mac": "0a:58:0a:f4:00:01"},
                {"name": "eth0", "mac": "0a:58:0a:f4:00:05", "sandbox": "/run/netns/cni-1234"}
            ],
            "ips": [
                {"version": "4", "interface": 1, "address": "10.244.0.5/24",
                 "gateway": "10.244.0.1"},
                {"version": "6", "interface": 1, "address": "fd44::5/64", "gateway": "fd44::1"}
            ],
            "routes": [{"dst": "0.0.0.0/0"}],
            "dns": {}
        }
    })
}

#[test]
fn a_0_3_x_config_is_served_add_passes_its_result_through_del_needs_none() {
    for version in ["0.3.0", "0.3.1"] {
        let plugin = Recorder::default();
        let mut conf = config_0_3_1();
        conf["cniVersion"] = json!(version);
        conf["prevResult"]["cniVersion"] = json!(version);
        let (out, error) = call(&env("ADD"), &conf, &plugin);
        assert_eq!(error, None, "{version}");
        let printed: Value = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(printed, conf["prevResult"], "{version}");
        // DEL as a 0.3.x runtime sends it: no prevResult (it came with 0.4.0).
        let mut del = conf.clone();
        del.as_object_mut().unwrap().remove("prevResult");
        let (out, error) = call(&env("DEL"), &del, &plugin);
        assert_eq!((error, out.stdout.as_str()), (None, ""), "{version}");
        let calls = plugin.calls.borrow();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].0, Command::Add);
        assert_eq!(
            calls[0].2,
            vec![mapping(None, 6667, 80, Protocol::Tcp)],
            "{version}"
        );
        assert_eq!(calls[1].0, Command::Del);
        // Errors answer in the config's version.
        let (_, error) = call(&env("CHECK"), &conf, &plugin);
        assert_eq!(error.unwrap().cni_version, version);
    }
}

#[test]
fn environment_errors_are_code_4_and_name_the_variables() {
    let plugin = Recorder::default();
    let cases: Vec<(&str, Option<&str>, &str)> = vec![
        ("CNI_CONTAINERID", None, "CNI_CONTAINERID"),
        ("CNI_IFNAME", None, "CNI_IFNAME"),
        ("CNI_NETNS", None, "CNI_NETNS"),
        ("CNI_CONTAINERID", Some("-leading"), "CNI_CONTAINERID"),
        ("CNI_CONTAINERID", Some("a/b"), "CNI_CONTAINERID"),
        ("CNI_CONTAINERID", Some("a+b"), "CNI_CONTAINERID"),
        ("CNI_IFNAME", Some("eth0:1"), "CNI_IFNAME"),
        ("CNI_IFNAME", Some("sixteen-chars-xx"), "CNI_IFNAME"),
        ("CNI_IFNAME", Some(".."), "CNI_IFNAME"),
        ("CNI_IFNAME", Some("a b"), "CNI_IFNAME"),
        ("CNI_COMMAND", Some("REMOVE"), "CNI_COMMAND"),
    ];
    for (name, value, named) in cases {
        let mut vars = env("ADD");
        match value {
            None => {
                vars.remove(name);
            }
            Some(v) => {
                vars.insert(name, OsString::from(v));
            }
        }
        let (out, error) = call(&vars, &config(), &plugin);
        let error = error.unwrap();
        assert_eq!((out.code, error.code), (1, 4), "{name}={value:?}");
        assert!(
            error.msg.contains(named) || error.details.contains(named),
            "{name}={value:?}: {error:?}"
        );
    }
    // GC needs CNI_PATH; DEL needs no CNI_NETNS.
    let mut vars = env("GC");
    vars.remove("CNI_PATH");
    let mut conf = config();
    conf["cniVersion"] = json!("1.1.0");
    let (_, error) = call(&vars, &conf, &plugin);
    assert!(error.unwrap().details.contains("CNI_PATH"));
    assert!(plugin.calls.borrow().is_empty());
}

#[test]
fn a_non_utf8_variable_is_code_4() {
    use std::os::unix::ffi::OsStringExt;
    let mut vars = env("ADD");
    vars.insert("CNI_IFNAME", OsString::from_vec(vec![b'e', 0xff]));
    let (_, error) = call(&vars, &config(), &Recorder::default());
    let error = error.unwrap();
    assert_eq!(error.code, 4);
    assert!(error.details.contains("CNI_IFNAME"));
}
