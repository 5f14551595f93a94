//! A `vans-master` process for the tests, and `vans-submit` runs against it.

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub(crate) const MASTER: &str = env!("CARGO_BIN_EXE_vans-master");
pub(crate) const SUBMIT: &str = env!("CARGO_BIN_EXE_vans-submit");

/// A running master; killed, and its jobs folder removed, when dropped.
pub(crate) struct Master {
    child: Child,
    pub(crate) addr: String,
    jobs: std::path::PathBuf,
    /// The token it was started with (`VANS_MASTER_TOKEN` among its variables), which
    /// [`get`](Self::get) and [`submit`](Self::submit) present.
    pub(crate) token: Option<jobs::token::Token>,
}

impl Master {
    /// Starts a master with `backend` and extra environment; waits until it answers.
    pub(crate) fn start(backend: &str, env: &[(&str, &str)]) -> Master {
        Master::start_with(backend, &[], env)
    }

    /// [`Master::start`] with more arguments.
    pub(crate) fn start_with(backend: &str, args: &[&str], env: &[(&str, &str)]) -> Master {
        let port = super::free_port();
        let jobs =
            std::env::temp_dir().join(format!("vans-master-test-{}-{port}", std::process::id()));
        let mut cmd = Command::new(MASTER);
        cmd.args([
            "--port",
            &port.to_string(),
            "--backend",
            backend,
            "--jobs-dir",
        ])
        .arg(&jobs)
        .args(args)
        .stdout(Stdio::null());
        // What the master says goes to a file in its jobs folder, shown if it does not come up.
        std::fs::create_dir_all(&jobs).unwrap();
        let log_path = jobs.join("vans-master.log");
        cmd.stderr(std::fs::File::create(&log_path).unwrap());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let token = env
            .iter()
            .find(|(k, _)| *k == jobs::token::TOKEN_ENV)
            .map(|(_, v)| jobs::token::Token::new(v).unwrap());
        let mut master = Master {
            child: cmd.spawn().unwrap(),
            addr: format!("127.0.0.1:{port}"),
            jobs,
            token,
        };
        let started = Instant::now();
        while std::net::TcpStream::connect(&master.addr).is_err() {
            let exited = master.child.try_wait().ok().flatten();
            if exited.is_some() || started.elapsed() > Duration::from_secs(30) {
                panic!(
                    "vans-master did not listen ({}): {}",
                    exited.map_or("still running after 30 s".into(), |s| s.to_string()),
                    std::fs::read_to_string(&log_path).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        master
    }

    /// What the master has written to its log (stderr) so far.
    #[allow(dead_code)] // not every test binary reads it
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.jobs.join("vans-master.log")).unwrap_or_default()
    }

    /// Submits a TensorFlow job (`--tensorflow`) of 2 ps and 2 worker tasks named `task`,
    /// with the variables `env` (`NAME=VALUE`), each task running `command`.
    #[allow(dead_code)] // not every test binary submits one
    pub(crate) fn submit_tensorflow(&self, task: &str, env: &[&str], command: &[&str]) -> Output {
        let mut args = vec![
            "--strategy",
            "ParameterServer",
            "--ps-num",
            "2",
            "--worker-num",
            "2",
            "--tensorflow",
            "--task",
            task,
        ];
        for e in env {
            args.extend(["--env", e]);
        }
        args.push("--");
        args.extend_from_slice(command);
        self.submit(&args)
    }

    /// Submits a parameter-server job of one worker whose task `task` runs `command`.
    pub(crate) fn submit_task(&self, task: &str, command: &[&str]) -> Output {
        let mut args = vec![
            "--strategy",
            "ParameterServer",
            "--worker-num",
            "1",
            "--task",
            task,
            "--",
        ];
        args.extend_from_slice(command);
        self.submit(&args)
    }

    /// `vans-submit` against this master with `args`; its output.
    pub(crate) fn submit(&self, args: &[&str]) -> Output {
        let mut submit = Command::new(SUBMIT);
        submit.env_remove(jobs::token::TOKEN_ENV);
        if let Some(token) = &self.token {
            submit.env(jobs::token::TOKEN_ENV, token.expose());
        }
        let child = submit
            .args(["--master", &format!("http://{}", self.addr)])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        super::wait_output(child, "vans-submit")
    }

    /// `GET path` on the master: status and body.
    pub(crate) fn get(&self, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime
            .block_on(jobs::client::request(
                &self.addr,
                method,
                path,
                body,
                self.token.as_ref(),
            ))
            .unwrap()
    }
}

/// (name, state, exit code) of each task of a job's status.
pub(crate) fn task_states(status: &serde_json::Value) -> Vec<(String, String, Option<i64>)> {
    status["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap().to_owned(),
                t["state"].as_str().unwrap().to_owned(),
                t["exit_code"].as_i64(),
            )
        })
        .collect()
}

impl Drop for Master {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.jobs);
    }
}
