//! Where things are in a JSON text, by byte range, so that a conflist is edited in place: only
//! the bytes of one value change, every other byte (whitespace, key order, number spellings,
//! escapes) stays. Pure; run only on a text `serde_json` has already accepted, and still never
//! panics on one it would not (`None`).

use std::ops::Range;

/// A JSON text read from a byte offset.
struct Cursor<'a> {
    b: &'a [u8],
    i: usize,
}

impl Cursor<'_> {
    fn ws(&mut self) {
        while matches!(self.b.get(self.i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.b.get(self.i).copied()
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.peek()? == c).then(|| self.i += 1)
    }

    /// One value (any kind), its range.
    fn value(&mut self) -> Option<Range<usize>> {
        let start = self.i_after_ws();
        match self.peek()? {
            b'{' => self.members(|_, _| ())?,
            b'[' => self.elements(|_| ())?,
            b'"' => {
                self.string()?;
            }
            _ => {
                let scalar =
                    |c: &u8| !matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r');
                while self.b.get(self.i).is_some_and(scalar) {
                    self.i += 1;
                }
                if self.i == start {
                    return None;
                }
            }
        }
        Some(start..self.i)
    }

    fn i_after_ws(&mut self) -> usize {
        self.ws();
        self.i
    }

    fn string(&mut self) -> Option<Range<usize>> {
        let start = self.i_after_ws();
        self.eat(b'"')?;
        loop {
            match self.b.get(self.i)? {
                b'\\' => self.i += 2,
                b'"' => {
                    self.i += 1;
                    return Some(start..self.i);
                }
                _ => self.i += 1,
            }
        }
    }

    /// An object: each member's key range and value range to `each`.
    fn members(&mut self, mut each: impl FnMut(Range<usize>, Range<usize>)) -> Option<()> {
        self.eat(b'{')?;
        if self.eat(b'}').is_some() {
            return Some(());
        }
        loop {
            let key = self.string()?;
            self.eat(b':')?;
            let value = self.value()?;
            each(key, value);
            match self.peek()? {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// An array: each element's range to `each`.
    fn elements(&mut self, mut each: impl FnMut(Range<usize>)) -> Option<()> {
        self.eat(b'[')?;
        if self.eat(b']').is_some() {
            return Some(());
        }
        loop {
            each(self.value()?);
            match self.peek()? {
                b',' => self.i += 1,
                b']' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }
}

/// The whole text's value; `None` when it is not one value (trailing bytes but whitespace).
pub fn whole(text: &str) -> Option<Range<usize>> {
    let mut cursor = Cursor {
        b: text.as_bytes(),
        i: 0,
    };
    let range = cursor.value()?;
    cursor.ws();
    (cursor.i == text.len()).then_some(range)
}

/// The members of the object at `at`: each key decoded, with its value's range; `None` when
/// `at` is no object.
pub fn members(text: &str, at: Range<usize>) -> Option<Vec<(String, Range<usize>)>> {
    let mut cursor = Cursor {
        b: text.as_bytes(),
        i: at.start,
    };
    let mut found = Vec::new();
    let mut keys = Vec::new();
    cursor.members(|key, value| {
        keys.push(key);
        found.push(value);
    })?;
    keys.into_iter()
        .zip(found)
        .map(|(key, value)| Some((serde_json::from_str(text.get(key)?).ok()?, value)))
        .collect()
}

/// The elements of the array at `at`; `None` when `at` is no array.
pub fn elements(text: &str, at: Range<usize>) -> Option<Vec<Range<usize>>> {
    let mut cursor = Cursor {
        b: text.as_bytes(),
        i: at.start,
    };
    let mut found = Vec::new();
    cursor.elements(|element| found.push(element))?;
    Some(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_and_elements_are_found_by_range() {
        let text = r#" { "a" : [1, {"t\u0079pe":"x"} , "s\"]"], "b":-1.5e3 ,"c":{}} "#;
        let top = whole(text).unwrap();
        assert_eq!(&text[top.clone()], text.trim());
        let members = members(text, top).unwrap();
        let keys: Vec<&str> = members.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["a", "b", "c"]);
        assert_eq!(&text[members[1].1.clone()], "-1.5e3");
        let elements = elements(text, members[0].1.clone()).unwrap();
        assert_eq!(elements.len(), 3);
        assert_eq!(&text[elements[2].clone()], r#""s\"]""#);
        let inner = super::members(text, elements[1].clone()).unwrap();
        assert_eq!(inner[0].0, "type");
        assert_eq!(&text[inner[0].1.clone()], r#""x""#);
        assert!(super::members(text, elements[0].clone()).is_none());
    }

    #[test]
    fn what_is_not_one_value_is_none() {
        assert!(whole(r#"{"a":1} {}"#).is_none());
        assert!(whole(r#"{"a":1"#).is_none());
        assert!(whole("").is_none());
    }
}
