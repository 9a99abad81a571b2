//! Test helpers for the drivers' process-level behaviour: a scripted runner ([`Script`])
//! behind a [`super::Netfilter`] that reaches only its tools, and its answers.

use std::cell::RefCell;

use crate::kernel::exec::{Invocation, Outcome, Runner};

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
