//! `nft list ruleset` text (as nft 1.0.x prints it; `nft -a` adds the handles) into a
//! [`Ruleset`]: a tokenizer ([`lex`]) and a recursive reader of tables, chains, sets and maps
//! (here) and of rules' statements and elements ([`stmt`]). Unknown statements become
//! [`super::Stmt::Other`], unknown blocks in a table (flowtables, named objects) are skipped;
//! text that is not a ruleset at all is an error naming its line.

mod lex;
mod stmt;

use lex::{Tok, Token};

use super::symbols::{self, Ty};
use super::{Base, Chain, DumpError, NftTable, Policy, Ruleset, Set, SetData, TableFamily};

type R<T> = Result<T, DumpError>;

/// Reads `nft list ruleset` (or `nft -a list ruleset`) output.
pub fn parse_text(dump: &str) -> Result<Ruleset, DumpError> {
    let toks = lex::tokenize(dump).map_err(|line| DumpError::Line {
        line,
        reason: "unterminated quoted string".into(),
    })?;
    let mut c = Cursor::new(&toks);
    let mut ruleset = Ruleset::default();
    loop {
        c.skip_separators();
        match c.peek() {
            None => break,
            Some(Tok::Word(w)) if w == "table" => {
                c.next();
                let mut table = table(&mut c)?;
                symbols::finish_table(&mut table);
                ruleset.tables.push(table);
            }
            Some(Tok::Word(_)) => c.skip_item()?,
            Some(_) => return Err(c.err("expected \"table\"")),
        }
    }
    Ok(ruleset)
}

/// A position in a token list.
pub(super) struct Cursor<'a> {
    toks: &'a [Token],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn new(toks: &'a [Token]) -> Self {
        Cursor { toks, pos: 0 }
    }

    fn peek(&self) -> Option<&'a Tok> {
        self.toks.get(self.pos).map(|t| &t.tok)
    }

    fn peek_at(&self, ahead: usize) -> Option<&'a Tok> {
        self.toks.get(self.pos + ahead).map(|t| &t.tok)
    }

    fn peek_word(&self) -> Option<&'a str> {
        match self.peek() {
            Some(Tok::Word(w)) => Some(w),
            _ => None,
        }
    }

    fn next(&mut self) -> Option<&'a Tok> {
        let t = self.toks.get(self.pos).map(|t| &t.tok);
        if t.is_some() {
            self.pos += 1;
        }
        t
    }

    fn line(&self) -> usize {
        self.toks
            .get(self.pos)
            .or_else(|| self.toks.last())
            .map_or(1, |t| t.line)
    }

    fn err(&self, reason: impl Into<String>) -> DumpError {
        DumpError::Line {
            line: self.line(),
            reason: reason.into(),
        }
    }

    /// A word or a quoted string.
    fn name(&mut self, what: &str) -> R<String> {
        match self.peek() {
            Some(Tok::Word(w) | Tok::Str(w)) => {
                self.next();
                Ok(w.clone())
            }
            _ => Err(self.err(format!("expected {what}"))),
        }
    }

    fn eat_word(&mut self, word: &str) -> bool {
        let hit = self.peek_word() == Some(word);
        if hit {
            self.pos += 1;
        }
        hit
    }

    fn eat_sym(&mut self, c: char) -> bool {
        let hit = self.peek() == Some(&Tok::Sym(c));
        if hit {
            self.pos += 1;
        }
        hit
    }

    fn expect_sym(&mut self, c: char) -> R<()> {
        if self.eat_sym(c) {
            Ok(())
        } else {
            Err(self.err(format!("expected '{c}'")))
        }
    }

    fn eat_handle(&mut self) -> Option<u64> {
        match self.peek() {
            Some(Tok::Handle(h)) => {
                self.pos += 1;
                Some(*h)
            }
            _ => None,
        }
    }

    fn skip_separators(&mut self) {
        while matches!(self.peek(), Some(Tok::Newline | Tok::Sym(';'))) {
            self.pos += 1;
        }
    }

    /// Skips one item: to the end of its line or `;`, or past its balanced `{ ... }` block.
    fn skip_item(&mut self) -> R<()> {
        let mut depth = 0usize;
        while let Some(t) = self.peek() {
            match t {
                Tok::Sym('{') => depth += 1,
                Tok::Sym('}') if depth == 0 => return Ok(()),
                Tok::Sym('}') => {
                    depth -= 1;
                    if depth == 0 {
                        self.pos += 1;
                        return Ok(());
                    }
                }
                Tok::Newline | Tok::Sym(';') if depth == 0 => return Ok(()),
                _ => {}
            }
            self.pos += 1;
        }
        if depth > 0 {
            return Err(self.err("expected '}'"));
        }
        Ok(())
    }

    /// The tokens up to the end of the line (or `;`, or the block's `}`), braces balanced.
    fn line_tokens(&mut self) -> R<&'a [Token]> {
        let start = self.pos;
        let mut depth = 0usize;
        while let Some(t) = self.peek() {
            match t {
                Tok::Sym('{') => depth += 1,
                Tok::Sym('}') if depth == 0 => break,
                Tok::Sym('}') => depth -= 1,
                Tok::Newline | Tok::Sym(';') if depth == 0 => break,
                Tok::Newline => {}
                _ => {}
            }
            self.pos += 1;
        }
        if depth > 0 {
            return Err(self.err("expected '}'"));
        }
        Ok(&self.toks[start..self.pos])
    }
}

fn table(c: &mut Cursor) -> R<NftTable> {
    let word = c.name("a table family")?;
    let family =
        TableFamily::from_word(&word).ok_or_else(|| c.err(format!("unknown family {word:?}")))?;
    let name = c.name("a table name")?;
    c.expect_sym('{')?;
    let mut table = NftTable {
        family,
        name,
        handle: c.eat_handle(),
        comment: None,
        chains: Vec::new(),
        sets: Vec::new(),
    };
    loop {
        c.skip_separators();
        let Some(tok) = c.peek() else {
            return Err(c.err("expected '}' closing the table"));
        };
        match tok {
            Tok::Sym('}') => {
                c.next();
                return Ok(table);
            }
            Tok::Word(w) if w == "comment" => {
                c.next();
                table.comment = Some(c.name("a comment")?);
            }
            Tok::Word(w) if w == "chain" => {
                c.next();
                let chain = chain(c, family)?;
                table.chains.push(chain);
            }
            Tok::Word(w) if w == "set" || w == "map" => {
                c.next();
                let set = set(c)?;
                table.sets.push(set);
            }
            Tok::Word(_) => c.skip_item()?,
            _ => return Err(c.err("expected a chain, set or map")),
        }
    }
}

fn chain(c: &mut Cursor, family: TableFamily) -> R<Chain> {
    let name = c.name("a chain name")?;
    c.expect_sym('{')?;
    let mut chain = Chain {
        name,
        handle: c.eat_handle(),
        base: None,
        rules: Vec::new(),
    };
    let mut policy = Policy::Accept;
    loop {
        c.skip_separators();
        match c.peek() {
            None => return Err(c.err("expected '}' closing the chain")),
            Some(Tok::Sym('}')) => {
                c.next();
                break;
            }
            Some(Tok::Word(w))
                if w == "type" && c.peek_at(2) == Some(&Tok::Word("hook".into())) =>
            {
                c.next();
                chain.base = base(c, family)?;
            }
            Some(Tok::Word(w)) if w == "policy" => {
                c.next();
                let word = c.name("a policy")?;
                policy = symbols::policy(&word)
                    .ok_or_else(|| c.err(format!("unknown policy {word:?}")))?;
            }
            Some(Tok::Word(w)) if w == "comment" || w == "devices" || w == "flags" => {
                c.skip_item()?
            }
            Some(_) => {
                let toks = c.line_tokens()?;
                chain.rules.push(stmt::rule(toks)?);
            }
        }
    }
    if let Some(base) = &mut chain.base {
        base.policy = policy;
    }
    Ok(chain)
}

/// `type nat hook prerouting [device "x"] priority dstnat + 5`.
fn base(c: &mut Cursor, family: TableFamily) -> R<Option<Base>> {
    let kind = c.name("a chain type")?;
    let kind = symbols::chain_kind(&kind).ok_or_else(|| c.err(format!("unknown type {kind:?}")))?;
    c.eat_word("hook");
    let hook = c.name("a hook")?;
    if c.eat_word("device") {
        c.name("a device")?;
    }
    if c.peek_word() == Some("devices") {
        while !matches!(c.peek(), None | Some(Tok::Sym('}'))) {
            c.next();
        }
        c.next();
    }
    if !c.eat_word("priority") {
        return Err(c.err("expected \"priority\""));
    }
    let word = c.name("a priority")?;
    let delta = match c.peek_word() {
        Some(sign @ ("+" | "-")) => {
            let negative = sign == "-";
            c.next();
            let n = c.name("a number")?;
            let n: i64 = n.parse().map_err(|_| c.err("expected a number"))?;
            if negative {
                n.checked_neg().ok_or_else(|| c.err("expected a number"))?
            } else {
                n
            }
        }
        _ => 0,
    };
    let priority = symbols::priority(family, &word, delta)
        .ok_or_else(|| c.err(format!("unknown priority {word:?}")))?;
    let Some(hook) = symbols::hook(&hook) else {
        log::debug!("chain hook {hook:?} not modelled: read as a regular chain");
        return Ok(None);
    };
    Ok(Some(Base {
        kind,
        hook,
        priority,
        policy: Policy::Accept,
    }))
}

fn set(c: &mut Cursor) -> R<Set> {
    let name = c.name("a set name")?;
    c.expect_sym('{')?;
    let mut set = Set {
        name,
        handle: c.eat_handle(),
        key: Vec::new(),
        data: None,
        interval: false,
        comment: None,
        elements: Vec::new(),
    };
    loop {
        c.skip_separators();
        match c.peek() {
            None => return Err(c.err("expected '}' closing the set")),
            Some(Tok::Sym('}')) => {
                c.next();
                return Ok(set);
            }
            Some(Tok::Word(w)) if w == "type" || w == "typeof" => {
                let typeof_ = w == "typeof";
                c.next();
                let toks = c.line_tokens()?;
                let (key, data) = stmt::set_types(toks, typeof_)?;
                set.key = key;
                set.data = data;
            }
            Some(Tok::Word(w)) if w == "flags" => {
                c.next();
                let toks = c.line_tokens()?;
                set.interval = toks.iter().any(|t| t.tok == Tok::Word("interval".into()));
            }
            Some(Tok::Word(w)) if w == "comment" => {
                c.next();
                set.comment = Some(c.name("a comment")?);
            }
            Some(Tok::Word(w)) if w == "elements" => {
                c.next();
                c.eat_word("=");
                let key: Vec<Ty> = set.key.iter().map(|t| symbols::datatype(t)).collect();
                let data: Vec<Ty> = match &set.data {
                    Some(SetData::Typed(t)) => t.iter().map(|t| symbols::datatype(t)).collect(),
                    _ => Vec::new(),
                };
                set.elements = stmt::elements(c, &key, &data)?;
            }
            Some(_) => c.skip_item()?,
        }
    }
}

#[cfg(test)]
mod tests;
