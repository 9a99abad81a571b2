//! Placeholder until the encoder lands (replaced by the real module).
use crate::family::Family;
use crate::rule::Rule;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    #[error("unsupported")]
    Unsupported,
}

pub fn encode(_buf: &mut Vec<u8>, _family: Family, _rule: &Rule) -> Result<(), EncodeError> {
    Err(EncodeError::Unsupported)
}

pub fn decode(_family: Family, _expressions: &[u8]) -> Option<Rule> {
    None
}

pub fn comment_udata(comment: &str) -> Vec<u8> {
    let mut v = vec![0u8, comment.len() as u8 + 1];
    v.extend(comment.as_bytes());
    v.push(0);
    v
}
