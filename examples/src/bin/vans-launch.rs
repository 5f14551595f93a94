//! `vans-launch`: start a scheduler, servers and workers of one program on this machine.
//!
//! ```text
//! vans-launch -s 2 -w 3 --env PS_VERBOSE=1 -- target/release/ps-bench --quick
//! ```
//!
//! Every node gets the ps-lite environment (`DMLC_ROLE`, `DMLC_NUM_SERVER`, `DMLC_NUM_WORKER`,
//! `DMLC_PS_ROOT_URI`, `DMLC_PS_ROOT_PORT`, ...) and its output is printed with a `[server 1] `
//! style prefix. When a node fails, the timeout passes or Ctrl-C is pressed, every node is
//! stopped; see `launcher`. Exit code: 0 when every node exited 0, 1 when the job failed,
//! 2 for a usage error.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use launcher::{launch, LaunchSpec, DEFAULT_GRACE, DEFAULT_ROOT_URI};

const USAGE: &str = "\
usage: vans-launch -s N -w N [options] [--] PROGRAM [ARGS...]

Starts 1 scheduler, N servers and N workers running PROGRAM ARGS on this machine, with the
ps-lite environment (DMLC_ROLE, DMLC_NUM_SERVER, DMLC_NUM_WORKER, DMLC_PS_ROOT_URI,
DMLC_PS_ROOT_PORT, DMLC_NODE_HOST) set for each, and prints their output line by line behind
[scheduler], [server I] or [worker I]. If a node fails, the timeout passes or the launcher gets
SIGINT/SIGTERM, every node is stopped (SIGTERM, then SIGKILL after the grace period).

options:
  -s, --servers N     number of servers (required)
  -w, --workers N     number of workers (required)
  -p, --port P        scheduler port (default: a free port)
  -u, --uri HOST      scheduler address (default: 127.0.0.1)
  -t, --timeout SECS  stop everything and fail after SECS seconds (default: no limit)
      --grace SECS    time between SIGTERM and SIGKILL when stopping nodes (default: 3)
  -e, --env K=V       extra environment for every node (repeatable)
  -h, --help          print this help

exit code: 0 if every node exited 0, 1 if the job failed, 2 for a usage error.
";

fn main() -> ExitCode {
    let args: Vec<String> = match std::env::args_os()
        .skip(1)
        .map(|arg| arg.into_string())
        .collect()
    {
        Ok(args) => args,
        Err(arg) => return usage_error(&format!("argument {arg:?} is not valid UTF-8")),
    };
    let spec = match parse(&args) {
        Ok(Parsed::Help) => {
            let _ = std::io::stdout().write_all(USAGE.as_bytes());
            return ExitCode::SUCCESS;
        }
        Ok(Parsed::Launch(spec)) => spec,
        Err(message) => return usage_error(&message),
    };
    // `launch` spawns the nodes from the thread that polls it (the main thread, through
    // `block_on`), which lives as long as the job: that keeps their parent-death signal armed.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build();
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(error) => {
            let _ = writeln!(
                std::io::stderr(),
                "vans-launch: cannot start the runtime: {error}"
            );
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(launch(&spec)) {
        Ok(_) => ExitCode::SUCCESS,
        Err(error) => {
            let _ = writeln!(std::io::stderr(), "vans-launch: {error}");
            ExitCode::FAILURE
        }
    }
}

fn usage_error(message: &str) -> ExitCode {
    let _ = writeln!(std::io::stderr(), "vans-launch: {message}\n\n{USAGE}");
    ExitCode::from(2)
}

enum Parsed {
    Help,
    Launch(LaunchSpec),
}

/// Parses the command line (without the program name).
fn parse(args: &[String]) -> Result<Parsed, String> {
    let (mut servers, mut workers) = (None, None);
    let mut spec = LaunchSpec::new(0, 0, "");
    spec.root_uri = DEFAULT_ROOT_URI.to_owned();
    spec.grace = DEFAULT_GRACE;
    let mut rest = args.iter();
    let mut program = None;
    while let Some(arg) = rest.next() {
        if arg == "--" {
            program = rest.next();
            break;
        }
        if !arg.starts_with('-') || arg == "-" {
            program = Some(arg);
            break;
        }
        // `--name=value` or `--name value` / `-n value`.
        let (name, inline) = match arg.split_once('=') {
            Some((name, value)) if name.starts_with("--") => (name, Some(value.to_owned())),
            _ => (arg.as_str(), None),
        };
        if matches!(name, "-h" | "--help") {
            return Ok(Parsed::Help);
        }
        let mut value = || match inline.clone() {
            Some(value) => Ok(value),
            None => rest
                .next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value")),
        };
        match name {
            "-s" | "--servers" => servers = Some(number::<u32>(name, &value()?)?),
            "-w" | "--workers" => workers = Some(number::<u32>(name, &value()?)?),
            "-p" | "--port" => spec.root_port = number::<u16>(name, &value()?)?,
            "-u" | "--uri" => spec.root_uri = value()?,
            "-t" | "--timeout" => spec.timeout = Some(seconds(name, &value()?)?),
            "--grace" => spec.grace = seconds(name, &value()?)?,
            "-e" | "--env" => {
                let entry = value()?;
                let Some((key, value)) = entry.split_once('=') else {
                    return Err(format!("{name} takes K=V, got {entry:?}"));
                };
                spec.env.push((key.to_owned(), value.to_owned()));
            }
            _ => return Err(format!("unknown option {arg:?}")),
        }
    }
    let Some(program) = program else {
        return Err("no PROGRAM given".into());
    };
    spec.program = program.into();
    spec.args = rest.cloned().collect();
    spec.num_servers = servers.ok_or("--servers is required")?;
    spec.num_workers = workers.ok_or("--workers is required")?;
    Ok(Parsed::Launch(spec))
}

fn number<T: std::str::FromStr>(name: &str, value: &str) -> Result<T, String> {
    value
        .parse()
        .map_err(|_| format!("{name} takes a non-negative integer in range, got {value:?}"))
}

fn seconds(name: &str, value: &str) -> Result<Duration, String> {
    value
        .parse::<f64>()
        .ok()
        .filter(|secs| *secs > 0.0)
        .and_then(|secs| Duration::try_from_secs_f64(secs).ok())
        .ok_or_else(|| format!("{name} takes a positive number of seconds, got {value:?}"))
}
