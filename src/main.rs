//! The `natledger` command: argument parsing and error printing; the work is in the library.

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser as _;
use nix::sys::resource::{UsageWho, getrusage};

use natledger::backend::{self, Netfilter};
use natledger::bundle::{self, HookSpec, Injected};
use natledger::cli::{Cli, Command};
use natledger::doctor::{self, DoctorOptions, evidence::Roots};
use natledger::echo::limit;
use natledger::exec::SystemRunner;
use natledger::ledger::Ledger;
use natledger::oci::State;
use natledger::ops::{self, Context, SweepOptions};
use natledger::{cni, metrics, selftest, wrapper};

/// The library logs through `log`; this prints its records on stderr, one line each, in the
/// words natledger has always used: `natledger: warning: ...` for warnings, `natledger: ...`
/// for the rest.
struct Stderr;

impl log::Log for Stderr {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        match record.level() {
            log::Level::Warn => eprintln!("natledger: warning: {}", record.args()),
            _ => eprintln!("natledger: {}", record.args()),
        }
    }

    fn flush(&self) {}
}

static LOGGER: Stderr = Stderr;

fn main() -> ExitCode {
    let _ = log::set_logger(&LOGGER);
    log::set_max_level(if std::env::var_os("NATLEDGER_TRACE").is_some() {
        log::LevelFilter::Trace
    } else {
        log::LevelFilter::Info
    });
    let mut args = std::env::args_os();
    if args
        .next()
        .is_some_and(|argv0| wrapper::called_as_wrapper(&argv0))
    {
        return runtime(args.collect());
    }
    // Run by a CNI runtime (found by its `type` in CNI_PATH): a chained plugin, answering on
    // stdout with the result or the error object.
    if cni::requested() {
        let output = cni::run_process(&cni::plugin::Natledger);
        out(&output.stdout);
        return ExitCode::from(output.code);
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // Monitoring reads doctor's exit status: a usage error is doctor failing (3), not
        // "errors found" (clap's 2).
        Err(e) if e.use_stderr() && std::env::args().any(|a| a == "doctor") => {
            let _ = e.print();
            return ExitCode::from(doctor::EXIT_FAILED);
        }
        Err(e) => e.exit(),
    };
    let code = match run(cli) {
        Ok(code) => code,
        Err(e) => {
            // Library errors cut the input they quote (`natledger::echo`); this is the net.
            eprintln!("natledger: {}", limit(&one_line(&e), LINE));
            ExitCode::FAILURE
        }
    };
    if std::env::var_os("NATLEDGER_TRACE").is_some() {
        // This process alone (its iptables children are not counted).
        let usage = getrusage(UsageWho::RUSAGE_SELF);
        if let Ok(usage) = usage {
            eprintln!("natledger: peak rss {} KiB", usage.max_rss());
        }
    }
    code
}

/// The longest error line printed.
const LINE: usize = 4096;

/// The error and its causes on one line. Library errors already name their cause in their
/// own message (they are read on their own too), so a cause whose text is already there is
/// not repeated.
fn one_line(error: &anyhow::Error) -> String {
    let mut line = error.to_string();
    for cause in error.chain().skip(1) {
        let text = cause.to_string();
        if !line.contains(&text) {
            line = format!("{line}: {text}");
        }
    }
    line
}

/// The wrapper runtime; returns only if the real runtime could not be started.
fn runtime(args: Vec<OsString>) -> ExitCode {
    let error = wrapper::run(args);
    eprintln!("natledger-runtime: {}", limit(&error.to_string(), LINE));
    ExitCode::FAILURE
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let ledger = Ledger::new(cli.state_dir);
    match cli.command {
        Command::Hook { stage } => {
            let state = State::read(std::io::stdin().lock())?;
            let runner = SystemRunner::from_env();
            let ctx = Context::for_hooks(ledger, cli.backend.resolve(), &runner);
            ops::run_hook(&ctx, stage, state)?;
        }
        Command::Sweep {
            dry_run,
            json,
            all,
            wait,
            metrics_file,
        } => {
            let runner = SystemRunner::from_env();
            let mut ctx = Context::new(ledger, cli.backend.resolve(), &runner);
            // Native: iptables-nft's container rules deleted by handle (`ops::sweep`).
            ctx.netfilter = Netfilter::on_kernel(&runner, ops::native_allowed());
            let opts = SweepOptions {
                dry_run,
                all,
                wait: wait.map(Duration::from_secs),
            };
            let report = ops::sweep(&ctx, &opts)?;
            if json {
                let text = serde_json::to_string_pretty(&report).context("encoding the report")?;
                out(&format!("{text}\n"));
            } else {
                out(&report.render());
            }
            let now = std::time::SystemTime::now();
            metrics::write_option(metrics_file.as_deref(), &metrics::sweep(&report, now))?;
            if !report.ok() {
                anyhow::bail!("sweep incomplete: {} error(s)", report.errors.len());
            }
        }
        Command::Inject {
            bundle,
            binary,
            hook_env,
            timeout,
        } => {
            let binary = match binary {
                Some(b) => b,
                None => std::env::current_exe().context("finding the natledger binary")?,
            };
            let spec = HookSpec {
                binary: std::path::absolute(&binary)
                    .with_context(|| format!("{}", binary.display()))?,
                env: hook_env,
                timeout,
            };
            let done = bundle::inject(&bundle, &spec)?;
            eprintln!(
                "natledger: {}: {}",
                bundle.join("config.json").display(),
                match done {
                    Injected::Written => "natledger hooks written",
                    _ => "natledger hooks already there, unchanged",
                }
            );
        }
        Command::Runtime { args } => return Err(anyhow::anyhow!(wrapper::run(args))),
        Command::Doctor {
            json,
            port,
            from,
            metrics_file,
        } => {
            let runner = SystemRunner::from_env();
            let opts = DoctorOptions {
                from,
                port,
                ledger,
                netfilter: Netfilter::new(&runner),
                host_backend: backend::detect_explained(),
                roots: Roots::default(),
            };
            let report = match doctor::doctor(&opts) {
                Ok(report) => report,
                Err(e) => {
                    eprintln!("natledger: doctor: {e}");
                    return Ok(ExitCode::from(doctor::EXIT_FAILED));
                }
            };
            if json {
                let text = serde_json::to_string_pretty(&report).context("encoding the report")?;
                out(&format!("{text}\n"));
            } else {
                out(&doctor::render(&report));
            }
            let now = std::time::SystemTime::now();
            if let Err(e) =
                metrics::write_option(metrics_file.as_deref(), &metrics::doctor(&report, now))
            {
                eprintln!("natledger: doctor: {e}");
                return Ok(ExitCode::from(doctor::EXIT_FAILED));
            }
            return Ok(ExitCode::from(report.exit_code()));
        }
        Command::Selftest => {
            let ok = selftest::run(&cli.backend.explained(), &mut |check| match &check.result {
                Ok(seen) => out(&format!("ok    {}: {seen}\n", check.name)),
                Err(why) => out(&format!("FAIL  {}: {why}\n", check.name)),
            });
            if !ok {
                anyhow::bail!("selftest failed");
            }
        }
        Command::List { json } => {
            let mut entries = Vec::new();
            for entry in ops::list(&ledger)? {
                match entry {
                    Ok(e) => entries.push(e),
                    Err(e) => eprintln!("natledger: {e}"),
                }
            }
            if json {
                let text = serde_json::to_string_pretty(&entries).context("encoding the list")?;
                out(&format!("{text}\n"));
            } else {
                let chosen = cli.backend.explained();
                out(&format!(
                    "backend for new rules: {} ({})\n{}",
                    chosen.backend,
                    chosen.how,
                    ops::render_table(&entries)
                ));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Print a report on stdout. A reader that went away (`natledger doctor | head`) is not an
/// error: the rest of the report is dropped and the exit status stays the command's own (Rust
/// ignores SIGPIPE, so `print!` would panic on the broken pipe instead).
fn out(text: &str) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        Err(e) => eprintln!("natledger: writing the report to stdout: {e}"),
    }
}
