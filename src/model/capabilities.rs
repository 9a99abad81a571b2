//! What a backend writes beyond the mapping rules, and what it can forward: data its driver
//! reports (the backend driver's `capabilities`), read by the layout and the operations,
//! so that neither asks which backend it is.

/// A backend's capabilities.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// It gets the forward accept (`NATLEDGER-FORWARD`, its jump and its rules). Not where an
    /// accept ends only natledger's own base chain (another table's forward drop still
    /// drops), since there it would do nothing.
    pub forward_accept: bool,
    /// The localhost guard needs its second rule, for packets conntrack does not track
    /// (the layout's `guard_untracked`).
    pub untracked_guard: bool,
    /// A range of host ports may forward to other container ports (a DNAT with a base
    /// port); otherwise a range forwards only to the same ports.
    pub shifted_ranges: bool,
    /// Its rules are written by tools (`*-save`, `*-restore`) that may be absent from a
    /// node: a backend without them holds nothing natledger did not write there.
    pub tools: bool,
    /// Whether a table's existence is seen without its tools (legacy's procfs names file):
    /// then a table that exists while its tools are missing may hold rules, unreadable.
    pub tables_seen_without_tools: bool,
    /// Every create writes (or checks) the chains and shared rules in the same transaction
    /// as its rules, all or nothing: the localhost guard is in place with any IPv4 rule.
    pub one_transaction: bool,
}

impl Capabilities {
    /// Every capability: for what any backend could have made (every chain name).
    pub const ALL: Capabilities = Capabilities {
        forward_accept: true,
        untracked_guard: true,
        shifted_ranges: true,
        tools: true,
        tables_seen_without_tools: true,
        one_transaction: true,
    };
}
