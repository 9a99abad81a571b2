//! The suites that drive real runtimes and shared daemons, one crate: runc, crun, podman
//! (hooks and CNI), dockerd (natledger's wrapper, and beside Docker's own firewall),
//! containerd's CRI (annotations and natledger as a CNI plugin), the .deb package, the
//! systemd units, the container image and the Kubernetes DaemonSet's pod run through the CRI. Each module's `//!` header says what it proves, a line per test. Run one
//! with `cargo test --test runtimes docker::`.
//!
//! They share daemons' directories and machine-wide paths (`/run/containerd`, dpkg's
//! database in the package test's overlay, the runtimes' roots), so two modules never run at
//! once: every test first takes [`one_suite_at_a_time`] with its module's name. Tests of one
//! module may still run together, as they did when each file was its own crate (and cargo
//! ran the crates one after another). `cargo test` runs this crate after `it`, never beside
//! it.

#[path = "../common/mod.rs"]
mod common;

mod cri;
mod cri_cni;
mod crun;
mod docker;
mod docker_host;
mod image;
mod kubernetes;
mod package;
mod podman;
mod podman_cni;
mod runc;
mod units;

pub use common::one_suite_at_a_time;
