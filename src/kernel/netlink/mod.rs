//! Netlink framing and the socket, the lowest kernel layer: the protocols natledger speaks
//! without a helper process (sock_diag for listening sockets, nf_tables for deleting a
//! container's rules, ctnetlink for flows) are built on it in their own modules.
//!
//! A message is a 16-byte `nlmsghdr` (length, type, flags, sequence, port id) and a payload,
//! padded to 4 bytes; attributes inside a payload are `nlattr`s (length, type, data), padded
//! the same way. Host byte order throughout, except where a protocol says otherwise.

use std::io;

mod socket;
pub use socket::Socket;

pub const HEADER: usize = 16;
pub const NLM_F_REQUEST: u16 = 0x1;
pub const NLM_F_ACK: u16 = 0x4;
pub const NLM_F_DUMP: u16 = 0x300;
pub const NLMSG_ERROR: u16 = 2;
pub const NLMSG_DONE: u16 = 3;
/// Marks an attribute whose data is itself attributes (the kernel sets it on what it sends;
/// sending it costs nothing and strict parsers want it).
pub const NLA_F_NESTED: u16 = 0x8000;
/// The nested and byte-order flags of an attribute type.
const NLA_TYPE_MASK: u16 = 0x3fff;

fn align(n: usize) -> usize {
    (n + 3) & !3
}

/// Start a message in `buf`; returns where it starts, for [`finish`].
pub fn begin(buf: &mut Vec<u8>, kind: u16, flags: u16, seq: u32) -> usize {
    let start = buf.len();
    buf.extend(0u32.to_ne_bytes()); // length, written by finish
    buf.extend(kind.to_ne_bytes());
    buf.extend(flags.to_ne_bytes());
    buf.extend(seq.to_ne_bytes());
    buf.extend(0u32.to_ne_bytes());
    start
}

/// Pad the message begun at `start` and write its length.
pub fn finish(buf: &mut Vec<u8>, start: usize) {
    buf.resize(align(buf.len()), 0);
    let len = (buf.len() - start) as u32;
    buf[start..start + 4].copy_from_slice(&len.to_ne_bytes());
}

/// Append one attribute.
pub fn put_attr(buf: &mut Vec<u8>, kind: u16, data: &[u8]) {
    let len = 4 + data.len();
    buf.extend((len as u16).to_ne_bytes());
    buf.extend(kind.to_ne_bytes());
    buf.extend(data);
    buf.resize(align(buf.len()), 0);
}

/// Start a nested attribute (type marked [`NLA_F_NESTED`]); the caller appends its inner
/// attributes and calls [`end_nest`] with the returned start.
pub fn begin_nest(buf: &mut Vec<u8>, kind: u16) -> usize {
    let start = buf.len();
    buf.extend(0u16.to_ne_bytes()); // length, written by end_nest
    buf.extend((kind | NLA_F_NESTED).to_ne_bytes());
    start
}

/// Write the length of the nested attribute begun at `start` (its inner attributes are
/// padded already, so it is too).
pub fn end_nest(buf: &mut [u8], start: usize) {
    let len = (buf.len() - start) as u16;
    buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
}

/// A NUL-terminated string attribute.
pub fn put_str(buf: &mut Vec<u8>, kind: u16, value: &str) {
    let mut data = Vec::with_capacity(value.len() + 1);
    data.extend(value.as_bytes());
    data.push(0);
    put_attr(buf, kind, &data);
}

/// One received message.
#[derive(Debug, Clone, Copy)]
pub struct Message<'a> {
    pub kind: u16,
    pub seq: u32,
    pub payload: &'a [u8],
}

impl Message<'_> {
    /// For an `NLMSG_ERROR` message: 0 for an acknowledgement, else the (positive) errno.
    pub fn error(&self) -> Option<i32> {
        if self.kind != NLMSG_ERROR {
            return None;
        }
        let code = self.payload.get(..4)?;
        Some(-i32::from_ne_bytes(code.try_into().ok()?))
    }
}

/// The messages in one datagram; a message whose length runs past the end is an error.
pub fn messages(buf: &[u8]) -> impl Iterator<Item = io::Result<Message<'_>>> {
    let mut at = 0;
    std::iter::from_fn(move || {
        if at + HEADER > buf.len() {
            return None;
        }
        let len = u32::from_ne_bytes(buf[at..at + 4].try_into().unwrap()) as usize;
        if len < HEADER || at + len > buf.len() {
            at = buf.len();
            return Some(Err(io::Error::other("truncated netlink message")));
        }
        let message = Message {
            kind: u16::from_ne_bytes(buf[at + 4..at + 6].try_into().unwrap()),
            seq: u32::from_ne_bytes(buf[at + 8..at + 12].try_into().unwrap()),
            payload: &buf[at + HEADER..at + len],
        };
        at += align(len);
        Some(Ok(message))
    })
}

/// The attributes in `buf` as (type without flags, data); stops at a malformed one.
pub fn attrs(buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    let mut at = 0;
    std::iter::from_fn(move || {
        let head = buf.get(at..at + 4)?;
        let len = u16::from_ne_bytes([head[0], head[1]]) as usize;
        let kind = u16::from_ne_bytes([head[2], head[3]]) & NLA_TYPE_MASK;
        let data = buf.get(at + 4..at + len.max(4))?;
        at += align(len.max(4));
        Some((kind, data))
    })
}

/// The first attribute of type `kind`.
pub fn attr(buf: &[u8], kind: u16) -> Option<&[u8]> {
    attrs(buf).find(|(k, _)| *k == kind).map(|(_, d)| d)
}

/// A NUL-terminated (or unterminated) string attribute's text.
pub fn str_of(data: &[u8]) -> Option<&str> {
    let end = data.iter().position(|b| *b == 0).unwrap_or(data.len());
    std::str::from_utf8(&data[..end]).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_and_attributes_round_trip() {
        let mut buf = Vec::new();
        let first = begin(&mut buf, 0x0a07, NLM_F_REQUEST | NLM_F_DUMP, 7);
        buf.extend([2, 0, 0, 0]);
        put_str(&mut buf, 1, "nat");
        put_attr(&mut buf, 3, &42u64.to_be_bytes());
        finish(&mut buf, first);
        let second = begin(&mut buf, NLMSG_ERROR, 0, 8);
        buf.extend((-2i32).to_ne_bytes());
        finish(&mut buf, second);
        assert_eq!(buf.len() % 4, 0);

        let got: Vec<Message> = messages(&buf).collect::<io::Result<_>>().unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].kind, got[0].seq), (0x0a07, 7));
        assert_eq!(got[0].error(), None);
        let body = &got[0].payload[4..];
        assert_eq!(attr(body, 1).and_then(str_of), Some("nat"));
        assert_eq!(attr(body, 3), Some(&42u64.to_be_bytes()[..]));
        assert_eq!(got[1].error(), Some(2));
    }

    #[test]
    fn nested_attributes_carry_the_flag_and_their_length() {
        let mut buf = Vec::new();
        let outer = begin_nest(&mut buf, 1);
        put_attr(&mut buf, 2, &[7]);
        let inner = begin_nest(&mut buf, 3);
        put_attr(&mut buf, 4, &9u16.to_be_bytes());
        end_nest(&mut buf, inner);
        end_nest(&mut buf, outer);
        assert_eq!(buf.len(), 4 + 8 + 4 + 8);
        assert_eq!(u16::from_ne_bytes([buf[0], buf[1]]) as usize, buf.len());
        assert_eq!(u16::from_ne_bytes([buf[2], buf[3]]), 1 | NLA_F_NESTED);
        // Readers see the type without the flag.
        let body = attr(&buf, 1).unwrap();
        assert_eq!(attr(body, 2), Some(&[7][..]));
        assert_eq!(
            attr(attr(body, 3).unwrap(), 4),
            Some(&9u16.to_be_bytes()[..])
        );
    }

    #[test]
    fn malformed_input_ends_cleanly() {
        let mut buf = Vec::new();
        let start = begin(&mut buf, 1, 0, 1);
        finish(&mut buf, start);
        buf[0] = 200; // length past the end
        let got: Vec<_> = messages(&buf).collect();
        assert_eq!(got.len(), 1);
        assert!(got[0].is_err());
        // An attribute claiming more than there is stops the walk.
        assert_eq!(attrs(&[8, 0, 1, 0, 1]).count(), 0);
        assert_eq!(str_of(b"abc"), Some("abc"));
    }
}
