//! `vans-master` with the local backend, driven by `vans-submit` and by plain HTTP: a
//! parameter-server job and an all-reduce job run to the end with exact results, a failing
//! job is reported with its task's log, a job is stopped, and bad submissions are refused.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::master::Master;

const PS_BENCH: &str = env!("CARGO_BIN_EXE_ps-bench");
const ALLREDUCE_BENCH: &str = env!("CARGO_BIN_EXE_allreduce-bench");

fn job(master: &Master, id: u64) -> serde_json::Value {
    let (code, body) = master.get("GET", &format!("/jobs/{id}"), None);
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

#[test]
fn a_parameter_server_and_an_allreduce_job_run_to_the_end() {
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
        PS_BENCH,
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
        ALLREDUCE_BENCH,
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
    let (code, _) = master.get("DELETE", "/jobs/2", None);
    assert_eq!(code, 200);
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
