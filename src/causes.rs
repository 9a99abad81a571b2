//! An error and its causes as one line: `top: cause: cause`.
//!
//! An error's own message never repeats its cause (the cause is its `source()`); wherever an
//! error becomes text (a log line, a report field, the CNI error object, `main`'s last
//! line), [`Causes`] says each cause once, after it.

use std::error::Error;
use std::fmt;

/// `error: source: source's source ...`, each said once.
pub struct Causes<'a>(pub &'a (dyn Error + 'static));

impl fmt::Display for Causes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(e) = cause {
            write!(f, ": {e}")?;
            cause = e.source();
        }
        Ok(())
    }
}

/// [`Causes`] as a `String`.
pub fn text(error: &(dyn Error + 'static)) -> String {
    Causes(error).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("reading /x")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn each_cause_once_after_its_error() {
        let e = Outer(std::io::Error::other("denied"));
        assert_eq!(text(&e), "reading /x: denied");
        let plain = std::io::Error::other("alone");
        assert_eq!(Causes(&plain).to_string(), "alone");
    }
}
