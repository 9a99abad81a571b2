//! Robustness: no input makes either reader panic. Every owner-shaped dump, in both formats,
//! cut at every line and at many byte offsets, and mutated (bytes replaced, deleted, tokens
//! swapped) by a fixed pseudo-random sequence, reads to a ruleset or an error.

use super::*;

const TEXTS: [&str; 6] = [
    include_str!("../../../tests/fixtures/nftables-dumps/docker.nft"),
    include_str!("../../../tests/fixtures/nftables-dumps/sample.nft.txt"),
    include_str!("../../../tests/fixtures/nftables-dumps/kube-proxy.nft"),
    include_str!("../../../tests/fixtures/nftables-dumps/netavark.nft"),
    include_str!("../../../tests/fixtures/nftables-dumps/firewalld.nft"),
    include_str!("../../../tests/fixtures/nftables-dumps/portmap.nft"),
];
const JSON: &str = include_str!("../../../tests/fixtures/nftables-dumps/sample.json");

/// xorshift64: the same sequence every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Bytes nft's syntax gives meaning to, and some it never prints.
const NOISE: &[u8] = b"{}[];,:.\"#@-/ \n\t0123456789abcdefxyz!=<>&|()\\\x00\xff";

fn mutate(rng: &mut Rng, input: &str) -> String {
    let mut bytes = input.as_bytes().to_vec();
    for _ in 0..1 + rng.below(6) {
        if bytes.is_empty() {
            break;
        }
        let at = rng.below(bytes.len());
        match rng.below(4) {
            0 => bytes[at] = NOISE[rng.below(NOISE.len())],
            1 => {
                bytes.remove(at);
            }
            2 => bytes.insert(at, NOISE[rng.below(NOISE.len())]),
            _ => {
                let from = rng.below(bytes.len());
                let len = rng.below(40).min(bytes.len() - from);
                let chunk: Vec<u8> = bytes[from..from + len].to_vec();
                bytes.splice(at..at, chunk);
            }
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

fn read_all_ways(input: &str) {
    let _ = parse_dump(input);
    let _ = super::super::parse_text(input);
    let _ = super::super::parse_json(input);
}

#[test]
fn truncated_dumps_never_panic() {
    for dump in TEXTS.iter().chain([&JSON]) {
        let mut cut = 0;
        for line in dump.split_inclusive('\n') {
            cut += line.len();
            read_all_ways(&dump[..cut]);
            read_all_ways(&dump[cut..]);
        }
        for at in (0..dump.len()).step_by(31) {
            if dump.is_char_boundary(at) {
                read_all_ways(&dump[..at]);
            }
        }
    }
}

#[test]
fn mutated_dumps_never_panic() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for dump in TEXTS.iter().chain([&JSON]) {
        for _ in 0..400 {
            read_all_ways(&mutate(&mut rng, dump));
        }
    }
}

/// JSON that is well-formed but of the wrong shape anywhere is an error, never a panic.
#[test]
fn json_of_the_wrong_shape_never_panics() {
    let doc: serde_json::Value = serde_json::from_str(JSON).unwrap();
    let swaps = [
        serde_json::json!(null),
        serde_json::json!(-1),
        serde_json::json!(1e300),
        serde_json::json!("@"),
        serde_json::json!([]),
        serde_json::json!({}),
        serde_json::json!([1, 2, 3]),
        serde_json::json!({"concat": 5}),
        serde_json::json!({"range": [1]}),
        serde_json::json!({"prefix": {"addr": "x", "len": 999}}),
    ];
    // Replace every node of the document, one at a time, with each odd value.
    fn paths(v: &serde_json::Value, at: String, out: &mut Vec<String>) {
        out.push(at.clone());
        match v {
            serde_json::Value::Array(a) => {
                for (i, x) in a.iter().enumerate() {
                    paths(x, format!("{at}/{i}"), out);
                }
            }
            serde_json::Value::Object(o) => {
                for (k, x) in o {
                    paths(
                        x,
                        format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")),
                        out,
                    );
                }
            }
            _ => {}
        }
    }
    let mut all = Vec::new();
    paths(&doc, String::new(), &mut all);
    for (i, path) in all.iter().enumerate() {
        let mut d = doc.clone();
        *d.pointer_mut(path).unwrap() = swaps[i % swaps.len()].clone();
        let _ = super::super::parse_json(&d.to_string());
    }
}
