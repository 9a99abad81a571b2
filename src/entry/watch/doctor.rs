//! `--doctor-period`: doctor's live analysis ([`crate::analysis::doctor`], exactly as
//! `natledger doctor` runs it) every period, on a thread of its own, so a repair never waits
//! for it (a run costs a read of every table and a walk of every hook: 0.1 s for 8,000 rules,
//! about 1 s for 80,000, docs/doctor.md#speed). Doctor only reads and takes no lock (it reads
//! the manifests as `natledger doctor` does, without the ledger lock); a run racing a hook or a
//! repair may see a rule missing for one period.
//!
//! The thread keeps only the last [`Run`] and tells the loop through one end of a socket pair
//! ([`Doctoring::fd`], polled with the others); the loop takes it ([`Doctoring::take`]),
//! logs what changed and publishes the series ([`super::findings`]). SIGTERM never waits for
//! a run: the process ends with the loop, the thread with it.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::analysis::doctor::{self, DoctorOptions, Report};
use crate::backend::{self, Netfilter};
use crate::entry::settings::Settings;
use crate::state::ledger::Ledger;

/// One doctor run: its report, or why it failed (the error's chain), and when it ended.
#[derive(Debug)]
pub struct Run {
    pub result: Result<Report, String>,
    pub finished: SystemTime,
}

/// The doctor thread, as the loop sees it.
pub struct Doctoring {
    told: UnixStream,
    last: Arc<Mutex<Option<Run>>>,
    /// The thread is gone (it panicked, in a build that unwinds): no longer polled.
    ended: bool,
}

impl Doctoring {
    /// Start the thread: a run at once, then one every `period` after the last ended (it
    /// inherits the caller's blocked signals: they stay the loop's).
    pub fn spawn(settings: Settings, period: Duration) -> io::Result<Doctoring> {
        let (told, tell) = UnixStream::pair()?;
        told.set_nonblocking(true)?;
        let last: Arc<Mutex<Option<Run>>> = Arc::default();
        let slot = last.clone();
        std::thread::Builder::new()
            .name("doctor".into())
            .spawn(move || {
                loop {
                    let run = run(&settings);
                    match slot.lock() {
                        Ok(mut s) => *s = Some(run),
                        Err(poisoned) => *poisoned.into_inner() = Some(run),
                    }
                    // The loop is gone (the process is ending): so is this thread.
                    if (&tell).write_all(&[1]).is_err() {
                        return;
                    }
                    std::thread::sleep(period);
                }
            })?;
        Ok(Doctoring {
            told,
            last,
            ended: false,
        })
    }

    /// Readable when a run has ended since the last [`Doctoring::take`]; `None` once the
    /// thread is gone (its end of the pair would be readable for ever).
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        (!self.ended).then(|| self.told.as_fd())
    }

    /// The run that ended since the last take, if any; a failed run when the thread is gone.
    pub fn take(&mut self) -> Option<Run> {
        let mut buf = [0u8; 64];
        loop {
            match (&self.told).read(&mut buf) {
                Ok(0) => {
                    self.ended = true;
                    break;
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        let run = match self.last.lock() {
            Ok(mut s) => s.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        match run {
            None if self.ended => Some(Run {
                result: Err("the doctor thread ended: doctor runs no more".into()),
                finished: SystemTime::now(),
            }),
            run => run,
        }
    }
}

/// `natledger doctor` on the live host: every backend and family, the host's evidence, the
/// manifests in `settings.state_dir`.
fn run(settings: &Settings) -> Run {
    let runner = settings.runner();
    let opts = DoctorOptions {
        from: Vec::new(),
        port: None,
        ledger: Ledger::new(settings.state_dir.clone()),
        netfilter: Netfilter::new(&runner),
        host_backend: backend::detect_explained(settings.host()),
        roots: settings.evidence_roots(),
    };
    let result = doctor::doctor(&opts).map_err(|e| crate::causes::text(&e));
    Run {
        result,
        finished: SystemTime::now(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (Doctoring, UnixStream) {
        let (told, tell) = UnixStream::pair().unwrap();
        told.set_nonblocking(true).unwrap();
        let doctoring = Doctoring {
            told,
            last: Arc::default(),
            ended: false,
        };
        (doctoring, tell)
    }

    #[test]
    fn a_run_told_is_taken_once() {
        let (mut d, tell) = pair();
        assert!(d.take().is_none());
        *d.last.lock().unwrap() = Some(Run {
            result: Err("x".into()),
            finished: SystemTime::UNIX_EPOCH,
        });
        (&tell).write_all(&[1]).unwrap();
        assert_eq!(d.take().map(|r| r.result.err()), Some(Some("x".into())));
        assert!(d.take().is_none());
        assert!(d.fd().is_some());
    }

    #[test]
    fn a_thread_gone_is_a_failed_run_and_no_longer_polled() {
        let (mut d, tell) = pair();
        drop(tell);
        let run = d.take().expect("a failed run");
        assert!(run.result.unwrap_err().contains("doctor thread ended"));
        assert!(d.fd().is_none());
    }
}
