use super::*;
use crate::kernel::nftables::own::{OwnChain, OwnRule, OwnTable};
use crate::model::layout::{DNAT_CHAIN, MASQ_CHAIN, NAT, shared_rules};
use crate::model::save::Op;

fn args(text: &str) -> Vec<String> {
    text.split_whitespace().map(String::from).collect()
}

const DNAT: &str = "-p tcp -m tcp --dport 8080 -m comment --comment natledger:c1 -j DNAT \
                    --to-destination 10.77.0.2:80";
const JUMP: &str = "-m addrtype --dst-type LOCAL -m comment --comment natledger -j \
                    NATLEDGER-HOSTPORTS";

/// natledger's table with PREROUTING's jump into the DNAT chain and one DNAT (handles 5, 6).
fn installed(objects: u32) -> OwnTable {
    let chain = |name: &str, hook| OwnChain {
        name: name.into(),
        hook,
        policy: hook.map(|_| 1),
    };
    OwnTable {
        family: Family::Ipv4,
        chains: vec![chain("PREROUTING", Some(0)), chain(DNAT_CHAIN, None)],
        rules: vec![
            OwnRule {
                chain: "PREROUTING".into(),
                handle: 5,
                args: args(JUMP),
            },
            OwnRule {
                chain: DNAT_CHAIN.into(),
                handle: 6,
                args: args(DNAT),
            },
        ],
        objects,
    }
}

fn batch(ops: Vec<Op>) -> Batch {
    Batch { table: NAT, ops }
}

#[test]
fn the_first_write_makes_the_table_its_chains_and_base_chains() {
    let (jump_chain, jump) = &shared_rules(
        crate::model::backend_name::Backend::OwnNftables,
        NAT,
        Family::Ipv4,
    )[0];
    let ops = vec![
        Op::InsertFirst(jump_chain.to_string(), jump.to_args()),
        Op::DeclareChain(DNAT_CHAIN.into()),
        Op::InsertFirst(DNAT_CHAIN.into(), args(DNAT)),
    ];
    let messages = plan(Family::Ipv4, None, &[batch(ops)]).unwrap();
    let kinds: Vec<String> = messages
        .iter()
        .map(|m| match m {
            Message::NewTable => "table".into(),
            Message::NewChain { name, base, .. } => {
                format!(
                    "chain {name}{}",
                    if base.is_some() { " (base)" } else { "" }
                )
            }
            Message::NewRule { chain, place, .. } => format!("rule {chain} {place:?}"),
            other => format!("{other:?}"),
        })
        .collect();
    // Declarations first, as iptables-restore reads a block; the base chain on first use.
    assert_eq!(
        kinds,
        [
            "table",
            "chain NATLEDGER-HOSTPORTS",
            "chain PREROUTING (base)",
            "rule PREROUTING Top",
            "rule NATLEDGER-HOSTPORTS Top"
        ]
    );
}

#[test]
fn a_rule_is_deleted_by_the_handle_the_read_gave_it() {
    let ops = vec![Op::Delete(DNAT_CHAIN.into(), args(DNAT))];
    let messages = plan(Family::Ipv4, Some(installed(2)), &[batch(ops)]).unwrap();
    assert_eq!(
        messages,
        [Message::DelRule {
            chain: DNAT_CHAIN.into(),
            handle: 6
        }]
    );
}

#[test]
fn an_absent_rule_or_a_failed_check_refuses_the_whole_batch() {
    let other = DNAT.replace("8080", "8081");
    for op in [
        Op::Delete(DNAT_CHAIN.into(), args(&other)),
        Op::Check(DNAT_CHAIN.into(), args(&other)),
        Op::Delete(MASQ_CHAIN.into(), args(DNAT)),
        Op::Flush(MASQ_CHAIN.into()),
        Op::DeleteChain(DNAT_CHAIN.into()),
    ] {
        // Something valid before it: still nothing is planned.
        let ops = vec![Op::Delete(DNAT_CHAIN.into(), args(DNAT)), op.clone()];
        let refused = plan(Family::Ipv4, Some(installed(2)), &[batch(ops)]);
        assert!(
            matches!(refused, Err(NftError::Refused { .. })),
            "{op:?}: {refused:?}"
        );
    }
    // A chain something jumps to stays.
    let ops = vec![
        Op::Flush(DNAT_CHAIN.into()),
        Op::DeleteChain(DNAT_CHAIN.into()),
    ];
    let refused = plan(Family::Ipv4, Some(installed(2)), &[batch(ops)]).unwrap_err();
    assert!(
        refused.to_string().contains("jumps to the chain"),
        "{refused}"
    );
}

#[test]
fn a_table_left_empty_goes_unless_someone_else_has_an_object_in_it() {
    let ops = vec![
        Op::Delete("PREROUTING".into(), args(JUMP)),
        Op::Flush(DNAT_CHAIN.into()),
        Op::DeleteChain(DNAT_CHAIN.into()),
    ];
    let messages = plan(Family::Ipv4, Some(installed(2)), &[batch(ops.clone())]).unwrap();
    assert_eq!(messages.last(), Some(&Message::DelTable));
    // A set (or a chain natledger does not know) of someone else's: the table stays.
    let messages = plan(Family::Ipv4, Some(installed(3)), &[batch(ops)]).unwrap();
    assert!(!messages.contains(&Message::DelTable), "{messages:?}");
    // Removing one container's rule leaves the shared chains and the table.
    let ops = vec![Op::Delete(DNAT_CHAIN.into(), args(DNAT))];
    let messages = plan(Family::Ipv4, Some(installed(2)), &[batch(ops)]).unwrap();
    assert!(!messages.contains(&Message::DelTable), "{messages:?}");
}

#[test]
fn insert_at_goes_before_the_rule_at_that_position() {
    let second = DNAT.replace("8080", "8081");
    let ops = vec![Op::InsertAt(DNAT_CHAIN.into(), 1, args(&second))];
    let messages = plan(Family::Ipv4, Some(installed(2)), &[batch(ops)]).unwrap();
    assert!(matches!(
        messages[0],
        Message::NewRule {
            place: Place::Top,
            ..
        }
    ));
    let ops = vec![Op::InsertAt(DNAT_CHAIN.into(), 2, args(&second))];
    let messages = plan(Family::Ipv4, Some(installed(2)), &[batch(ops)]).unwrap();
    assert!(matches!(
        messages[0],
        Message::NewRule {
            place: Place::Bottom,
            ..
        }
    ));
    let ops = vec![
        Op::InsertFirst(DNAT_CHAIN.into(), args(&second)),
        Op::InsertAt(DNAT_CHAIN.into(), 2, args(&DNAT.replace("8080", "8082"))),
    ];
    let messages = plan(Family::Ipv4, Some(installed(2)), &[batch(ops)]).unwrap();
    assert!(matches!(
        messages[1],
        Message::NewRule {
            place: Place::Before(6),
            ..
        }
    ));
}

#[test]
fn a_declared_chain_that_exists_is_flushed() {
    let ops = vec![Op::DeclareChain(DNAT_CHAIN.into())];
    let messages = plan(Family::Ipv4, Some(installed(2)), &[batch(ops)]).unwrap();
    assert_eq!(
        messages,
        [Message::Flush {
            chain: DNAT_CHAIN.into()
        }]
    );
}

/// natledger's table with `n` DNATs (ports 10000.., handles 100..) and then `copies` copies
/// of [`DNAT`] in the DNAT chain.
fn with_dnats(n: usize, copies: usize) -> (OwnTable, Vec<Vec<String>>) {
    let mut table = installed(2);
    table.rules.retain(|r| r.chain != DNAT_CHAIN);
    let mut all: Vec<Vec<String>> = (0..n)
        .map(|i| args(&DNAT.replace("8080", &(10000 + i).to_string())))
        .collect();
    all.extend(std::iter::repeat_n(args(DNAT), copies));
    for (i, a) in all.iter().enumerate() {
        table.rules.push(OwnRule {
            chain: DNAT_CHAIN.into(),
            handle: 100 + i as u64,
            args: a.clone(),
        });
    }
    (table, all)
}

/// Deleting rule by rule is linear (each found through the chain's index, marked gone): a
/// chain whose every rule goes is flushed by one message (the kernel walks the chain for
/// each handle it is given), a chain keeping one loses the others by handle, in order; of
/// identical rules the first goes first, and one more than there are refuses the batch.
#[test]
fn a_chain_emptied_rule_by_rule_is_flushed_by_one_message() {
    let (table, all) = with_dnats(20_000, 0);
    let every: Vec<Op> = all
        .iter()
        .map(|a| Op::Delete(DNAT_CHAIN.into(), a.clone()))
        .collect();
    let messages = plan(Family::Ipv4, Some(table), &[batch(every.clone())]).unwrap();
    assert_eq!(
        messages,
        [Message::Flush {
            chain: DNAT_CHAIN.into()
        }]
    );

    let (table, _) = with_dnats(20_000, 0);
    let messages = plan(Family::Ipv4, Some(table), &[batch(every[1..].to_vec())]).unwrap();
    assert_eq!(messages.len(), 19_999);
    assert!(messages.iter().enumerate().all(|(i, m)| *m
        == Message::DelRule {
            chain: DNAT_CHAIN.into(),
            handle: 101 + i as u64
        }));

    let (table, _) = with_dnats(1, 2);
    let twice = vec![Op::Delete(DNAT_CHAIN.into(), args(DNAT)); 2];
    let messages = plan(Family::Ipv4, Some(table), &[batch(twice)]).unwrap();
    let handles: Vec<u64> = messages
        .iter()
        .map(|m| match m {
            Message::DelRule { handle, .. } => *handle,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(handles, [101, 102]);
    let (table, _) = with_dnats(1, 2);
    let thrice = vec![Op::Delete(DNAT_CHAIN.into(), args(DNAT)); 3];
    assert!(plan(Family::Ipv4, Some(table), &[batch(thrice)]).is_err());
}

/// An insertion after deletions goes where the rules not gone put it.
#[test]
fn an_insertion_after_deletions_counts_only_the_rules_left() {
    let (table, all) = with_dnats(3, 0);
    let new = args(&DNAT.replace("8080", "9999"));
    let ops = vec![
        Op::Delete(DNAT_CHAIN.into(), all[0].clone()),
        Op::InsertAt(DNAT_CHAIN.into(), 2, new.clone()),
        Op::Delete(DNAT_CHAIN.into(), all[1].clone()),
        Op::InsertAt(DNAT_CHAIN.into(), 2, new),
    ];
    let messages = plan(Family::Ipv4, Some(table), &[batch(ops)]).unwrap();
    let places: Vec<Place> = messages
        .iter()
        .filter_map(|m| match m {
            Message::NewRule { place, .. } => Some(*place),
            _ => None,
        })
        .collect();
    // Left after the first deletion: 101, 102, so position 2 is 102; after the second
    // (the index rebuilt past the insertion): new, 102, so position 2 is 102 again.
    assert_eq!(places, [Place::Before(102), Place::Before(102)]);
}
