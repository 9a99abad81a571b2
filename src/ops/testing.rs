//! Test helpers for the operations: fake drivers ([`FakeDriver`]) on a runner that refuses
//! to run anything, a fake host where the test's container runs, and a hook input. No
//! process, no kernel, no tool looked for.

pub(crate) use crate::backend::fake::{Call, FakeDriver};
use crate::backend::{Driver, Netfilter};
use crate::kernel::exec::Runner;
pub(crate) use crate::kernel::machine::fake::{FakeHost, netns};
use crate::model::oci::HookInput;
use crate::ops::Context;
use crate::state::ledger::Ledger;

/// The pid of the test's container process, and its start time, on [`fake_host`].
pub(crate) const PID: i32 = 4242;
pub(crate) const START: u64 = 1000;
/// A CNI attachment's namespace path on [`fake_host`], naming the container's namespace.
pub(crate) const NETNS_PATH: &str = "/run/netns/cni-1";

/// A host where the container process [`PID`] runs in network namespace `netns(1)`, which
/// [`NETNS_PATH`] names too; no listeners.
pub(crate) fn fake_host() -> FakeHost {
    FakeHost::default()
        .with_process(PID, START, netns(1))
        .with_namespace(NETNS_PATH, netns(1))
}

/// A runner that refuses to run anything: a unit test on fake drivers runs no process.
pub(crate) struct NoProcess;

impl Runner for NoProcess {
    fn run(
        &self,
        inv: &crate::kernel::exec::Invocation,
    ) -> std::io::Result<crate::kernel::exec::Outcome> {
        panic!("a unit test of ops on fake drivers ran {inv}")
    }
}

/// Fake drivers (new rules with `driver`), on a fake host: no process, no kernel.
pub(crate) fn fake_context<'r>(
    ledger: Ledger,
    driver: &'r FakeDriver,
    drivers: &'r [&'r dyn Driver],
    host: &'r FakeHost,
) -> Context<'r> {
    let nf = Netfilter::new(&NoProcess);
    Context::with_drivers(ledger, driver, drivers, nf, host)
}

/// Container c1, whose process is [`PID`] (a createRuntime state always has a pid).
pub(crate) fn input(dir: &std::path::Path) -> HookInput {
    HookInput {
        id: "c1".parse().unwrap(),
        pid: Some(PID),
        bundle: Some(dir.into()),
        annotations: [
            ("io.natledger.ports".to_string(), "8080:80".to_string()),
            ("io.natledger.ip".to_string(), "10.77.0.2".to_string()),
        ]
        .into(),
    }
}
