//! `vans-launch` as a user runs it: real processes, `/bin/sh` nodes, real signals.
//!
//! Nodes that should be stopped by the launcher record their pid in a file and then
//! `exec sleep 6x` (exec keeps the pid); afterwards each pid must be gone. A pid counts as
//! still running only while `/proc/<pid>/cmdline` is that test's own `sleep 6x`, so a recycled
//! pid cannot fail a test and a test cannot see another test's nodes. Deadlines are generous:
//! the machine may be small and busy.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// How long any launcher may run before the test gives up on it.
const LAUNCHER_DEADLINE: Duration = Duration::from_secs(120);
/// Launcher stdout lines buffered for a test; far more than any test prints, so the reader
/// never blocks the launcher.
const STDOUT_LINES: usize = 4096;
/// Sleeping nodes sleep 60 s or more; a launcher that stops them returns well within this.
const STOPPED_WITHIN: Duration = Duration::from_secs(30);

/// A running `vans-launch` whose output is read as it comes.
struct Launcher {
    child: Child,
    started: Instant,
    stdout_lines: mpsc::Receiver<String>,
    stdout_seen: Vec<String>,
    stderr: Option<JoinHandle<String>>,
}

/// A finished `vans-launch`.
struct Finished {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    elapsed: Duration,
}

impl Launcher {
    fn start(args: &[&str]) -> Launcher {
        Launcher::start_with(args, false, &[])
    }

    /// With `own_group`, the launcher leads a new process group, like a job a shell started;
    /// `env` is added to what the launcher inherits.
    fn start_with(args: &[&str], own_group: bool, env: &[(&str, &str)]) -> Launcher {
        let mut command = Command::new(env!("CARGO_BIN_EXE_vans-launch"));
        command.envs(env.iter().copied());
        if own_group {
            command.process_group(0);
        }
        let mut child = command
            .args(args)
            .env_remove("DMLC_NODE_HOST")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|error| panic!("cannot start vans-launch: {error}"));
        let (sender, stdout_lines) = mpsc::sync_channel(STDOUT_LINES);
        let stdout = child.stdout.take().map(BufReader::new);
        thread::spawn(move || {
            for line in stdout.into_iter().flat_map(|reader| reader.split(b'\n')) {
                let Ok(line) = line else { break };
                if sender
                    .send(String::from_utf8_lossy(&line).into_owned())
                    .is_err()
                {
                    break;
                }
            }
        });
        let mut stderr_pipe = child.stderr.take();
        let stderr = thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(pipe) = stderr_pipe.as_mut() {
                let _ = pipe.read_to_end(&mut bytes);
            }
            String::from_utf8_lossy(&bytes).into_owned()
        });
        Launcher {
            child,
            started: Instant::now(),
            stdout_lines,
            stdout_seen: Vec::new(),
            stderr: Some(stderr),
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits until stdout has shown every line in `wanted` (while the launcher keeps running).
    fn wait_for_stdout(&mut self, wanted: &[String]) {
        let deadline = Instant::now() + LAUNCHER_DEADLINE;
        while !wanted.iter().all(|line| self.stdout_seen.contains(line)) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stdout_lines.recv_timeout(left) {
                Ok(line) => self.stdout_seen.push(line),
                Err(_) => panic!("never saw {wanted:?}; saw {:?}", self.stdout_seen),
            }
        }
    }

    fn finish(mut self) -> Finished {
        let deadline = self.started + LAUNCHER_DEADLINE;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(50)),
                Ok(None) => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    panic!("vans-launch ran longer than {LAUNCHER_DEADLINE:?}");
                }
                Err(error) => panic!("cannot wait for vans-launch: {error}"),
            }
        };
        let elapsed = self.started.elapsed();
        self.stdout_seen.extend(self.stdout_lines.iter());
        let stderr = self.stderr.take().and_then(|reader| reader.join().ok());
        let finished = Finished {
            status,
            stdout: self.stdout_seen.join("\n"),
            stderr: stderr.unwrap_or_default(),
            elapsed,
        };
        eprintln!("--- vans-launch {status} after {elapsed:?}");
        eprintln!(
            "--- stdout:\n{}\n--- stderr:\n{}",
            finished.stdout, finished.stderr
        );
        finished
    }
}

impl Drop for Launcher {
    /// A test that fails half-way must not leave a launcher running; its nodes die with it.
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn run(args: &[&str]) -> Finished {
    Launcher::start(args).finish()
}

/// A scratch file for pids, removed when dropped.
struct PidFile(PathBuf);

impl PidFile {
    fn new(test: &str) -> PidFile {
        let path = std::env::temp_dir().join(format!("vans-launch-{}-{test}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        PidFile(path)
    }

    fn env(&self) -> String {
        format!("PIDS={}", self.0.display())
    }

    fn pids(&self) -> Vec<u32> {
        let text = std::fs::read_to_string(&self.0).unwrap_or_default();
        text.lines()
            .filter_map(|line| line.trim().parse().ok())
            .collect()
    }

    fn wait_for(&self, count: usize) -> Vec<u32> {
        let deadline = Instant::now() + LAUNCHER_DEADLINE;
        loop {
            let pids = self.pids();
            if pids.len() >= count {
                return pids;
            }
            assert!(
                Instant::now() < deadline,
                "only {} of {count} nodes started",
                pids.len()
            );
            thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Whether `pid` is still this test's `sleep <seconds>`.
fn still_sleeping(pid: u32, seconds: u32) -> bool {
    let cmdline = std::fs::read(Path::new("/proc").join(pid.to_string()).join("cmdline"));
    cmdline.is_ok_and(|cmdline| cmdline == format!("sleep\0{seconds}\0").as_bytes())
}

fn assert_all_gone(pids: &[u32], seconds: u32) {
    let running: Vec<u32> = pids
        .iter()
        .copied()
        .filter(|&pid| still_sleeping(pid, seconds))
        .collect();
    assert!(
        running.is_empty(),
        "nodes {running:?} of {pids:?} are still running"
    );
}

/// Every node name of a 1 + `servers` + `workers` cluster.
fn node_names(servers: u32, workers: u32) -> Vec<(String, &'static str, u32)> {
    let mut names = vec![("scheduler".to_owned(), "scheduler", 0)];
    names.extend((0..servers).map(|rank| (format!("server {rank}"), "server", rank)));
    names.extend((0..workers).map(|rank| (format!("worker {rank}"), "worker", rank)));
    names
}

#[test]
fn every_node_runs_with_its_environment_and_prefixed_output() {
    let script = r#"
        printf 'role=%s rank=%s ' "$DMLC_ROLE" "$VANS_LAUNCH_RANK"
        printf 'servers=%s workers=%s ' "$DMLC_NUM_SERVER" "$DMLC_NUM_WORKER"
        printf 'uri=%s port=%s ' "$DMLC_PS_ROOT_URI" "$DMLC_PS_ROOT_PORT"
        printf 'host=%s extra=%s\n' "$DMLC_NODE_HOST" "$EXTRA"
        echo "to-stderr $DMLC_ROLE $VANS_LAUNCH_RANK" >&2
        printf 'bad \377 byte\n'
        printf 'no newline'
    "#;
    let out = run(&[
        "-s",
        "2",
        "-w",
        "3",
        "--env",
        "EXTRA=hello",
        "--",
        "/bin/sh",
        "-c",
        script,
    ]);
    assert!(out.status.success(), "exit {}", out.status);

    let mut ports = Vec::new();
    for (name, role, rank) in node_names(2, 3) {
        let prefix =
            format!("[{name}] role={role} rank={rank} servers=2 workers=3 uri=127.0.0.1 port=");
        let line = out.stdout.lines().find(|line| line.starts_with(&prefix));
        let line = line.unwrap_or_else(|| panic!("no line starting {prefix:?}"));
        let rest = &line[prefix.len()..];
        assert!(rest.ends_with(" host=127.0.0.1 extra=hello"), "{line}");
        ports.push(rest.split(' ').next().unwrap_or_default().to_owned());
        assert!(out
            .stdout
            .lines()
            .any(|line| line == format!("[{name}] bad \u{fffd} byte")));
        assert!(out
            .stdout
            .lines()
            .any(|line| line == format!("[{name}] no newline")));
        let stderr_line = format!("[{name}] to-stderr {role} {rank}");
        assert!(
            out.stderr.lines().any(|line| line == stderr_line),
            "{stderr_line}"
        );
        assert!(
            !out.stdout.contains(&stderr_line),
            "stderr line on stdout: {stderr_line}"
        );
    }
    assert!(
        ports[0].parse::<u16>().is_ok_and(|port| port != 0),
        "port {:?}",
        ports[0]
    );
    assert!(
        ports.iter().all(|port| *port == ports[0]),
        "ports differ: {ports:?}"
    );
    assert!(out
        .stderr
        .contains("[launcher] launching 1 scheduler, 2 servers, 3 workers"));
    assert!(out.stderr.contains("[launcher] all 6 nodes exited 0 in"));
}

#[test]
fn explicit_root_is_passed_through_and_node_host_only_for_loopback() {
    let script = r#"echo "uri=$DMLC_PS_ROOT_URI port=$DMLC_PS_ROOT_PORT host=$DMLC_NODE_HOST""#;
    let out = run(&[
        "-s",
        "1",
        "-w",
        "1",
        "--uri",
        "localhost",
        "--port",
        "9123",
        "/bin/sh",
        "-c",
        script,
    ]);
    assert!(out.status.success());
    assert!(out
        .stdout
        .contains("[worker 0] uri=localhost port=9123 host=127.0.0.1"));

    let out = run(&[
        "-s",
        "1",
        "-w",
        "1",
        "--uri=10.0.0.2",
        "--port=9000",
        "/bin/sh",
        "-c",
        script,
    ]);
    assert!(out.status.success());
    assert!(out
        .stdout
        .contains("[server 0] uri=10.0.0.2 port=9000 host="));
    assert!(!out.stdout.contains("host=127.0.0.1"));
}

#[test]
fn a_failing_worker_stops_the_whole_job() {
    let pids = PidFile::new("failing-worker");
    // Worker 1 fails once every node has recorded its pid; the rest would sleep for a minute.
    let script = r#"
        echo $$ >> "$PIDS"
        if [ "$DMLC_ROLE" = worker ] && [ "$VANS_LAUNCH_RANK" = 1 ]; then
            i=0
            while [ "$(wc -l < "$PIDS")" -lt 6 ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
            echo "worker 1 gives up" >&2
            exit 3
        fi
        exec sleep 61
    "#;
    let out = run(&[
        "-s",
        "2",
        "-w",
        "3",
        "--env",
        &pids.env(),
        "--",
        "/bin/sh",
        "-c",
        script,
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.elapsed < STOPPED_WITHIN, "took {:?}", out.elapsed);
    assert!(out.stderr.contains("[worker 1] worker 1 gives up"));
    assert!(out
        .stderr
        .contains("vans-launch: worker 1 exited with code 3"));
    assert!(out.stderr.contains("(5 stopped by the launcher)"));
    let recorded = pids.pids();
    assert_eq!(recorded.len(), 6, "pids {recorded:?}");
    assert_all_gone(&recorded, 61);
}

#[test]
fn the_timeout_stops_the_whole_job() {
    let pids = PidFile::new("timeout");
    let script = r#"echo $$ >> "$PIDS"; exec sleep 62"#;
    let args = [
        "-s",
        "1",
        "-w",
        "2",
        "--timeout",
        "1",
        "--env",
        &pids.env(),
        "/bin/sh",
        "-c",
        script,
    ];
    let out = run(&args);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.elapsed < STOPPED_WITHIN, "took {:?}", out.elapsed);
    assert!(out
        .stderr
        .contains("vans-launch: the job ran longer than its 1.0 s timeout"));
    // A node may not have written its pid before it was stopped; those recorded must be gone.
    assert_all_gone(&pids.pids(), 62);
}

#[test]
fn sigint_and_sigterm_stop_the_whole_job() {
    // `-INT -<pgid>` is a terminal's Ctrl-C to the launcher's group; the nodes lead groups of
    // their own, so the launcher stops them in order either way.
    for (signal, to_group) in [("INT", false), ("TERM", false), ("INT", true)] {
        let pids = PidFile::new(&format!("signal-{signal}-{to_group}"));
        let script = r#"echo $$ >> "$PIDS"; echo ready; exec sleep 63"#;
        let args = [
            "-s",
            "2",
            "-w",
            "2",
            "-e",
            &pids.env(),
            "--",
            "/bin/sh",
            "-c",
            script,
        ];
        let mut launcher = Launcher::start_with(&args, to_group, &[]);
        // The nodes are still running, so seeing their lines shows output is streamed.
        let ready: Vec<String> = node_names(2, 2)
            .into_iter()
            .map(|(name, _, _)| format!("[{name}] ready"))
            .collect();
        launcher.wait_for_stdout(&ready);
        let recorded = pids.wait_for(5);
        let sent_at = Instant::now();
        let target = match to_group {
            true => format!("-{}", launcher.pid()),
            false => launcher.pid().to_string(),
        };
        let kill = Command::new("/bin/sh")
            .args(["-c", &format!("kill -s {signal} -- {target}")])
            .status();
        assert!(
            kill.is_ok_and(|status| status.success()),
            "kill -{signal} {target} failed"
        );
        let out = launcher.finish();
        assert_eq!(out.status.code(), Some(1), "after SIG{signal} to {target}");
        assert!(
            sent_at.elapsed() < STOPPED_WITHIN,
            "took {:?}",
            sent_at.elapsed()
        );
        assert!(out
            .stderr
            .contains(&format!("vans-launch: interrupted by SIG{signal}")));
        assert_all_gone(&recorded, 63);
    }
}

#[test]
fn nodes_that_ignore_sigterm_are_killed_after_the_grace_period() {
    let pids = PidFile::new("ignore-term");
    let script = r#"
        trap '' TERM
        echo $$ >> "$PIDS"
        if [ "$DMLC_ROLE" = worker ]; then
            i=0
            while [ "$(wc -l < "$PIDS")" -lt 3 ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
            exit 5
        fi
        exec sleep 64
    "#;
    let args = [
        "-s",
        "1",
        "-w",
        "1",
        "--grace",
        "1",
        "-e",
        &pids.env(),
        "/bin/sh",
        "-c",
        script,
    ];
    let out = run(&args);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.elapsed < STOPPED_WITHIN, "took {:?}", out.elapsed);
    assert!(out
        .stderr
        .contains("vans-launch: worker 0 exited with code 5"));
    let recorded = pids.pids();
    assert_eq!(recorded.len(), 3, "pids {recorded:?}");
    assert_all_gone(&recorded, 64);
}

#[test]
fn what_a_node_started_is_stopped_with_it() {
    let pids = PidFile::new("grandchildren");
    // Each node is a shell with a background `sleep 66`; worker 0 fails once all six run.
    let script = r#"
        sleep 66 &
        echo $! >> "$PIDS"
        if [ "$DMLC_ROLE" = worker ]; then
            i=0
            while [ "$(wc -l < "$PIDS")" -lt 3 ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
            exit 4
        fi
        wait
    "#;
    let out = run(&[
        "-s",
        "1",
        "-w",
        "1",
        "-e",
        &pids.env(),
        "/bin/sh",
        "-c",
        script,
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.elapsed < STOPPED_WITHIN, "took {:?}", out.elapsed);
    assert!(out
        .stderr
        .contains("vans-launch: worker 0 exited with code 4"));
    assert!(out
        .stderr
        .contains("killed processes that worker 0 left running"));
    let recorded = pids.pids();
    assert_eq!(recorded.len(), 3, "pids {recorded:?}");
    assert_all_gone(&recorded, 66);
}

#[test]
fn what_a_successful_node_leaves_behind_is_killed() {
    let pids = PidFile::new("leftovers");
    let script = r#"sleep 67 & echo $! >> "$PIDS"; echo started"#;
    let out = run(&[
        "-s",
        "1",
        "-w",
        "1",
        "-e",
        &pids.env(),
        "/bin/sh",
        "-c",
        script,
    ]);
    assert!(out.status.success(), "exit {}", out.status);
    assert!(out.elapsed < STOPPED_WITHIN, "took {:?}", out.elapsed);
    assert!(out
        .stderr
        .contains("killed processes that scheduler left running"));
    assert!(out.stderr.contains("[launcher] all 3 nodes exited 0"));
    let recorded = pids.pids();
    assert_eq!(recorded.len(), 3, "pids {recorded:?}");
    assert_all_gone(&recorded, 67);
}

#[test]
fn nodes_die_with_a_sigkilled_launcher() {
    let pids = PidFile::new("sigkill");
    let script = r#"echo $$ >> "$PIDS"; exec sleep 65"#;
    let mut launcher = Launcher::start(&[
        "-s",
        "1",
        "-w",
        "1",
        "-e",
        &pids.env(),
        "/bin/sh",
        "-c",
        script,
    ]);
    let recorded = pids.wait_for(3);
    let _ = launcher.child.kill();
    let out = launcher.finish();
    assert!(!out.status.success());
    // The kernel delivers the parent-death signal; give the reaper a moment.
    let deadline = Instant::now() + STOPPED_WITHIN;
    while recorded.iter().any(|&pid| still_sleeping(pid, 65)) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(50));
    }
    assert_all_gone(&recorded, 65);
}

#[test]
fn bad_command_lines_are_usage_errors() {
    let help = run(&["--help"]);
    assert!(help.status.success());
    assert!(help.stdout.contains("usage: vans-launch"));
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
        let out = run(args);
        assert_eq!(out.status.code(), Some(2), "args {args:?}");
        assert!(out.stderr.contains("usage: vans-launch"), "args {args:?}");
    }
}

#[test]
fn a_missing_program_fails_with_its_name() {
    let out = run(&["-s", "1", "-w", "1", "--", "/nonexistent/vans-program"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out
        .stderr
        .contains("could not start scheduler (/nonexistent/vans-program)"));

    let out = run(&[
        "-s",
        "1",
        "-w",
        "1",
        "--env",
        "DMLC_NUM_WORKER=4",
        "/bin/true",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stderr.contains("DMLC_NUM_WORKER cannot be set"));
}

#[test]
fn tensorflow_tasks_get_their_tf_config_and_end_with_the_chief() {
    let pids = PidFile::new("tensorflow");
    // Each task prints its TF_CONFIG and what is left of the ps-lite environment; every task
    // but worker 0 (the chief) then serves until stopped, as TensorFlow's do.
    let script = r#"
        echo "$TF_CONFIG"
        echo "role=${DMLC_ROLE:-none} root=${DMLC_PS_ROOT_PORT:-none} rank=${VANS_RANK:-none}"
        echo $$ >> "$PIDS"
        case "$TF_CONFIG" in
            *'"index":0,"type":"worker"'*)
                i=0
                while [ "$(wc -l < "$PIDS")" -lt 4 ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
                exit 0 ;;
        esac
        exec sleep 62
    "#;
    let args = [
        "--tensorflow",
        "-s",
        "2",
        "-w",
        "2",
        "--env",
        &pids.env(),
        "--",
        "/bin/sh",
        "-c",
        script,
    ];
    let inherited = [
        ("DMLC_ROLE", "server"),
        ("DMLC_PS_ROOT_PORT", "1"),
        ("VANS_RANK", "5"),
    ];
    let out = Launcher::start_with(&args, false, &inherited).finish();
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    assert!(out.elapsed < STOPPED_WITHIN, "took {:?}", out.elapsed);
    // No scheduler, and one cluster: two ps tasks, two workers, four different ports.
    assert!(!out.stdout.contains("[scheduler]"), "{}", out.stdout);
    let configs: Vec<serde_json::Value> = out
        .stdout
        .lines()
        .filter_map(|line| line.split_once("] {").map(|(_, json)| format!("{{{json}")))
        .map(|json| serde_json::from_str(&json).unwrap())
        .collect();
    assert_eq!(configs.len(), 4, "{}", out.stdout);
    let cluster = &configs[0]["cluster"];
    let mut addresses: Vec<&str> = ["ps", "worker"]
        .iter()
        .flat_map(|kind| cluster[kind].as_array().unwrap())
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(addresses.len(), 4, "{cluster}");
    assert!(addresses.iter().all(|a| a.starts_with("127.0.0.1:")));
    addresses.sort_unstable();
    addresses.dedup();
    assert_eq!(addresses.len(), 4, "ports repeat: {cluster}");
    let mut tasks: Vec<(String, u64)> = configs
        .iter()
        .map(|c| {
            assert_eq!(&c["cluster"], cluster);
            let task = &c["task"];
            (
                task["type"].as_str().unwrap().to_owned(),
                task["index"].as_u64().unwrap(),
            )
        })
        .collect();
    tasks.sort();
    let expected = [("ps", 0), ("ps", 1), ("worker", 0), ("worker", 1)];
    assert_eq!(tasks, expected.map(|(k, i)| (k.to_owned(), i)));
    // Inherited ps-lite variables are removed: only TF_CONFIG describes the cluster.
    assert_eq!(
        out.stdout.matches("role=none root=none rank=none").count(),
        4,
        "{}",
        out.stdout
    );
    assert!(
        out.stderr.contains("worker 0, the chief, exited 0"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("(3 stopped by the launcher)"),
        "{}",
        out.stderr
    );
    let recorded = pids.pids();
    assert_eq!(recorded.len(), 4, "pids {recorded:?}");
    assert_all_gone(&recorded, 62);

    // A failing worker fails the job, as any node does; --port has no meaning here.
    let out = run(&[
        "--tensorflow",
        "-s",
        "1",
        "-w",
        "2",
        "--",
        "/bin/sh",
        "-c",
        r#"case "$TF_CONFIG" in *'"index":1,"type":"worker"'*) exit 4;; esac; exec sleep 63"#,
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("vans-launch: worker 1 exited with code 4"),
        "{}",
        out.stderr
    );
    let out = run(&[
        "--tensorflow",
        "-p",
        "9999",
        "-s",
        "1",
        "-w",
        "1",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("no scheduler port"), "{}", out.stderr);
}
