use super::*;
use crate::model::ruleset::parse_json;

const SAMPLE_TEXT: &str = include_str!("../../../tests/fixtures/nftables-dumps/sample.nft.txt");
const SAMPLE_JSON: &str = include_str!("../../../tests/fixtures/nftables-dumps/sample.json");

/// nft 1.0.6's JSON has no table comments; everything else must agree.
fn without_table_comments(mut r: Ruleset) -> Ruleset {
    for t in &mut r.tables {
        t.comment = None;
    }
    r
}

#[test]
fn text_and_json_of_one_ruleset_read_the_same() {
    let text = without_table_comments(parse_text(SAMPLE_TEXT).unwrap());
    let json = without_table_comments(parse_json(SAMPLE_JSON).unwrap());
    for (t, j) in text.tables.iter().zip(&json.tables) {
        assert_eq!(t.sets, j.sets, "sets of {}", t.name);
        for (tc, jc) in t.chains.iter().zip(&j.chains) {
            for (tr, jr) in tc.rules.iter().zip(&jc.rules) {
                assert_eq!(tr, jr, "chain {}", tc.name);
            }
            assert_eq!(tc, jc);
        }
    }
    assert_eq!(text, json);
}
