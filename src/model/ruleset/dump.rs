//! A saved ruleset, either format: `nft -j list ruleset` JSON ([`super::json`]) or `nft list
//! ruleset` text ([`super::text`]), and the error naming where a dump could not be read.

use super::Ruleset;

/// Where a saved dump could not be read: the JSON object (its index in the `nftables` array)
/// or the text line, and what was expected there.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    #[error("not JSON")]
    Json(#[source] serde_json::Error),
    #[error("JSON: {0}")]
    Shape(String),
    #[error("JSON object {index} ({kind}): expected {expected}")]
    Object {
        index: usize,
        kind: String,
        expected: String,
    },
    #[error("line {line}: {reason}")]
    Line { line: usize, reason: String },
}

/// JSON when the first non-blank character is `{`, else text.
pub fn parse_dump(dump: &str) -> Result<Ruleset, DumpError> {
    if dump.trim_start().starts_with('{') {
        super::json::parse_json(dump)
    } else {
        super::text::parse_text(dump)
    }
}

#[cfg(test)]
#[path = "dump_tests.rs"]
mod tests;
