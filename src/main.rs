//! The `natledger` command: argument parsing and error printing; the work is in the library.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use nix::sys::resource::{UsageWho, getrusage};

use natledger::backend::{self, BackendChoice, Netfilter};
use natledger::bundle::{self, HookSpec, Injected};
use natledger::doctor::{self, DoctorOptions, DumpFile, evidence::Roots};
use natledger::echo::limit;
use natledger::exec::SystemRunner;
use natledger::ledger::Ledger;
use natledger::oci::{Stage, State};
use natledger::ops::{self, Context, SweepOptions};
use natledger::{cni, metrics, selftest, wrapper};

#[derive(Parser)]
#[command(
    version,
    about = "Container host-port forwards that never outlive their container"
)]
struct Cli {
    /// Where manifests and the lock live.
    #[arg(
        long,
        global = true,
        env = "NATLEDGER_STATE_DIR",
        default_value = "/run/natledger"
    )]
    state_dir: PathBuf,
    /// Backend for new rules (removal and sweep look in all three). auto: the backend the
    /// host's `iptables` symlink names, or nftables (natledger's own tables, no tool needed)
    /// where no iptables tool is installed.
    #[arg(
        long,
        global = true,
        env = "NATLEDGER_BACKEND",
        value_enum,
        default_value = "auto"
    )]
    backend: BackendChoice,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run as an OCI hook; the container state comes on stdin. Without a stage, the state's
    /// status decides (creating: create-runtime, stopped: poststop).
    Hook {
        #[arg(value_enum)]
        stage: Option<Stage>,
    },
    /// Remove the rules of dead containers, and every natledger rule no live container
    /// claims, in iptables-legacy and iptables-nft, IPv4 and IPv6. Exit status 0 when
    /// everything due was removed, 1 otherwise (the report says what remains and why).
    Sweep {
        /// Print the plan; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Print a JSON report instead of text.
        #[arg(long)]
        json: bool,
        /// Remove everything natledger owns, live containers' rules, shared chains and
        /// jumps included (for uninstalling).
        #[arg(long)]
        all: bool,
        /// First give exiting containers up to SECONDS to die (ends early once none has
        /// exited for 3 s).
        #[arg(long, value_name = "SECONDS")]
        wait: Option<u64>,
        /// Also write the sweep's metrics (Prometheus text format) to FILE, atomically, for a
        /// node_exporter textfile collector; nothing is written when FILE's directory does not
        /// exist.
        #[arg(long, value_name = "FILE", conflicts_with = "dry_run")]
        metrics_file: Option<PathBuf>,
    },
    /// Add natledger's createRuntime and poststop hooks to BUNDLE/config.json (runc, crun),
    /// after any hooks already there. Idempotent; keeps every other field; refuses a
    /// malformed file and leaves it unchanged.
    Inject {
        bundle: PathBuf,
        /// The natledger binary the runtime runs (default: this one).
        #[arg(long)]
        binary: Option<PathBuf>,
        /// Environment for the hooks (repeatable), e.g. NATLEDGER_STATE_DIR=/run/natledger.
        #[arg(long = "hook-env", value_name = "KEY=VALUE", value_parser = key_value)]
        hook_env: Vec<String>,
        /// Seconds the runtime gives each hook.
        #[arg(long, default_value_t = natledger::wrapper::HOOK_TIMEOUT)]
        timeout: u32,
    },
    /// Wrapper runtime for Docker and containerd (also reached as `natledger-runtime`):
    /// [--natledger-runtime PATH] [--natledger-hook-env KEY=VALUE]... RUNC-ARGS...; on
    /// create/run, injects the hooks when the container asks for ports, then execs runc.
    #[command(disable_help_flag = true)]
    Runtime {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
        args: Vec<OsString>,
    },
    /// Find the rules that make a port unreachable, whoever wrote them: shadowed rules, dead
    /// DNAT targets, hijacked listeners, rules split across backends, natledger's own state.
    /// Only reads; prints the fixing commands. Exit 0 no problem, 1 warnings only, 2 errors,
    /// 3 doctor itself failed.
    Doctor {
        /// Print a JSON report instead of text.
        #[arg(long)]
        json: bool,
        /// Only findings about this host port.
        #[arg(long)]
        port: Option<u16>,
        /// Analyse saved *-save dumps instead of this host: BACKEND[/FAMILY]:FILE, e.g.
        /// legacy:iptables.txt nft/ipv6:ip6tables.txt.
        #[arg(long, num_args = 1.., value_name = "BACKEND[/FAMILY]:FILE")]
        from: Vec<DumpFile>,
        /// Also write the findings per kind and severity (Prometheus text format) to FILE, as
        /// sweep --metrics-file does.
        #[arg(long, value_name = "FILE")]
        metrics_file: Option<PathBuf>,
    },
    /// Prove natledger works on this host, in private network namespaces it creates and
    /// removes: both backends accept its rules, a forwarded port answers, poststop leaves the
    /// tables as they were. One line per check; exit 1 on any failure.
    Selftest,
    /// Show every manifest: container, pid, alive or dead, mappings, backend and rules.
    List {
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
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

fn key_value(s: &str) -> Result<String, String> {
    match s.split_once('=') {
        Some((k, _)) if !k.is_empty() => Ok(s.to_string()),
        _ => Err("expected KEY=VALUE".into()),
    }
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
            ctx.netfilter = ctx.netfilter.with_conntrack(true);
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
