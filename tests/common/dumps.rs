//! Firewall dumps: `*-save` of every (iptables backend, family) pair and `nft list ruleset`
//! (the tables iptables-nft-save does not show: natledger's own and other native nftables
//! tables), normalized so that before/after comparisons are exact, and loading foreign rules
//! with `*-restore`.

use super::run_in;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Backend {
    IptablesLegacy,
    IptablesNft,
    /// natledger's own nf_tables tables (`ip natledger`, `ip6 natledger`).
    OwnNftables,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Family {
    V4,
    V6,
}

impl Backend {
    pub const ALL: [Backend; 3] = [
        Backend::IptablesLegacy,
        Backend::IptablesNft,
        Backend::OwnNftables,
    ];
    /// The backends with iptables tools (and other owners' iptables rules).
    pub const IPTABLES: [Backend; 2] = [Backend::IptablesLegacy, Backend::IptablesNft];

    /// "legacy" / "nft" / "nftables": natledger's `--backend` names.
    pub fn name(self) -> &'static str {
        match self {
            Backend::IptablesLegacy => "legacy",
            Backend::IptablesNft => "nft",
            Backend::OwnNftables => "nftables",
        }
    }

    pub fn is_iptables(self) -> bool {
        self != Backend::OwnNftables
    }
}

impl Family {
    pub const ALL: [Family; 2] = [Family::V4, Family::V6];

    /// "ipv4" / "ipv6"
    pub fn name(self) -> &'static str {
        match self {
            Family::V4 => "ipv4",
            Family::V6 => "ipv6",
        }
    }
}

/// The iptables binary for a pair, e.g. "ip6tables-nft"; append "-save" /
/// "-restore" for the others.
pub fn iptables_tool(backend: Backend, family: Family) -> &'static str {
    match (backend, family) {
        (Backend::IptablesLegacy, Family::V4) => "iptables-legacy",
        (Backend::IptablesLegacy, Family::V6) => "ip6tables-legacy",
        (Backend::IptablesNft, Family::V4) => "iptables-nft",
        (Backend::IptablesNft, Family::V6) => "ip6tables-nft",
        (Backend::OwnNftables, _) => panic!("natledger's nftables backend has no iptables tool"),
    }
}

/// Raw `*-save` output (all tables) in `ns`. Panics if the tool fails.
pub fn save(ns: &str, backend: Backend, family: Family) -> String {
    let prog = format!("{}-save", iptables_tool(backend, family));
    let out = run_in(ns, &prog, &[], None);
    assert!(
        out.status.success(),
        "{prog} in {ns} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    String::from_utf8(out.stdout)
        .unwrap_or_else(|e| panic!("{prog} in {ns}: non-UTF-8 output: {e}"))
}

/// Replaces a leading "[packets:bytes]" with "[0:0]".
fn zero_leading_counters(s: &str) -> Option<String> {
    let rest = s.strip_prefix('[')?;
    let end = rest.find(']')?;
    let (p, b) = rest[..end].split_once(':')?;
    if p.is_empty()
        || b.is_empty()
        || !p.bytes().all(|c| c.is_ascii_digit())
        || !b.bytes().all(|c| c.is_ascii_digit())
    {
        return None;
    }
    Some(format!("[0:0]{}", &rest[end + 1..]))
}

/// Normalizes `*-save` output: drops comments and blank lines, zeroes
/// counters, and drops table blocks made only of built-in chains with policy
/// ACCEPT (no rules, no user chains), so an absent table equals an empty one.
pub fn normalized(dump: &str) -> String {
    let mut out = String::new();
    // Current table block and whether it carries any information.
    let mut block: Option<(Vec<String>, bool)> = None;
    for line in dump.lines() {
        let line = line.trim_end();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if line.starts_with('*') {
            if let Some((lines, _)) = block.take() {
                // Unterminated block: keep it verbatim.
                lines.iter().for_each(|l| {
                    out.push_str(l);
                    out.push('\n');
                });
            }
            block = Some((vec![line.to_string()], false));
            continue;
        }
        let Some((lines, interesting)) = block.as_mut() else {
            out.push_str(&zero_leading_counters(line).unwrap_or_else(|| line.to_string()));
            out.push('\n');
            continue;
        };
        if line == "COMMIT" {
            lines.push(line.to_string());
            let (lines, interesting) = block.take().expect("block is open");
            if interesting {
                lines.iter().for_each(|l| {
                    out.push_str(l);
                    out.push('\n');
                });
            }
            continue;
        }
        if let Some(chain) = line.strip_prefix(':') {
            let mut parts = chain.split_whitespace();
            let name = parts.next().unwrap_or("");
            let policy = parts.next().unwrap_or("");
            // "-" marks a user chain; DROP etc. is a non-default policy.
            if policy != "ACCEPT" {
                *interesting = true;
            }
            lines.push(format!(":{name} {policy} [0:0]"));
        } else {
            *interesting = true;
            lines.push(zero_leading_counters(line).unwrap_or_else(|| line.to_string()));
        }
    }
    if let Some((lines, _)) = block {
        lines.iter().for_each(|l| {
            out.push_str(l);
            out.push('\n');
        });
    }
    out
}

/// Normalized dumps of all four (iptables backend, family) pairs in `ns`, each headed
/// by "## <legacy|nft> <ipv4|ipv6>", then "## nftables": `nft list ruleset` without the
/// tables iptables-nft owns ([`native_ruleset`]).
pub fn dump_all(ns: &str) -> String {
    let mut out = String::new();
    for backend in Backend::IPTABLES {
        for family in Family::ALL {
            out.push_str(&format!("## {} {}\n", backend.name(), family.name()));
            out.push_str(&normalized(&save(ns, backend, family)));
        }
    }
    out.push_str("## nftables\n");
    out.push_str(&native_ruleset(ns));
    out
}

/// The tables iptables-nft writes (shown by the `*-save` sections already).
const IPTABLES_NFT_TABLES: [&str; 5] = ["filter", "nat", "mangle", "raw", "security"];

/// `nft list ruleset` in `ns` without the `ip`/`ip6` tables iptables-nft owns: natledger's
/// own tables and any other owner's native nftables tables, exactly as nft prints them.
pub fn native_ruleset(ns: &str) -> String {
    let out = run_in(ns, "nft", &["list", "ruleset"], None);
    assert!(
        out.status.success(),
        "nft list ruleset in {ns} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let text = String::from_utf8(out.stdout).expect("nft prints UTF-8");
    let mut kept = String::new();
    let mut keep = true;
    for line in text.lines() {
        if let Some(head) = line.strip_prefix("table ") {
            let mut words = head.split_whitespace();
            let (family, name) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
            keep = !(matches!(family, "ip" | "ip6") && IPTABLES_NFT_TABLES.contains(&name));
        }
        if keep && !line.trim().is_empty() {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    kept
}

/// The rule lines (nft syntax, trimmed) of `chain` in natledger's own table of `family`, as
/// a [`dump_all`] dump's nftables section shows them; empty when there is no such chain.
pub fn nft_chain_rules<'d>(dump: &'d str, family: Family, chain: &str) -> Vec<&'d str> {
    let table = match family {
        Family::V4 => "table ip natledger {",
        Family::V6 => "table ip6 natledger {",
    };
    let section = dump.split("## nftables\n").nth(1).unwrap_or("");
    let mut lines = section.lines().skip_while(|l| l.trim() != table).skip(1);
    let head = format!("chain {chain} {{");
    let mut out = Vec::new();
    let mut inside = false;
    for line in lines.by_ref() {
        let t = line.trim();
        if line.starts_with('}') {
            break;
        }
        if t == head {
            inside = true;
            continue;
        }
        if inside {
            if t == "}" {
                break;
            }
            if !t.starts_with("type ") {
                out.push(t);
            }
        }
    }
    out
}

/// The `-A CHAIN` lines of one pair's section of a [`dump_all`] dump, in order.
pub fn chain_rules<'d>(
    dump: &'d str,
    backend: Backend,
    family: Family,
    chain: &str,
) -> Vec<&'d str> {
    if backend == Backend::OwnNftables {
        return nft_chain_rules(dump, family, chain);
    }
    let header = format!("{} {}\n", backend.name(), family.name());
    let prefix = format!("-A {chain} ");
    dump.split("## ")
        .find(|s| s.starts_with(&header))
        .unwrap_or_else(|| panic!("no {header:?} section in the dump"))
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .collect()
}

/// Pipes `restore_text` into `*-restore --noflush` in `ns` (waiting for the
/// xtables lock, which legacy shares across all namespaces). Panics with
/// stderr on failure.
pub fn load_rules(ns: &str, backend: Backend, family: Family, restore_text: &str) {
    let prog = format!("{}-restore", iptables_tool(backend, family));
    let out = run_in(
        ns,
        &prog,
        &["--noflush", "-w", "30"],
        Some(restore_text.as_bytes()),
    );
    assert!(
        out.status.success(),
        "{prog} --noflush in {ns} failed ({}): {}\ninput:\n{restore_text}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// Another owner's native nftables tables that resemble natledger's own: a table named
/// `natledger` in the `inet` family, natledger's chain names and `natledger:<id>` comments in
/// foreign `ip`/`ip6` tables, a base chain jumping with natledger's shared comment. Every
/// backend must leave them as they are.
pub const NFT_LOOK_ALIKES: &str = "table inet natledger {
  chain NATLEDGER-HOSTPORTS {
    tcp dport 8080 dnat ip to 10.77.0.2:80 comment \"natledger:c2\"
  }
}
table ip lookalike {
  chain PREROUTING {
    type nat hook prerouting priority dstnat; policy accept;
    tcp dport 8080 dnat to 10.77.0.2:80 comment \"natledger:c2\"
    fib daddr type local jump NATLEDGER-HOSTPORTS comment \"natledger\"
  }
  chain NATLEDGER-HOSTPORTS {
    tcp dport 8081 dnat to 10.77.0.3:80 comment \"natledger:c3\"
  }
  chain POSTROUTING {
    type nat hook postrouting priority srcnat; policy accept;
    ip saddr 10.77.0.2 ip daddr 10.77.0.2 tcp dport 80 masquerade comment \"natledger:c2\"
  }
}
table ip6 natledgerish {
  chain NATLEDGER-HOSTPORTS {
    tcp dport 8080 dnat to [fd77::2]:80 comment \"natledger:c2\"
  }
}
";

/// Pipes `script` into `nft -f -` in `ns`. Panics with stderr on failure.
pub fn load_nft(ns: &str, script: &str) {
    let out = run_in(ns, "nft", &["-f", "-"], Some(script.as_bytes()));
    assert!(
        out.status.success(),
        "nft -f in {ns} failed ({}): {}\ninput:\n{script}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// natledger's own table of `family` as `nft list table` prints it (what `nft -f` reads
/// back); empty when there is none.
pub fn nft_save_own(ns: &str, family: Family) -> String {
    let family = match family {
        Family::V4 => "ip",
        Family::V6 => "ip6",
    };
    let out = run_in(ns, "nft", &["list", "table", family, "natledger"], None);
    String::from_utf8(out.stdout).expect("nft prints UTF-8")
}

/// Deletes, behind natledger's back, the rule a manifest's rule record (`{"backend",
/// "family", "table", "chain", "rule"}`) names: with the iptables tool (`-D` with the
/// recorded arguments), or in natledger's nftables table by the handle of the one rule of
/// that chain with the record's tag (and `--dport`, if any).
pub fn delete_recorded_rule(ns: &str, backend: Backend, record: &serde_json::Value) {
    let family = match record["family"].as_str() {
        Some("ipv4") => Family::V4,
        Some("ipv6") => Family::V6,
        other => panic!("record without a family: {other:?} in {record}"),
    };
    let table = record["table"].as_str().expect("a table");
    let chain = record["chain"].as_str().expect("a chain");
    let args: Vec<&str> = record["rule"]
        .as_array()
        .expect("the rule's arguments")
        .iter()
        .map(|a| a.as_str().expect("string arguments"))
        .collect();
    if backend.is_iptables() {
        let mut argv = vec!["-w", "-t", table, "-D", chain];
        argv.extend(&args);
        let out = run_in(ns, iptables_tool(backend, family), &argv, None);
        assert!(
            out.status.success(),
            "deleting {record}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    let after = |flag: &str| {
        let at = args.iter().position(|a| *a == flag)?;
        args.get(at + 1).copied()
    };
    let tag = format!("comment \"{}\"", after("--comment").expect("a tagged rule"));
    let dport = after("--dport").map(|p| format!("dport {p} "));
    let fam = match family {
        Family::V4 => "ip",
        Family::V6 => "ip6",
    };
    let out = run_in(
        ns,
        "nft",
        &["-a", "list", "chain", fam, "natledger", chain],
        None,
    );
    let listing = String::from_utf8(out.stdout).expect("nft prints UTF-8");
    let handles: Vec<&str> = listing
        .lines()
        .filter(|l| l.contains(&tag) && dport.as_ref().is_none_or(|d| l.contains(d)))
        .filter_map(|l| l.rsplit_once("# handle ").map(|(_, h)| h.trim()))
        .collect();
    assert_eq!(handles.len(), 1, "one rule for {record} in:\n{listing}");
    let out = run_in(
        ns,
        "nft",
        &[
            "delete",
            "rule",
            fam,
            "natledger",
            chain,
            "handle",
            handles[0],
        ],
        None,
    );
    assert!(
        out.status.success(),
        "nft delete rule: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
