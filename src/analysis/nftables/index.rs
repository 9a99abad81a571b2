//! Named sets and maps indexed by their exact keys, built once per set for many packets: a
//! kube-proxy node's maps hold tens of thousands of elements, and every packet looks up
//! several of them.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::IpAddr;

use super::tables_for;
use super::value::{Field, Lookup, lookup};
use crate::analysis::verdict::Tri;
use crate::model::ruleset::{Chain, ChainKind, Element, Hook, NftTable, Ruleset, Value};

const HOOKS: [Hook; 5] = [
    Hook::Prerouting,
    Hook::Input,
    Hook::Forward,
    Hook::Output,
    Hook::Postrouting,
];

/// A field or a value, as an exact key compares it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Norm {
    Addr(IpAddr),
    Int(u64),
}

fn norm_value(v: &Value) -> Option<Norm> {
    match v {
        Value::Addr(a) => Some(Norm::Addr(*a)),
        Value::Int(n) => Some(Norm::Int(*n)),
        Value::Proto(p) => Some(Norm::Int((*p).into())),
        _ => None,
    }
}

fn norm_key(v: &Value) -> Option<Vec<Norm>> {
    match v {
        Value::Concat(parts) => parts.iter().map(norm_value).collect(),
        v => norm_value(v).map(|n| vec![n]),
    }
}

fn norm_field(f: &Field) -> Option<Norm> {
    match f {
        Field::Addr(a) => Some(Norm::Addr(*a)),
        Field::Int(n) => Some(Norm::Int(*n)),
        _ => None,
    }
}

/// One set's elements: those with an exact key by it, the rest (prefixes, ranges, words) in
/// order.
struct SetIndex {
    exact: HashMap<Vec<Norm>, usize>,
    rest: Vec<usize>,
}

impl SetIndex {
    fn new(elements: &[Element]) -> SetIndex {
        let mut exact = HashMap::new();
        let mut rest = Vec::new();
        for (i, e) in elements.iter().enumerate() {
            match norm_key(&e.key) {
                Some(k) => {
                    exact.entry(k).or_insert(i);
                }
                None => rest.push(i),
            }
        }
        SetIndex { exact, rest }
    }
}

/// Base chains in the order one hook runs them.
pub(crate) type Order<'r> = Vec<(&'r NftTable, &'r Chain)>;

/// A ruleset with its sets indexed as the walks first use them.
pub struct Indexed<'r> {
    sets: RefCell<HashMap<(usize, String), SetIndex>>,
    /// Every table's chains by name.
    chains: HashMap<(usize, &'r str), &'r Chain>,
    /// The base chains of each hook, per IP version, in every order the kernel may run them.
    orders: HashMap<(Hook, bool), Vec<Order<'r>>>,
    /// Rule evaluations every walk over this index has cost so far.
    spent: Cell<u64>,
}

impl<'r> Indexed<'r> {
    pub fn new(rs: &'r Ruleset) -> Indexed<'r> {
        let chains = rs
            .tables
            .iter()
            .flat_map(|t| {
                t.chains
                    .iter()
                    .map(move |c| ((t as *const NftTable as usize, c.name.as_str()), c))
            })
            .collect();
        let mut orders = HashMap::new();
        for hook in HOOKS {
            for v4 in [true, false] {
                orders.insert((hook, v4), self::orders(rs, hook, v4));
            }
        }
        Indexed {
            sets: RefCell::default(),
            chains,
            orders,
            spent: Cell::new(0),
        }
    }

    /// Count `evaluations` more rule evaluations.
    pub(crate) fn spend(&self, evaluations: usize) {
        self.spent
            .set(self.spent.get().saturating_add(evaluations as u64));
    }

    /// Rule evaluations every walk over this index has cost so far.
    pub(crate) fn spent(&self) -> u64 {
        self.spent.get()
    }

    /// Chain `name` of `table`.
    pub(crate) fn chain(&self, table: &NftTable, name: &str) -> Option<&'r Chain> {
        self.chains
            .get(&(table as *const NftTable as usize, name))
            .copied()
    }

    /// The base chains of `hook` in every order the kernel may run them.
    pub(crate) fn orders(&self, hook: Hook, v4: bool) -> &[Vec<(&'r NftTable, &'r Chain)>] {
        self.orders.get(&(hook, v4)).map_or(&[], Vec::as_slice)
    }

    /// What a lookup of `fields` in set `name` of `table` may find; `None`: no such set.
    pub(crate) fn find<'t>(
        &self,
        table: &'t NftTable,
        name: &str,
        fields: &[Field],
    ) -> Option<Lookup<'t>> {
        let set = table.set(name)?;
        let key: Option<Vec<Norm>> = fields.iter().map(norm_field).collect();
        let Some(key) = key.filter(|_| set.elements.len() > 16) else {
            return Some(lookup(fields, &set.elements));
        };
        let mut sets = self.sets.borrow_mut();
        let index = sets
            .entry((table as *const NftTable as usize, name.to_string()))
            .or_insert_with(|| SetIndex::new(&set.elements));
        if let Some(&i) = index.exact.get(&key) {
            return Some(Lookup {
                hits: vec![(&set.elements[i], Tri::Yes)],
                none: false,
            });
        }
        Some(lookup(fields, index.rest.iter().map(|&i| &set.elements[i])))
    }
}

/// The base chains of `hook` in every order the kernel may run them.
///
/// Nat chains run where the kernel's nat core hooks in (`NF_IP_PRI_NAT_DST`, -100, in
/// prerouting and output; `NF_IP_PRI_NAT_SRC`, 100, in input and postrouting), among
/// themselves by their own priorities.
pub(crate) fn orders(rs: &Ruleset, hook: Hook, v4: bool) -> Vec<Vec<(&NftTable, &Chain)>> {
    let at = |b: &crate::model::ruleset::Base| match (b.kind, hook) {
        (ChainKind::Nat, Hook::Prerouting | Hook::Output) => (-100, b.priority),
        (ChainKind::Nat, _) => (100, b.priority),
        _ => (b.priority, b.priority),
    };
    let mut chains: Vec<((i32, i32), &NftTable, &Chain)> = tables_for(rs, v4)
        .flat_map(|t| t.chains.iter().map(move |c| (t, c)))
        .filter_map(|(t, c)| {
            c.base
                .as_ref()
                .filter(|b| b.hook == hook)
                .map(|b| (at(b), t, c))
        })
        .collect();
    chains.sort_by_key(|(p, _, _)| *p);
    let mut orders: Vec<Vec<(&NftTable, &Chain)>> = vec![Vec::new()];
    let mut i = 0;
    while i < chains.len() {
        let j = i + chains[i..]
            .iter()
            .take_while(|(p, _, _)| *p == chains[i].0)
            .count();
        let group: Vec<_> = chains[i..j].iter().map(|(_, t, c)| (*t, *c)).collect();
        let perms = permutations(&group);
        orders = orders
            .into_iter()
            .flat_map(|o| {
                perms.iter().map(move |p| {
                    let mut o = o.clone();
                    o.extend(p.iter().copied());
                    o
                })
            })
            .collect();
        i = j;
    }
    orders
}

/// Every order of `items` (up to 4 of them; more keep their order and its reverse).
fn permutations<T: Copy>(items: &[T]) -> Vec<Vec<T>> {
    if items.len() <= 1 {
        return vec![items.to_vec()];
    }
    if items.len() > 4 {
        let mut rev = items.to_vec();
        rev.reverse();
        return vec![items.to_vec(), rev];
    }
    let mut out = Vec::new();
    for i in 0..items.len() {
        let mut rest = items.to_vec();
        let first = rest.remove(i);
        for mut p in permutations(&rest) {
            p.insert(0, first);
            out.push(p);
        }
    }
    out
}
