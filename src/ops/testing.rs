//! Test helpers for the operations: a scripted process runner, a fake host where the test's
//! container runs, and a hook input.

use std::cell::RefCell;

use crate::backend::{Backend, DRIVERS, Netfilter};
use crate::kernel::exec::{Invocation, Outcome, Runner};
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

/// The real drivers (new rules with `backend`'s) running their tools through `runner`, on
/// a fake host.
pub(crate) fn context<'r>(
    ledger: Ledger,
    backend: Backend,
    runner: &'r dyn Runner,
    host: &'r FakeHost,
) -> Context<'r> {
    let nf = Netfilter::new(runner);
    Context::with_drivers(ledger, backend.driver(), &DRIVERS, nf, host)
}

/// A scripted runner: answers each call with the next outcome and records the call.
pub(crate) struct Script {
    pub(crate) answers: RefCell<Vec<Outcome>>,
    pub(crate) calls: RefCell<Vec<Invocation>>,
}

impl Script {
    pub(crate) fn new(answers: Vec<Outcome>) -> Self {
        Script {
            answers: RefCell::new(answers.into_iter().rev().collect()),
            calls: RefCell::new(Vec::new()),
        }
    }
}

impl Runner for Script {
    fn run(&self, inv: &Invocation) -> std::io::Result<Outcome> {
        self.calls.borrow_mut().push(inv.clone());
        Ok(self
            .answers
            .borrow_mut()
            .pop()
            .expect("no more scripted answers"))
    }
}

pub(crate) fn ok(stdout: &str) -> Outcome {
    Outcome {
        code: Some(0),
        stdout: stdout.into(),
        stderr: Vec::new(),
    }
}

pub(crate) fn fail() -> Outcome {
    Outcome {
        code: Some(1),
        stdout: Vec::new(),
        stderr: b"iptables-restore: line 2 failed".to_vec(),
    }
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
