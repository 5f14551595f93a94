//! Jobs under a real Slurm (Debian's `slurm-wlm` 22.05 and `munge`, which `scripts/setup.sh`
//! installs): each test starts its own single-node Slurm in a temporary directory (munged,
//! slurmctld and slurmd on loopback ports, the node named `localhost`), then runs vans jobs
//! with `srun` and with the batch scripts of `deploy/slurm/`, whose tasks take their roles
//! from their Slurm ranks. Needs root (the daemons run as root); without it each test says it
//! skipped.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A single-node Slurm of our own; stopped and removed when dropped.
struct Slurm {
    dir: PathBuf,
    /// One Slurm at a time: of three started at once on 2 cores (the tests run in parallel),
    /// one's slurmd never registered in a run of the test command. Fields drop after
    /// `Drop::drop`, so the turn passes on once the daemons are stopped.
    _turn: std::sync::MutexGuard<'static, ()>,
}

/// Whose turn it is to run a Slurm (see [`Slurm::_turn`]).
static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}: {}", common::text(&out));
    out
}

impl Slurm {
    /// Starts the daemons, or says why this machine cannot (then the test skips).
    fn start(tag: &str) -> Option<Slurm> {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: the Slurm daemons need root");
            return None;
        }
        for program in ["munged", "slurmctld", "slurmd", "srun", "sbatch"] {
            if Command::new("sh")
                .args(["-c", &format!("command -v {program}")])
                .output()
                .map_or(true, |o| !o.status.success())
            {
                panic!("{program} not found: run scripts/setup.sh (Debian: slurm-wlm, munge)");
            }
        }
        // A test that failed while it held the turn poisons the lock; the turn is still free.
        let turn = TURN
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let dir = std::env::temp_dir().join(format!("vans-slurm-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for sub in ["state", "spool", "log", "munge"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        let slurm = Slurm { dir, _turn: turn };
        let d = |p: &str| slurm.dir.join(p).to_string_lossy().into_owned();
        // munged wants its socket folder 755 and its key 600.
        run(Command::new("chmod").args(["755", &d("munge")]));
        let key: Vec<u8> = (0..128).map(|i| (i * 97 + 13) as u8).collect();
        std::fs::write(slurm.dir.join("munge/munge.key"), key).unwrap();
        run(Command::new("chmod").args(["600", &d("munge/munge.key")]));
        run(Command::new("munged").args([
            "--force",
            &format!("--key-file={}", d("munge/munge.key")),
            &format!("--socket={}", d("munge/munge.socket")),
            &format!("--pid-file={}", d("munge/munged.pid")),
            &format!("--log-file={}", d("log/munged.log")),
            &format!("--seed-file={}", d("munge/seed")),
        ]));
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
        let conf = format!(
            "ClusterName=vans\n\
             SlurmctldHost={host}(127.0.0.1)\n\
             SlurmctldPort={ctld}\n\
             SlurmdPort={slurmd}\n\
             AuthType=auth/munge\n\
             AuthInfo=socket={socket}\n\
             CredType=cred/munge\n\
             SlurmUser=root\n\
             SlurmdUser=root\n\
             StateSaveLocation={state}\n\
             SlurmdSpoolDir={spool}\n\
             SlurmctldPidFile={dir}/slurmctld.pid\n\
             SlurmdPidFile={dir}/slurmd.pid\n\
             SlurmctldLogFile={dir}/log/slurmctld.log\n\
             SlurmdLogFile={dir}/log/slurmd.log\n\
             ProctrackType=proctrack/linuxproc\n\
             TaskPlugin=task/none\n\
             SelectType=select/cons_tres\n\
             MpiDefault=none\n\
             ReturnToService=2\n\
             SlurmdParameters=config_overrides\n\
             NodeName=localhost NodeHostname={host} NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN\n\
             PartitionName=vans Nodes=localhost Default=YES MaxTime=INFINITE State=UP \
             OverSubscribe=YES\n",
            host = hostname.trim(),
            ctld = common::free_port(),
            slurmd = common::free_port(),
            socket = d("munge/munge.socket"),
            state = d("state"),
            spool = d("spool"),
            dir = slurm.dir.display(),
        );
        std::fs::write(slurm.dir.join("slurm.conf"), conf).unwrap();
        run(slurm.command("slurmctld").args(["-f", &d("slurm.conf")]));
        run(slurm
            .command("slurmd")
            .args(["-f", &d("slurm.conf"), "-N", "localhost"]));
        // Ready once the node is idle.
        let started = Instant::now();
        loop {
            let out = slurm.command("sinfo").args(["-h", "-o", "%T"]).output();
            if out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "idle") {
                return Some(slurm);
            }
            if started.elapsed() > Duration::from_secs(60) {
                let log = |name: &str| {
                    std::fs::read_to_string(slurm.dir.join("log").join(name)).unwrap_or_default()
                };
                panic!(
                    "the Slurm node did not become idle:\n--- slurmctld.log\n{}\n--- slurmd.log\n{}",
                    log("slurmctld.log"),
                    log("slurmd.log")
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `program` with this Slurm's configuration.
    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        cmd.env("SLURM_CONF", self.dir.join("slurm.conf"))
            .env_remove("DMLC_ROLE")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        let mut pids = Vec::new();
        for pid_file in ["slurmd.pid", "slurmctld.pid", "munge/munged.pid"] {
            if let Ok(pid) = std::fs::read_to_string(self.dir.join(pid_file)) {
                let pid = pid.trim().to_owned();
                let _ = Command::new("kill").arg(&pid).status();
                pids.push(pid);
            }
        }
        // Removed once the daemons are gone (they write into it until they exit).
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(10)
            && pids
                .iter()
                .any(|pid| Path::new(&format!("/proc/{pid}")).exists())
        {
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn srun_tasks_take_their_roles_from_their_slurm_ranks() {
    let Some(slurm) = Slurm::start("srun") else {
        return;
    };
    let port = common::free_port();
    let child = slurm
        .command("srun")
        .args(["-n", "4", "--kill-on-bad-exit=1"])
        .arg(format!(
            "--export=ALL,DMLC_NUM_SERVER=1,DMLC_PS_ROOT_PORT={port},DMLC_ENABLE_RDMA=0"
        ))
        .args([common::PS_BENCH.as_str(), "--mode", "check", "--keys", "16"])
        .spawn()
        .unwrap();
    let out = common::wait_output(child, "srun");
    let text = common::text(&out);
    assert!(out.status.success(), "{text}");
    common::exact_sums(&text, 16, 2);
}

/// Submits `script` with `sbatch --wait`; its output file's text.
fn sbatch(slurm: &Slurm, script: &str, export: &str, args: &[&str]) -> String {
    let output = slurm.dir.join(format!("{script}.out"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/slurm")
        .join(script);
    let child = slurm
        .command("sbatch")
        .args(["--wait", "-o"])
        .arg(&output)
        .arg(format!("--export=ALL,DMLC_ENABLE_RDMA=0,{export}"))
        .arg(&script)
        .args(args)
        .spawn()
        .unwrap();
    let out = common::wait_output(child, "sbatch");
    let text = std::fs::read_to_string(&output).unwrap_or_default();
    assert!(
        out.status.success(),
        "{script:?}: {}\n{text}",
        common::text(&out)
    );
    text
}

#[test]
fn the_batch_scripts_run_a_parameter_server_and_an_allreduce_job() {
    let Some(slurm) = Slurm::start("sbatch") else {
        return;
    };
    let ps = sbatch(
        &slurm,
        "ps-job.sbatch",
        &format!("VANS_PROGRAM={}", *common::PS_BENCH),
        &["--mode", "check", "--keys", "16"],
    );
    assert!(ps.contains("vans-ps: 4 tasks, 1 server(s)"), "{ps}");
    common::exact_sums(&ps, 16, 2);
    let allreduce = sbatch(
        &slurm,
        "allreduce-job.sbatch",
        &format!("VANS_PROGRAM={}", *common::ALLREDUCE_BENCH),
        &["node", "check"],
    );
    assert!(
        allreduce.contains("vans-allreduce: 3 workers"),
        "{allreduce}"
    );
    let checked = allreduce
        .lines()
        .filter(|l| l.contains("collective check ok") && l.ends_with("of 3"))
        .count();
    assert_eq!(checked, 3, "{allreduce}");
}

#[test]
fn vans_master_runs_submitted_jobs_on_slurm() {
    let Some(slurm) = Slurm::start("master") else {
        return;
    };
    let conf = slurm.dir.join("slurm.conf");
    let master = common::master::Master::start(
        "slurm",
        &[
            ("SLURM_CONF", conf.to_str().unwrap()),
            ("DMLC_ENABLE_RDMA", "0"),
        ],
    );
    let ps = master.submit(&[
        "--strategy",
        "ParameterServer",
        "--ps-num",
        "1",
        "--worker-num",
        "2",
        "--task",
        "ps",
        "--",
        common::PS_BENCH.as_str(),
        "--mode",
        "check",
        "--keys",
        "16",
    ]);
    let text = common::text(&ps);
    assert!(ps.status.success(), "{text}");
    assert!(
        text.contains("slurm backend") && text.contains("succeeded"),
        "{text}"
    );
    let mut logs = String::new();
    for w in 0..2 {
        logs += &master
            .get("GET", &format!("/jobs/1/logs/worker-{w}"), None)
            .1;
    }
    common::exact_sums(&logs, 16, 2);
    let ar = master.submit(&[
        "--strategy",
        "AllReduce",
        "--ps-num",
        "0",
        "--worker-num",
        "3",
        "--task",
        "ar",
        "--",
        common::ALLREDUCE_BENCH.as_str(),
        "node",
        "check",
    ]);
    let text = common::text(&ar);
    assert!(ar.status.success(), "{text}");
    for w in 0..3 {
        let (_, log) = master.get("GET", &format!("/jobs/2/logs/worker-{w}"), None);
        assert!(
            log.contains("collective check ok") && log.contains("of 3"),
            "{log}"
        );
    }
    // A failing job is reported failed.
    let bad = master.submit(&[
        "--strategy",
        "ParameterServer",
        "--ps-num",
        "1",
        "--worker-num",
        "1",
        "--task",
        "bad",
        "--",
        "sh",
        "-c",
        "exit 3",
    ]);
    let text = common::text(&bad);
    assert_eq!(bad.status.code(), Some(1), "{text}");
    assert!(text.contains("failed"), "{text}");
    // Only one task fails: it is named with its own exit code, the others were stopped.
    let one = master.submit(&[
        "--strategy",
        "ParameterServer",
        "--ps-num",
        "1",
        "--worker-num",
        "1",
        "--task",
        "one",
        "--",
        "sh",
        "-c",
        "if [ \"$SLURM_PROCID\" = 2 ]; then exit 5; fi; sleep 30",
    ]);
    let text = common::text(&one);
    assert_eq!(one.status.code(), Some(1), "{text}");
    let (_, body) = master.get("GET", "/jobs/4", None);
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    let tasks = common::master::task_states(&status);
    let states: Vec<(String, String)> = tasks
        .iter()
        .map(|(n, s, _)| (n.clone(), s.clone()))
        .collect();
    assert_eq!(
        states,
        [
            ("scheduler".to_owned(), "stopped".to_owned()),
            ("server-0".to_owned(), "stopped".to_owned()),
            ("worker-0".to_owned(), "failed".to_owned()),
        ],
        "{body}"
    );
    // The others were stopped by srun (SIGTERM, or SIGKILL after its grace period), or
    // before they could write their code.
    for (name, _, code) in &tasks[..2] {
        assert!(matches!(code, None | Some(137 | 143)), "{name}: {body}");
    }
    assert_eq!(tasks[2].2, Some(5), "{body}");
    assert!(
        status["error"]
            .as_str()
            .is_some_and(|e| e.contains("task worker-0 exited with 5")),
        "{body}"
    );
}

/// A port base for a TensorFlow job's tasks (`VANS_TF_PORT_BASE`, ranks on the node above it)
/// below 20,000: neither the kernel's ephemeral ports nor the other tests' picks
/// (`free_port`, 20,000 and up) land there.
fn tf_port_base(tasks: u16) -> u16 {
    let mut base = 10_000 + (std::process::id() % 9_000) as u16;
    while !(0..tasks).all(|r| std::net::TcpListener::bind(("127.0.0.1", base + r)).is_ok()) {
        base = 10_000 + (base - 10_000 + tasks) % 9_000;
    }
    base
}

/// `--tensorflow` jobs on Slurm: each task sets its `TF_CONFIG` from its Slurm rank and the
/// step's nodes (`deploy/slurm/tf-config.sh`), the job ends well with its chief, and — when
/// `VANS_TEST_PYTHON` names a Python with TensorFlow and the vans wheel, as the test command's
/// second pass does — a real TensorFlow job over `grpc+vans` trains to the same bits as over
/// `grpc` (`bindings/python/tests/tf_scripts/tf_job.py`, 2 ps and 2 worker tasks).
#[test]
fn vans_master_runs_tensorflow_jobs_on_slurm() {
    let Some(slurm) = Slurm::start("tensorflow") else {
        return;
    };
    let conf = slurm.dir.join("slurm.conf");
    let master = common::master::Master::start("slurm", &[("SLURM_CONF", conf.to_str().unwrap())]);
    let base = tf_port_base(4);
    let port_base = format!("VANS_TF_PORT_BASE={base}");
    let submit = |task: &str, env: &[&str], command: &[&str]| {
        let env: Vec<&str> = [port_base.as_str()]
            .into_iter()
            .chain(env.iter().copied())
            .collect();
        let out = master.submit_tensorflow(task, &env, command);
        let text = common::text(&out);
        assert!(out.status.success(), "{text}");
        assert!(text.contains("succeeded"), "{text}");
    };
    // Shell tasks: each writes its TF_CONFIG and leaves a mark; the chief (worker 0) exits 0
    // once every task has, the others serve until stopped.
    let marks = slurm.dir.join("marks");
    std::fs::create_dir_all(&marks).unwrap();
    let marks_env = format!("MARKS={}", marks.display());
    let script = r#"
        echo "$TF_CONFIG"
        echo "role=${DMLC_ROLE:-none}"
        touch "$MARKS/$SLURM_PROCID"
        case "$TF_CONFIG" in
            *'"type":"worker","index":0'*)
                for _ in $(seq 600); do
                    [ "$(ls "$MARKS" | wc -l)" -ge 4 ] && exit 0
                    sleep 0.1
                done
                echo "the other tasks did not start"; exit 1 ;;
        esac
        exec sleep 64
    "#;
    submit("tf", &[&marks_env], &["/bin/sh", "-c", script]);
    let (_, body) = master.get("GET", "/jobs/1", None);
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    let states: Vec<(String, String)> = common::master::task_states(&status)
        .into_iter()
        .map(|(name, state, _)| (name, state))
        .collect();
    let expected = [
        ("ps-0", "stopped"),
        ("ps-1", "stopped"),
        ("worker-0", "succeeded"),
        ("worker-1", "stopped"),
    ];
    assert_eq!(
        states,
        expected.map(|(n, s)| (n.to_owned(), s.to_owned())),
        "{body}"
    );
    // One cluster for every task, in rank order on the one node, each task its own.
    let cluster = serde_json::json!({
        "ps": [format!("localhost:{base}"), format!("localhost:{}", base + 1)],
        "worker": [format!("localhost:{}", base + 2), format!("localhost:{}", base + 3)],
    });
    for (name, _) in expected {
        let (code, log) = master.get("GET", &format!("/jobs/1/logs/{name}"), None);
        assert_eq!(code, 200, "{log}");
        let mut lines = log.lines();
        let config: serde_json::Value = serde_json::from_str(lines.next().unwrap_or_default())
            .unwrap_or_else(|e| {
                panic!("{name}: no TF_CONFIG ({e}): {log}");
            });
        let (kind, index) = name.split_once('-').unwrap();
        assert_eq!(config["cluster"], cluster, "{name}: {log}");
        assert_eq!(config["task"]["type"], kind, "{log}");
        assert_eq!(
            config["task"]["index"],
            index.parse::<u64>().unwrap(),
            "{log}"
        );
        assert_eq!(lines.next(), Some("role=none"), "{log}");
    }
    let Ok(python) = std::env::var("VANS_TEST_PYTHON") else {
        eprintln!(
            "skipped the TensorFlow training half: VANS_TEST_PYTHON is not set (the test \
             command sets it once the Python environment exists)"
        );
        return;
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../bindings/python/tests/tf_scripts/tf_job.py")
        .canonicalize()
        .unwrap();
    let mut results = Vec::new();
    for protocol in ["grpc", "grpc+vans"] {
        let out = slurm.dir.join(format!("{protocol}.npz"));
        submit(
            &protocol.replace('+', "-"),
            &["TF_CPP_MIN_LOG_LEVEL=2"],
            &[
                &python,
                script.to_str().unwrap(),
                "--protocol",
                protocol,
                "--steps",
                "5",
                "--out",
                out.to_str().unwrap(),
            ],
        );
        results.push(out);
    }
    // Bit for bit: the losses and every variable; vans carried tensors, grpc none.
    let compare = r#"
import sys
import numpy as np
grpc, vans = (dict(np.load(p)) for p in sys.argv[1:])
assert grpc.pop("received") == 0 and vans.pop("received") > 0
assert grpc.keys() == vans.keys()
for name in grpc:
    np.testing.assert_array_equal(grpc[name], vans[name], err_msg=name)
print("equal:", sorted(grpc))
"#;
    let check = Command::new(&python)
        .args(["-c", compare])
        .args(&results)
        .output()
        .unwrap();
    let text = common::text(&check);
    assert!(check.status.success(), "{text}");
    assert!(text.contains("equal: ['losses', 'v0', 'v1']"), "{text}");
}
