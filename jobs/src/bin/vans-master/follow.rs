//! The one loop that follows a job, whatever its backend: it looks at the tasks through the
//! backend's [`Watch`] at the backend's pace, records each task's state and exit code, starts
//! a failed worker of an elastic job again when the backend can, stops the other tasks on
//! the first failure or when the job is asked to stop, and gives the job its final state.
//!
//! A backend says only what it sees ([`Watch::look`]) and how to stop, and perhaps restart,
//! its tasks; the rules are here: which failure ends the job, that a task ending after the
//! job was told to stop counts as stopped, that no worker is restarted once the scheduler or
//! a server has ended (it could not rejoin), and that when the loop ends no task is left
//! pending or running in the status.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use jobs::{JobSpec, State};

use crate::Jobs;

/// What a backend sees of one task.
pub(crate) struct Seen {
    /// The task's state.
    pub(crate) state: State,
    /// Its exit code, once it ended with one.
    pub(crate) exit_code: Option<i32>,
    /// What happened to it, after "task NAME ": its failure in the job's error
    /// (`exited with exit status: 3`, `failed: its container is stuck: ErrImagePull`).
    pub(crate) why: String,
}

impl Seen {
    /// A task in `state`, no exit code yet.
    pub(crate) fn now(state: State) -> Seen {
        Seen {
            state,
            exit_code: None,
            why: String::new(),
        }
    }
}

/// What a backend sees at one look.
#[derive(Default)]
pub(crate) struct Look {
    /// Tasks by name; a task left out is as it was.
    pub(crate) tasks: Vec<(String, Seen)>,
    /// The job failed as a whole (its Slurm job lost, its pods unlisted for too long): the
    /// loop stops the tasks and ends.
    pub(crate) failed: Option<String>,
}

/// A backend's view of one job's tasks.
pub(crate) trait Watch: Send + 'static {
    /// The time between two looks.
    const EVERY: Duration;

    /// Looks at the tasks once.
    fn look(&mut self) -> impl Future<Output = Look> + Send;

    /// Stops the tasks still running. `true` when nothing is left to look at (their objects
    /// deleted); `false` when the next looks see them end.
    fn stop(&mut self) -> impl Future<Output = bool> + Send;

    /// After a job failed or was stopped, even with every task ended: removes what the
    /// backend leaves behind (Kubernetes: the job's objects). Nothing by default.
    fn clean_up(&mut self) -> impl Future<Output = ()> + Send {
        std::future::ready(())
    }

    /// Starts failed task `name` again in its place, the `attempt`-th time of at most `max`
    /// (`why`: how it ended): `None` when this backend does not restart tasks, else the new
    /// process's id or why it could not start.
    fn restart(
        &mut self,
        name: &str,
        why: &str,
        attempt: u32,
        max: u32,
    ) -> impl Future<Output = Option<Result<u32, String>>> + Send {
        let _ = (name, why, attempt, max);
        std::future::ready(None)
    }
}

/// Follows job `id` with `watch` on the runtime, until every task ended or the job failed
/// or was stopped (its `stop` flag).
pub(crate) fn spawn(jobs: Jobs, id: u64, spec: &JobSpec, stop: Arc<AtomicBool>, watch: impl Watch) {
    let restarts = Restarts {
        elastic: spec.elastic,
        max: spec.max_restarts,
        tensorflow: spec.tensorflow,
    };
    // The job's state from its tasks' as the backend started them, before the first look.
    settle_job_state(&jobs, id);
    tokio::spawn(follow(jobs, id, restarts, stop, watch));
}

/// When a failed task is started again: a worker of an elastic job, up to `max` times.
struct Restarts {
    elastic: bool,
    max: u32,
    /// A TensorFlow job: it ends, well, when `worker-0` (the chief) does.
    tensorflow: bool,
}

async fn follow<W: Watch>(
    jobs: Jobs,
    id: u64,
    restarts: Restarts,
    stop: Arc<AtomicBool>,
    mut watch: W,
) {
    let mut stopping = false;
    let mut failure: Option<String> = None;
    // A TensorFlow job's chief has exited 0: the tasks left serve until stopped.
    let mut chief_done = false;
    // The scheduler or a server has ended: a worker started again could not rejoin.
    let mut support_gone = false;
    loop {
        if (stop.load(Ordering::Acquire) || failure.is_some() || chief_done) && !stopping {
            if chief_done && failure.is_none() {
                eprintln!(
                    "vans-master: job {id}: worker-0, the chief, exited 0; stopping the tasks \
                     left (they serve until stopped)"
                );
            }
            stopping = true;
            if watch.stop().await {
                break;
            }
        }
        let look = watch.look().await;
        for (name, seen) in look.tasks {
            let Some((role, before, restarted)) = task(&jobs, id, &name) else {
                continue;
            };
            if before.is_final() {
                continue;
            }
            let restart = seen.state == State::Failed
                && !stopping
                && failure.is_none()
                && !support_gone
                && restarts.elastic
                && role == "worker"
                && restarted < restarts.max;
            if restart {
                match watch
                    .restart(&name, &seen.why, restarted + 1, restarts.max)
                    .await
                {
                    Some(Ok(pid)) => {
                        eprintln!(
                            "vans-master: job {id}: task {name} {}; started again ({} of {})",
                            seen.why,
                            restarted + 1,
                            restarts.max
                        );
                        jobs.update(id, |job| {
                            if let Some(t) = job.status.tasks.iter_mut().find(|t| t.name == name) {
                                (t.pid, t.restarts, t.state) =
                                    (Some(pid), restarted + 1, State::Running);
                            }
                        });
                        continue;
                    }
                    Some(Err(e)) => {
                        failure = Some(format!("task {name} could not be restarted: {e}"));
                    }
                    None => {}
                }
            }
            // Ended after the job was told to stop: stopped, whatever its exit.
            let state = match seen.state {
                State::Failed if stopping => State::Stopped,
                state => state,
            };
            jobs.update(id, |job| {
                if let Some(t) = job.status.tasks.iter_mut().find(|t| t.name == name) {
                    (t.state, t.exit_code) = (state, seen.exit_code.or(t.exit_code));
                }
            });
            if state.is_final() {
                support_gone |= role != "worker";
                let state = format!("{state:?}").to_lowercase();
                eprintln!("vans-master: job {id}: task {name} {state}: {}", seen.why);
            }
            if state == State::Failed && failure.is_none() {
                failure = Some(format!("task {name} {}", seen.why));
            }
            chief_done |= restarts.tensorflow && name == "worker-0" && state == State::Succeeded;
        }
        if let Some(why) = look.failed {
            failure.get_or_insert(why);
            if !stopping {
                watch.stop().await;
            }
            break;
        }
        if settle_job_state(&jobs, id) {
            break;
        }
        tokio::time::sleep(W::EVERY).await;
    }
    let asked = stop.load(Ordering::Acquire);
    if asked || failure.is_some() {
        watch.clean_up().await;
    }
    jobs.update(id, |job| {
        for t in &mut job.status.tasks {
            if !t.state.is_final() {
                t.state = State::Stopped;
            }
        }
        job.status.state = if asked {
            State::Stopped
        } else if failure.is_some() {
            State::Failed
        } else {
            State::Succeeded
        };
        job.status.error = failure.clone();
    });
    match &failure {
        Some(why) if !asked => eprintln!("vans-master: job {id} failed: {why}"),
        _ if asked => eprintln!("vans-master: job {id} stopped"),
        _ => eprintln!("vans-master: job {id} succeeded"),
    }
}

/// Task `name` of job `id`: its role, state and restarts so far.
fn task(jobs: &Jobs, id: u64, name: &str) -> Option<(String, State, u32)> {
    let mut found = None;
    jobs.update(id, |job| {
        found = job
            .status
            .tasks
            .iter()
            .find(|t| t.name == name)
            .map(|t| (t.role.clone(), t.state, t.restarts));
    });
    found
}

/// Gives job `id`, while it is not over, the state its tasks show (pending while every task
/// not ended is pending, else running); `true` when every task has ended.
fn settle_job_state(jobs: &Jobs, id: u64) -> bool {
    let mut ended = false;
    jobs.update(id, |job| {
        let mut open = job
            .status
            .tasks
            .iter()
            .filter(|t| !t.state.is_final())
            .peekable();
        ended = open.peek().is_none();
        let waiting = open.all(|t| t.state == State::Pending);
        if !job.status.state.is_final() && !ended {
            let state = if waiting {
                State::Pending
            } else {
                State::Running
            };
            if job.status.state != state {
                let name = format!("{state:?}").to_lowercase();
                eprintln!("vans-master: job {id}: {name}");
            }
            job.status.state = state;
        }
    });
    ended
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::path::PathBuf;
    use std::sync::Mutex;

    use jobs::{JobStatus, Strategy, TaskStatus};

    use super::*;
    use crate::Job;

    /// What the loop asked of the backend, in order.
    #[derive(Debug, Clone, PartialEq, Eq)]
    enum Call {
        Look,
        Stop,
        CleanUp,
        Restart(String, u32),
    }

    /// A backend that plays looks from a script (the last one repeats) and records calls.
    struct Script {
        looks: VecDeque<Vec<(&'static str, State, Option<i32>)>>,
        failed_at: Option<usize>,
        stop_ends: bool,
        calls: Arc<Mutex<Vec<Call>>>,
        looked: usize,
    }

    impl Watch for Script {
        const EVERY: Duration = Duration::from_millis(1);

        async fn look(&mut self) -> Look {
            self.calls.lock().unwrap().push(Call::Look);
            self.looked += 1;
            let tasks = if self.looks.len() > 1 {
                self.looks.pop_front().unwrap_or_default()
            } else {
                self.looks.front().cloned().unwrap_or_default()
            };
            Look {
                tasks: tasks
                    .into_iter()
                    .map(|(name, state, code)| {
                        let why = format!("exited with {code:?}");
                        (
                            name.to_owned(),
                            Seen {
                                state,
                                exit_code: code,
                                why,
                            },
                        )
                    })
                    .collect(),
                failed: (self.failed_at == Some(self.looked)).then(|| "lost".to_owned()),
            }
        }

        async fn stop(&mut self) -> bool {
            self.calls.lock().unwrap().push(Call::Stop);
            self.stop_ends
        }

        async fn clean_up(&mut self) {
            self.calls.lock().unwrap().push(Call::CleanUp);
        }

        async fn restart(
            &mut self,
            name: &str,
            _why: &str,
            attempt: u32,
            _max: u32,
        ) -> Option<Result<u32, String>> {
            self.calls
                .lock()
                .unwrap()
                .push(Call::Restart(name.to_owned(), attempt));
            Some(Ok(1000 + attempt))
        }
    }

    const TASKS: [(&str, &str); 4] = [
        ("scheduler", "scheduler"),
        ("server-0", "server"),
        ("worker-0", "worker"),
        ("worker-1", "worker"),
    ];

    /// A job of [`TASKS`], every task running.
    fn jobs(elastic: bool) -> (Jobs, Arc<AtomicBool>) {
        let spec: JobSpec = serde_json::from_value(serde_json::json!({
            "name": "t", "strategy": "ParameterServer", "ps_num": 1, "worker_num": 2,
            "command": ["true"], "elastic": elastic, "max_restarts": 1,
        }))
        .unwrap();
        assert_eq!(spec.strategy, Strategy::ParameterServer);
        let status = JobStatus {
            id: 1,
            spec,
            backend: "test".into(),
            state: State::Running,
            tasks: TASKS
                .iter()
                .map(|(name, role)| TaskStatus {
                    name: (*name).into(),
                    role: (*role).into(),
                    state: State::Running,
                    exit_code: None,
                    restarts: 0,
                    pid: None,
                })
                .collect(),
            error: None,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let jobs = Jobs {
            inner: Arc::default(),
        };
        jobs.inner.lock().unwrap().insert(
            1,
            Job {
                status,
                dir: PathBuf::new(),
                stop: Arc::clone(&stop),
            },
        );
        (jobs, stop)
    }

    fn all(state: State, code: Option<i32>) -> Vec<(&'static str, State, Option<i32>)> {
        TASKS.iter().map(|(name, _)| (*name, state, code)).collect()
    }

    /// Follows job 1 with `script` to the end: the job's status and the backend's calls.
    async fn run(jobs: &Jobs, stop: Arc<AtomicBool>, script: Script) -> (JobStatus, Vec<Call>) {
        let calls = Arc::clone(&script.calls);
        let spec = jobs.inner.lock().unwrap()[&1].status.spec.clone();
        let restarts = Restarts {
            elastic: spec.elastic,
            max: spec.max_restarts,
            tensorflow: spec.tensorflow,
        };
        tokio::time::timeout(
            Duration::from_secs(10),
            follow(jobs.clone(), 1, restarts, stop, script),
        )
        .await
        .expect("the loop ended");
        let status = jobs.inner.lock().unwrap()[&1].status.clone();
        let calls = calls.lock().unwrap().clone();
        (status, calls)
    }

    fn script(looks: Vec<Vec<(&'static str, State, Option<i32>)>>) -> Script {
        Script {
            looks: looks.into(),
            failed_at: None,
            stop_ends: false,
            calls: Arc::default(),
            looked: 0,
        }
    }

    fn states(status: &JobStatus) -> Vec<(String, State, Option<i32>, u32)> {
        status
            .tasks
            .iter()
            .map(|t| (t.name.clone(), t.state, t.exit_code, t.restarts))
            .collect()
    }

    #[tokio::test]
    async fn every_task_ending_well_ends_the_job_well_without_stopping_anything() {
        let (jobs, stop) = jobs(false);
        let looks = vec![all(State::Running, None), all(State::Succeeded, Some(0))];
        let (status, calls) = run(&jobs, stop, script(looks)).await;
        assert_eq!(status.state, State::Succeeded);
        assert_eq!(status.error, None);
        assert!(status.tasks.iter().all(|t| t.state == State::Succeeded));
        assert_eq!(calls, [Call::Look, Call::Look]);
    }

    #[tokio::test]
    async fn a_tensorflow_job_ends_well_with_its_chief_and_the_rest_count_as_stopped() {
        let (jobs, stop) = jobs(false);
        jobs.update(1, |job| job.status.spec.tensorflow = true);
        let mut chief_done = all(State::Running, None);
        chief_done[2] = ("worker-0", State::Succeeded, Some(0));
        // Killed by the stop: they end as failed, with SIGKILL's code.
        let mut killed = all(State::Failed, Some(137));
        killed[2] = ("worker-0", State::Succeeded, Some(0));
        let (status, calls) = run(&jobs, stop, script(vec![chief_done, killed])).await;
        assert_eq!(status.state, State::Succeeded);
        assert_eq!(status.error, None);
        let s = states(&status);
        assert_eq!(s[2], ("worker-0".into(), State::Succeeded, Some(0), 0));
        for i in [0, 1, 3] {
            assert_eq!(s[i].1, State::Stopped, "{:?}", s[i]);
        }
        assert_eq!(calls.iter().filter(|c| **c == Call::Stop).count(), 1);
        assert!(!calls.contains(&Call::CleanUp), "{calls:?}");
    }

    #[tokio::test]
    async fn the_first_failure_stops_the_rest_and_they_count_as_stopped() {
        let (jobs, stop) = jobs(false);
        let mut failed = all(State::Running, None);
        failed[3] = ("worker-1", State::Failed, Some(3));
        let looks = vec![failed, all(State::Failed, Some(137))];
        let (status, calls) = run(&jobs, stop, script(looks)).await;
        assert_eq!(status.state, State::Failed);
        assert_eq!(
            status.error.as_deref(),
            Some("task worker-1 exited with Some(3)")
        );
        let s = states(&status);
        assert_eq!(s[3], ("worker-1".into(), State::Failed, Some(3), 0));
        for t in &s[..3] {
            assert_eq!(t.1, State::Stopped, "{t:?}");
        }
        assert_eq!(calls, [Call::Look, Call::Stop, Call::Look, Call::CleanUp]);
    }

    #[tokio::test]
    async fn an_elastic_worker_is_restarted_up_to_its_limit_then_fails_the_job() {
        let (jobs, stop) = jobs(true);
        let mut failed = all(State::Running, None);
        failed[3] = ("worker-1", State::Failed, Some(1));
        let looks = vec![failed.clone(), failed, all(State::Failed, Some(137))];
        let (status, calls) = run(&jobs, stop, script(looks)).await;
        assert_eq!(
            calls[..4],
            [
                Call::Look,
                Call::Restart("worker-1".into(), 1),
                Call::Look,
                Call::Stop
            ]
        );
        assert_eq!(status.state, State::Failed);
        let worker = &status.tasks[3];
        assert_eq!(
            (worker.state, worker.restarts, worker.pid),
            (State::Failed, 1, Some(1001))
        );
    }

    #[tokio::test]
    async fn no_worker_is_restarted_once_a_server_has_ended() {
        let (jobs, stop) = jobs(true);
        let mut look = all(State::Running, None);
        look[1] = ("server-0", State::Failed, Some(1));
        look[3] = ("worker-1", State::Failed, Some(1));
        let (status, calls) =
            run(&jobs, stop, script(vec![look, all(State::Failed, Some(9))])).await;
        assert!(
            !calls.iter().any(|c| matches!(c, Call::Restart(..))),
            "{calls:?}"
        );
        assert_eq!(
            status.error.as_deref(),
            Some("task server-0 exited with Some(1)")
        );
        assert_eq!(status.tasks[3].state, State::Failed);
    }

    #[tokio::test]
    async fn a_stop_request_stops_the_tasks_and_no_task_is_left_running() {
        let (jobs, stop) = jobs(false);
        stop.store(true, Ordering::Release);
        let mut script = script(vec![all(State::Running, None)]);
        script.stop_ends = true;
        let (status, calls) = run(&jobs, stop, script).await;
        assert_eq!(calls, [Call::Stop, Call::CleanUp]);
        assert_eq!(status.state, State::Stopped);
        assert_eq!(status.error, None);
        assert!(status.tasks.iter().all(|t| t.state == State::Stopped));
    }

    #[tokio::test]
    async fn a_job_lost_as_a_whole_fails_with_its_reason() {
        let (jobs, stop) = jobs(false);
        let mut script = script(vec![all(State::Running, None)]);
        script.failed_at = Some(2);
        let (status, calls) = run(&jobs, stop, script).await;
        assert_eq!(calls, [Call::Look, Call::Look, Call::Stop, Call::CleanUp]);
        assert_eq!(status.state, State::Failed);
        assert_eq!(status.error.as_deref(), Some("lost"));
        assert!(status.tasks.iter().all(|t| t.state == State::Stopped));
    }
}
