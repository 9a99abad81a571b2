//! The `natledger` command: the ways in (the wrapper runtime, the CNI plugin, the command
//! line), the settings resolved once (`natledger::entry::settings`), one function per command, and
//! the error chain printed once. The work is in the library.

#![deny(clippy::undocumented_unsafe_blocks)]

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::FromArgMatches as _;
use nix::sys::resource::{UsageWho, getrusage};

use natledger::analysis::doctor::{self, DoctorOptions, DumpFile};
use natledger::backend::{self, Netfilter};
use natledger::entry::bundle::{self, HookSpec, Injected};
use natledger::entry::cli::{self, Cli, Command};
use natledger::entry::install_cni;
use natledger::entry::settings::{self, Settings};

use natledger::model::echo::limit;
use natledger::model::oci::{Stage, State};
use natledger::ops::{self, Context, SweepOptions};
use natledger::state::ledger::Ledger;
use natledger::{entry::cni, entry::metrics, entry::selftest, entry::watch, entry::wrapper};

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

/// The process environment, read here only.
fn env(name: &str) -> Option<OsString> {
    std::env::var_os(name)
}

fn main() -> ExitCode {
    let _ = log::set_logger(&LOGGER);
    let mut args = std::env::args_os();
    let argv0 = args.next();
    if argv0.is_some_and(|argv0| wrapper::called_as_wrapper(&argv0)) {
        wrapper_runtime(args.collect())
    } else if cni::requested(&env, args.len() == 0) {
        // Run by a CNI runtime (found by its `type` in CNI_PATH): a chained plugin, answering
        // on stdout with the result or the error object.
        cni_plugin()
    } else {
        command_line()
    }
}

/// The longest error line printed.
const LINE: usize = 4096;

/// An error and its causes on one line, `top: cause: cause`: each error's message says only
/// its own part (`natledger::causes`).
fn chain(error: &anyhow::Error) -> String {
    format!("{error:#}")
}

/// The wrapper runtime (`natledger-runtime`); returns only if the real runtime could not be
/// started.
fn wrapper_runtime(args: Vec<OsString>) -> ExitCode {
    // It needs only the real runtime's path: a bad value of another variable (for the hooks
    // it injects, which refuse it themselves) must not stop runc's every call.
    let settings = Settings::from_env(&env).unwrap_or_else(|_| {
        let (settings, refused) = Settings::lenient(&env);
        for (name, e) in &refused {
            log::debug!("{name} ignored here: {}", settings::one_line(e));
        }
        settings
    });
    settings.install();
    let error = anyhow::Error::new(wrapper::run(args, settings.runtime));
    eprintln!("natledger-runtime: {}", limit(&chain(&error), LINE));
    ExitCode::FAILURE
}

/// The CNI plugin: its settings from its environment (a bad one is its error object).
fn cni_plugin() -> ExitCode {
    let settings = Settings::from_env(&env);
    // Only when a variable is refused: DEL, GC and STATUS then go on without it.
    let lenient = settings.is_err().then(|| Settings::lenient(&env));
    if let Some(settings) = settings.as_ref().ok().or(lenient.as_ref().map(|l| &l.0)) {
        settings.install();
    }
    let output = cni::run_process(&env, &cni::plugin::Natledger::new(settings, lenient));
    out(&output.stdout);
    ExitCode::from(output.code)
}

/// The command line: parsed, its settings resolved, its command run.
fn command_line() -> ExitCode {
    let parsed = parse_command_line(&[]).and_then(|cli| {
        let settings = Settings::new(&cli.global, &env)?;
        Ok((cli, settings))
    });
    let (cli, settings, refused) = match parsed {
        Ok((cli, settings)) => (cli, settings, Vec::new()),
        // A variable's value is refused: only a hook goes on without it (a poststop must
        // still remove what was recorded; a create-runtime refuses, `hook`).
        Err(e) => {
            let refused = settings::refused(&env);
            let names: Vec<&str> = refused.iter().map(|(name, _)| name.as_str()).collect();
            let usable = |name: &str| {
                if names.contains(&name) {
                    None
                } else {
                    env(name)
                }
            };
            let retried = parse_command_line(&names)
                .ok()
                .filter(|cli| !names.is_empty() && matches!(cli.command, Command::Hook { .. }))
                .and_then(|cli| Some((Settings::new(&cli.global, &usable).ok()?, cli)));
            let Some((settings, cli)) = retried else {
                return usage(e);
            };
            (cli, settings, refused)
        }
    };
    settings.install();
    let code = match run(cli.command, &settings, &refused) {
        Ok(code) => code,
        Err(e) => {
            // Library errors cut the input they quote (`natledger::model::echo`); this is the net.
            eprintln!("natledger: {}", limit(&chain(&e), LINE));
            ExitCode::FAILURE
        }
    };
    // This process alone (its iptables children are not counted).
    if log::log_enabled!(log::Level::Debug)
        && let Ok(usage) = getrusage(UsageWho::RUSAGE_SELF)
    {
        log::debug!("peak rss {} KiB", usage.max_rss());
    }
    code
}

/// A usage error exits 2 as clap's do, but doctor's: monitoring reads doctor's exit status,
/// and a usage error is doctor failing (3), not "errors found" (2). Which command the error
/// belongs to is what clap parses, whatever the words of the arguments.
/// The command line, each global flag's variable read as clap reads it, but for an empty one
/// and those named in `unset` (both as if not set).
fn parse_command_line(unset: &[&str]) -> Result<Cli, clap::Error> {
    let cmd = cli::command().mut_args(|arg| {
        let name = arg.get_env().and_then(|n| n.to_str()).map(str::to_string);
        match name {
            Some(name)
                if unset.contains(&name.as_str()) || env(&name).is_some_and(|v| v.is_empty()) =>
            {
                arg.env(None)
            }
            _ => arg,
        }
    });
    Cli::from_arg_matches(&cmd.try_get_matches()?)
}

fn usage(e: clap::Error) -> ExitCode {
    if !e.use_stderr() {
        e.exit(); // --help, --version
    }
    let matches = cli::command().ignore_errors(true).try_get_matches();
    if matches.is_ok_and(|m| m.subcommand_name() == Some("doctor")) {
        let _ = e.print();
        return ExitCode::from(doctor::EXIT_FAILED);
    }
    e.exit()
}

/// Each command.
fn run(
    command: Command,
    settings: &Settings,
    refused: &[(String, clap::Error)],
) -> anyhow::Result<ExitCode> {
    match command {
        Command::Hook { stage } => hook(settings, stage, refused),
        Command::Sweep {
            dry_run,
            json,
            all,
            repair,
            wait,
            boot,
            metrics_file,
        } => {
            let opts = SweepOptions {
                dry_run,
                all,
                wait: wait.map(Duration::from_secs),
                repair,
                boot,
                try_lock: false,
                hold: Vec::new(),
            };
            sweep(settings, &opts, json, metrics_file)
        }
        Command::Watch {
            period,
            metrics_file,
            metrics_address,
            doctor_period,
            legacy_every_ms,
        } => {
            let opts = watch::Options {
                period: Duration::from_secs(period),
                legacy_every: Duration::from_millis(legacy_every_ms),
                metrics_file,
                metrics_address,
                doctor_period: (doctor_period > 0).then(|| Duration::from_secs(doctor_period)),
            };
            watch::run(settings, &opts)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Inject {
            bundle,
            binary,
            hook_env,
            timeout,
        } => inject(&bundle, binary, hook_env, timeout),
        Command::Runtime { args } => Err(anyhow::Error::new(wrapper::run(
            args,
            settings.runtime.clone(),
        ))),
        Command::Doctor {
            json,
            port,
            from,
            metrics_file,
        } => doctor(settings, from, port, json, metrics_file),
        Command::Selftest => selftest(settings),
        Command::List { json } => list(settings, json),
        Command::InstallCni {
            bin_dir,
            conf_dir,
            uninstall,
        } => install_cni(
            settings,
            &install_cni::Options {
                bin_dir,
                conf_dir,
                uninstall,
                source: PathBuf::from("/proc/self/exe"),
            },
        ),
    }
}

/// A refused variable (`refused`) refuses a create-runtime; a poststop goes on without it.
fn hook(
    settings: &Settings,
    stage: Option<Stage>,
    refused: &[(String, clap::Error)],
) -> anyhow::Result<ExitCode> {
    let state = State::read(std::io::stdin().lock())?;
    let stage = match stage {
        Some(stage) => stage,
        None => state.stage()?,
    };
    if let (Stage::CreateRuntime, Some((_, e))) = (stage, refused.first()) {
        let _ = e.print();
        return Ok(ExitCode::from(2));
    }
    for (name, e) in refused {
        log::warn!("{name} ignored: {}", settings::one_line(e));
    }
    let (runner, machine) = (settings.runner(), settings.machine());
    let ledger = Ledger::new(settings.state_dir.clone());
    let nf = settings.netfilter(&runner);
    let backend = settings.backend.resolve(settings.host());
    let mut ctx = Context::new(ledger, backend, nf, &machine);
    ctx.refuse_conflicts = settings.refuse_conflicts();
    ops::run_hook(&ctx, Some(stage), state)?;
    Ok(ExitCode::SUCCESS)
}

fn sweep(
    settings: &Settings,
    opts: &SweepOptions,
    json: bool,
    metrics_file: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    let (runner, machine) = (settings.runner(), settings.machine());
    let ledger = Ledger::new(settings.state_dir.clone());
    // Direct: iptables-nft's container rules deleted by handle (`ops::sweep`).
    let nf = settings.netfilter(&runner);
    let backend = settings.backend.resolve(settings.host());
    let ctx = Context::new(ledger, backend, nf, &machine);
    let report = ops::sweep(&ctx, opts)?;
    if let Some(held) = &report.held_back {
        log::warn!("{held}");
    }
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
    Ok(ExitCode::SUCCESS)
}

fn inject(
    bundle: &std::path::Path,
    binary: Option<PathBuf>,
    hook_env: Vec<String>,
    timeout: u32,
) -> anyhow::Result<ExitCode> {
    let binary = match binary {
        Some(b) => b,
        None => std::env::current_exe().context("finding the natledger binary")?,
    };
    let spec = HookSpec {
        binary: std::path::absolute(&binary).with_context(|| format!("{}", binary.display()))?,
        env: hook_env,
        timeout,
    };
    let done = bundle::inject(bundle, &spec)?;
    log::info!(
        "{}: {}",
        bundle.join("config.json").display(),
        match done {
            Injected::Written => "natledger hooks written",
            _ => "natledger hooks already there, unchanged",
        }
    );
    Ok(ExitCode::SUCCESS)
}

/// Doctor's exit status is its report's; 3 when doctor itself failed.
fn doctor(
    settings: &Settings,
    from: Vec<DumpFile>,
    port: Option<u16>,
    json: bool,
    metrics_file: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    let failed = |e: anyhow::Error| {
        eprintln!("natledger: doctor: {}", limit(&chain(&e), LINE));
        Ok(ExitCode::from(doctor::EXIT_FAILED))
    };
    let runner = settings.runner();
    let opts = DoctorOptions {
        from,
        port,
        ledger: Ledger::new(settings.state_dir.clone()),
        netfilter: Netfilter::new(&runner),
        host_backend: backend::detect_explained(settings.host()),
        roots: settings.evidence_roots(),
    };
    let report = match doctor::doctor(&opts) {
        Ok(report) => report,
        Err(e) => return failed(e.into()),
    };
    if json {
        let text = serde_json::to_string_pretty(&report).context("encoding the report")?;
        out(&format!("{text}\n"));
    } else {
        out(&doctor::render(&report));
    }
    let now = std::time::SystemTime::now();
    if let Err(e) = metrics::write_option(metrics_file.as_deref(), &metrics::doctor(&report, now)) {
        return failed(e.into());
    }
    Ok(ExitCode::from(report.exit_code()))
}

fn selftest(settings: &Settings) -> anyhow::Result<ExitCode> {
    let ok = selftest::run(
        settings,
        &settings.backend.explained(settings.host()),
        &mut |check| match &check.result {
            Ok(seen) => out(&format!("ok    {}: {seen}\n", check.name)),
            Err(why) => out(&format!("FAIL  {}: {why}\n", check.name)),
        },
    );
    if !ok {
        anyhow::bail!("selftest failed");
    }
    Ok(ExitCode::SUCCESS)
}

fn list(settings: &Settings, json: bool) -> anyhow::Result<ExitCode> {
    let mut entries = Vec::new();
    for entry in ops::list(
        &settings.machine(),
        &Ledger::new(settings.state_dir.clone()),
    )? {
        match entry {
            Ok(e) => entries.push(e),
            Err(e) => log::error!("{}", natledger::causes::Causes(&e)),
        }
    }
    if json {
        let text = serde_json::to_string_pretty(&entries).context("encoding the list")?;
        out(&format!("{text}\n"));
    } else {
        let chosen = settings.backend.explained(settings.host());
        out(&format!(
            "backend for new rules: {} ({})\n{}",
            chosen.backend,
            chosen.how,
            ops::render_table(&entries)
        ));
    }
    Ok(ExitCode::SUCCESS)
}

/// One line per file on stdout (a file left alone that may need a look: a warning), each
/// file it could not read named in a warning; exit 0 when every file it could read is done.
fn install_cni(settings: &Settings, opts: &install_cni::Options) -> anyhow::Result<ExitCode> {
    let report = install_cni::run(opts, &Ledger::new(settings.state_dir.clone()))?;
    for line in &report.lines {
        if line.warning() {
            log::warn!("{line}");
        } else {
            out(&format!("{line}\n"));
        }
    }
    for refused in &report.refused {
        log::warn!("{}", natledger::causes::Causes(refused));
    }
    if !report.changed() {
        out("install-cni: nothing to change\n");
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
