//! Helpers shared by the cluster tests of `examples` and `jobs` (which includes this file by
//! path): a free loopback port, the programs of the other crate, waiting for a child process
//! with a deadline, and a child's whole output as text. (Each test binary uses a subset.)

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, LazyLock, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// `allreduce-bench node` arguments of the elastic loops: about 20 s of checked all-reduces
/// (600 steps of 5000 elements, 30 ms apart), so a replacement joins while the survivors
/// are mid-loop.
pub(crate) const ELASTIC_ARGS: [&str; 7] = [
    "elastic",
    "--steps",
    "600",
    "--len",
    "5000",
    "--step-ms",
    "30",
];

/// How long a cluster test waits for a process: generous, these run on a loaded 2-core
/// machine (and some inside an emulated guest).
pub(crate) const DEADLINE: Duration = Duration::from_secs(120);

/// A port on 127.0.0.1 that was free a moment ago, outside the kernel's ephemeral range:
/// nodes of tests running in parallel bind ephemeral ports, and a scheduler started a second
/// after its port was picked (as the worker-first test does) could otherwise find it taken.
pub(crate) fn free_port() -> u16 {
    van_core::testkit::free_port()
}

/// Waits for `child` up to [`DEADLINE`]; see [`wait_output_within`].
pub(crate) fn wait_output(child: Child, what: &str) -> Output {
    wait_output_within(child, what, DEADLINE)
}

/// Waits for every named child (each up to [`DEADLINE`]), then checks that each exited 0;
/// their outputs, in order.
pub(crate) fn all_succeeded<const N: usize>(nodes: [(&str, Child); N]) -> [Output; N] {
    let outputs = nodes.map(|(name, child)| (name, wait_output(child, name)));
    for (name, out) in &outputs {
        assert!(out.status.success(), "{name} failed: {}", text(out));
    }
    outputs.map(|(_, out)| out)
}

/// Waits for `child` with a deadline; kills it and fails the test, showing its output, when
/// the deadline passes. Its piped output is read all along (a chatty child, such as a
/// 2,000-node in-process cluster, would otherwise block on a full pipe and never exit).
pub(crate) fn wait_output_within(child: Child, what: &str, deadline: Duration) -> Output {
    let (out, late) = wait_or_kill(child, deadline);
    assert!(
        !late,
        "{what} still running after {deadline:?}\n{}",
        text(&out)
    );
    out
}

/// Waits for `child` up to `deadline`, reading its piped output all along, and kills it
/// when the deadline passes; its output, and whether it had to be killed.
#[allow(dead_code)] // not every test file that includes this module kills late children
pub(crate) fn wait_or_kill(mut child: Child, deadline: Duration) -> (Output, bool) {
    fn drain(pipe: Option<impl Read + Send + 'static>) -> std::sync::mpsc::Receiver<Vec<u8>> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1); // one message: the whole output
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            let _ = tx.send(bytes);
        });
        rx
    }
    // A grandchild that inherited the pipes can hold them open after the child is gone:
    // what arrived is shown after a grace period instead of waiting for ever.
    let collect = |rx: std::sync::mpsc::Receiver<Vec<u8>>| {
        rx.recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| b"(output still open 10 s after the exit: not read)".to_vec())
    };
    let (stdout, stderr) = (drain(child.stdout.take()), drain(child.stderr.take()));
    let started = Instant::now();
    let (status, late) = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break (status, false);
        }
        if started.elapsed() > deadline {
            let _ = child.kill();
            break (child.wait().unwrap(), true);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = Output {
        status,
        stdout: collect(stdout),
        stderr: collect(stderr),
    };
    (out, late)
}

/// A finished child's stdout then stderr, as text.
pub(crate) fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `program` as one `role` of a hand-started 1-server, 1-worker cluster whose scheduler is at
/// 127.0.0.1:`port`, configured only through ps-lite's environment (as in ps-lite's
/// tutorial); output piped. Callers add their arguments and variables.
pub(crate) fn loopback_node(program: &str, role: &str, port: u16) -> std::process::Command {
    let mut cmd = std::process::Command::new(program);
    cmd.env("DMLC_ROLE", role)
        .env("DMLC_NUM_WORKER", "1")
        .env("DMLC_NUM_SERVER", "1")
        .env("DMLC_PS_ROOT_URI", "127.0.0.1")
        .env("DMLC_PS_ROOT_PORT", port.to_string())
        .env("DMLC_INTERFACE", "lo")
        .env("DMLC_ENABLE_RDMA", "0")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    cmd
}

/// Sends signal `sig` (`KILL`, `STOP`, `CONT`, …) to `pid` with the shell's builtin `kill`:
/// no procps needed on a minimal machine.
pub(crate) fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("/bin/sh")
        .args(["-c", &format!("kill -{sig} {pid}")])
        .status()
        .unwrap();
    assert!(ok.success(), "could not send {sig} to {pid}");
}

/// Asserts that exactly `workers` lines of `text` are ps-bench's "exact sums verified for
/// `keys` keys from `workers` workers" (one per worker of a `--mode check` run).
pub(crate) fn exact_sums(text: &str, keys: usize, workers: usize) {
    let line = format!("exact sums verified for {keys} keys from {workers} workers");
    let verified = text.lines().filter(|l| l.contains(&line)).count();
    assert_eq!(verified, workers, "{text}");
}

/// A program of the workspace built beside this test binary (`target/<profile>/NAME`): the
/// way to a program of the other crate, since `env!("CARGO_BIN_EXE_…")` names only this
/// crate's. `cargo test --workspace` builds every crate's programs; a test run with `-p`
/// needs them built first (`cargo build -p examples -p jobs`).
pub(crate) fn program(name: &str) -> String {
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test binary is in target/<profile>/deps");
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} is not built: run the tests with `cargo test --workspace`, or build it first \
         (`cargo build -p examples -p jobs`)",
        path.display()
    );
    path.to_string_lossy().into_owned()
}

/// `ps-bench` (crate `examples`).
pub(crate) static PS_BENCH: LazyLock<String> = LazyLock::new(|| program("ps-bench"));
/// `allreduce-bench` (crate `examples`).
pub(crate) static ALLREDUCE_BENCH: LazyLock<String> = LazyLock::new(|| program("allreduce-bench"));
/// `vans-launch` (crate `jobs`).
pub(crate) static LAUNCH: LazyLock<String> = LazyLock::new(|| program("vans-launch"));
/// `vans-doctor` (crate `jobs`).
pub(crate) static DOCTOR: LazyLock<String> = LazyLock::new(|| program("vans-doctor"));

/// A child process whose output is collected line by line as it arrives, so a test can wait
/// for a line while it runs.
pub(crate) struct Watched {
    child: Child,
    stdout: Arc<Mutex<Vec<String>>>,
    readers: Vec<JoinHandle<()>>,
    stderr: Arc<Mutex<Vec<String>>>,
}

fn collect_lines(
    pipe: impl Read + Send + 'static,
    lines: Arc<Mutex<Vec<String>>>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            lines.lock().unwrap().push(line);
        }
    })
}

impl Watched {
    /// Starts `cmd` with its output piped and collected.
    pub(crate) fn spawn(mut cmd: Command) -> Watched {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let readers = vec![
            collect_lines(child.stdout.take().unwrap(), Arc::clone(&stdout)),
            collect_lines(child.stderr.take().unwrap(), Arc::clone(&stderr)),
        ];
        Watched {
            child,
            stdout,
            readers,
            stderr,
        }
    }

    /// What it printed so far, stdout then stderr.
    pub(crate) fn output(&self) -> String {
        let out = self.stdout.lock().unwrap().join("\n");
        let err = self.stderr.lock().unwrap().join("\n");
        format!("stdout:\n{out}\nstderr:\n{err}")
    }

    /// Waits until a stdout line contains `text`; fails the test at the deadline or if the
    /// process exits first.
    pub(crate) fn wait_for_line(&mut self, text: &str, what: &str) {
        let started = Instant::now();
        loop {
            if self.stdout.lock().unwrap().iter().any(|l| l.contains(text)) {
                return;
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!(
                    "{what} exited ({status}) before printing `{text}`\n{}",
                    self.output()
                );
            }
            assert!(
                started.elapsed() < 2 * DEADLINE,
                "{what} never printed `{text}`\n{}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the exit, killing the process and failing the test after `limit`.
    pub(crate) fn wait(mut self, limit: Duration, what: &str) -> (ExitStatus, String) {
        let started = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if started.elapsed() > limit {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("{what} still running after {limit:?}\n{}", self.output());
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
        (status, self.output())
    }

    /// Kills it (SIGKILL) and reaps it.
    pub(crate) fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
