//! Test helpers for the operations: a scripted process runner and a hook input.

use std::cell::RefCell;

use crate::exec::{Invocation, Outcome, Runner};
use crate::oci::HookInput;

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

/// Container c1, whose process is this test's own (a createRuntime state always has a pid).
pub(crate) fn input(dir: &std::path::Path) -> HookInput {
    HookInput {
        id: "c1".parse().unwrap(),
        pid: Some(std::process::id() as i32),
        bundle: Some(dir.into()),
        annotations: [
            ("io.natledger.ports".to_string(), "8080:80".to_string()),
            ("io.natledger.ip".to_string(), "10.77.0.2".to_string()),
        ]
        .into(),
    }
}
