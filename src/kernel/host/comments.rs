//! Container ids in rule comments.

/// The container ids a rule comment names, in order, without duplicates: CNI portmap's
/// `name: "NET" id: "ID"` and `dnat name: "NET" id: "ID"` (quotes possibly still
/// backslash-escaped as in `iptables-save` output), netavark's unquoted `name: NET id: ID`
/// and `dnat name: NET id: ID`, natledger's `natledger:ID`, and any run of exactly 64 hex
/// digits (a Docker/containerd id written by anyone).
pub fn comment_container_ids(comment: &str) -> Vec<String> {
    let words: Vec<&str> = comment
        .split_whitespace()
        .map(|w| w.trim_matches(['"', '\'', '\\']))
        .collect();
    let mut found: Vec<&str> = Vec::new();
    for (i, word) in words.iter().enumerate() {
        if *word == "id:" && i >= 2 && words[i - 2] == "name:" {
            found.extend(words.get(i + 1));
        }
        found.extend(word.strip_prefix("natledger:"));
    }
    found.extend(
        comment
            .split(|c: char| !c.is_ascii_alphanumeric())
            .filter(|w| w.len() == 64 && w.bytes().all(|b| b.is_ascii_hexdigit())),
    );
    let mut ids: Vec<String> = Vec::new();
    for id in found {
        let valid = id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_+-.".contains(&b));
        if !id.is_empty() && valid && !ids.iter().any(|known| known == id) {
            ids.push(id.to_string());
        }
    }
    ids
}
