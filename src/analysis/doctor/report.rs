//! The report for people: findings grouped by port, the worst port first, each finding's
//! sentence, rule lines, evidence and fix wrapped to 80 columns.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::{Finding, Report, RuleRef, Severity};

const WIDTH: usize = 80;

/// Render `report` as text.
pub fn render(report: &Report) -> String {
    let mut groups: BTreeMap<Option<u16>, Vec<&Finding>> = BTreeMap::new();
    for f in &report.findings {
        groups.entry(f.port).or_default().push(f);
    }
    let mut groups: Vec<(Option<u16>, Vec<&Finding>)> = groups.into_iter().collect();
    // Worst port first; ports before host-wide findings at equal severity.
    groups.sort_by(|(pa, a), (pb, b)| {
        worst(b)
            .cmp(&worst(a))
            .then(pb.is_some().cmp(&pa.is_some()))
            .then(pa.cmp(pb))
    });
    let mut out = String::new();
    for (port, findings) in &groups {
        let heading = match (port, findings.iter().find_map(|f| f.protocol.as_deref())) {
            (Some(p), Some(proto)) => format!("port {p}/{proto}"),
            (Some(p), None) => format!("port {p}"),
            (None, _) => "host".to_string(),
        };
        let _ = writeln!(out, "{heading}");
        for f in findings {
            let label = match f.severity {
                Severity::Error => "ERROR",
                Severity::Warning => "WARNING",
                Severity::Info => "INFO",
            };
            let kind = serde_json::to_value(f.kind)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            let _ = writeln!(out, "  {label} {kind}");
            wrap(&mut out, &f.summary, "    ", "    ");
            for r in &f.rules {
                wrap(&mut out, &place(r), "    ", "    ");
                wrap(&mut out, &r.line, "      ", "        ");
            }
            for e in &f.evidence {
                wrap(&mut out, &format!("evidence: {e}"), "    ", "      ");
            }
            // A fix of several commands has one per line: each starts a line of its own.
            for (i, command) in f.fix.iter().flat_map(|fix| fix.lines()).enumerate() {
                let (first, rest) = if i == 0 {
                    (format!("fix: {command}"), "      ")
                } else {
                    (command.to_string(), "        ")
                };
                let indent = if i == 0 { "    " } else { "      " };
                wrap(&mut out, &first, indent, rest);
            }
        }
        out.push('\n');
    }
    let count = |s: Severity| report.findings.iter().filter(|f| f.severity == s).count();
    let summary = format!(
        "{} error(s), {} warning(s), {} note(s); {} rules read from {}{}",
        count(Severity::Error),
        count(Severity::Warning),
        count(Severity::Info),
        report.rules_read,
        report.sources.join(", "),
        if report.complete {
            ""
        } else {
            " (walk cut short: see below)"
        }
    );
    wrap(&mut out, &summary, "", "  ");
    for n in &report.not_followed {
        let r = &n.rule;
        let place = format!(
            "not followed past {}/{} {} {} #{} (from {}): {}; nothing is claimed about the \
             rules it leads to:",
            r.backend, r.family, r.table, r.chain, r.position, n.hook, n.reason
        );
        wrap(&mut out, &place, "", "  ");
        wrap(&mut out, &r.line, "    ", "      ");
    }
    out
}

/// Where a rule is: `legacy/ipv4 nat DOCKER #3:`; a native one by its table's family and
/// name, chain and handle, and the map element that decided (`nftables/ipv4 ip kube-proxy
/// nodeport-endpoints-check handle 7, element { tcp . 30080 } of no-endpoint-nodeports
/// (kube-proxy):`).
fn place(r: &RuleRef) -> String {
    let Some(nft) = &r.nft else {
        return if r.position > 0 {
            format!(
                "{}/{} {} {} #{}:",
                r.backend, r.family, r.table, r.chain, r.position
            )
        } else {
            format!("{}/{} {} {}:", r.backend, r.family, r.table, r.chain)
        };
    };
    let mut out = format!(
        "{}/{} {} {} {}",
        r.backend, r.family, nft.table_family, r.table, r.chain
    );
    match nft.handle {
        Some(handle) => out.push_str(&format!(" handle {handle}")),
        None => out.push_str(&format!(" #{}", r.position)),
    }
    if let Some(e) = &nft.element {
        out.push_str(&format!(", element {{ {} }} of {}", e.key, e.set));
    }
    if let Some(owner) = nft.owner {
        out.push_str(&format!(" ({owner})"));
    }
    out.push(':');
    out
}

fn worst(findings: &[&Finding]) -> Severity {
    findings
        .iter()
        .map(|f| f.severity)
        .max()
        .unwrap_or(Severity::Info)
}

/// Append `text` word-wrapped to [`WIDTH`], the first line indented by `first`, the rest by
/// `rest`. A word longer than a line gets a line of its own.
fn wrap(out: &mut String, text: &str, first: &str, rest: &str) {
    let mut line = String::from(first);
    let mut empty = true;
    for word in text.split(' ').filter(|w| !w.is_empty()) {
        if !empty && line.len() + 1 + word.len() > WIDTH {
            out.push_str(&line);
            out.push('\n');
            line = String::from(rest);
            empty = true;
        }
        if !empty {
            line.push(' ');
        }
        line.push_str(word);
        empty = false;
    }
    out.push_str(&line);
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_at_80_columns_with_hanging_indents() {
        let mut out = String::new();
        let text = "word ".repeat(40);
        wrap(&mut out, &text, "    ", "      ");
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines.len() > 2);
        assert!(lines.iter().all(|l| l.len() <= WIDTH), "{out}");
        assert!(lines[1].starts_with("      word"));
    }
}
