//! The model back in nft's own syntax: a [`Value`], an element's key (`tcp . 30080`), a rule's
//! statements (a finding's line), and the two fix commands, `nft delete rule FAMILY TABLE
//! CHAIN handle N` and `nft delete element FAMILY TABLE SET { KEY }`. What a reader kept only
//! as words ([`Stmt::Other`], [`Stmt::Effect`], [`Key::Other`]) is written back as those words.
//! Names come from a ruleset (outside input): a name nft or a shell would split is quoted.

use std::net::IpAddr;

use super::symbols;
use super::{
    Element, ElementData, Key, Match, Nat, NatAddr, NatKind, NatPort, Op, Operand, Rule, SetRef,
    Stmt, TableFamily, Value, Verdict,
};

/// A value as nft writes it: `10.0.0.0/8`, `1-5`, `tcp`, `10.0.0.1 . tcp . 80`.
pub fn value(v: &Value) -> String {
    match v {
        Value::Int(n) => n.to_string(),
        Value::IntRange(lo, hi) => format!("{lo}-{hi}"),
        Value::Addr(a) => a.to_string(),
        Value::Prefix(a, len) => format!("{a}/{len}"),
        Value::AddrRange(lo, hi) => format!("{lo}-{hi}"),
        Value::Proto(p) => symbols::proto_name(*p).map_or_else(|| p.to_string(), str::to_string),
        Value::Word(w) => word(w),
        Value::Concat(parts) => parts.iter().map(value).collect::<Vec<_>>().join(" . "),
    }
}

/// An element's key, as `nft delete element` takes it (`tcp . 30080`).
pub fn element_key(key: &Value) -> String {
    value(key)
}

/// A symbol bare when nft reads it as one word, else quoted (`"veth*"`).
fn word(w: &str) -> String {
    let bare = !w.is_empty()
        && w.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && w.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if bare { w.to_string() } else { quote(w) }
}

fn quote(w: &str) -> String {
    format!("\"{}\"", w.replace('\\', "\\\\").replace('"', "\\\""))
}

pub fn verdict(v: &Verdict) -> String {
    match v {
        Verdict::Accept => "accept".into(),
        Verdict::Drop => "drop".into(),
        Verdict::Continue => "continue".into(),
        Verdict::Return => "return".into(),
        Verdict::Jump(c) => format!("jump {}", name(c)),
        Verdict::Goto(c) => format!("goto {}", name(c)),
    }
}

/// A chain, set or table name: bare when nft's parser takes it as one identifier.
fn name(n: &str) -> String {
    let bare = n.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-/.".contains(c));
    if bare { n.to_string() } else { quote(n) }
}

pub fn key(keys: &[Key]) -> String {
    keys.iter()
        .map(symbols::key_words)
        .collect::<Vec<_>>()
        .join(" . ")
}

fn element(e: &Element) -> String {
    let mut s = value(&e.key);
    if let Some(c) = &e.comment {
        s.push_str(&format!(" comment {}", quote(c)));
    }
    match &e.data {
        Some(ElementData::Verdict(v)) => s.push_str(&format!(" : {}", verdict(v))),
        Some(ElementData::Value(v)) => s.push_str(&format!(" : {}", value(v))),
        None => {}
    }
    s
}

fn set_ref(r: &SetRef) -> String {
    match r {
        SetRef::Named(n) => format!("@{n}"),
        SetRef::Inline(elements) => format!(
            "{{ {} }}",
            elements.iter().map(element).collect::<Vec<_>>().join(", ")
        ),
    }
}

fn operand(o: &Operand) -> String {
    match o {
        Operand::Set(n) => format!("@{n}"),
        Operand::Values(vs) if vs.len() == 1 => value(&vs[0]),
        Operand::Values(vs) => format!(
            "{{ {} }}",
            vs.iter().map(value).collect::<Vec<_>>().join(", ")
        ),
    }
}

fn matcher(m: &Match) -> String {
    let op = match m.op {
        Op::Eq => "",
        Op::Ne => "!= ",
        Op::Lt => "< ",
        Op::Gt => "> ",
        Op::Le => "<= ",
        Op::Ge => ">= ",
    };
    format!("{} {op}{}", key(&m.key), operand(&m.right))
}

fn nat(n: &Nat) -> String {
    let mut s = match n.kind {
        NatKind::Dnat => "dnat",
        NatKind::Snat => "snat",
        NatKind::Masquerade => "masquerade",
        NatKind::Redirect => "redirect",
    }
    .to_string();
    match n.v4 {
        Some(true) => s.push_str(" ip"),
        Some(false) => s.push_str(" ip6"),
        None => {}
    }
    let port = match &n.port {
        Some(NatPort::Fixed(p)) => Some(p.to_string()),
        Some(NatPort::Range(lo, hi)) => Some(format!("{lo}-{hi}")),
        Some(NatPort::FromMap) | None => None,
    };
    match (&n.addr, port) {
        (Some(NatAddr::Map { key: k, map }), _) => {
            if matches!(n.port, Some(NatPort::FromMap)) {
                s.push_str(" addr . port");
            }
            s.push_str(&format!(" to {} map {}", key(k), set_ref(map)));
        }
        (Some(NatAddr::Fixed(a)), Some(p)) => {
            let a = match a {
                Value::Addr(IpAddr::V6(v6)) => format!("[{v6}]"),
                other => value(other),
            };
            s.push_str(&format!(" to {a}:{p}"));
        }
        (Some(NatAddr::Fixed(a)), None) => s.push_str(&format!(" to {}", value(a))),
        (None, Some(p)) => s.push_str(&format!(" to :{p}")),
        (None, None) => {}
    }
    s
}

pub fn stmt(s: &Stmt) -> String {
    match s {
        Stmt::Match(m) => matcher(m),
        Stmt::Verdict(v) => verdict(v),
        Stmt::Vmap { key: k, map } => format!("{} vmap {}", key(k), set_ref(map)),
        Stmt::Nat(n) => nat(n),
        Stmt::Reject => "reject".into(),
        Stmt::Effect(w) | Stmt::Other(w) => w.clone(),
    }
}

/// A rule's statements on one line, and its comment, as `nft list ruleset` shows it.
pub fn rule(r: &Rule) -> String {
    let mut s = r.stmts.iter().map(stmt).collect::<Vec<_>>().join(" ");
    if let Some(c) = &r.comment {
        s.push_str(&format!(" comment {}", quote(c)));
    }
    s
}

/// The command deleting one rule: `nft delete rule inet netavark CHAIN handle N`.
pub fn delete_rule(family: TableFamily, table: &str, chain: &str, handle: u64) -> String {
    format!(
        "nft delete rule {} {} {} handle {handle}",
        family.word(),
        shell(table),
        shell(chain)
    )
}

/// The command deleting one element of a set or map: `nft delete element ip kube-proxy
/// no-endpoint-nodeports { tcp . 30080 }`.
pub fn delete_element(family: TableFamily, table: &str, set: &str, key: &Value) -> String {
    let element = format!("{{ {} }}", element_key(key));
    format!(
        "nft delete element {} {} {} {}",
        family.word(),
        shell(table),
        shell(set),
        shell(&element)
    )
}

/// A word as one shell argument: bare when the shell would not split or expand it.
fn shell(w: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-/.:@,+=%".contains(c);
    if w.chars()
        .all(|c| plain(c) || c == ' ' || c == '{' || c == '}')
        && !w.is_empty()
        && (w.chars().all(plain) || (w.starts_with("{ ") && w.ends_with(" }")))
    {
        w.to_string()
    } else {
        format!("'{}'", w.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
#[path = "render_tests.rs"]
mod tests;
