//! Running `natledger doctor` and reading its report, for the doctor tests.

use std::path::{Path, PathBuf};
use std::process::{Child, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::*;

/// A fixture under `tests/fixtures/doctor/`.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/doctor")
        .join(name)
}

/// `LABEL:tests/fixtures/doctor/NAME`.
pub fn from(label: &str, name: &str) -> String {
    format!("{label}:{}", fixture(name).display())
}

/// What one doctor run gave.
pub struct Doc {
    pub code: i32,
    pub report: Value,
    pub stdout: String,
    pub stderr: String,
}

impl Doc {
    pub fn of(out: Output, json: bool) -> Doc {
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let code = out.status.code().unwrap_or(-1);
        let report = if json && code != 3 {
            serde_json::from_str(&stdout).unwrap_or_else(|e| {
                panic!("doctor --json printed no JSON ({e}); exit {code}\n{stdout}\n{stderr}")
            })
        } else {
            Value::Null
        };
        let doc = Doc {
            code,
            report,
            stdout,
            stderr,
        };
        if json && code != 3 {
            doc.check_schema();
            doc.check_prose();
        }
        doc
    }

    /// Every sentence doctor wrote for a person parses: no known-bad pattern (see
    /// [`garbled`]) in any finding's summary, evidence or fix (the rule lines quoted in a
    /// fix are the owners' words, left out).
    pub fn check_prose(&self) {
        for f in self.findings() {
            let mut texts = vec![text(f, "summary")];
            texts.extend(
                f["evidence"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .map(str::to_string),
            );
            texts.push(unquoted(&text(f, "fix")));
            for t in texts.iter().map(|t| without_nft_sets(t)) {
                let bad = garbled(&t);
                assert!(bad.is_empty(), "garbled ({bad:?}): {t:?}\n{}", self.show());
            }
        }
    }

    pub fn findings(&self) -> &[Value] {
        self.report["findings"]
            .as_array()
            .map_or(&[], Vec::as_slice)
    }

    pub fn of_kind(&self, kind: &str) -> Vec<&Value> {
        self.findings()
            .iter()
            .filter(|f| f["kind"] == kind)
            .collect()
    }

    /// Everything, for assertion messages.
    pub fn show(&self) -> String {
        let report = serde_json::to_string_pretty(&self.report).unwrap_or_default();
        let text = if self.report.is_null() {
            &self.stdout
        } else {
            &report
        };
        format!("exit {}\n{text}\nstderr: {}", self.code, self.stderr)
    }

    /// The exit status matches the worst severity, and the report has the documented shape:
    /// `{sources, rules_read, complete, findings: [{severity, kind, port?, protocol?, summary,
    /// rules: [{backend, family, table, chain, position, line, hooks?, table_family?, handle?,
    /// element?: {set, key}, owner?}], evidence?, fix?}],
    /// not_followed?: [{hook, rule, reason}]}` (`not_followed` exactly when not complete).
    pub fn check_schema(&self) {
        let r = &self.report;
        let keys = |v: &Value| -> Vec<String> {
            v.as_object()
                .unwrap_or_else(|| panic!("not an object: {v}"))
                .keys()
                .cloned()
                .collect()
        };
        let cut = r["complete"] == false;
        let mut expected = vec!["sources", "rules_read", "complete", "findings"];
        expected.extend(cut.then_some("not_followed"));
        expected.push("duration_seconds");
        assert_eq!(keys(r), expected, "{}", self.show());
        for n in r["not_followed"].as_array().into_iter().flatten() {
            assert_eq!(keys(n), ["hook", "rule", "reason"], "{}", self.show());
            assert!(
                n["rule"]["line"].is_string() && n["reason"].is_string(),
                "{}",
                self.show()
            );
        }
        assert!(
            r["sources"]
                .as_array()
                .is_some_and(|s| s.iter().all(Value::is_string))
        );
        assert!(
            r["rules_read"].is_u64()
                && r["complete"].is_boolean()
                && r["duration_seconds"].as_f64().is_some_and(|d| d >= 0.0),
            "{}",
            self.show()
        );
        let mut worst = 0;
        for f in self.findings() {
            let allowed = [
                "severity", "kind", "port", "protocol", "summary", "rules", "evidence", "fix",
            ];
            for k in keys(f) {
                assert!(allowed.contains(&k.as_str()), "unknown key {k} in {f}");
            }
            let severity = f["severity"].as_str().unwrap_or_default();
            worst = worst.max(match severity {
                "info" => 0,
                "warning" => 1,
                "error" => 2,
                other => panic!("severity {other:?} in {f}"),
            });
            let kinds = [
                "shadowed",
                "dead-target",
                "hijacked-listener",
                "split-backends",
                "natledger-state",
                "forward-dropped",
                "unlocked-legacy-writer",
                "localhost-exposed",
            ];
            assert!(
                kinds.contains(&f["kind"].as_str().unwrap_or_default()),
                "{f}"
            );
            assert!(
                f.get("port")
                    .is_none_or(|p| p.as_u64().is_some_and(|p| p <= 65535))
            );
            assert!(f.get("protocol").is_none_or(Value::is_string), "{f}");
            assert!(f["summary"].as_str().is_some_and(|s| !s.is_empty()), "{f}");
            assert!(
                f.get("evidence")
                    .is_none_or(|e| e.as_array().is_some_and(|e| !e.is_empty()))
            );
            assert!(f.get("fix").is_none_or(Value::is_string), "{f}");
            for rule in f["rules"]
                .as_array()
                .unwrap_or_else(|| panic!("no rules: {f}"))
            {
                let mut rule_keys = keys(rule);
                // The hooks a shadowed rule never matches on (shadow findings only).
                if let Some(hooks) = rule.get("hooks") {
                    assert_eq!(f["kind"], "shadowed", "{f}");
                    assert!(
                        hooks
                            .as_array()
                            .is_some_and(|h| !h.is_empty() && h.iter().all(Value::is_string)),
                        "{f}"
                    );
                    rule_keys.retain(|k| k != "hooks");
                }
                // A native nf_tables rule: its table's family, and its handle, the map
                // element that decided and its owner when known; its line in nft's words.
                let native = rule.get("table_family").is_some();
                if native {
                    assert_eq!(rule["backend"], "nftables", "{rule}");
                    assert!(
                        ["ip", "ip6", "inet", "arp", "bridge", "netdev"]
                            .contains(&rule["table_family"].as_str().unwrap_or("")),
                        "{rule}"
                    );
                    assert!(rule.get("handle").is_none_or(Value::is_u64), "{rule}");
                    assert!(
                        rule.get("element").is_none_or(|e| {
                            keys(e) == ["set", "key"] && e["key"].as_str().is_some()
                        }),
                        "{rule}"
                    );
                    assert!(
                        rule.get("owner").is_none_or(|o| {
                            let owners = [
                                "kube-proxy",
                                "netavark",
                                "firewalld",
                                "docker",
                                "portmap",
                                "natledger",
                            ];
                            owners.contains(&o.as_str().unwrap_or(""))
                        }),
                        "{rule}"
                    );
                    rule_keys.retain(|k| {
                        !["table_family", "handle", "element", "owner"].contains(&k.as_str())
                    });
                }
                assert_eq!(
                    rule_keys,
                    ["backend", "family", "table", "chain", "position", "line"]
                );
                // natledger's own nftables tables: its natledger-state findings name them.
                let backends = ["legacy", "nft", "nftables"];
                assert!(
                    backends.contains(&rule["backend"].as_str().unwrap_or("")),
                    "{rule}"
                );
                assert!(["ipv4", "ipv6"].contains(&rule["family"].as_str().unwrap_or("")));
                assert!(rule["position"].is_u64(), "{rule}");
                let line = rule["line"].as_str().unwrap_or_default();
                let chain = rule["chain"].as_str().unwrap_or_default();
                assert!(
                    native || line.starts_with(&format!("-A {chain} ")),
                    "{rule}"
                );
            }
        }
        assert_eq!(
            self.code,
            worst,
            "exit status vs worst severity\n{}",
            self.show()
        );
    }
}

/// The known-bad patterns `text` shows: doubled prepositions ("in on", "to to"), doubled
/// articles, empty parentheses, double spaces, a space before punctuation, a dangling article
/// or preposition before punctuation or at the end ("for a.", "to,"), a plural subject with a
/// singular verb ("packets goes").
pub fn garbled(text: &str) -> Vec<String> {
    let mut bad = Vec::new();
    let lower = text.to_lowercase();
    for pattern in [
        " in on ",
        " on in ",
        " to to ",
        " of of ",
        " for for ",
        " from from ",
        " on on ",
        " in in ",
        " a a ",
        " an an ",
        " a an ",
        " an a ",
        " the the ",
        "()",
        "( )",
        "  ",
        " ,",
        " .",
        " ;",
        " :",
        " )",
        "( ",
        ",,",
        "..",
        "packets goes",
        "packets is ",
    ] {
        if lower.contains(pattern) {
            bad.push(pattern.trim().to_string());
        }
    }
    let words: Vec<&str> = lower.split(' ').collect();
    for (i, w) in words.iter().enumerate() {
        let bare = w.trim_end_matches(['.', ',', ';', ':', ')']);
        let dangling = [
            "a", "an", "the", "for", "to", "of", "in", "on", "from", "not",
        ];
        let ends = bare.len() < w.len() || i + 1 == words.len();
        if dangling.contains(&bare) && ends && !w.is_empty() {
            bad.push(format!("dangling {bare:?}"));
        }
    }
    // A sentence about packets ("tcp packets to port 80 ...") takes a plural verb.
    for sentence in lower.split(". ") {
        let plural = sentence.split(' ').take(2).any(|w| w == "packets");
        let head = sentence.split([',', ':', ';']).next().unwrap_or_default();
        if plural
            && [" goes ", " is ", " takes ", " reaches "]
                .iter()
                .any(|v| head.contains(v))
        {
            bad.push("plural subject, singular verb".into());
        }
    }
    if text.starts_with(' ') || text.ends_with(' ') {
        bad.push("leading or trailing space".into());
    }
    bad
}

/// `text` with every nft set or element in braces (`element { tcp . 30080 }`, nft's own
/// syntax for a concatenated key, spaces around its dots) replaced by one word.
fn without_nft_sets(text: &str) -> String {
    let mut out = String::new();
    let mut depth = 0;
    for c in text.chars() {
        match c {
            '{' => {
                if depth == 0 {
                    out.push_str("SET");
                }
                depth += 1;
            }
            '}' if depth > 0 => depth -= 1,
            _ if depth > 0 => {}
            c => out.push(c),
        }
    }
    out
}

/// `text` with every quoted word replaced by one word (the owners' rule comments in a
/// command): doctor's commands single-quote a word for the shell (`'a b'`, a `'` inside as
/// `'\''`); double quotes are kept for older texts. An apostrophe inside a word
/// ("natledger's") quotes nothing.
fn unquoted(text: &str) -> String {
    let mut out = String::new();
    let mut quote: Option<char> = None;
    let mut escaped = false;
    let mut prev = ' ';
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match (quote, escaped, c) {
            (Some('"'), false, '\\') => escaped = true,
            (Some('"'), false, '"') => quote = None,
            (Some('\''), _, '\'') => {
                // `'\''` continues the word; a quote before a blank or the end closes it.
                match chars.peek() {
                    Some('\\') => {
                        chars.next();
                        chars.next();
                        chars.next();
                    }
                    _ => quote = None,
                }
            }
            (None, _, '"') => {
                quote = Some('"');
                out.push_str("QUOTED");
            }
            (None, _, '\'') if prev.is_whitespace() => {
                quote = Some('\'');
                out.push_str("QUOTED");
            }
            (None, _, c) => out.push(c),
            _ => escaped = false,
        }
        prev = c;
    }
    out
}

/// `natledger doctor ARGS` on this host, with an empty state directory of its own. Only
/// for `--from`: nothing live is read.
pub fn doctor(args: &[&str]) -> Doc {
    let state = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(BIN)
        .env("NATLEDGER_STATE_DIR", state.path())
        .arg("doctor")
        .args(args)
        .output()
        .expect("run natledger");
    Doc::of(out, args.contains(&"--json"))
}

pub fn doctor_json(args: &[&str]) -> Doc {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    doctor(&all)
}

/// `natledger doctor --json ARGS` inside the node namespace.
pub fn live(node: &Node, args: &[&str]) -> Doc {
    let mut all = vec!["doctor", "--json"];
    all.extend_from_slice(args);
    Doc::of(node.natledger(&all, "", &[]), true)
}

/// `(chain, position)` of each rule of a finding.
pub fn places(f: &Value) -> Vec<(String, u64)> {
    f["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["chain"].as_str().unwrap().to_string(),
                r["position"].as_u64().unwrap(),
            )
        })
        .collect()
}

pub fn line_of(f: &Value, i: usize) -> &str {
    f["rules"][i]["line"].as_str().unwrap_or_default()
}

pub fn text(f: &Value, key: &str) -> String {
    match &f[key] {
        Value::String(s) => s.clone(),
        Value::Array(a) => a
            .iter()
            .map(|v| v.as_str().unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

// ---------------------------------------------------------------------------------------------
// Fixtures (--from): one per seed, a clean host, --port, IPv6, failure modes

pub struct Proc(pub Child);

impl Proc {
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Start `argv` in `ns` and wait until it listens on TCP `port` (its own socket tables).
pub fn listener(ns: &str, argv: &[&str], port: u16) -> Proc {
    let child = Proc(spawn_in(ns, argv));
    let pid = child.pid();
    let needle = format!(":{port:04X} ");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let listening = ["tcp", "tcp6"].iter().any(|f| {
            std::fs::read_to_string(format!("/proc/{pid}/net/{f}"))
                .unwrap_or_default()
                .lines()
                .any(|l| {
                    let cols: Vec<&str> = l.split_whitespace().collect();
                    cols.get(1)
                        .is_some_and(|a| format!("{a} ").ends_with(&needle))
                        && cols.get(3) == Some(&"0A")
                })
        });
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if listening && comm.trim() != "ip" {
            return child;
        }
        assert!(
            Instant::now() < deadline,
            "{argv:?} did not listen on {port} in {ns}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An IPv4-only listener (`0.0.0.0:PORT`), like seed 003's `SimpleHTTPServer`.
pub fn httpd_v4(node: &Node, port: u16) -> Proc {
    let home = node.dir.path().display().to_string();
    let addr = format!("0.0.0.0:{port}");
    listener(
        node.topo.node(),
        &["busybox", "httpd", "-f", "-p", &addr, "-h", &home],
        port,
    )
}

pub fn load_fixture(node: &Node, backend: Backend, family: Family, name: &str) {
    let text = std::fs::read_to_string(fixture(name)).unwrap();
    load_rules(node.topo.node(), backend, family, &text);
}

pub const STALE_DN: &str = "CNI-DN-b24a4eb3a38dc5843c23a";
pub const LIVE_DN: &str = "CNI-DN-f2390ee4e08c581b1ea73";
