//! The tests that bound a time, one crate: what natledger must finish within a bound however
//! large its input (`bounds`: the per-container limits and the manifest read cap; `oversized`:
//! a manifest past that cap removed linearly). Each module's `//!` header says what it proves,
//! a line per test. Run one with `cargo test --test timed bounds::`.
//!
//! They are apart from `it` so that their bounds are measured as when each file was its own
//! crate: cargo runs the test crates one after another, never two at once, and every
//! test first takes [`one_suite_at_a_time`] with its module's name, so `bounds` and
//! `oversized` never overlap (tests of one module may still run together, as before).

#[path = "../common/mod.rs"]
mod common;

mod bounds;
mod oversized;

pub use common::one_suite_at_a_time;
