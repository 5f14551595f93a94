//! `vans-launch`: start a scheduler, servers and workers of one program on this machine.
//!
//! ```text
//! vans-launch -s 2 -w 3 --env PS_VERBOSE=1 -- target/release/ps-bench --quick
//! ```
//!
//! With `--tensorflow` the nodes are TensorFlow tasks instead (`ps` and `worker`, each with
//! its `TF_CONFIG`; see `launcher::LaunchSpec::tensorflow`):
//!
//! ```text
//! vans-launch --tensorflow -s 2 -w 2 -- python train.py   # protocol="grpc+vans" inside
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

use clap::error::ErrorKind;
use clap::Parser;
use launcher::{launch, LaunchSpec, DEFAULT_GRACE, DEFAULT_ROOT_URI};

// `--help` prints the usage line first, lower case (`usage: vans-launch …`), as the launcher
// always has; a usage error prints its message, then the help (see `usage_error`).
/// Starts 1 scheduler, N servers and N workers running PROGRAM ARGS on this machine, with the
/// ps-lite environment (DMLC_ROLE, DMLC_NUM_SERVER, DMLC_NUM_WORKER, DMLC_PS_ROOT_URI,
/// DMLC_PS_ROOT_PORT, DMLC_NODE_HOST) set for each, and prints their output line by line
/// behind `[scheduler]`, `[server I]` or `[worker I]`. If a node fails, the timeout passes or the
/// launcher gets SIGINT/SIGTERM, every node is stopped (SIGTERM, then SIGKILL after the grace
/// period).
#[derive(Debug, Parser)]
#[command(
    name = "vans-launch",
    override_usage = "vans-launch -s N -w N [options] [--] PROGRAM [ARGS...]",
    help_template = "usage: {usage}\n\n{about-with-newline}\n{all-args}{after-help}",
    verbatim_doc_comment,
    disable_help_flag = true,
    after_help = "exit code: 0 if every node exited 0, 1 if the job failed, 2 for a usage error."
)]
struct Cli {
    /// number of servers (required)
    #[arg(short = 's', long, value_name = "N")]
    servers: u32,
    /// number of workers (required)
    #[arg(short = 'w', long, value_name = "N")]
    workers: u32,
    /// scheduler port (default: a free port)
    #[arg(
        short = 'p',
        long,
        value_name = "P",
        default_value_t = 0,
        hide_default_value = true
    )]
    port: u16,
    /// scheduler address (default: 127.0.0.1)
    #[arg(short = 'u', long, value_name = "HOST", default_value = DEFAULT_ROOT_URI, hide_default_value = true)]
    uri: String,
    /// stop everything and fail after SECS seconds (default: no limit)
    #[arg(short = 't', long, value_name = "SECS", value_parser = seconds, allow_negative_numbers = true)]
    timeout: Option<Duration>,
    /// time between SIGTERM and SIGKILL when stopping nodes (default: 3)
    #[arg(long, value_name = "SECS", value_parser = seconds, allow_negative_numbers = true)]
    grace: Option<Duration>,
    /// TensorFlow tasks: N ps (-s) and N worker (-w) tasks, each with a TF_CONFIG naming
    /// its task and a free port; no scheduler process and no DMLC_* variables. The job
    /// succeeds once worker 0 (the chief) exits 0; the tasks left are then stopped
    #[arg(long)]
    tensorflow: bool,
    /// extra environment for every node (repeatable)
    #[arg(short = 'e', long = "env", value_name = "K=V", value_parser = key_value)]
    env: Vec<(String, String)>,
    /// print this help
    #[arg(short = 'h', long, action = clap::ArgAction::Help)]
    help: Option<bool>,
    /// the program every node runs, then its arguments (options after PROGRAM are its own)
    #[arg(value_name = "PROGRAM", required = true, num_args = 1.., trailing_var_arg = true)]
    command: Vec<String>,
}

impl Cli {
    /// The launch this command line asks for.
    fn spec(self) -> LaunchSpec {
        let mut command = self.command.into_iter();
        let program = command.next().unwrap_or_default();
        let mut spec = LaunchSpec::new(self.servers, self.workers, program);
        spec.args = command.collect();
        spec.env = self.env;
        spec.root_uri = self.uri;
        spec.root_port = self.port;
        spec.timeout = self.timeout;
        spec.grace = self.grace.unwrap_or(DEFAULT_GRACE);
        spec.tensorflow = self.tensorflow;
        spec
    }
}

fn main() -> ExitCode {
    let spec = match Cli::try_parse() {
        Ok(cli) => cli.spec(),
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => return usage_error(&e),
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

/// Prints what was wrong with the command line, then the help; exit code 2.
fn usage_error(error: &clap::Error) -> ExitCode {
    let help = <Cli as clap::CommandFactory>::command().render_help();
    let _ = writeln!(
        std::io::stderr(),
        "vans-launch: {}\n\n{help}",
        error_message(error)
    );
    ExitCode::from(2)
}

/// clap's message for `error` without its `error: ` prefix and what it appends after a blank
/// line (the usage, a pointer to `--help`): the help printed after it has both.
fn error_message(error: &clap::Error) -> String {
    let text = error.render().to_string();
    let text = text.strip_prefix("error: ").unwrap_or(&text);
    let end = ["\n\nUsage:", "\n\nFor more information"]
        .iter()
        .filter_map(|tail| text.find(tail))
        .min()
        .unwrap_or(text.len());
    text[..end].trim_end().to_owned()
}

/// `K=V` for `--env`.
fn key_value(entry: &str) -> Result<(String, String), String> {
    match entry.split_once('=') {
        Some((key, value)) => Ok((key.to_owned(), value.to_owned())),
        None => Err(format!("takes K=V, got {entry:?}")),
    }
}

/// A positive number of seconds for `--timeout` and `--grace`.
fn seconds(value: &str) -> Result<Duration, String> {
    value
        .parse::<f64>()
        .ok()
        .filter(|secs| *secs > 0.0)
        .and_then(|secs| Duration::try_from_secs_f64(secs).ok())
        .ok_or_else(|| format!("takes a positive number of seconds, got {value:?}"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use clap::CommandFactory;

    use super::*;

    fn parse(args: &[&str]) -> Result<LaunchSpec, clap::Error> {
        Cli::try_parse_from(std::iter::once("vans-launch").chain(args.iter().copied()))
            .map(Cli::spec)
    }

    #[test]
    fn options_stop_at_the_program() {
        Cli::command().debug_assert();
        let spec = parse(&[
            "-s",
            "2",
            "-w",
            "3",
            "-e",
            "A=1",
            "--env=B=x=y",
            "prog",
            "-c",
            "--port",
            "9",
        ])
        .unwrap();
        assert_eq!((spec.num_servers, spec.num_workers), (2, 3));
        assert_eq!(spec.program.to_str(), Some("prog"));
        assert_eq!(spec.args, ["-c", "--port", "9"]);
        assert_eq!(
            spec.env,
            [("A".into(), "1".into()), ("B".into(), "x=y".into())]
        );
        assert_eq!(
            (spec.root_uri.as_str(), spec.root_port),
            (DEFAULT_ROOT_URI, 0)
        );
        assert_eq!((spec.timeout, spec.grace), (None, DEFAULT_GRACE));

        let spec = parse(&[
            "--servers=1",
            "--workers",
            "1",
            "--uri=h",
            "-p",
            "9000",
            "-t",
            "1.5",
            "--grace",
            "0.5",
            "--",
            "--prog",
        ])
        .unwrap();
        assert_eq!(spec.program.to_str(), Some("--prog"));
        assert_eq!((spec.root_uri.as_str(), spec.root_port), ("h", 9000));
        assert_eq!(spec.timeout, Some(Duration::from_millis(1500)));
        assert_eq!(spec.grace, Duration::from_millis(500));
    }

    #[test]
    fn bad_command_lines_are_errors_with_a_message() {
        for args in [
            &[][..],
            &["-s", "1", "-w", "1"],
            &["-s", "x", "-w", "1", "/bin/true"],
            &["-w", "1", "/bin/true"],
            &["-s", "1", "-w", "1", "--bogus", "/bin/true"],
            &["-s", "1", "-w", "1", "--timeout", "-3", "/bin/true"],
            &["-s", "1", "-w", "1", "--env", "NOEQUALS", "/bin/true"],
            &["-s", "1", "-w"],
        ] {
            let error = parse(args).unwrap_err();
            let message = error_message(&error);
            assert!(
                !message.is_empty()
                    && !message.contains("Usage:")
                    && !message.contains("For more information"),
                "{args:?}: {message}"
            );
        }
    }

    #[test]
    fn the_help_keeps_the_usage_line_and_the_defaults_it_names() {
        let help = Cli::command().render_help().to_string();
        assert!(help.starts_with("usage: vans-launch -s N -w N"), "{help}");
        assert!(
            help.contains("exit code: 0 if every node exited 0"),
            "{help}"
        );
        // The help says so.
        assert_eq!(DEFAULT_GRACE, Duration::from_secs(3));
        assert_eq!(DEFAULT_ROOT_URI, "127.0.0.1");
    }
}
