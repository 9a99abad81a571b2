//! Settling a manifest after a sweep: only the tables not swept keep their records.

use super::*;

fn record(backend: Backend, family: Family, table: &str) -> RuleRecord {
    RuleRecord::parse(
        backend,
        family,
        table,
        "C",
        vec!["-j".to_string(), "ACCEPT".to_string()],
    )
}

#[test]
fn only_the_tables_not_swept_keep_their_records() {
    let (nft, v4, v6) = (Backend::IptablesNft, Family::Ipv4, Family::Ipv6);
    let rules = [
        record(nft, v4, "filter"),
        record(nft, v4, "nat"),
        record(nft, v6, "nat"),
        record(Backend::IptablesLegacy, v4, "nat"),
    ];
    let mut tables = Vec::new();
    for (backend, family, table, state) in [
        (nft, v4, "filter", TableState::Failed),
        (nft, v4, "nat", TableState::Swept),
        (nft, v6, "nat", TableState::Swept),
        (Backend::IptablesLegacy, v4, "nat", TableState::NotInstalled),
    ] {
        let mut t = TableReport::new(backend, family, table);
        t.state = state;
        tables.push(t);
    }
    // The DNAT in a nat table swept clean is settled though its filter table failed.
    assert_eq!(
        remaining(&rules, &tables),
        [rules[0].clone(), rules[3].clone()]
    );
}
