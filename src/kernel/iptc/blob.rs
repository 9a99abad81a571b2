//! The legacy table as one blob, and edits to it.
//!
//! ```text
//! offset 0                                                              size
//! | PREROUTING rules.. policy | INPUT .. policy | ... | ERROR "NATLEDGER-HOSTPORTS" |
//!   ^hook_entry[0]   ^underflow[0]                       rules.. RETURN | ... | ERROR "ERROR"
//! ```
//!
//! Built-in chains run from `hook_entry[h]` to their policy entry at `underflow[h]`; a user
//! chain is an ERROR entry naming it, its rules, and a RETURN entry; the table ends with an
//! ERROR entry named "ERROR". A jump or goto is a standard target whose verdict is the offset
//! of the entry it continues at (a user chain's first rule, or its RETURN when it is empty).
//!
//! An edit inserts entries before, or removes, entries at given offsets and moves every jump
//! verdict, hook entry and underflow with them. A jump to an offset where entries were
//! inserted lands on the first inserted entry (the chain's new first rule); a jump to a
//! removed entry lands on what follows it. Nothing else in the blob holds an offset.

use std::collections::HashMap;

use super::entry::{ERROR, Layout, STANDARD, XT_HEADER, i32_at, xt_at};

/// `ipt_getinfo` without the name: where the hooks start and end, and the totals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Info {
    pub valid_hooks: u32,
    pub hook_entry: [u32; 5],
    pub underflow: [u32; 5],
    pub num_entries: u32,
    pub size: u32,
}

/// The built-in chains by hook number.
pub const HOOKS: [&str; 5] = ["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blob {
    pub layout: Layout,
    pub info: Info,
    /// The entries are `buf[start..]`; what comes before is the caller's (the header the
    /// kernel wrote them after), so that reading costs no copy.
    buf: Vec<u8>,
    start: usize,
    /// Entry offsets, in order.
    offsets: Vec<usize>,
}

/// Where a chain's rules are: `first..tail`, `tail` being its policy or RETURN entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub first: usize,
    pub tail: usize,
}

/// The result of [`Blob::edit`].
#[derive(Debug)]
pub struct Edited {
    pub info: Info,
    /// The blob's buffer: the caller's header room, then the new entries from `start`.
    pub buf: Vec<u8>,
    pub start: usize,
    /// For each new entry, the index of the old entry it is (its counters carry over).
    pub from_old: Vec<Option<u32>>,
}

impl Blob {
    /// Walk the entries in `buf[start..]`; `None` if they do not tile it exactly as `info`
    /// says.
    pub fn parse(layout: Layout, info: Info, buf: Vec<u8>, start: usize) -> Option<Blob> {
        let bytes = buf.get(start..)?;
        let mut offsets = Vec::with_capacity(info.num_entries as usize);
        let mut at = 0;
        while at < bytes.len() {
            let e = bytes.get(at..at + layout.entry_size)?;
            let next = layout.next_offset(e);
            let target = layout.target_offset(e);
            if target < layout.entry_size || target + XT_HEADER > next {
                return None;
            }
            bytes.get(at..at + next)?;
            offsets.push(at);
            at += next;
        }
        (at == info.size as usize && offsets.len() == info.num_entries as usize).then_some(Blob {
            layout,
            info,
            buf,
            start,
            offsets,
        })
    }

    /// The entries, back to back.
    pub fn bytes(&self) -> &[u8] {
        &self.buf[self.start..]
    }

    fn entry(&self, at: usize) -> &[u8] {
        let bytes = self.bytes();
        let next = self.layout.next_offset(&bytes[at..]);
        &bytes[at..at + next]
    }

    fn target_name(&self, at: usize) -> Option<&str> {
        let e = self.entry(at);
        xt_at(e, self.layout.target_offset(e)).map(|(t, _)| t.name)
    }

    /// The chain name of a user chain's ERROR head entry.
    fn head_name(&self, at: usize) -> Option<&str> {
        if self.target_name(at) != Some(ERROR) {
            return None;
        }
        let e = self.entry(at);
        let (t, _) = xt_at(e, self.layout.target_offset(e))?;
        let end = t.data.iter().position(|b| *b == 0)?;
        std::str::from_utf8(&t.data[..end]).ok()
    }

    pub fn chain(&self, name: &str) -> Option<Span> {
        if let Some(h) = HOOKS.iter().position(|n| *n == name) {
            if self.info.valid_hooks & (1 << h) == 0 {
                return None;
            }
            return Some(Span {
                first: self.info.hook_entry[h] as usize,
                tail: self.info.underflow[h] as usize,
            });
        }
        let i = self
            .offsets
            .iter()
            .position(|&at| self.head_name(at) == Some(name) && name != ERROR)?;
        // Rules follow the head up to the next ERROR entry; the last of them is the RETURN.
        let next_head = self.offsets[i + 1..]
            .iter()
            .position(|&at| self.target_name(at) == Some(ERROR))
            .map(|k| i + 1 + k)?;
        if next_head < i + 2 {
            return None; // no RETURN entry: not a chain libiptc wrote
        }
        Some(Span {
            first: self.offsets[i + 1],
            tail: self.offsets[next_head - 1],
        })
    }

    /// Every user chain's [`Span`] by name, in one pass over the entries: for a reader that
    /// looks many chains up ([`Blob::chain`] reads the entries up to the chain each time).
    pub fn user_chain_spans(&self) -> HashMap<&str, Span> {
        let heads: Vec<usize> = (0..self.offsets.len())
            .filter(|&i| self.target_name(self.offsets[i]) == Some(ERROR))
            .collect();
        heads
            .windows(2)
            .filter(|w| w[1] >= w[0] + 2)
            .filter_map(|w| {
                let name = self.head_name(self.offsets[w[0]]).filter(|n| *n != ERROR)?;
                let span = Span {
                    first: self.offsets[w[0] + 1],
                    tail: self.offsets[w[1] - 1],
                };
                Some((name, span))
            })
            .collect()
    }

    /// The entries of a chain before its tail, with their offsets.
    pub fn rules(&self, span: Span) -> impl Iterator<Item = (usize, &[u8])> {
        let from = self.offsets.partition_point(|&at| at < span.first);
        self.offsets[from..]
            .iter()
            .copied()
            .take_while(move |&at| at < span.tail)
            .map(|at| (at, self.entry(at)))
    }

    /// The user chain whose rules start at `offset` (a jump's destination).
    pub fn chain_starting_at(&self, offset: usize) -> Option<&str> {
        let i = self.offsets.binary_search(&offset).ok()?;
        let head = *self.offsets.get(i.checked_sub(1)?)?;
        self.head_name(head).filter(|n| *n != ERROR)
    }

    /// The user chains' names, in table order.
    pub fn user_chains(&self) -> impl Iterator<Item = &str> {
        self.offsets
            .iter()
            .filter_map(|&at| self.head_name(at))
            .filter(|n| *n != ERROR)
    }

    /// The entry at `at` (an offset from [`Blob::rules`] or a [`Span`]).
    pub fn entry_at(&self, at: usize) -> &[u8] {
        self.entry(at)
    }

    /// A digest of what natledger owns in the table: the rules of every user chain named
    /// `prefix`…, by name, and the built-in chains' jumps into them, counters and `comefrom`
    /// left out (traffic changes them). A restore that swaps same-shaped rules keeps the
    /// table's size and entry count ([`super::Stamp`]) but not this.
    pub fn digest(&self, prefix: &str) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        let c = self.layout.counters_at;
        let entry = |e: &[u8], h: &mut std::collections::hash_map::DefaultHasher| {
            e[..c - 4].hash(h);
            e[c + 16..].hash(h);
        };
        // In table order: the map's own order changes from one read to the next.
        let mut chains: Vec<_> = self.user_chain_spans().into_iter().collect();
        chains.sort_by_key(|(_, span)| span.first);
        for (name, span) in chains {
            if name.starts_with(prefix) {
                name.hash(&mut h);
                for (_, e) in self.rules(span) {
                    entry(e, &mut h);
                }
            }
        }
        for hook in HOOKS {
            let Some(span) = self.chain(hook) else {
                continue;
            };
            for (_, e) in self.rules(span) {
                let Some((t, _)) = xt_at(e, self.layout.target_offset(e)) else {
                    continue;
                };
                let to = (t.name == STANDARD && t.data.len() >= 4)
                    .then(|| i32_at(t.data, 0))
                    .filter(|v| *v >= 0)
                    .and_then(|v| self.chain_starting_at(v as usize));
                if to.is_some_and(|to| to.starts_with(prefix)) {
                    hook.hash(&mut h);
                    entry(e, &mut h);
                }
            }
        }
        h.finish()
    }

    /// Insert `inserts` (each before the entry at its offset; several at one offset in the
    /// order given) or remove the entries at `removes`, in place: the table is never copied,
    /// so a hook holds one copy of it however large it is. The bytes before the entries are
    /// kept (the caller's header room). `None` if an offset is not an entry's, both inserts
    /// and removes are given, or an inserted entry is malformed or a jump (it would be taken
    /// for an old one when offsets move); the blob is consumed either way, and nothing
    /// reaches the kernel.
    ///
    /// Linear in the table: one walk over the old entries computes where each lands, one
    /// pass moves the bytes, one pass over the kept entries moves their jumps (each looked
    /// up by binary search). Nothing is searched per inserted or removed entry.
    pub fn edit(mut self, inserts: &[(usize, Vec<u8>)], removes: &[usize]) -> Option<Edited> {
        if (!inserts.is_empty() && !removes.is_empty())
            || inserts.iter().any(|(_, e)| !self.insertable(e))
        {
            return None;
        }
        let moves = self.moves(inserts, removes)?;
        let old_len = self.bytes().len();
        if !moves.order.is_empty() {
            self.insert_in_place(inserts, &moves.order, old_len);
        } else if moves.removed.contains(&true) {
            self.close_gaps(&moves.removed, old_len)?;
        }
        self.move_jumps(&moves)?;
        let info = self.moved_info(&moves)?;
        Some(Edited {
            info,
            buf: self.buf,
            start: self.start,
            from_old: moves.from_old,
        })
    }

    /// Whether `e` may be inserted: a well-formed entry, not a jump (it would be taken for
    /// an old one when offsets move).
    fn insertable(&self, e: &[u8]) -> bool {
        e.len() >= self.layout.entry_size
            && self.layout.next_offset(e) == e.len()
            && self.layout.target_offset(e) + XT_HEADER <= e.len()
            && jump_verdict_at(self.layout, e).is_none()
    }

    /// The index of the entry at offset `at`.
    fn index(&self, at: usize) -> Option<usize> {
        self.offsets.binary_search(&at).ok()
    }

    /// Where old entry `i` ends.
    fn end_of(&self, i: usize, old_len: usize) -> usize {
        self.offsets.get(i + 1).copied().unwrap_or(old_len)
    }

    /// One walk over the old entries: where each lands once `inserts` or `removes` apply.
    fn moves(&self, inserts: &[(usize, Vec<u8>)], removes: &[usize]) -> Option<Moves> {
        let n = self.offsets.len();
        // The inserts as (old entry index, given order), sorted: grouped by point, each
        // group in the order given.
        let mut order = inserts
            .iter()
            .enumerate()
            .map(|(k, (at, _))| Some((self.index(*at)?, k)))
            .collect::<Option<Vec<(usize, usize)>>>()?;
        order.sort_unstable();
        let mut removed = vec![false; n];
        for &at in removes {
            removed[self.index(at)?] = true;
        }
        let old_len = self.bytes().len();
        let mut m = Moves {
            position: Vec::with_capacity(n),
            landed: Vec::with_capacity(n),
            from_old: Vec::with_capacity(n + inserts.len()),
            order,
            removed,
        };
        let mut shift: isize = 0;
        let mut k = 0;
        for (i, &at) in self.offsets.iter().enumerate() {
            m.position.push(u32::try_from(at as isize + shift).ok()?);
            while let Some(&(_, given)) = m.order.get(k).filter(|(point, _)| *point == i) {
                shift += inserts[given].1.len() as isize;
                m.from_old.push(None);
                k += 1;
            }
            if m.removed[i] {
                m.landed.push(NONE);
                shift -= (self.end_of(i, old_len) - at) as isize;
            } else {
                m.landed.push(u32::try_from(at as isize + shift).ok()?);
                m.from_old.push(Some(i as u32));
            }
        }
        Some(m)
    }

    /// Grow, then, from the last insertion point backwards, move the stretch up to the next
    /// point and write the point's entries before it.
    fn insert_in_place(
        &mut self,
        inserts: &[(usize, Vec<u8>)],
        order: &[(usize, usize)],
        old_len: usize,
    ) {
        let start = self.start;
        let total: usize = inserts.iter().map(|(_, e)| e.len()).sum();
        self.buf.resize(self.buf.len() + total, 0);
        let mut after = total; // bytes inserted at this point and before
        let mut end = old_len;
        let mut hi = order.len();
        while hi > 0 {
            let point = order[hi - 1].0;
            let lo = order[..hi].partition_point(|(p, _)| *p < point);
            let at = self.offsets[point];
            self.buf
                .copy_within(start + at..start + end, start + at + after);
            let here: usize = order[lo..hi].iter().map(|(_, g)| inserts[*g].1.len()).sum();
            let mut w = start + at + after - here;
            for &(_, given) in &order[lo..hi] {
                let e = &inserts[given].1;
                self.buf[w..w + e.len()].copy_from_slice(e);
                w += e.len();
            }
            after -= here;
            end = at;
            hi = lo;
        }
    }

    /// Close each gap, front to back: every kept entry after the first removed one moves
    /// once.
    fn close_gaps(&mut self, removed: &[bool], old_len: usize) -> Option<()> {
        let start = self.start;
        let first = removed.iter().position(|r| *r)?;
        let mut write = start + self.offsets[first];
        let kept = (first..removed.len()).filter(|&i| !removed[i]);
        for i in kept {
            let (at, end) = (self.offsets[i], self.end_of(i, old_len));
            self.buf.copy_within(start + at..start + end, write);
            write += end - at;
        }
        self.buf.truncate(write);
        Some(())
    }

    /// Where the entry at old offset `old` begins now (before entries inserted there).
    fn moved(&self, moves: &Moves, old: u32) -> Option<u32> {
        Some(moves.position[self.index(old as usize)?])
    }

    /// Every kept entry's jump names an old offset: move it.
    fn move_jumps(&mut self, moves: &Moves) -> Option<()> {
        for &at in moves.landed.iter().filter(|at| **at != NONE) {
            let at = self.start + at as usize;
            let e_len = self.layout.next_offset(&self.buf[at..]);
            if let Some(v) = jump_verdict_at(self.layout, &self.buf[at..at + e_len]) {
                let old = i32_at(&self.buf, at + v) as u32;
                let new = self.moved(moves, old)? as i32;
                self.buf[at + v..at + v + 4].copy_from_slice(&new.to_ne_bytes());
            }
        }
        Some(())
    }

    /// The table's info after the edit: hooks, underflows, count and size.
    fn moved_info(&self, moves: &Moves) -> Option<Info> {
        let mut info = self.info;
        for h in 0..5 {
            if info.valid_hooks & (1 << h) == 0 {
                continue;
            }
            info.hook_entry[h] = self.moved(moves, self.info.hook_entry[h])?;
            // The policy entry itself, never what was inserted before it.
            let i = self.index(self.info.underflow[h] as usize)?;
            info.underflow[h] = Some(moves.landed[i]).filter(|l| *l != NONE)?;
        }
        info.num_entries = moves.from_old.len() as u32;
        info.size = (self.buf.len() - self.start) as u32;
        Some(info)
    }
}

/// `Moves::landed` of a removed entry.
const NONE: u32 = u32::MAX;

/// Per old entry: where its position begins (before entries inserted there) and where the
/// entry itself lands (`NONE` if removed), in the new table; and for each new entry, the old
/// one it is (`None`: inserted).
struct Moves {
    position: Vec<u32>,
    landed: Vec<u32>,
    from_old: Vec<Option<u32>>,
    /// The inserts as (old entry index, given order), sorted.
    order: Vec<(usize, usize)>,
    removed: Vec<bool>,
}

/// Where, inside entry `e`, a standard target holds a jump offset.
fn jump_verdict_at(layout: Layout, e: &[u8]) -> Option<usize> {
    let target_at = layout.target_offset(e);
    let (t, size) = xt_at(e, target_at)?;
    let verdict_at = target_at + XT_HEADER;
    (t.name == STANDARD && size >= XT_HEADER + 4 && i32_at(e, verdict_at) >= 0)
        .then_some(verdict_at)
}

#[cfg(test)]
mod tests {
    use super::super::entry::{Encoded, align8, encode};
    use super::*;
    use crate::model::family::Family;
    use crate::model::rule::Rule;

    fn rule(args: &str) -> Rule {
        Rule::parse_args(&args.split_whitespace().collect::<Vec<_>>()).unwrap()
    }

    /// A standard or ERROR entry with no match.
    fn bare(layout: Layout, name: &str, data: &[u8]) -> Vec<u8> {
        let mut e = vec![0u8; layout.entry_size];
        let size = align8(XT_HEADER + data.len());
        e.extend((size as u16).to_ne_bytes());
        let mut n = [0u8; 29];
        n[..name.len()].copy_from_slice(name.as_bytes());
        e.extend(n);
        e.push(0);
        e.extend(data);
        e.resize(layout.entry_size + size, 0);
        let at = layout.target_offset_at;
        e[at..at + 2].copy_from_slice(&(layout.entry_size as u16).to_ne_bytes());
        let len = e.len() as u16;
        e[at + 2..at + 4].copy_from_slice(&len.to_ne_bytes());
        e
    }

    fn verdict(layout: Layout, v: i32) -> Vec<u8> {
        bare(layout, STANDARD, &v.to_ne_bytes())
    }

    fn head(layout: Layout, name: &str) -> Vec<u8> {
        let mut d = [0u8; 32];
        d[..name.len()].copy_from_slice(name.as_bytes());
        bare(layout, ERROR, &d)
    }

    /// nat with PREROUTING jumping to X, X empty (RETURN), the other hooks empty.
    fn table() -> Blob {
        let l = Layout::of(Family::Ipv4);
        let accept = -2; // -NF_ACCEPT - 1
        let ret = -5; // XT_RETURN
        let mut bytes = Vec::new();
        let mut info = Info {
            valid_hooks: 0b11011,
            hook_entry: [0; 5],
            underflow: [0; 5],
            num_entries: 0,
            size: 0,
        };
        let mut jump_at = 0;
        let mut count = 0;
        for h in [0usize, 1, 3, 4] {
            info.hook_entry[h] = bytes.len() as u32;
            if h == 0 {
                jump_at = bytes.len();
                bytes.extend(verdict(l, 0));
                count += 1;
            }
            info.underflow[h] = bytes.len() as u32;
            bytes.extend(verdict(l, accept));
            count += 1;
        }
        bytes.extend(head(l, "X"));
        let x_first = bytes.len();
        bytes.extend(verdict(l, ret));
        bytes.extend(head(l, ERROR));
        count += 3;
        let v = jump_at + l.entry_size + XT_HEADER;
        bytes[v..v + 4].copy_from_slice(&(x_first as i32).to_ne_bytes());
        info.num_entries = count;
        info.size = bytes.len() as u32;
        Blob::parse(l, info, bytes, 0).unwrap()
    }

    #[test]
    fn the_digest_covers_the_prefixed_chains_and_jumps_into_them_not_counters_or_others() {
        let t = table();
        let l = t.layout;
        let base = t.digest("X");
        let pre = t.chain("PREROUTING").unwrap().first;
        let policy = t.info.underflow[0] as usize;
        let changed = |at: usize, byte: usize| {
            let mut bytes = t.bytes().to_vec();
            bytes[at + byte] ^= 0xff;
            Blob::parse(l, t.info, bytes, 0).unwrap().digest("X")
        };
        assert_eq!(changed(pre, l.counters_at + 3), base, "the jump's counters");
        assert_eq!(changed(pre, l.counters_at - 2), base, "comefrom");
        assert_ne!(changed(pre, 8), base, "the jump's destination address");
        assert_eq!(changed(policy, 8), base, "another entry");
        assert_ne!(t.digest("Y"), base);
    }

    #[test]
    fn chains_are_found_by_hook_and_by_head() {
        let t = table();
        let pre = t.chain("PREROUTING").unwrap();
        assert_eq!(t.rules(pre).count(), 1);
        assert!(t.chain("FORWARD").is_none(), "not a nat hook");
        let x = t.chain("X").unwrap();
        assert_eq!(x.first, x.tail, "empty user chain");
        assert_eq!(t.chain_starting_at(x.first), Some("X"));
        assert!(t.chain("ERROR").is_none());
        assert!(t.chain("Y").is_none());
        let spans = t.user_chain_spans();
        assert_eq!(spans.len(), 1);
        assert_eq!(spans.get("X"), Some(&x));
    }

    #[test]
    fn inserting_into_an_empty_chain_moves_jumps_and_hooks() {
        let t = table();
        let x = t.chain("X").unwrap();
        let Some(Encoded::Entry(e)) = encode(
            &rule("-p tcp -m tcp --dport 80 -j MASQUERADE"),
            Family::Ipv4,
        ) else {
            panic!()
        };
        let edited = t.clone().edit(&[(x.tail, e.clone())], &[]).unwrap();
        assert_eq!(edited.info.num_entries, t.info.num_entries + 1);
        assert_eq!(edited.info.size as usize, t.bytes().len() + e.len());
        let new = Blob::parse(t.layout, edited.info, edited.buf, edited.start).unwrap();
        let nx = new.chain("X").unwrap();
        assert_eq!(new.rules(nx).count(), 1);
        // PREROUTING's jump lands on the new first rule of X.
        let (at, jump) = new.rules(new.chain("PREROUTING").unwrap()).next().unwrap();
        let v = i32_at(jump, new.layout.entry_size + XT_HEADER) as usize;
        assert_eq!(v, nx.first);
        assert_eq!(new.chain_starting_at(v), Some("X"));
        assert_eq!(at, 0);
        // Underflows still name the policies; hooks after the insert did not move (it is
        // after them).
        assert_eq!(new.info.hook_entry, t.info.hook_entry);
        assert_eq!(new.info.underflow, t.info.underflow);
        assert_eq!(edited.from_old.iter().filter(|o| o.is_none()).count(), 1);

        // Removing it again gives back the original blob.
        let (rule_at, _) = new.rules(nx).next().unwrap();
        let back = new.edit(&[], &[rule_at]).unwrap();
        assert_eq!(back.buf, t.bytes());
        assert_eq!(back.info, t.info);
    }

    #[test]
    fn inserting_before_a_hook_moves_the_later_hooks() {
        let t = table();
        let pre = t.chain("PREROUTING").unwrap();
        let jump = verdict(t.layout, 0);
        assert!(
            t.clone().edit(&[(pre.first, jump)], &[]).is_none(),
            "a jump"
        );
        let e = verdict(t.layout, -2);
        let edited = t.clone().edit(&[(pre.first, e.clone())], &[]).unwrap();
        assert_eq!(
            edited.info.hook_entry[0], 0,
            "the new entry is PREROUTING's first"
        );
        assert_eq!(
            edited.info.underflow[0],
            t.info.underflow[0] + e.len() as u32
        );
        assert_eq!(
            edited.info.hook_entry[4],
            t.info.hook_entry[4] + e.len() as u32
        );
        assert!(
            t.clone().edit(&[(3, e.clone())], &[]).is_none(),
            "not an entry offset"
        );
        assert!(
            t.edit(&[(0, e)], &[0]).is_none(),
            "inserts and removes at once"
        );
    }
}
