//! `nft -j list ruleset` (nft 1.0.x, JSON schema 1) into a [`Ruleset`]: the `nftables`
//! array's tables, chains, rules, sets and maps; other objects (flowtables, named counters,
//! quotas, ct helpers) are skipped. Expressions the model does not name become
//! [`Key::Other`]/[`Stmt::Other`] ("may match"); an object of the wrong shape is an error
//! naming its index in the array and what was expected.

use std::collections::HashMap;

use serde_json::{Map, Value as J};

mod expr;

use expr::{exists, key, words};

use super::symbols::{self, Ty};
use super::{
    Base, Chain, DumpError, Element, ElementData, Key, Match, Nat, NatAddr, NatKind, NatPort,
    NftTable, Op, Operand, Rule, Ruleset, Set, SetData, SetRef, Stmt, TableFamily, Value, Verdict,
};

/// Reads `nft -j list ruleset` output.
pub fn parse_json(dump: &str) -> Result<Ruleset, DumpError> {
    let doc: J = serde_json::from_str(dump).map_err(DumpError::Json)?;
    let items = doc
        .get("nftables")
        .and_then(J::as_array)
        .ok_or_else(|| DumpError::Shape("expected an object with an \"nftables\" array".into()))?;
    let mut reader = Reader::default();
    for (index, item) in items.iter().enumerate() {
        let at = At {
            index,
            kind: String::new(),
        };
        let (kind, body) = item
            .as_object()
            .and_then(|o| o.iter().next())
            .ok_or_else(|| at.err("an object with one key"))?;
        let at = At {
            index,
            kind: kind.clone(),
        };
        reader.item(&at, kind, body)?;
    }
    let mut ruleset = Ruleset {
        tables: reader.tables,
    };
    for table in &mut ruleset.tables {
        symbols::finish_table(table);
    }
    Ok(ruleset)
}

/// Where in the array an object is, for errors.
struct At {
    index: usize,
    kind: String,
}

impl At {
    fn err(&self, expected: impl Into<String>) -> DumpError {
        DumpError::Object {
            index: self.index,
            kind: self.kind.clone(),
            expected: expected.into(),
        }
    }
}

type R<T> = Result<T, DumpError>;

#[derive(Default)]
struct Reader {
    tables: Vec<NftTable>,
    by_name: HashMap<(TableFamily, String), usize>,
    chains: HashMap<(usize, String), usize>,
}

impl Reader {
    fn item(&mut self, at: &At, kind: &str, body: &J) -> R<()> {
        match kind {
            "table" => {
                let o = obj(at, body)?;
                let family = family(at, o)?;
                let name = string(at, o, "name")?.to_string();
                self.by_name
                    .insert((family, name.clone()), self.tables.len());
                self.tables.push(NftTable {
                    family,
                    name,
                    handle: o.get("handle").and_then(J::as_u64),
                    comment: o.get("comment").and_then(J::as_str).map(str::to_string),
                    chains: Vec::new(),
                    sets: Vec::new(),
                });
            }
            "chain" => {
                let o = obj(at, body)?;
                let t = self.table(at, o)?;
                let chain = chain(at, o, self.tables[t].family)?;
                self.chains
                    .insert((t, chain.name.clone()), self.tables[t].chains.len());
                self.tables[t].chains.push(chain);
            }
            "rule" => {
                let o = obj(at, body)?;
                let t = self.table(at, o)?;
                let name = string(at, o, "chain")?;
                let c = *self
                    .chains
                    .get(&(t, name.to_string()))
                    .ok_or_else(|| at.err(format!("chain {name:?} listed before its rules")))?;
                let rule = rule(at, o)?;
                self.tables[t].chains[c].rules.push(rule);
            }
            "set" | "map" => {
                let o = obj(at, body)?;
                let t = self.table(at, o)?;
                let set = set(at, o)?;
                self.tables[t].sets.push(set);
            }
            _ => {}
        }
        Ok(())
    }

    fn table(&self, at: &At, o: &Map<String, J>) -> R<usize> {
        let key = (family(at, o)?, string(at, o, "table")?.to_string());
        self.by_name
            .get(&key)
            .copied()
            .ok_or_else(|| at.err(format!("table {:?} listed before its contents", key.1)))
    }
}

fn obj<'a>(at: &At, v: &'a J) -> R<&'a Map<String, J>> {
    v.as_object().ok_or_else(|| at.err("an object"))
}

fn string<'a>(at: &At, o: &'a Map<String, J>, field: &str) -> R<&'a str> {
    o.get(field)
        .and_then(J::as_str)
        .ok_or_else(|| at.err(format!("\"{field}\" a string")))
}

fn family(at: &At, o: &Map<String, J>) -> R<TableFamily> {
    let word = string(at, o, "family")?;
    TableFamily::from_word(word).ok_or_else(|| at.err(format!("a family, not {word:?}")))
}

fn chain(at: &At, o: &Map<String, J>, family: TableFamily) -> R<Chain> {
    let base = match o.get("hook").and_then(J::as_str) {
        None => None,
        Some(hook) => base(at, o, family, hook)?,
    };
    Ok(Chain {
        name: string(at, o, "name")?.to_string(),
        handle: o.get("handle").and_then(J::as_u64),
        base,
        rules: Vec::new(),
    })
}

fn base(at: &At, o: &Map<String, J>, family: TableFamily, hook: &str) -> R<Option<Base>> {
    let Some(hook) = symbols::hook(hook) else {
        log::debug!("chain hook {hook:?} not modelled: read as a regular chain");
        return Ok(None);
    };
    let kind = string(at, o, "type")?;
    let kind = symbols::chain_kind(kind).ok_or_else(|| at.err("\"type\" filter, nat or route"))?;
    let priority = match o.get("prio") {
        Some(J::Number(n)) => n.as_i64().and_then(|n| i32::try_from(n).ok()),
        Some(J::String(s)) => priority_words(family, s),
        _ => None,
    }
    .ok_or_else(|| at.err("\"prio\" a number or a priority word"))?;
    let policy = match o.get("policy").and_then(J::as_str) {
        None => super::Policy::Accept,
        Some(p) => symbols::policy(p).ok_or_else(|| at.err("\"policy\" accept or drop"))?,
    };
    Ok(Some(Base {
        kind,
        hook,
        priority,
        policy,
    }))
}

/// `dstnat`, `filter - 10`, `-100`.
fn priority_words(family: TableFamily, text: &str) -> Option<i32> {
    let words: Vec<&str> = text.split_whitespace().collect();
    match words.as_slice() {
        [w] => symbols::priority(family, w, 0),
        [w, "+", n] => symbols::priority(family, w, n.parse().ok()?),
        [w, "-", n] => symbols::priority(family, w, n.parse::<i64>().ok()?.checked_neg()?),
        _ => None,
    }
}

fn rule(at: &At, o: &Map<String, J>) -> R<Rule> {
    let exprs = o
        .get("expr")
        .and_then(J::as_array)
        .ok_or_else(|| at.err("\"expr\" an array"))?;
    let stmts = exprs.iter().map(|e| stmt(at, e)).collect::<R<Vec<_>>>()?;
    Ok(Rule {
        handle: o.get("handle").and_then(J::as_u64),
        comment: o.get("comment").and_then(J::as_str).map(str::to_string),
        stmts,
    })
}

fn set(at: &At, o: &Map<String, J>) -> R<Set> {
    let key = types(o.get("type")).ok_or_else(|| at.err("\"type\" a string or an array"))?;
    let data = match o.get("map") {
        None => None,
        Some(J::String(s)) if s == "verdict" => Some(SetData::Verdict),
        Some(t) => Some(SetData::Typed(
            types(Some(t)).ok_or_else(|| at.err("\"map\" a type"))?,
        )),
    };
    let interval = match o.get("flags") {
        Some(J::String(s)) => s == "interval",
        Some(J::Array(a)) => a.iter().any(|f| f.as_str() == Some("interval")),
        _ => false,
    };
    let key_tys: Vec<Ty> = key.iter().map(|t| symbols::datatype(t)).collect();
    let data_tys: Vec<Ty> = match &data {
        Some(SetData::Typed(t)) => t.iter().map(|t| symbols::datatype(t)).collect(),
        _ => Vec::new(),
    };
    let elements = match o.get("elem") {
        None => Vec::new(),
        Some(J::Array(items)) => items
            .iter()
            .map(|e| element(at, e, &key_tys, &data_tys))
            .collect::<R<Vec<_>>>()?,
        Some(_) => return Err(at.err("\"elem\" an array")),
    };
    Ok(Set {
        name: string(at, o, "name")?.to_string(),
        handle: o.get("handle").and_then(J::as_u64),
        key,
        data,
        interval,
        comment: o.get("comment").and_then(J::as_str).map(str::to_string),
        elements,
    })
}

/// A set's key or data type: `"ipv4_addr"`, `["inet_proto", "inet_service"]` or
/// `"ipv4_addr . inet_service"`.
fn types(v: Option<&J>) -> Option<Vec<String>> {
    match v? {
        J::String(s) => Some(s.split(" . ").map(|t| t.trim().to_string()).collect()),
        J::Array(a) => a.iter().map(|t| t.as_str().map(str::to_string)).collect(),
        _ => None,
    }
}

/// A set element: `KEY`, `{"elem": {"val": KEY, "comment": ..}}` or `[KEY, DATA]`.
fn element(at: &At, v: &J, key_tys: &[Ty], data_tys: &[Ty]) -> R<Element> {
    let (key, data) = match v {
        J::Array(pair) if pair.len() == 2 => (&pair[0], Some(&pair[1])),
        other => (other, None),
    };
    let (key, comment) = match key.get("elem") {
        Some(elem) => (
            elem.get("val")
                .ok_or_else(|| at.err("\"elem\" with a \"val\""))?,
            elem.get("comment").and_then(J::as_str).map(str::to_string),
        ),
        None => (key, None),
    };
    let data = match data {
        None => None,
        Some(d) => Some(match verdict(d) {
            Some(v) => ElementData::Verdict(v),
            None => ElementData::Value(value(at, d, data_tys)?),
        }),
    };
    Ok(Element {
        key: value(at, key, key_tys)?,
        data,
        comment,
    })
}

/// A literal, prefix, range or concatenation, typed by position in `tys`.
fn value(at: &At, v: &J, tys: &[Ty]) -> R<Value> {
    let ty = tys.first().copied().unwrap_or(Ty::Any);
    Ok(match v {
        J::Number(n) => symbols::atom(&n.to_string(), ty),
        J::String(s) => symbols::atom(s, ty),
        J::Bool(b) => Value::Word(exists(*b).into()),
        J::Object(o) if o.contains_key("concat") => {
            let parts = o["concat"]
                .as_array()
                .ok_or_else(|| at.err("\"concat\" an array"))?;
            let values = parts
                .iter()
                .enumerate()
                .map(|(i, p)| value(at, p, tys.get(i..).unwrap_or(&[])))
                .collect::<R<Vec<_>>>()?;
            Value::Concat(values)
        }
        J::Object(o) if o.contains_key("prefix") => {
            let p = &o["prefix"];
            let addr = p
                .get("addr")
                .and_then(J::as_str)
                .and_then(|a| a.parse().ok());
            let len = p
                .get("len")
                .and_then(J::as_u64)
                .and_then(|l| u8::try_from(l).ok());
            match (addr, len) {
                (Some(addr), Some(len)) => Value::Prefix(addr, len),
                _ => return Err(at.err("\"prefix\" an address and a length")),
            }
        }
        J::Object(o) if o.contains_key("range") => match o["range"].as_array().map(Vec::as_slice) {
            Some([lo, hi]) => symbols::range(value(at, lo, tys)?, value(at, hi, tys)?)
                .ok_or_else(|| at.err("\"range\" of two numbers or addresses"))?,
            _ => return Err(at.err("\"range\" an array of two")),
        },
        J::Object(o) if o.contains_key("elem") => {
            let val = o["elem"]
                .get("val")
                .ok_or_else(|| at.err("\"elem\" with a \"val\""))?;
            value(at, val, tys)?
        }
        other => Value::Word(words(other)),
    })
}

fn verdict(v: &J) -> Option<Verdict> {
    let (kind, body) = v.as_object()?.iter().next()?;
    let target = || body.get("target").and_then(J::as_str).map(str::to_string);
    Some(match kind.as_str() {
        "accept" => Verdict::Accept,
        "drop" => Verdict::Drop,
        "continue" => Verdict::Continue,
        "return" => Verdict::Return,
        "jump" => Verdict::Jump(target()?),
        "goto" => Verdict::Goto(target()?),
        _ => return None,
    })
}

fn stmt(at: &At, v: &J) -> R<Stmt> {
    if let Some(verdict) = verdict(v) {
        return Ok(Stmt::Verdict(verdict));
    }
    let (kind, body) = v
        .as_object()
        .and_then(|o| o.iter().next())
        .ok_or_else(|| at.err("a statement object"))?;
    Ok(match kind.as_str() {
        "match" => {
            let (keys, offset) = key(body.get("left").ok_or_else(|| at.err("\"left\""))?);
            let op = match body.get("op").and_then(J::as_str) {
                Some("==" | "in") | None => Op::Eq,
                Some("!=") => Op::Ne,
                Some("<") => Op::Lt,
                Some(">") => Op::Gt,
                Some("<=") => Op::Le,
                Some(">=") => Op::Ge,
                Some(other) => return Err(at.err(format!("a match operator, not {other:?}"))),
            };
            let right = body.get("right").ok_or_else(|| at.err("\"right\""))?;
            let right = operand(at, right, &keys, offset)?;
            Stmt::Match(Match {
                key: keys,
                op,
                right,
            })
        }
        "vmap" => {
            let (keys, offset) = key(body.get("key").ok_or_else(|| at.err("\"key\""))?);
            let data = body.get("data").ok_or_else(|| at.err("\"data\""))?;
            let map = set_ref(at, data, &keys, offset)?;
            Stmt::Vmap { key: keys, map }
        }
        "dnat" | "snat" | "masquerade" | "redirect" => Stmt::Nat(nat(at, kind, body)?),
        "reject" => Stmt::Reject,
        "counter" | "log" | "notrack" => Stmt::Effect(kind.clone()),
        "mangle" => {
            let target = body.get("key").map(words).unwrap_or_default();
            Stmt::Effect(format!("{target} set"))
        }
        "set" | "map" => {
            let op = body.get("op").and_then(J::as_str).unwrap_or("update");
            let name = body.get("set").and_then(J::as_str).unwrap_or("");
            Stmt::Effect(format!("{op} {name}"))
        }
        // `ct helper set "ftp"`, as the text reader names a field's mangle.
        "ct helper" | "ct timeout" | "ct expectation" => Stmt::Effect(format!("{kind} set")),
        other => Stmt::Other(other.to_string()),
    })
}

/// A match's right side, typed by the key.
fn operand(at: &At, v: &J, keys: &[Key], offset: u64) -> R<Operand> {
    if let Some(name) = v.as_str().and_then(|s| s.strip_prefix('@')) {
        return Ok(Operand::Set(name.to_string()));
    }
    let tys: Vec<Ty> = keys.iter().map(symbols::key_type).collect();
    let items: Vec<&J> = match v {
        J::Object(o) if o.contains_key("set") => o["set"]
            .as_array()
            .map_or_else(Vec::new, |a| a.iter().collect()),
        J::Array(a) => a.iter().collect(),
        other => vec![other],
    };
    let mut values = Vec::with_capacity(items.len());
    for item in items {
        let value = value(at, item, &tys)?;
        values.extend(fold(value, offset));
    }
    Ok(Operand::Values(values))
}

fn fold(value: Value, offset: u64) -> Option<Value> {
    if offset == 0 {
        Some(value)
    } else {
        symbols::fold_offset(value, offset)
    }
}

/// A vmap's or NAT map's `data`: `"@name"` or `{"set": [[KEY, DATA], ...]}`.
fn set_ref(at: &At, v: &J, keys: &[Key], offset: u64) -> R<SetRef> {
    if let Some(name) = v.as_str().and_then(|s| s.strip_prefix('@')) {
        return Ok(SetRef::Named(name.to_string()));
    }
    let items = v
        .get("set")
        .and_then(J::as_array)
        .ok_or_else(|| at.err("a map's data \"@name\" or {\"set\": [...]}"))?;
    let tys: Vec<Ty> = keys.iter().map(symbols::key_type).collect();
    let mut elements = Vec::with_capacity(items.len());
    for item in items {
        let mut element = element(at, item, &tys, &[])?;
        match fold(element.key, offset) {
            Some(key) => element.key = key,
            None => continue,
        }
        elements.push(element);
    }
    Ok(SetRef::Inline(elements))
}

fn nat(at: &At, kind: &str, body: &J) -> R<Nat> {
    let kind = match kind {
        "dnat" => NatKind::Dnat,
        "snat" => NatKind::Snat,
        "masquerade" => NatKind::Masquerade,
        _ => NatKind::Redirect,
    };
    let v4 = match body.get("family").and_then(J::as_str) {
        Some("ip") => Some(true),
        Some("ip6") => Some(false),
        _ => None,
    };
    let addr = match body.get("addr") {
        None => None,
        Some(m) if m.get("map").is_some() => {
            let m = &m["map"];
            let (keys, offset) = key(m
                .get("key")
                .ok_or_else(|| at.err("\"map\" with a \"key\""))?);
            let data = m
                .get("data")
                .ok_or_else(|| at.err("\"map\" with \"data\""))?;
            let map = set_ref(at, data, &keys, offset)?;
            Some(NatAddr::Map { key: keys, map })
        }
        Some(a) => Some(NatAddr::Fixed(value(at, a, &[Ty::Addr, Ty::Int])?)),
    };
    // `dnat ip addr . port to 172.16.30.2 . 80`: address and port as one concatenation.
    let (addr, concat_port) = match addr {
        Some(NatAddr::Fixed(Value::Concat(parts))) => match parts.as_slice() {
            [a, Value::Int(p)] => (Some(NatAddr::Fixed(a.clone())), Some(*p)),
            _ => return Err(at.err("an address and a port")),
        },
        other => (other, None),
    };
    let port = match body.get("port") {
        None => match concat_port {
            Some(p) => Some(NatPort::Fixed(port_number(at, Some(p))?)),
            None => None,
        },
        Some(J::Number(n)) => Some(NatPort::Fixed(port_number(at, n.as_u64())?)),
        Some(p) => match p.get("range").and_then(J::as_array).map(Vec::as_slice) {
            Some([lo, hi]) => Some(NatPort::Range(
                port_number(at, lo.as_u64())?,
                port_number(at, hi.as_u64())?,
            )),
            _ => Some(NatPort::FromMap),
        },
    };
    Ok(Nat {
        kind,
        v4,
        addr,
        port,
    })
}

fn port_number(at: &At, n: Option<u64>) -> R<u16> {
    n.and_then(|n| u16::try_from(n).ok())
        .ok_or_else(|| at.err("a port number"))
}

#[cfg(test)]
mod tests;
