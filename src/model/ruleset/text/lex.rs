//! `nft list ruleset` text into tokens with their line numbers: words, quoted strings, the
//! punctuation that separates (`{ } ; , ( ) |`), line ends (a rule is one line), and the
//! `# handle N` comments `nft -a` appends; other comments are dropped.

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Tok {
    Word(String),
    /// A `"quoted string"`, unquoted.
    Str(String),
    /// `# handle N`.
    Handle(u64),
    Sym(char),
    Newline,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Token {
    pub tok: Tok,
    pub line: usize,
}

const SYMS: &[char] = &['{', '}', ';', ',', '(', ')', '|'];

/// Splits a dump; an unterminated string is an error naming its line.
pub(super) fn tokenize(text: &str) -> Result<Vec<Token>, usize> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    let mut line = 1;
    while let Some(&c) = chars.peek() {
        if c == '\n' {
            chars.next();
            out.push(Token {
                tok: Tok::Newline,
                line,
            });
            line += 1;
        } else if c.is_whitespace() {
            chars.next();
        } else if c == '#' {
            let mut comment = String::new();
            while let Some(&c) = chars.peek() {
                if c == '\n' {
                    break;
                }
                comment.push(c);
                chars.next();
            }
            let words: Vec<&str> = comment[1..].split_whitespace().collect();
            if let ["handle", n] = words.as_slice()
                && let Ok(n) = n.parse()
            {
                out.push(Token {
                    tok: Tok::Handle(n),
                    line,
                });
            }
        } else if c == '"' {
            chars.next();
            let start = line;
            let mut s = String::new();
            loop {
                match chars.next() {
                    None => return Err(start),
                    Some('"') => break,
                    Some('\\') => match chars.next() {
                        Some(e) => s.push(e),
                        None => return Err(start),
                    },
                    Some('\n') => {
                        line += 1;
                        s.push('\n');
                    }
                    Some(c) => s.push(c),
                }
            }
            out.push(Token {
                tok: Tok::Str(s),
                line: start,
            });
        } else if SYMS.contains(&c) {
            chars.next();
            out.push(Token {
                tok: Tok::Sym(c),
                line,
            });
        } else {
            let mut w = String::new();
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() || SYMS.contains(&c) || c == '"' || c == '#' {
                    break;
                }
                w.push(c);
                chars.next();
            }
            out.push(Token {
                tok: Tok::Word(w),
                line,
            });
        }
    }
    Ok(out)
}
