//! `natledger doctor`: on dumps modelling each seed and real rulesets of other owners
//! (`tests/fixtures/doctor/`), live in namespaces for each finding type, as a property over
//! random rulesets, on branching ladders under a memory limit, with counters, for the
//! forward-dropped check and for whole hosts. One submodule per area; each header says what
//! it proves.

mod counters;
mod dumps;
mod fixtures;
mod forward;
mod hosts;
mod ladders;
mod live;
mod live_backends;
mod live_listeners;
mod live_natledger;
mod live_seed002;
mod localhost;
mod real;
mod review;
mod shadows_prop;
