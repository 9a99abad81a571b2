//! The picture a batch is planned against: natledger's table as it will be once the
//! messages so far are committed ([`plan`]).
//!
//! Linear in the table whatever the batch: a rule deleted by its arguments is found through
//! an index of its chain (built once, rebuilt only after an insertion moves positions) and
//! only marked gone, never shifted out of a vector; and a chain whose every rule the batch
//! deletes one by one is flushed by one message instead, since the kernel finds each
//! DELRULE's handle by walking the chain (`crate::kernel::nftables::handles`). The batch carries the
//! generation of the read, so "every rule" is every rule at commit.

use std::collections::{HashMap, VecDeque};

use super::super::NftError;
use super::{BaseChain, OwnTable, base_chain};
use crate::model::family::Family;
use crate::model::rule::Rule;
use crate::model::save::{Batch, Op};

pub(super) const NF_ACCEPT: u32 = 1;
pub(super) const NF_DROP: u32 = 0;

/// Where a new rule goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Place {
    Top,
    Bottom,
    Before(u64),
}

/// One message of the transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Message {
    NewTable,
    NewChain {
        name: String,
        base: Option<&'static BaseChain>,
        policy: u32,
    },
    NewRule {
        chain: String,
        rule: Rule,
        place: Place,
    },
    DelRule {
        chain: String,
        handle: u64,
    },
    /// A DELRULE naming only the chain: every rule of it.
    Flush {
        chain: String,
    },
    DelChain {
        name: String,
    },
    DelTable,
}

/// A rule of the picture: its arguments, and its handle unless this batch adds it.
struct Pictured {
    args: Vec<String>,
    handle: Option<u64>,
    /// Deleted by this batch (kept in place so that no deletion shifts the others).
    gone: bool,
}

/// One chain of the picture.
struct Chain {
    name: String,
    rules: Vec<Pictured>,
    /// Rules not gone.
    live: usize,
    /// Positions of the read's rules not gone, by arguments, in chain order; `None` until a
    /// deletion needs it, and again after an insertion moved positions.
    index: Option<HashMap<Vec<String>, VecDeque<usize>>>,
    /// Rules the read gave, and how many of them this batch deletes by handle.
    read: usize,
    deleted: usize,
    /// Whether the batch writes the chain otherwise (a rule added, a flush).
    written: bool,
}

impl Chain {
    fn new(name: &str, rules: Vec<Pictured>) -> Chain {
        Chain {
            name: name.to_string(),
            live: rules.len(),
            read: rules.len(),
            rules,
            index: None,
            deleted: 0,
            written: false,
        }
    }

    fn live(&self) -> impl Iterator<Item = &Pictured> {
        self.rules.iter().filter(|r| !r.gone)
    }

    /// Mark the first rule of the read with `args` gone and return its handle.
    fn delete(&mut self, args: &[String]) -> Option<u64> {
        let rules = &self.rules;
        let index = self.index.get_or_insert_with(|| {
            let mut index: HashMap<Vec<String>, VecDeque<usize>> = HashMap::new();
            for (at, r) in rules.iter().enumerate() {
                if !r.gone && r.handle.is_some() {
                    index.entry(r.args.clone()).or_default().push_back(at);
                }
            }
            index
        });
        let at = index.get_mut(args)?.pop_front()?;
        let rule = &mut self.rules[at];
        rule.gone = true;
        self.live -= 1;
        self.deleted += 1;
        rule.handle
    }

    fn clear(&mut self) {
        self.rules.clear();
        self.live = 0;
        self.index = None;
        self.written = true;
    }
}

/// The table as it will be once the messages so far are committed.
struct Picture {
    family: Family,
    exists: bool,
    /// Chains in creation order, with their rules.
    chains: Vec<Chain>,
    /// Objects in the table that are not chains this picture knows (someone else's).
    foreign_objects: u32,
    messages: Vec<Message>,
}

impl Picture {
    fn new(family: Family, table: Option<OwnTable>) -> Picture {
        let Some(table) = table else {
            return Picture {
                family,
                exists: false,
                chains: Vec::new(),
                foreign_objects: 0,
                messages: Vec::new(),
            };
        };
        let mut by_chain: HashMap<&str, Vec<Pictured>> = HashMap::new();
        for r in &table.rules {
            by_chain
                .entry(r.chain.as_str())
                .or_default()
                .push(Pictured {
                    args: r.args.clone(),
                    handle: Some(r.handle),
                    gone: false,
                });
        }
        let chains = table
            .chains
            .iter()
            .map(|c| {
                Chain::new(
                    &c.name,
                    by_chain.remove(c.name.as_str()).unwrap_or_default(),
                )
            })
            .collect::<Vec<_>>();
        Picture {
            family,
            exists: true,
            foreign_objects: table.objects.saturating_sub(chains.len() as u32),
            chains,
            messages: Vec::new(),
        }
    }

    fn chain(&mut self, name: &str) -> Option<&mut Chain> {
        self.chains.iter_mut().find(|c| c.name == name)
    }

    fn make_table(&mut self) {
        if !self.exists {
            self.messages.push(Message::NewTable);
            self.exists = true;
        }
    }

    fn make_chain(&mut self, name: &str, policy: u32) {
        self.make_table();
        self.messages.push(Message::NewChain {
            name: name.to_string(),
            base: base_chain(name),
            policy,
        });
        self.chains.push(Chain::new(name, Vec::new()));
    }

    /// The chain `name`; a base chain is made when missing (as iptables' built-in chains
    /// always exist), any other missing chain is an error.
    fn chain_or_base(&mut self, name: &str) -> Result<&mut Chain, NftError> {
        if self.chain(name).is_none() {
            if base_chain(name).is_none() {
                return Err(self.refused(name, "no such chain".to_string()));
            }
            self.make_chain(name, NF_ACCEPT);
        }
        Ok(self.chain(name).expect("made above"))
    }

    fn refused(&self, chain: &str, reason: String) -> NftError {
        NftError::Refused {
            family: self.family,
            chain: chain.to_string(),
            reason,
        }
    }

    fn play(&mut self, op: &Op) -> Result<(), NftError> {
        match op {
            Op::DeclareChain(name) => {
                if self.chain(name).is_some() {
                    // As `:CHAIN - [0:0]` with --noflush: an existing chain is flushed.
                    self.flush(name)?;
                } else {
                    self.make_chain(name, NF_ACCEPT);
                }
            }
            Op::Policy(name, policy) => self.policy(name, policy)?,
            Op::Check(chain, args) => {
                let found = self
                    .chain(chain)
                    .is_some_and(|c| c.live().any(|r| r.args == *args));
                if !found {
                    return Err(self.refused(chain, format!("no rule {}", args.join(" "))));
                }
            }
            Op::InsertFirst(chain, args) => {
                self.insert(chain, 1, self.parse(chain, args)?, args)?
            }
            Op::InsertAt(chain, at, args) => {
                self.insert(chain, *at, self.parse(chain, args)?, args)?
            }
            Op::Append(chain, args) => self.append(chain, args)?,
            Op::Delete(chain, args) => self.delete_rule(chain, args)?,
            Op::Flush(chain) => self.flush(chain)?,
            Op::DeleteChain(name) => self.delete_chain(name)?,
        }
        Ok(())
    }

    /// The rule `args` stand for; refused when natledger would not write it.
    fn parse(&self, chain: &str, args: &[String]) -> Result<Rule, NftError> {
        Rule::parse_args(args).map_err(|e| NftError::Refused {
            family: self.family,
            chain: chain.to_string(),
            reason: format!("not a rule natledger writes ({e}): {}", args.join(" ")),
        })
    }

    fn policy(&mut self, name: &str, policy: &str) -> Result<(), NftError> {
        let policy = match policy {
            "ACCEPT" => NF_ACCEPT,
            "DROP" => NF_DROP,
            other => return Err(self.refused(name, format!("no policy {other}"))),
        };
        if base_chain(name).is_none() {
            return Err(self.refused(name, "a policy needs a base chain".into()));
        }
        if self.chain(name).is_none() {
            self.make_chain(name, policy);
        } else {
            self.messages.push(Message::NewChain {
                name: name.to_string(),
                base: base_chain(name),
                policy,
            });
        }
        Ok(())
    }

    fn append(&mut self, chain: &str, args: &[String]) -> Result<(), NftError> {
        let rule = self.parse(chain, args)?;
        let target = self.chain_or_base(chain)?;
        target.rules.push(Pictured {
            args: args.to_vec(),
            handle: None,
            gone: false,
        });
        target.live += 1;
        target.written = true;
        self.messages.push(Message::NewRule {
            chain: chain.to_string(),
            rule,
            place: Place::Bottom,
        });
        Ok(())
    }

    fn delete_rule(&mut self, chain: &str, args: &[String]) -> Result<(), NftError> {
        let family = self.family;
        let target = self.chain(chain).ok_or_else(|| NftError::Refused {
            family,
            chain: chain.to_string(),
            reason: "no such chain".into(),
        })?;
        let handle = target.delete(args).ok_or_else(|| NftError::Refused {
            family,
            chain: chain.to_string(),
            reason: format!("no rule {}", args.join(" ")),
        })?;
        self.messages.push(Message::DelRule {
            chain: chain.to_string(),
            handle,
        });
        Ok(())
    }

    /// A chain is deleted only when empty and no rule jumps to it.
    fn delete_chain(&mut self, name: &String) -> Result<(), NftError> {
        let nonempty = self.chain(name).map(|c| c.live > 0);
        match nonempty {
            None => return Err(self.refused(name, "no such chain".into())),
            Some(true) => return Err(self.refused(name, "the chain is not empty".into())),
            Some(false) => {}
        }
        let referenced = self.chains.iter().any(|c| {
            c.live()
                .any(|r| crate::model::layout::comment_and_target(&r.args).1 == Some(name))
        });
        if referenced {
            return Err(self.refused(name, "a rule jumps to the chain".into()));
        }
        self.chains.retain(|c| c.name != *name);
        self.messages.push(Message::DelChain { name: name.clone() });
        Ok(())
    }

    fn flush(&mut self, chain: &str) -> Result<(), NftError> {
        let family = self.family;
        let target = self.chain(chain).ok_or_else(|| NftError::Refused {
            family,
            chain: chain.to_string(),
            reason: "no such chain".into(),
        })?;
        if target.live > 0 {
            target.clear();
            self.messages.push(Message::Flush {
                chain: chain.to_string(),
            });
        }
        Ok(())
    }

    /// Insert at position `at` (from 1) as `-I CHAIN at`: before the rule there, or at the
    /// bottom when `at` is one past the last.
    fn insert(
        &mut self,
        chain: &str,
        at: usize,
        rule: Rule,
        args: &[String],
    ) -> Result<(), NftError> {
        let family = self.family;
        let target = self.chain_or_base(chain)?;
        let index = at.max(1) - 1;
        // Where the `index`th rule not gone is (the end when there is none).
        let slot = target
            .rules
            .iter()
            .enumerate()
            .filter(|(_, r)| !r.gone)
            .nth(index)
            .map(|(i, _)| i);
        let place = match slot.map(|i| &target.rules[i]) {
            _ if index == 0 => Place::Top,
            None if index == target.live => Place::Bottom,
            None => {
                return Err(NftError::Refused {
                    family,
                    chain: chain.to_string(),
                    reason: format!("no position {at}"),
                });
            }
            Some(Pictured {
                handle: Some(handle),
                ..
            }) => Place::Before(*handle),
            // Before a rule of this very batch: not something natledger asks for.
            Some(_) => {
                return Err(NftError::Refused {
                    family,
                    chain: chain.to_string(),
                    reason: format!("position {at} is a rule of the same batch"),
                });
            }
        };
        let at = match (place, slot) {
            (Place::Top, _) => 0,
            (_, Some(i)) => i,
            (_, None) => target.rules.len(),
        };
        target.rules.insert(
            at,
            Pictured {
                args: args.to_vec(),
                handle: None,
                gone: false,
            },
        );
        target.live += 1;
        target.index = None;
        target.written = true;
        self.messages.push(Message::NewRule {
            chain: chain.to_string(),
            rule,
            place,
        });
        Ok(())
    }

    /// After the last operation: a chain whose every rule of the read goes one by one, with
    /// nothing written into it, is flushed by one message where its first deletion was; a
    /// table left with no rule, no chain but base chains and no one else's object goes too.
    fn finish(&mut self) {
        let emptied: Vec<&str> = self
            .chains
            .iter()
            .filter(|c| !c.written && c.read > 1 && c.deleted == c.read)
            .map(|c| c.name.as_str())
            .collect();
        if !emptied.is_empty() {
            let mut flushed: Vec<&str> = Vec::new();
            let mut kept = Vec::with_capacity(self.messages.len());
            for message in self.messages.drain(..) {
                match &message {
                    Message::DelRule { chain, .. } if emptied.contains(&chain.as_str()) => {
                        let name = emptied[emptied.iter().position(|c| c == chain).unwrap()];
                        if !flushed.contains(&name) {
                            flushed.push(name);
                            kept.push(Message::Flush {
                                chain: chain.clone(),
                            });
                        }
                    }
                    _ => kept.push(message),
                }
            }
            self.messages = kept;
        }
        let empty = self.exists
            && self.foreign_objects == 0
            && self
                .chains
                .iter()
                .all(|c| c.live == 0 && base_chain(&c.name).is_some());
        let changed = !self.messages.is_empty();
        if empty && changed {
            self.messages.push(Message::DelTable);
            self.exists = false;
        }
    }
}

/// Play `batches` against natledger's table of `family` as it is now (`current`, read by
/// the caller) and return the messages, in order; nothing is sent.
pub(super) fn plan(
    family: Family,
    current: Option<OwnTable>,
    batches: &[Batch],
) -> Result<Vec<Message>, NftError> {
    let mut picture = Picture::new(family, current);
    for batch in batches {
        // As iptables-restore reads a block: the chain declarations first.
        let (declarations, rest): (Vec<&Op>, Vec<&Op>) = batch
            .ops
            .iter()
            .partition(|op| matches!(op, Op::DeclareChain(_) | Op::Policy(..)));
        for op in declarations.into_iter().chain(rest) {
            picture.play(op)?;
        }
    }
    picture.finish();
    Ok(picture.messages)
}
