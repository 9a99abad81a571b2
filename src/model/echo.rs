//! Outside input echoed in messages, cut to a readable length.
//!
//! A container id, an annotation or a status comes from whoever starts the container, and may
//! be a megabyte: the refusal must still be one readable line. Every message that quotes
//! outside input quotes it through [`Echo`] (or [`limit`] for a message built from pieces of
//! it), and `main` cuts any line it prints with [`limit`] as a last resort.

use std::fmt;

/// How many characters of an input are shown.
pub(crate) const SHOWN: usize = 64;

/// How many characters of a message built from input are shown.
pub(crate) const MESSAGE: usize = 512;

/// Outside input as a message shows it: quoted and escaped as `{:?}` would, cut after
/// [`SHOWN`] characters with its full size in bytes. Compares by the whole input.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Echo(String);

impl Echo {
    pub fn new(input: impl Into<String>) -> Echo {
        Echo(input.into())
    }

    /// The whole input.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Echo {
    fn from(s: &str) -> Echo {
        Echo(s.to_string())
    }
}

impl From<String> for Echo {
    fn from(s: String) -> Echo {
        Echo(s)
    }
}

impl fmt::Display for Echo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.char_indices().nth(SHOWN) {
            None => write!(f, "{:?}", self.0),
            Some((end, _)) => write!(f, "{:?}… ({} bytes)", &self.0[..end], self.0.len()),
        }
    }
}

impl fmt::Debug for Echo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// The message of an error about input (serde's quote it), cut as [`limit`] cuts it to
/// [`MESSAGE`]: the cause of such an error, so that a megabyte of input is not a megabyte of
/// error.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Cut(String);

impl Cut {
    pub fn of(error: &dyn std::error::Error) -> Cut {
        Cut(limit(&error.to_string(), MESSAGE))
    }
}

/// `text` cut after `max` characters, with its full size in bytes; control characters
/// escaped, so that it stays one line.
pub fn limit(text: &str, max: usize) -> String {
    let escaped = |s: &str| -> String {
        s.chars()
            .flat_map(|c| -> Box<dyn Iterator<Item = char>> {
                if c.is_control() {
                    Box::new(c.escape_default())
                } else {
                    Box::new(std::iter::once(c))
                }
            })
            .collect()
    };
    match text.char_indices().nth(max) {
        None => escaped(text),
        Some((end, _)) => format!("{}… ({} bytes)", escaped(&text[..end]), text.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_input_is_cut_short_input_is_quoted() {
        assert_eq!(Echo::from("a\nb").to_string(), r#""a\nb""#);
        let long = "x".repeat(1 << 20);
        let shown = Echo::from(long.as_str()).to_string();
        assert_eq!(shown, format!("\"{}\"… (1048576 bytes)", "x".repeat(SHOWN)));
        // Cut on a character, not inside one.
        let wide = "é".repeat(100);
        assert!(
            Echo::from(wide.as_str())
                .to_string()
                .contains("(200 bytes)")
        );
        assert_eq!(limit("a\nb", 10), "a\\nb");
        assert_eq!(limit(&long, 3), "xxx… (1048576 bytes)");
    }
}
