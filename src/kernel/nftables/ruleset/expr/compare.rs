//! The compares of a rule: `cmp` (and nft's `>=` + `<=` of a range), and the `bitwise` masks
//! that make an address prefix or a set of flags of what they compare.

use super::super::types::{self, IFNAME};
use super::{Content, Decoder, is_addr, unit, units};
use crate::kernel::nftables::wire::{u32_attr, value_attr};
use crate::model::ruleset::{Key, Match, Op, Operand, Stmt, Value};

impl Decoder<'_> {
    /// A match just decoded: pushed (`>= A` then `<= B` of one key, nft's encoding of a
    /// range, as the range `A-B`), and remembered when later keys depend on it.
    pub(super) fn matched(&mut self, stmt: Stmt) {
        if let (Some(Stmt::Match(low)), Stmt::Match(high)) = (self.stmts.last_mut(), &stmt)
            && low.key == high.key
            && (low.op, high.op) == (Op::Ge, Op::Le)
            && let (Operand::Values(a), Operand::Values(b)) = (&low.right, &high.right)
            && let Some(range) = match (a.as_slice(), b.as_slice()) {
                ([Value::Int(a)], [Value::Int(b)]) => Some(Value::IntRange(*a, *b)),
                ([Value::Addr(a)], [Value::Addr(b)]) => Some(Value::AddrRange(*a, *b)),
                _ => None,
            }
        {
            low.op = Op::Eq;
            low.right = Operand::Values(vec![range]);
            return;
        }
        if let Stmt::Match(Match {
            key,
            op: Op::Eq,
            right: Operand::Values(values),
        }) = &stmt
        {
            let at = self.stmts.len();
            match (key.as_slice(), values.as_slice()) {
                ([Key::L4Proto], [Value::Proto(p)]) => self.l4 = Some((*p, at)),
                ([Key::NfProto], [Value::Word(w)]) if w == "ipv4" || w == "ipv6" => {
                    self.nf = Some((w == "ipv4", at))
                }
                _ => {}
            }
        }
        self.push(stmt);
    }

    pub(super) fn bitwise(&mut self, data: &[u8]) -> Option<()> {
        let (sreg, dreg, len) = (u32_attr(data, 1)?, u32_attr(data, 2)?, u32_attr(data, 3)?);
        let plain = u32_attr(data, 6).unwrap_or(0) == 0
            && value_attr(data, 5).is_some_and(|x| x.iter().all(|b| *b == 0));
        let mask = value_attr(data, 4);
        let content = match (self.read(sreg), mask) {
            (Some(Content::Field { key, len: l }), Some(mask)) if plain => {
                let full = types::size(types::of_key(key));
                match key {
                    Key::CtState | Key::CtStatus if mask.len() == 4 => Content::Flags {
                        key: key.clone(),
                        mask: u32::from_ne_bytes(mask.try_into().ok()?),
                    },
                    _ if is_addr(key) && Some(*l) == full && Some(mask.len()) == full => {
                        match types::mask_prefix(mask) {
                            Some(bits) => Content::Prefix {
                                key: key.clone(),
                                bits,
                            },
                            None => masked(key, mask, *l),
                        }
                    }
                    _ => masked(key, mask, *l),
                }
            }
            _ => Content::Field {
                key: Key::Other("a computed value".into()),
                len: len as usize,
            },
        };
        self.store(dreg, len as usize, content)
    }

    pub(super) fn cmp(&self, sreg: u32, op: Op, data: &[u8]) -> Stmt {
        let matched = |key: &Key, value: Option<Value>| match value {
            Some(v) => Stmt::Match(Match {
                key: vec![key.clone()],
                op,
                right: Operand::Values(vec![v]),
            }),
            None => Stmt::Other("cmp".into()),
        };
        match self.read(sreg) {
            Some(Content::Field { key, len }) => {
                let ty = types::of_key(key);
                let full = types::size(ty);
                if data.len() > units(*len) * 4 {
                    return self.concat_cmp(sreg, op, data);
                }
                let value = if is_addr(key) && Some(data.len()) < full {
                    types::prefix(ty, data, data.len() * 8)
                } else if ty == IFNAME {
                    Some(types::decode(ty, data))
                } else {
                    Some(types::decode(ty, &data[..data.len().min(*len)]))
                };
                matched(key, value)
            }
            Some(Content::Masked { name, ty, len }) => matched(
                &Key::Other(name.clone()),
                Some(types::decode(*ty, &data[..data.len().min(*len)])),
            ),
            Some(Content::Prefix { key, bits }) => {
                matched(key, types::prefix(types::of_key(key), data, *bits))
            }
            Some(Content::Flags { key, mask }) => {
                let ty = types::of_key(key);
                let value = data
                    .try_into()
                    .ok()
                    .map(u32::from_ne_bytes)
                    .unwrap_or(u32::MAX);
                let (op, values) = match (op, value) {
                    (Op::Ne, 0) => (Op::Eq, types::flag_words(ty, *mask)),
                    (Op::Eq, 0) => (Op::Ne, types::flag_words(ty, *mask)),
                    (Op::Eq | Op::Ne, v) if v == *mask => {
                        (op, types::flag_word(ty, v).map(|w| vec![w]))
                    }
                    _ => (op, None),
                };
                match values {
                    Some(values) => Stmt::Match(Match {
                        key: vec![key.clone()],
                        op,
                        right: Operand::Values(values),
                    }),
                    None => Stmt::Other("cmp".into()),
                }
            }
            _ => Stmt::Other("cmp".into()),
        }
    }

    /// A compare of fields loaded into consecutive registers, as one concatenated value.
    fn concat_cmp(&self, sreg: u32, op: Op, data: &[u8]) -> Stmt {
        let mut at = unit(sreg);
        let mut keys = Vec::new();
        let mut values = Vec::new();
        let mut offset = 0;
        while offset < data.len() {
            let Some(Content::Field { key, len }) = at.and_then(|u| self.regs.get(u)?.as_ref())
            else {
                return Stmt::Other("cmp".into());
            };
            let Some(bytes) = data.get(offset..offset + len) else {
                return Stmt::Other("cmp".into());
            };
            values.push(types::decode(types::of_key(key), bytes));
            keys.push(key.clone());
            offset += units(*len) * 4;
            at = at.map(|u| u + units(*len));
        }
        Stmt::Match(Match {
            key: keys,
            op,
            right: Operand::Values(vec![Value::Concat(values)]),
        })
    }
}

/// A field under a mask the model has no key for (`meta mark & 0x4000`).
fn masked(key: &Key, mask: &[u8], len: usize) -> Content {
    let ty = types::of_key(key);
    let mask = match types::decode(ty, mask) {
        Value::Int(n) => format!("{n:#x}"),
        _ => mask.iter().map(|b| format!("{b:02x}")).collect(),
    };
    Content::Masked {
        name: format!("{} & {mask}", key_word(key)),
        ty,
        len,
    }
}

/// A key in nft's words, for a masked key's description.
fn key_word(key: &Key) -> String {
    match key {
        Key::Mark => "meta mark".into(),
        Key::Other(words) => words.clone(),
        other => format!("{other:?}").to_lowercase(),
    }
}
