//! `vans-master` with the local backend, driven by `vans-submit` and by plain HTTP: a
//! parameter-server job and an all-reduce job run to the end with exact results, a failing
//! job is reported with its task's log, a job is stopped, and bad submissions are refused.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::master::Master;

/// One master at a time: each picks its tasks' ports in its own process, so two running at
/// once could hand the same free port to two tasks, and the second bind fails.
static ONE_MASTER: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_master() -> std::sync::MutexGuard<'static, ()> {
    ONE_MASTER.lock().unwrap_or_else(|e| e.into_inner())
}

fn job(master: &Master, id: u64) -> serde_json::Value {
    let (code, body) = master.get("GET", &format!("/jobs/{id}"), None);
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

#[test]
fn a_parameter_server_and_an_allreduce_job_run_to_the_end() {
    let _one = one_master();
    let master = Master::start("local", &[]);
    let ps = master.submit(&[
        "--strategy",
        "ParameterServer",
        "--ps-num",
        "2",
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
        text.contains("job 1: succeeded (tasks: 5 succeeded)"),
        "{text}"
    );
    // The master's log has the job's transitions and each task's end.
    let said = master.log();
    for line in [
        "job 1 (ps): submitted, 5 tasks on the local backend",
        "job 1: running",
        "job 1: task worker-0 succeeded",
        "job 1 succeeded",
    ] {
        assert!(
            said.contains(line),
            "{line:?} not in the master's log:\n{said}"
        );
    }
    // The client showed the job's progress on the way: submitted, then every task running.
    let submitted = text.find("job 1 (ps) submitted to ").expect(&text);
    let running = text.find("job 1: running (tasks: 5 running)").expect(&text);
    let ended = text.find("job 1: succeeded").expect(&text);
    assert!(submitted < running && running < ended, "{text}");
    for worker in ["worker-0", "worker-1"] {
        let (code, log) = master.get("GET", &format!("/jobs/1/logs/{worker}"), None);
        assert_eq!(code, 200);
        assert!(
            log.contains("exact sums verified for 16 keys from 2 workers"),
            "{log}"
        );
    }
    let status = job(&master, 1);
    assert_eq!(status["state"], "succeeded");
    assert!(status["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .all(|t| t["exit_code"] == 0));

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
    let (code, body) = master.get("GET", "/jobs", None);
    assert_eq!(code, 200);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&body)
            .unwrap()
            .as_array()
            .map(Vec::len),
        Some(2)
    );
}

#[test]
fn failures_stops_and_refusals() {
    let _one = one_master();
    let master = Master::start("local", &[]);
    // Every task fails: the job fails, and vans-submit shows a failed task's log.
    let failing = master.submit(&[
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
        "echo about to fail; exit 3",
    ]);
    let text = common::text(&failing);
    assert_eq!(failing.status.code(), Some(1), "{text}");
    assert!(text.contains("job 1: failed"), "{text}");
    assert!(text.contains("exited with exit status: 3"), "{text}");
    assert!(text.contains("about to fail"), "{text}");
    // A job stopped on request.
    let spec = serde_json::json!({
        "name": "sleepy", "strategy": "ParameterServer", "ps_num": 1, "worker_num": 1,
        "command": ["sleep", "60"],
    });
    let (code, body) = master.get("POST", "/jobs", Some(&spec.to_string()));
    assert_eq!(code, 201, "{body}");
    let (code, body) = master.get("DELETE", "/jobs/2", None);
    assert_eq!(code, 200);
    // The answer comes once the tasks are stopped: its job and task states agree.
    let answered: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answered["state"], "stopped", "{answered}");
    assert!(
        common::master::task_states(&answered)
            .iter()
            .all(|(_, state, _)| state == "stopped"),
        "{answered}"
    );
    let started = std::time::Instant::now();
    while job(&master, 2)["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["state"] == "running")
    {
        assert!(started.elapsed().as_secs() < 20, "{}", job(&master, 2));
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(job(&master, 2)["state"], "stopped");
    // Refused: no workers, a bad name, a command that does not exist, not JSON.
    for (spec, why) in [
        (
            r#"{"name":"x","strategy":"AllReduce","ps_num":0,"worker_num":0,"command":["true"]}"#,
            "worker_num",
        ),
        (
            r#"{"name":"a b","strategy":"AllReduce","ps_num":0,"worker_num":1,"command":["true"]}"#,
            "task name",
        ),
        (
            r#"{"name":"x","strategy":"AllReduce","ps_num":0,"worker_num":1,"command":["/no/such/program"]}"#,
            "cannot start",
        ),
    ] {
        let (code, body) = master.get("POST", "/jobs", Some(spec));
        assert_eq!(code, 400, "{spec}: {body}");
        assert!(body.contains(why), "{spec}: {body}");
    }
    let (code, _) = master.get("POST", "/jobs", Some("not json"));
    assert!((400..500).contains(&code), "{code}");
    let (code, _) = master.get("GET", "/jobs/99", None);
    assert_eq!(code, 404);
    // --image is for the Kubernetes backend: this master refuses it.
    let image = master.submit(&[
        "--strategy",
        "AllReduce",
        "--ps-num",
        "0",
        "--worker-num",
        "2",
        "--task",
        "img",
        "--image",
        "allreduce",
    ]);
    assert_eq!(image.status.code(), Some(2));
    let text = common::text(&image);
    assert!(
        text.contains("(400)") && text.contains("images run on the kubernetes backend"),
        "{text}"
    );
}

/// Polls job `id` until `done` holds of its status (within three minutes: the collective's own
/// waits for a generation to settle are 30 to 60 s); returns that status.
fn until(
    master: &Master,
    id: u64,
    what: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let started = std::time::Instant::now();
    loop {
        let status = job(master, id);
        if done(&status) {
            return status;
        }
        if started.elapsed().as_secs() >= 180 {
            // Every task's log, so a failure in CI can be read.
            for task in status["tasks"].as_array().into_iter().flatten() {
                let name = task["name"].as_str().unwrap_or("");
                let log = master
                    .get("GET", &format!("/jobs/{id}/logs/{name}"), None)
                    .1;
                eprintln!("--- log of {name}:\n{log}");
            }
            panic!("job {id}: no {what}: {status}");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn an_elastic_job_starts_a_killed_worker_again_and_finishes() {
    let _one = one_master();
    let master = Master::start("local", &[]);
    let spec = serde_json::json!({
        "name": "elastic", "strategy": "AllReduce", "ps_num": 0, "worker_num": 3,
        "elastic": true, "max_restarts": 2,
        "command": [common::ALLREDUCE_BENCH.as_str(), "node", "elastic", "--steps", "300", "--len", "2000",
                    "--step-ms", "30"],
        "env": {"PS_HEARTBEAT_INTERVAL": "1", "PS_HEARTBEAT_TIMEOUT": "10"},
    });
    let (code, body) = master.get("POST", "/jobs", Some(&spec.to_string()));
    assert_eq!(code, 201, "{body}");
    let id = serde_json::from_str::<serde_json::Value>(&body).unwrap()["id"]
        .as_u64()
        .unwrap();
    let worker = |status: &serde_json::Value, name: &str| {
        status["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .cloned()
            .unwrap()
    };
    let log = |task: &str| {
        master
            .get("GET", &format!("/jobs/{id}/logs/{task}"), None)
            .1
    };
    let running = until(&master, id, "running tasks", |s| s["state"] == "running");
    let pid = worker(&running, "worker-1")["pid"].as_u64().unwrap();
    // Mid-run: kill -9 a worker once its loop has taken 30 of its 300 steps (a kill while the
    // cluster forms would test the registration, not the elastic restart; on a loaded machine
    // forming can take longer than the whole loop takes on an idle one).
    until(&master, id, "step 30 of worker-1", |_| {
        log("worker-1")
            .lines()
            .filter_map(|l| {
                l.strip_prefix("step ")?
                    .split(' ')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .any(|step| step >= 30)
    });
    common::signal(u32::try_from(pid).unwrap(), "KILL");
    let status = until(&master, id, "end", |s| {
        ["succeeded", "failed", "stopped"].contains(&s["state"].as_str().unwrap_or(""))
    });
    assert_eq!(status["state"], "succeeded", "{status}");
    let restarted = worker(&status, "worker-1");
    assert_eq!(restarted["restarts"], 1, "{restarted}: {}", log("worker-1"));
    assert_ne!(restarted["pid"].as_u64(), Some(pid), "a new process");
    for (name, restarts) in [("worker-0", 0), ("worker-2", 0)] {
        assert_eq!(worker(&status, name)["restarts"], restarts);
    }
    let survivor = log("worker-0");
    assert!(survivor.contains("elastic ok: 300 steps"), "{survivor}");
    // A survivor names the failure. Which one does depends on timing: the coordinator
    // (worker-0, rank 0 since the master gives each task its index as VANS_RANK) may learn
    // of the death through a member asking to form the next generation before its own
    // exchange fails; the member then saw the failure itself.
    let other = log("worker-2");
    assert!(
        [&survivor, &other]
            .iter()
            .any(|log| log.lines().any(|l| l.contains("of generation 1 failed"))),
        "no survivor saw the failure named:\n{survivor}\n---\n{other}"
    );
    assert!(other.contains("elastic ok: 300 steps"), "{other}");
    let replaced = log("worker-1");
    assert!(
        replaced.contains("vans-master: worker-1 exited with signal: 9")
            && replaced.contains("starting it again (restart 1 of 2)")
            && replaced.contains("elastic ok: 300 steps"),
        "{replaced}"
    );
}

#[test]
fn a_tensorflow_job_gets_tf_config_and_ends_with_its_chief() {
    let _one = one_master();
    let master = Master::start("local", &[]);
    // Each task writes its TF_CONFIG and what is left of the ps-lite variables; the others
    // then mark themselves written (a file each in `ready`) and serve until stopped, as
    // TensorFlow's tasks do, and the chief (worker-0) exits 0 once all three have, so no task
    // is stopped before its lines are in its log.
    let ready = std::env::temp_dir().join(format!("vans-tf-ready-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&ready);
    std::fs::create_dir_all(&ready).unwrap();
    let script = r#"
        echo "$TF_CONFIG"
        echo "role=${DMLC_ROLE:-none} rank=${VANS_RANK:-none}"
        case "$TF_CONFIG" in
            *'"index":0,"type":"worker"'*)
                waited=0
                while [ "$(ls "$READY" | wc -l)" -lt 3 ]; do
                    waited=$((waited + 1))
                    [ "$waited" -gt 600 ] && { echo "the other tasks never wrote"; exit 1; }
                    sleep 0.1
                done
                exit 0 ;;
        esac
        touch "$READY/$$"
        exec sleep 64
    "#;
    let ready_var = format!("READY={}", ready.display());
    let tf = master.submit_tensorflow("tf", &[&ready_var], &["/bin/sh", "-c", script]);
    let _ = std::fs::remove_dir_all(&ready);
    let text = common::text(&tf);
    assert!(tf.status.success(), "{text}");
    let status = job(&master, 1);
    assert_eq!(status["state"], "succeeded", "{status}");
    let tasks = status["tasks"].as_array().unwrap();
    let names: Vec<&str> = tasks.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["ps-0", "ps-1", "worker-0", "worker-1"], "{status}");
    let states: Vec<&str> = tasks.iter().map(|t| t["state"].as_str().unwrap()).collect();
    assert_eq!(
        states,
        ["stopped", "stopped", "succeeded", "stopped"],
        "{status}"
    );
    let mut addresses = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let (code, log) = master.get("GET", &format!("/jobs/1/logs/{name}"), None);
        assert_eq!(code, 200, "{log}");
        let mut lines = log.lines();
        let config: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
        let (kind, index) = name.split_once('-').unwrap();
        assert_eq!(config["task"]["type"], kind, "{log}");
        assert_eq!(
            config["task"]["index"],
            index.parse::<u64>().unwrap(),
            "{log}"
        );
        assert_eq!(lines.next(), Some("role=none rank=none"), "{log}");
        let listed = &config["cluster"][kind][index.parse::<usize>().unwrap()];
        addresses.push(listed.as_str().unwrap().to_owned());
        assert_eq!(
            config["cluster"]["ps"].as_array().unwrap().len(),
            2,
            "task {i}"
        );
        assert_eq!(config["cluster"]["worker"].as_array().unwrap().len(), 2);
    }
    addresses.sort();
    addresses.dedup();
    assert_eq!(addresses.len(), 4, "{addresses:?}");
    assert!(master
        .log()
        .contains("job 1: worker-0, the chief, exited 0; stopping the tasks left"));

    // Elastic TensorFlow jobs are refused, with the reason.
    let refused = master.submit(&[
        "--strategy",
        "ParameterServer",
        "--worker-num",
        "1",
        "--tensorflow",
        "--elastic",
        "--task",
        "tf2",
        "--",
        "true",
    ]);
    assert!(!refused.status.success());
    assert!(
        common::text(&refused).contains("cannot be elastic"),
        "{}",
        common::text(&refused)
    );
    drop(master);
}
