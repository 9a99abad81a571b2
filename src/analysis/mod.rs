//! Ruleset analysis: reading any owner's rules and judging what a packet meets. Two pure
//! halves around one vocabulary ([`verdict`]: the three-valued answer both give):
//! [`iptables`] over rules as `iptables-save` prints them (`model::anyrule`: match sets,
//! packet tests, evaluation-order walks) and [`nftables`] over native nf_tables rulesets
//! (`model::ruleset`: fates and the native checks). `doctor` and [`forwards`] are the
//! consumers that read the host and combine both halves. Read-only: nothing here writes a
//! rule.

pub mod doctor;
pub mod forwards;
pub mod iptables;
pub mod nftables;
pub mod verdict;
