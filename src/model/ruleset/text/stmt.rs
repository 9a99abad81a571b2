//! A rule's line of `nft list ruleset` into statements, and the element lists of sets, maps,
//! anonymous sets and inline verdict maps. A statement the model does not name runs to the
//! next statement the reader knows (a verdict, `counter`, `dnat`...) and becomes
//! [`Stmt::Other`]; a field it does not name becomes [`Key::Other`] in the same canonical
//! words the JSON reader writes (numbers in decimal, a mask as `FIELD & a,b`).

use super::lex::{Tok, Token};
use super::{Cursor, R};
use crate::model::ruleset::symbols::{self, Ty};
use crate::model::ruleset::{
    Element, ElementData, Key, Match, Nat, NatAddr, NatKind, NatPort, Op, Operand, Rule, SetData,
    SetRef, Stmt, Value, Verdict,
};

/// Words that start a statement (so end the one before it).
const STOP: &[&str] = &[
    "accept",
    "drop",
    "continue",
    "return",
    "jump",
    "goto",
    "counter",
    "log",
    "limit",
    "quota",
    "dnat",
    "snat",
    "masquerade",
    "redirect",
    "reject",
    "notrack",
    "comment",
    "queue",
    "update",
    "add",
    "delete",
    "meter",
    "dup",
    "fwd",
    "tproxy",
    "synproxy",
    "flow",
];

/// Headers whose fields are written `PROTO FIELD`.
const PAYLOAD: &[&str] = &[
    "ip", "ip6", "tcp", "udp", "sctp", "dccp", "udplite", "th", "ether", "vlan", "arp", "icmp",
    "icmpv6", "igmp", "ah", "esp", "comp", "gre", "dst", "hbh", "frag", "mh", "rt", "srh",
];

/// Meta keys nft may write without `meta`.
const BARE_META: &[&str] = &[
    "iif",
    "oif",
    "iifname",
    "oifname",
    "iiftype",
    "oiftype",
    "iifgroup",
    "oifgroup",
    "mark",
    "skuid",
    "skgid",
    "nftrace",
    "rtclassid",
    "pkttype",
    "cpu",
    "cgroup",
    "ibriport",
    "obriport",
    "ibrname",
    "obrname",
];

/// The fields of a `tcp option`/`ip option` expression.
const OPTION_FIELDS: &[&str] = &[
    "kind", "length", "size", "count", "left", "right", "tsval", "tsecr", "value", "type", "addr",
    "ptr",
];

fn is_key_start(word: &str) -> bool {
    PAYLOAD.contains(&word)
        || BARE_META.contains(&word)
        || matches!(word, "meta" | "ct" | "fib" | "numgen")
}

/// One rule's tokens (its line).
pub(super) fn rule(toks: &[Token]) -> R<Rule> {
    let mut c = Cursor::new(toks);
    let mut rule = Rule {
        handle: None,
        comment: None,
        stmts: Vec::new(),
    };
    while let Some(t) = c.peek() {
        match t {
            Tok::Handle(h) => {
                rule.handle = Some(*h);
                c.next();
            }
            Tok::Newline => {
                c.next();
            }
            Tok::Word(w) if w == "comment" => {
                c.next();
                rule.comment = Some(c.name("a comment")?);
            }
            _ => {
                let stmt = stmt(&mut c)?;
                rule.stmts.push(stmt);
            }
        }
    }
    Ok(rule)
}

/// Consumes at least one token.
fn stmt(c: &mut Cursor) -> R<Stmt> {
    let Some(word) = c.peek_word() else {
        c.next();
        skip_args(c);
        return Ok(Stmt::Other(String::new()));
    };
    if let Some(v) = verdict(c)? {
        return Ok(Stmt::Verdict(v));
    }
    Ok(match word {
        "counter" | "log" | "notrack" => {
            c.next();
            skip_args(c);
            Stmt::Effect(word.to_string())
        }
        "reject" => {
            c.next();
            skip_args(c);
            Stmt::Reject
        }
        "dnat" | "snat" | "masquerade" | "redirect" => nat(c)?,
        "update" | "add" | "delete"
            if c.peek_at(1)
                .is_some_and(|t| matches!(t, Tok::Word(s) if s.starts_with('@'))) =>
        {
            c.next();
            let set = c.name("a set")?;
            skip_args(c);
            Stmt::Effect(format!("{word} {set}"))
        }
        // `ct count [over] N`: a statement that matches on a connection count.
        "ct" if c.peek_at(1) == Some(&Tok::Word("count".into())) => {
            c.next();
            c.next();
            skip_args(c);
            Stmt::Other("ct count".into())
        }
        w if is_key_start(w) => key_stmt(c)?,
        _ => {
            c.next();
            skip_args(c);
            Stmt::Other(word.to_string())
        }
    })
}

/// Skips a statement's arguments: to the next statement word, the handle, or the end.
fn skip_args(c: &mut Cursor) {
    let mut depth = 0usize;
    while let Some(t) = c.peek() {
        match t {
            Tok::Sym('{') => depth += 1,
            Tok::Sym('}') => depth = depth.saturating_sub(1),
            Tok::Handle(_) => return,
            Tok::Word(w) if depth == 0 && STOP.contains(&w.as_str()) => return,
            _ => {}
        }
        c.next();
    }
}

fn verdict(c: &mut Cursor) -> R<Option<Verdict>> {
    let v = match c.peek_word() {
        Some("accept") => Verdict::Accept,
        Some("drop") => Verdict::Drop,
        Some("continue") => Verdict::Continue,
        Some("return") => Verdict::Return,
        Some(w @ ("jump" | "goto")) => {
            c.next();
            let target = c.name("a chain")?;
            return Ok(Some(if w == "jump" {
                Verdict::Jump(target)
            } else {
                Verdict::Goto(target)
            }));
        }
        _ => return Ok(None),
    };
    c.next();
    Ok(Some(v))
}

/// A match, a verdict map, or a field's mangle (`meta mark set ...`).
fn key_stmt(c: &mut Cursor) -> R<Stmt> {
    let (mut keys, offset) = key(c)?;
    while let Some(op @ ("&" | "|" | "^" | "<<" | ">>")) = c.peek_word() {
        c.next();
        let operand = operand_words(c)?;
        keys = vec![Key::Other(format!("{} {op} {operand}", key_words(&keys)))];
    }
    match c.peek_word() {
        Some("vmap") => {
            c.next();
            let map = set_ref(c, &keys, offset)?;
            return Ok(Stmt::Vmap { key: keys, map });
        }
        Some("set") => {
            c.next();
            skip_args(c);
            return Ok(Stmt::Effect(format!("{} set", key_words(&keys))));
        }
        _ => {}
    }
    let op = match c.peek_word() {
        Some("==") => Some(Op::Eq),
        Some("!=") => Some(Op::Ne),
        Some("<") => Some(Op::Lt),
        Some(">") => Some(Op::Gt),
        Some("<=") => Some(Op::Le),
        Some(">=") => Some(Op::Ge),
        _ => None,
    };
    if op.is_some() {
        c.next();
    }
    let tys: Vec<Ty> = keys.iter().map(symbols::key_type).collect();
    let right = match c.peek() {
        Some(Tok::Word(w)) if w.starts_with('@') => {
            c.next();
            Operand::Set(w[1..].to_string())
        }
        Some(Tok::Sym('{')) => {
            let elements = elements(c, &tys, &[])?;
            Operand::Values(elements.into_iter().map(|e| e.key).collect())
        }
        // `ct status dnat`: a status is named like a statement.
        Some(Tok::Word(w)) if !STOP.contains(&w.as_str()) || keys == [Key::CtStatus] => {
            Operand::Values(value_list(c, &tys)?)
        }
        Some(Tok::Str(_)) => Operand::Values(value_list(c, &tys)?),
        _ => {
            skip_args(c);
            return Ok(Stmt::Other(key_words(&keys)));
        }
    };
    if c.eat_word("/") {
        let mask = operand_words(c)?;
        keys = vec![Key::Other(format!("{} & {mask}", key_words(&keys)))];
    }
    let right = match right {
        Operand::Values(values) if offset > 0 => Operand::Values(
            values
                .into_iter()
                .filter_map(|v| symbols::fold_offset(v, offset))
                .collect(),
        ),
        other => other,
    };
    Ok(Stmt::Match(Match {
        key: keys,
        op: op.unwrap_or(Op::Eq),
        right,
    }))
}

fn key_words(keys: &[Key]) -> String {
    keys.iter()
        .map(symbols::key_words)
        .collect::<Vec<_>>()
        .join(" . ")
}

/// A binary operation's right side or a mask, canonical: a number in decimal, a flag list
/// (`(fin|syn)` or `fin,syn`) joined by `,`.
fn operand_words(c: &mut Cursor) -> R<String> {
    let mut parts = Vec::new();
    let paren = c.eat_sym('(');
    loop {
        let w = c.name("an operand")?;
        parts.push(symbols::number(&w).map_or(w, |n| n.to_string()));
        if !(c.eat_sym('|') && paren || c.eat_sym(',')) {
            break;
        }
    }
    if paren {
        c.expect_sym(')')?;
    }
    Ok(parts.join(","))
}

/// A field, or several concatenated (`ip daddr . meta l4proto . th dport`), and a numgen's
/// offset.
fn key(c: &mut Cursor) -> R<(Vec<Key>, u64)> {
    let mut keys = Vec::new();
    let mut offsets = Vec::new();
    loop {
        let (k, off) = key_atom(c)?;
        keys.push(k);
        offsets.push(off);
        let more = c.peek_word() == Some(".")
            && matches!(c.peek_at(1), Some(Tok::Word(w)) if is_key_start(w));
        if !more {
            break;
        }
        c.next();
    }
    // An offset folds into the values of a key of its own (as the JSON reader does).
    let offset = if keys.len() == 1 { offsets[0] } else { 0 };
    Ok((keys, offset))
}

fn key_atom(c: &mut Cursor) -> R<(Key, u64)> {
    let w = c.name("a field")?;
    let key = match w.as_str() {
        "meta" => symbols::meta_key(&c.name("a meta key")?),
        bare if BARE_META.contains(&bare) => symbols::meta_key(bare),
        "ct" => {
            let k = c.name("a ct key")?;
            if k == "original" || k == "reply" {
                let mut field = c.name("a ct key")?;
                if field == "ip" || field == "ip6" {
                    field = c.name("a ct key")?;
                }
                Key::Other(format!("ct {k} {field}"))
            } else {
                symbols::ct_key(&k)
            }
        }
        "fib" => {
            let mut flags = vec![c.name("a fib flag")?];
            while c.eat_word(".") {
                flags.push(c.name("a fib flag")?);
            }
            let result = c.name("a fib result")?;
            if flags == ["daddr"] && result == "type" {
                Key::FibDaddrType
            } else {
                Key::Other(format!("fib {} {result}", flags.join(" . ")))
            }
        }
        "numgen" => {
            let mode = c.name("a numgen mode")?;
            c.eat_word("mod");
            let modulus = c.name("a modulus")?;
            let offset = if c.eat_word("offset") {
                symbols::number(&c.name("an offset")?).ok_or_else(|| c.err("expected a number"))?
            } else {
                0
            };
            match symbols::number(&modulus).and_then(|m| u32::try_from(m).ok()) {
                Some(modulus) if mode == "random" || mode == "inc" => {
                    return Ok((Key::Numgen { modulus }, offset));
                }
                _ => Key::Other(format!("numgen {mode}")),
            }
        }
        proto => {
            let field = c.name("a header field")?;
            if field == "option" {
                // `tcp option maxseg size`, `ip option rr exists`
                let mut words = format!("{proto} option {}", c.name("an option")?);
                if let Some(f) = c.peek_word().filter(|w| OPTION_FIELDS.contains(w)) {
                    c.next();
                    words = format!("{words} {f}");
                }
                Key::Other(words)
            } else {
                symbols::payload_key(proto, &field)
            }
        }
    };
    Ok((key, 0))
}

/// `v`, `v, w`, `established,related`: values typed by the key.
fn value_list(c: &mut Cursor, tys: &[Ty]) -> R<Vec<Value>> {
    let mut values = vec![value(c, tys)?];
    while c.eat_sym(',') {
        values.push(value(c, tys)?);
    }
    Ok(values)
}

/// A literal or a concatenation of literals (`10.0.0.1 . tcp . 80`).
fn value(c: &mut Cursor, tys: &[Ty]) -> R<Value> {
    let mut parts = Vec::new();
    loop {
        let ty = tys.get(parts.len()).copied().unwrap_or(Ty::Any);
        let v = match c.next() {
            Some(Tok::Word(w)) => symbols::literal(w, ty),
            Some(Tok::Str(s)) => symbols::atom(s, ty),
            _ => return Err(c.err("expected a value")),
        };
        parts.push(v);
        if !c.eat_word(".") {
            break;
        }
    }
    Ok(if parts.len() == 1 {
        parts.remove(0)
    } else {
        Value::Concat(parts)
    })
}

/// `{ KEY [comment "x"] [: DATA], ... }` over any number of lines.
pub(super) fn elements(c: &mut Cursor, key: &[Ty], data: &[Ty]) -> R<Vec<Element>> {
    c.expect_sym('{')?;
    let mut out = Vec::new();
    loop {
        while matches!(c.peek(), Some(Tok::Newline | Tok::Sym(','))) {
            c.next();
        }
        if c.eat_sym('}') {
            return Ok(out);
        }
        let key = value(c, key)?;
        let mut comment = None;
        loop {
            match c.peek_word() {
                Some("comment") => {
                    c.next();
                    comment = Some(c.name("a comment")?);
                }
                Some("timeout" | "expires" | "packets" | "bytes") => {
                    c.next();
                    c.next();
                }
                Some("counter") => {
                    c.next();
                }
                _ => break,
            }
        }
        let data = if c.eat_word(":") {
            Some(match verdict(c)? {
                Some(v) => ElementData::Verdict(v),
                None => ElementData::Value(value(c, data)?),
            })
        } else {
            None
        };
        out.push(Element { key, data, comment });
        if !matches!(c.peek(), Some(Tok::Sym(',' | '}') | Tok::Newline)) {
            return Err(c.err("expected ',' or '}' after an element"));
        }
    }
}

/// `@name` or `{ k : v, ... }` (a numgen's offset folded into the keys).
fn set_ref(c: &mut Cursor, keys: &[Key], offset: u64) -> R<SetRef> {
    if let Some(Tok::Word(w)) = c.peek()
        && let Some(name) = w.strip_prefix('@')
    {
        c.next();
        return Ok(SetRef::Named(name.to_string()));
    }
    let tys: Vec<Ty> = keys.iter().map(symbols::key_type).collect();
    let elements = elements(c, &tys, &[])?
        .into_iter()
        .filter_map(|mut e| {
            e.key = symbols::fold_offset(e.key, offset)?;
            Some(e)
        })
        .collect();
    Ok(SetRef::Inline(elements))
}

/// `dnat [ip|ip6] [addr . port] to TARGET [flags]`, `masquerade [to :PORT]`, `redirect [to
/// :PORT]`; TARGET an address, `addr:port`, `[v6]:port`, `:port`, or `KEY map @m`/`{...}`.
fn nat(c: &mut Cursor) -> R<Stmt> {
    let kind = match c.name("a NAT statement")?.as_str() {
        "dnat" => NatKind::Dnat,
        "snat" => NatKind::Snat,
        "masquerade" => NatKind::Masquerade,
        _ => NatKind::Redirect,
    };
    let v4 = if c.eat_word("ip") {
        Some(true)
    } else if c.eat_word("ip6") {
        Some(false)
    } else {
        None
    };
    if c.eat_word("addr") {
        c.eat_word(".");
        c.eat_word("port");
    }
    c.eat_word("prefix");
    let (mut addr, mut port) = (None, None);
    if c.eat_word("to") {
        if c.peek_word().is_some_and(is_key_start) {
            let (keys, offset) = key(c)?;
            if !c.eat_word("map") {
                skip_args(c);
                return Ok(Stmt::Other(format!("{kind:?}").to_lowercase()));
            }
            let map = set_ref(c, &keys, offset)?;
            addr = Some(NatAddr::Map { key: keys, map });
            // `dnat ip to numgen inc mod 2 map { 0 : 10.0.0.1, 1 : 10.0.0.2 }:9090`
            if let Some(p) = c.peek_word().and_then(|w| w.strip_prefix(':')) {
                let (_, p) =
                    nat_target(&format!(":{p}")).ok_or_else(|| c.err("expected a port"))?;
                c.next();
                port = p;
            }
        } else {
            let target = c.name("a NAT target")?;
            (addr, port) = nat_target(&target).ok_or_else(|| c.err("expected a NAT target"))?;
            // `dnat ip addr . port to 172.16.30.2 . 80`
            if c.eat_word(".") {
                let p = c.name("a port")?;
                let p = p.parse().map_err(|_| c.err("expected a port"))?;
                port = Some(NatPort::Fixed(p));
            }
        }
    }
    skip_args(c);
    Ok(Stmt::Nat(Nat {
        kind,
        v4,
        addr,
        port,
    }))
}

fn nat_target(s: &str) -> Option<(Option<NatAddr>, Option<NatPort>)> {
    let (a, p) = if let Some(rest) = s.strip_prefix('[') {
        let (a, after) = rest.split_once(']')?;
        (Some(a), after.strip_prefix(':'))
    } else if let Some(p) = s.strip_prefix(':') {
        (None, Some(p))
    } else if s.matches(':').count() == 1 {
        let (a, p) = s.split_once(':')?;
        (Some(a), Some(p))
    } else {
        (Some(s), None)
    };
    let port = |p: &str| p.parse::<u16>().ok();
    let port = match p {
        None => None,
        Some(p) => Some(match p.split_once('-') {
            Some((lo, hi)) => NatPort::Range(port(lo)?, port(hi)?),
            None => NatPort::Fixed(port(p)?),
        }),
    };
    let addr = a.map(|a| NatAddr::Fixed(symbols::literal(a, Ty::Addr)));
    Some((addr, port))
}

/// A set's `type a . b [: c . d]` or `typeof EXPR . EXPR [: verdict|EXPR]`.
pub(super) fn set_types(toks: &[Token], typeof_: bool) -> R<(Vec<String>, Option<SetData>)> {
    let mut c = Cursor::new(toks);
    let side = |c: &mut Cursor| -> R<Vec<String>> {
        let mut out = Vec::new();
        loop {
            if typeof_ && c.peek_word() != Some("verdict") {
                let (keys, _) = key(c)?;
                out.extend(keys.iter().map(symbols::typeof_datatype));
                if !c.eat_word(".") {
                    break;
                }
            } else {
                out.push(c.name("a type")?);
                if !c.eat_word(".") {
                    break;
                }
            }
        }
        Ok(out)
    };
    let key = side(&mut c)?;
    let data = if c.eat_word(":") {
        let data = side(&mut c)?;
        Some(if data == ["verdict"] {
            SetData::Verdict
        } else {
            SetData::Typed(data)
        })
    } else {
        None
    };
    Ok((key, data))
}
