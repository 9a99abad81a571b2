//! The D-Bus wire format (the D-Bus specification, "Message Protocol"), as far as a client
//! that subscribes to one signal needs it: a method call with at most one string argument
//! encoded, and any message's framing and header fields (path, interface, member, error name,
//! reply serial) decoded, in either byte order. Bodies are never decoded: the signal
//! natledger listens for has none, and the replies it waits for are told by their kind.
//! Pure: no I/O.
//!
//! A message: a 16-byte fixed part (byte order `l` or `B`, kind, flags, protocol version 1,
//! body length, serial, the header fields' array length), the header fields, an array of
//! `(BYTE code, VARIANT value)` structs each aligned to 8, padding to 8, then the body.

/// The largest message read: a signal or reply natledger waits for is a few hundred bytes;
/// a bus sending more is treated as broken (the connection is dropped and made again).
pub const MAX_MESSAGE: usize = 1 << 20;
/// The fixed part: up to and including the header fields' array length.
const FIXED: usize = 16;

/// Header field codes.
const PATH: u8 = 1;
const INTERFACE: u8 = 2;
const MEMBER: u8 = 3;
const ERROR_NAME: u8 = 4;
const REPLY_SERIAL: u8 = 5;
const DESTINATION: u8 = 6;
const SIGNATURE: u8 = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    MethodCall,
    MethodReturn,
    Error,
    Signal,
    /// A kind this version of the protocol does not name: to be ignored.
    Other(u8),
}

impl Kind {
    fn of(byte: u8) -> Kind {
        match byte {
            1 => Kind::MethodCall,
            2 => Kind::MethodReturn,
            3 => Kind::Error,
            4 => Kind::Signal,
            other => Kind::Other(other),
        }
    }
}

/// A received message's header, the fields natledger reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub serial: u32,
    pub path: Option<String>,
    pub interface: Option<String>,
    pub member: Option<String>,
    pub error_name: Option<String>,
    pub reply_serial: Option<u32>,
}

impl Header {
    /// Whether it is the signal `interface.member` sent from `path`.
    pub fn is_signal(&self, path: &str, interface: &str, member: &str) -> bool {
        self.kind == Kind::Signal
            && self.path.as_deref() == Some(path)
            && self.interface.as_deref() == Some(interface)
            && self.member.as_deref() == Some(member)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("byte order {0:#04x}, neither 'l' nor 'B'")]
    ByteOrder(u8),
    #[error("protocol version {0}, not 1")]
    Version(u8),
    #[error("a message of {0} bytes, over the {MAX_MESSAGE}-byte cap")]
    TooLarge(u64),
    #[error("a malformed header field at byte {0}")]
    Field(usize),
}

/// A method call to encode: little-endian, no flags, protocol version 1.
#[derive(Clone, Copy, Debug)]
pub struct Call<'a> {
    pub serial: u32,
    pub destination: &'a str,
    pub path: &'a str,
    pub interface: &'a str,
    pub member: &'a str,
    /// The one string argument, if any (signature `s`).
    pub arg: Option<&'a str>,
}

impl Call<'_> {
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::new();
        if let Some(arg) = self.arg {
            put_string(&mut body, arg);
        }
        let mut m = vec![b'l', 1, 0, 1];
        m.extend_from_slice(&(body.len() as u32).to_le_bytes());
        m.extend_from_slice(&self.serial.to_le_bytes());
        m.extend_from_slice(&[0; 4]);
        field(&mut m, PATH, b'o', self.path);
        field(&mut m, INTERFACE, b's', self.interface);
        field(&mut m, MEMBER, b's', self.member);
        field(&mut m, DESTINATION, b's', self.destination);
        if self.arg.is_some() {
            field(&mut m, SIGNATURE, b'g', "s");
        }
        let fields = (m.len() - FIXED) as u32;
        m[12..FIXED].copy_from_slice(&fields.to_le_bytes());
        pad(&mut m, 8);
        m.extend_from_slice(&body);
        m
    }
}

fn pad(m: &mut Vec<u8>, to: usize) {
    m.resize(m.len().next_multiple_of(to), 0);
}

/// A string (`s`, `o`): aligned to 4, its length, its bytes, a nul.
fn put_string(m: &mut Vec<u8>, s: &str) {
    pad(m, 4);
    m.extend_from_slice(&(s.len() as u32).to_le_bytes());
    m.extend_from_slice(s.as_bytes());
    m.push(0);
}

/// A header field: aligned to 8, its code, the variant's one-type signature, its value.
fn field(m: &mut Vec<u8>, code: u8, kind: u8, value: &str) {
    pad(m, 8);
    m.extend_from_slice(&[code, 1, kind, 0]);
    if kind == b'g' {
        m.push(value.len() as u8);
        m.extend_from_slice(value.as_bytes());
        m.push(0);
    } else {
        put_string(m, value);
    }
}

#[derive(Clone, Copy)]
enum Order {
    Little,
    Big,
}

impl Order {
    fn of(byte: u8) -> Result<Order, WireError> {
        match byte {
            b'l' => Ok(Order::Little),
            b'B' => Ok(Order::Big),
            other => Err(WireError::ByteOrder(other)),
        }
    }

    fn u32(self, b: [u8; 4]) -> u32 {
        match self {
            Order::Little => u32::from_le_bytes(b),
            Order::Big => u32::from_be_bytes(b),
        }
    }
}

/// The size of the first message of `buf` once its fixed part is there (`None`: more bytes
/// are needed to know it). The message itself may not be whole yet.
pub fn frame(buf: &[u8]) -> Result<Option<usize>, WireError> {
    let Some(fixed) = buf.get(..FIXED) else {
        return Ok(None);
    };
    let order = Order::of(fixed[0])?;
    if fixed[3] != 1 {
        return Err(WireError::Version(fixed[3]));
    }
    let word = |at: usize| u64::from(order.u32(fixed[at..at + 4].try_into().expect("4 bytes")));
    let total = (FIXED as u64 + word(12)).next_multiple_of(8) + word(4);
    if total > MAX_MESSAGE as u64 {
        return Err(WireError::TooLarge(total));
    }
    Ok(Some(total as usize))
}

/// The header of `message`, one whole message as [`frame`] measured it. Header fields of
/// codes natledger does not read are skipped when their type is a basic one; a field of
/// another type ends the reading (the fields read so far stand).
pub fn header(message: &[u8]) -> Result<Header, WireError> {
    let fixed = message.get(..FIXED).ok_or(WireError::Field(0))?;
    let order = Order::of(fixed[0])?;
    let word = |at: usize| order.u32(fixed[at..at + 4].try_into().expect("4 bytes"));
    let end = FIXED + word(12) as usize;
    let mut r = Reader {
        buf: message.get(..end).ok_or(WireError::Field(FIXED))?,
        at: FIXED,
        order,
    };
    let mut h = Header {
        kind: Kind::of(fixed[1]),
        serial: word(8),
        path: None,
        interface: None,
        member: None,
        error_name: None,
        reply_serial: None,
    };
    while r.align(8) && r.at < end {
        let code = r.byte()?;
        let signature = r.signature()?;
        match (code, signature.as_str()) {
            (PATH, "o") => h.path = Some(r.string()?),
            (INTERFACE, "s") => h.interface = Some(r.string()?),
            (MEMBER, "s") => h.member = Some(r.string()?),
            (ERROR_NAME, "s") => h.error_name = Some(r.string()?),
            (REPLY_SERIAL, "u") => h.reply_serial = Some(r.u32()?),
            (_, other) => {
                if !r.skip(other)? {
                    break;
                }
            }
        }
    }
    Ok(h)
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
    order: Order,
}

impl<'a> Reader<'a> {
    /// Move to the next multiple of `to`; false past the end.
    fn align(&mut self, to: usize) -> bool {
        self.at = self.at.next_multiple_of(to);
        self.at <= self.buf.len()
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let buf: &'a [u8] = self.buf;
        let bytes = self
            .at
            .checked_add(n)
            .and_then(|end| buf.get(self.at..end))
            .ok_or(WireError::Field(self.at))?;
        self.at += n;
        Ok(bytes)
    }

    fn byte(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, WireError> {
        self.align(4);
        let b = self.take(4)?;
        Ok(self.order.u32(b.try_into().expect("4 bytes")))
    }

    /// `len` bytes of UTF-8 and a nul.
    fn text(&mut self, len: usize) -> Result<String, WireError> {
        let at = self.at;
        let bytes = self.take(len + 1)?;
        if bytes[len] != 0 {
            return Err(WireError::Field(at));
        }
        String::from_utf8(bytes[..len].to_vec()).map_err(|_| WireError::Field(at))
    }

    /// A string or object path: aligned to 4, a length, the bytes, a nul.
    fn string(&mut self) -> Result<String, WireError> {
        let len = self.u32()? as usize;
        self.text(len)
    }

    /// A signature: a length byte, the bytes, a nul.
    fn signature(&mut self) -> Result<String, WireError> {
        let len = self.byte()? as usize;
        self.text(len)
    }

    /// Past a value of a basic type; false for any other type (not skipped).
    fn skip(&mut self, signature: &str) -> Result<bool, WireError> {
        let (align, size) = match signature {
            "y" => (1, 1),
            "n" | "q" => (2, 2),
            "b" | "i" | "u" | "h" => (4, 4),
            "x" | "t" | "d" => (8, 8),
            "s" | "o" => {
                self.string()?;
                return Ok(true);
            }
            "g" => {
                self.signature()?;
                return Ok(true);
            }
            _ => return Ok(false),
        };
        self.align(align);
        self.take(size)?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// firewalld's Reloaded signal as `dbus-send --type=signal /org/fedoraproject/FirewallD1
    /// org.fedoraproject.FirewallD1.Reloaded` sent it through dbus-daemon 1.14, captured by
    /// `dbus-monitor --binary`.
    const RELOADED: &str = "6c04010100000000010000008000000001016f001d0000002f6f72672f6665646f726170\
        726f6a6563742f4669726577616c6c4431000000020173001c0000006f72672e6665646f726170726f6a6563\
        742e4669726577616c6c443100000000030173000800000052656c6f616465640000000000000000070173000f\
        0000003a6e6f742e6163746976652e79657400";

    #[test]
    fn a_captured_reloaded_signal_is_framed_and_read() {
        let bytes = hex(RELOADED);
        assert_eq!(frame(&bytes), Ok(Some(bytes.len())));
        let h = header(&bytes).unwrap();
        assert_eq!(h.kind, Kind::Signal);
        assert_eq!(h.serial, 1);
        assert!(h.is_signal(
            "/org/fedoraproject/FirewallD1",
            "org.fedoraproject.FirewallD1",
            "Reloaded"
        ));
        assert!(!h.is_signal(
            "/org/fedoraproject/FirewallD1",
            "org.fedoraproject.FirewallD1",
            "Changed"
        ));
        // Cut anywhere in the fixed part: more is needed; past it, the size is known.
        assert_eq!(frame(&bytes[..15]), Ok(None));
        assert_eq!(frame(&bytes[..16]), Ok(Some(bytes.len())));
    }

    #[test]
    fn a_method_call_encodes_as_the_specification_lays_it_out_and_reads_back() {
        let call = Call {
            serial: 2,
            destination: "org.freedesktop.DBus",
            path: "/org/freedesktop/DBus",
            interface: "org.freedesktop.DBus",
            member: "AddMatch",
            arg: Some("type='signal'"),
        };
        let m = call.encode();
        // Fixed part: little-endian, a method call, no flags, version 1, a body of 4 + 13 + 1
        // bytes, serial 2.
        assert_eq!(&m[..12], &[b'l', 1, 0, 1, 18, 0, 0, 0, 2, 0, 0, 0]);
        assert_eq!(frame(&m), Ok(Some(m.len())));
        let fields = u32::from_le_bytes(m[12..16].try_into().unwrap()) as usize;
        let body = (16 + fields).next_multiple_of(8);
        assert_eq!(&m[body..body + 4], &13u32.to_le_bytes());
        assert_eq!(&m[body + 4..], b"type='signal'\0");
        // The path field first, at 16: code 1, signature "o", length 21.
        assert_eq!(&m[16..24], &[1, 1, b'o', 0, 21, 0, 0, 0]);
        // The signature field last: code 8, signature "g", value "s".
        assert_eq!(
            &m[16 + fields - 7..16 + fields],
            &[8, 1, b'g', 0, 1, b's', 0]
        );
        let h = header(&m).unwrap();
        assert_eq!(h.kind, Kind::MethodCall);
        assert_eq!(h.serial, 2);
        assert_eq!(h.member.as_deref(), Some("AddMatch"));
        assert_eq!(h.path.as_deref(), Some("/org/freedesktop/DBus"));
        // Without an argument: no body, no signature field.
        let hello = Call {
            member: "Hello",
            arg: None,
            ..call
        }
        .encode();
        assert_eq!(&hello[4..8], &[0; 4]);
        assert_eq!(frame(&hello), Ok(Some(hello.len())));
        assert_eq!(hello.len() % 8, 0);
    }

    /// A reply in big-endian order, with a field of a type natledger does not read skipped.
    #[test]
    fn big_endian_replies_and_unread_fields_are_read() {
        let mut m = vec![b'B', 3, 1, 1, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0];
        // REPLY_SERIAL: u 2.
        m.extend_from_slice(&[5, 1, b'u', 0, 0, 0, 0, 2]);
        // An unknown code 42 with an `x`: aligned to 8, 8 bytes.
        m.extend_from_slice(&[42, 1, b'x', 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]);
        // ERROR_NAME: s "e.E".
        m.extend_from_slice(&[4, 1, b's', 0, 0, 0, 0, 3, b'e', b'.', b'E', 0]);
        let fields = (m.len() - 16) as u32;
        m[12..16].copy_from_slice(&fields.to_be_bytes());
        pad(&mut m, 8);
        assert_eq!(frame(&m), Ok(Some(m.len())));
        let h = header(&m).unwrap();
        assert_eq!(h.kind, Kind::Error);
        assert_eq!(h.serial, 9);
        assert_eq!(h.reply_serial, Some(2));
        assert_eq!(h.error_name.as_deref(), Some("e.E"));
    }

    #[test]
    fn garbage_is_refused_never_read_past_its_end() {
        let bytes = hex(RELOADED);
        let mut bad = bytes.clone();
        bad[0] = b'x';
        assert_eq!(frame(&bad), Err(WireError::ByteOrder(b'x')));
        let mut bad = bytes.clone();
        bad[3] = 2;
        assert_eq!(frame(&bad), Err(WireError::Version(2)));
        let mut huge = bytes.clone();
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(frame(&huge), Err(WireError::TooLarge(_))));
        // A string length past the header fields' end.
        let mut long = bytes.clone();
        long[20..24].copy_from_slice(&0x1000u32.to_le_bytes());
        assert!(matches!(header(&long), Err(WireError::Field(_))));
        // A string without its nul.
        let mut unterminated = bytes.clone();
        unterminated[24 + 29] = b'x';
        assert!(matches!(header(&unterminated), Err(WireError::Field(_))));
        // Every prefix: an error or a header, never a panic.
        for cut in 0..bytes.len() {
            let _ = header(&bytes[..cut]);
        }
    }
}
