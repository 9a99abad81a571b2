//! The expressions of `nft -j` the model names as keys (payload, meta, ct, fib, numgen,
//! concatenations), and the canonical words of those it does not (the text reader writes the
//! same words for the same expression, so both readers agree on a [`Key::Other`]).

use serde_json::Value as J;

use crate::model::ruleset::Key;
use crate::model::ruleset::symbols;

/// A match's left side or a map's key: the model's keys, and a numgen's offset.
pub(super) fn key(v: &J) -> (Vec<Key>, u64) {
    match v.get("concat").and_then(J::as_array) {
        Some(parts) => (parts.iter().map(|p| key_one(p).0).collect(), 0),
        None => {
            let (k, offset) = key_one(v);
            (vec![k], offset)
        }
    }
}

fn key_one(v: &J) -> (Key, u64) {
    let field = |o: &J, f: &str| o.get(f).and_then(J::as_str).unwrap_or("").to_string();
    let Some((kind, body)) = v.as_object().and_then(|o| o.iter().next()) else {
        return (Key::Other(words(v)), 0);
    };
    let key = match kind.as_str() {
        "payload" if body.get("protocol").is_some() => {
            symbols::payload_key(&field(body, "protocol"), &field(body, "field"))
        }
        "payload" => Key::Other(words(v)),
        "meta" => symbols::meta_key(&field(body, "key")),
        "ct" => match body.get("dir").and_then(J::as_str) {
            None => symbols::ct_key(&field(body, "key")),
            Some(dir) => Key::Other(format!("ct {dir} {}", field(body, "key"))),
        },
        "fib" => {
            let flags = flag_words(body.get("flags"));
            let result = field(body, "result");
            if flags == "daddr" && result == "type" {
                Key::FibDaddrType
            } else {
                Key::Other(format!("fib {flags} {result}"))
            }
        }
        "numgen" => {
            let modulus = body
                .get("mod")
                .and_then(J::as_u64)
                .and_then(|m| u32::try_from(m).ok());
            let offset = body.get("offset").and_then(J::as_u64).unwrap_or(0);
            match (field(body, "mode").as_str(), modulus) {
                ("random" | "inc", Some(modulus)) => return (Key::Numgen { modulus }, offset),
                (mode, _) => Key::Other(format!("numgen {mode}")),
            }
        }
        _ => Key::Other(words(v)),
    };
    (key, 0)
}

fn flag_words(v: Option<&J>) -> String {
    match v {
        Some(J::String(s)) => s.clone(),
        Some(J::Array(a)) => a
            .iter()
            .filter_map(J::as_str)
            .collect::<Vec<_>>()
            .join(" . "),
        _ => String::new(),
    }
}

/// The canonical words of an expression the model does not name, as the text reader writes
/// them: fields in nft's words, numbers in decimal, flag lists joined by `,`.
pub(super) fn words(v: &J) -> String {
    match v {
        J::Null => String::new(),
        J::Number(n) => n.to_string(),
        J::String(s) => s.clone(),
        J::Bool(b) => exists(*b).into(),
        J::Array(a) => a.iter().map(words).collect::<Vec<_>>().join(","),
        J::Object(o) => {
            let Some((kind, body)) = o.iter().next() else {
                return String::new();
            };
            match kind.as_str() {
                "&" | "|" | "^" | "<<" | ">>" => match body.as_array().map(Vec::as_slice) {
                    Some([a, b]) => format!("{} {kind} {}", words(a), words(b)),
                    _ => kind.clone(),
                },
                "payload" if body.get("protocol").is_none() => {
                    let n = |f: &str| body.get(f).map(words).unwrap_or_default();
                    format!("@{},{},{}", n("base"), n("offset"), n("len"))
                }
                "meta" | "ct" | "fib" | "numgen" | "payload" => match key_one(v) {
                    (Key::Other(w), _) => w,
                    (k, _) => symbols::key_words(&k),
                },
                "tcp option" | "ip option" => {
                    let name = body.get("name").map(words).unwrap_or_default();
                    match body.get("field") {
                        Some(f) => format!("{kind} {name} {}", words(f)),
                        None => format!("{kind} {name}"),
                    }
                }
                "concat" => body
                    .as_array()
                    .map(|a| a.iter().map(words).collect::<Vec<_>>().join(" . "))
                    .unwrap_or_default(),
                _ => kind.clone(),
            }
        }
    }
}

/// A boolean as nft's text writes it (`fib ... oif missing`, `exthdr ... exists`).
pub(super) fn exists(b: bool) -> &'static str {
    if b { "exists" } else { "missing" }
}
