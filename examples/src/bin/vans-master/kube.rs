//! The Kubernetes backend (feature `kubernetes`): a job's objects
//! ([`examples::master::kubernetes`]: a headless service and a pod per task, or a Kubeflow
//! `TFJob`) created through the API with kube-rs, followed by listing the job's pods, and
//! deleted when the job is stopped or a task fails. The client is configured as `kubectl`
//! is: in a pod from its service account, else from `KUBECONFIG` / `~/.kube/config`.
//! A task's log is fetched from the API when the task ends.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use examples::master::kubernetes::{KubeJob, Layout, JOB_LABEL, KUBEFLOW_JOB_LABEL};
use examples::master::{JobSpec, State};
use examples::raw::BoxError;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, LogParams, PostParams,
};
use kube::{Api, Client};

use crate::Jobs;

/// How often the job's pods are listed.
const POLL: Duration = Duration::from_secs(1);
/// How long listing may keep failing before the job is given up as failed.
const LIST_RETRY_BUDGET: Duration = Duration::from_secs(60);

/// The backend's settings (`vans-master --namespace`, `--layout`, `--kube-secret`).
#[derive(Clone)]
pub(crate) struct Kube {
    pub(crate) client: Client,
    pub(crate) namespace: String,
    pub(crate) layout: Layout,
    pub(crate) secret: Option<String>,
}

impl Kube {
    /// Connects as `kubectl` would; `namespace` defaults to the configuration's.
    pub(crate) async fn connect(
        namespace: Option<String>,
        layout: Layout,
        secret: Option<String>,
    ) -> Result<Kube, BoxError> {
        let config = kube::Config::infer().await.map_err(|e| {
            format!("no Kubernetes configuration (in-cluster, KUBECONFIG or ~/.kube/config): {e}")
        })?;
        let namespace = namespace.unwrap_or_else(|| config.default_namespace.clone());
        let client = Client::try_from(config)
            .map_err(|e| format!("cannot make a Kubernetes client: {e}"))?;
        Ok(Kube {
            client,
            namespace,
            layout,
            secret,
        })
    }

    fn job<'a>(&self, id: u64, spec: &'a JobSpec) -> KubeJob<'a> {
        KubeJob {
            id,
            spec,
            namespace: self.namespace.clone(),
            secret: self.secret.clone(),
            layout: self.layout,
        }
    }

    fn tfjobs(&self) -> Api<DynamicObject> {
        let gvk = GroupVersionKind::gvk("kubeflow.org", "v1", "TFJob");
        let resource = ApiResource::from_gvk_with_plural(&gvk, "tfjobs");
        Api::namespaced_with(self.client.clone(), &self.namespace, &resource)
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Creates job `id`'s objects and a task that follows its pods.
    pub(crate) async fn start(
        &self,
        jobs: Jobs,
        id: u64,
        spec: &JobSpec,
        dir: &Path,
    ) -> Result<(), BoxError> {
        let job = self.job(id, spec);
        job.check()?;
        let name = job.name();
        let post = PostParams::default();
        let created = match self.layout {
            Layout::Pods => self.create_pods(&job, &post).await,
            Layout::TfJob => {
                let object: DynamicObject =
                    serde_json::from_value(serde_json::to_value(job.tfjob())?)?;
                self.tfjobs()
                    .create(&post, &object)
                    .await
                    .map(drop)
                    .map_err(|e| format!("cannot create TFJob {name}: {e} (is the Kubeflow training operator installed?)").into())
            }
        };
        if let Err(e) = created {
            self.delete(&name).await;
            return Err(e);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let stopper = Arc::clone(&stop);
        jobs.update(id, |job| {
            if self.layout == Layout::TfJob {
                // The chief hosts the scheduler: no pod of its own.
                job.status.tasks.retain(|t| t.name != "scheduler");
            }
            if job.status.state == State::Stopped {
                stopper.store(true, Ordering::Release);
                return;
            }
            job.status.state = State::Running;
            job.stop = Some(Box::new(move || stopper.store(true, Ordering::Release)));
        });
        let backend = self.clone();
        let dir = dir.to_owned();
        tokio::spawn(async move { backend.follow(jobs, id, name, dir, stop).await });
        Ok(())
    }

    async fn create_pods(&self, job: &KubeJob<'_>, post: &PostParams) -> Result<(), BoxError> {
        let services: Api<Service> = Api::namespaced(self.client.clone(), &self.namespace);
        services
            .create(post, &job.service())
            .await
            .map_err(|e| format!("cannot create service {}: {e}", job.name()))?;
        for pod in job.pods() {
            let name = pod.metadata.name.clone().unwrap_or_default();
            self.pods()
                .create(post, &pod)
                .await
                .map_err(|e| format!("cannot create pod {name}: {e}"))?;
        }
        Ok(())
    }

    /// Deletes job `name`'s objects (what exists of them); failures are logged.
    async fn delete(&self, name: &str) {
        let params = DeleteParams::background();
        let outcome = match self.layout {
            Layout::TfJob => self.tfjobs().delete(name, &params).await.map(drop),
            Layout::Pods => {
                let pods = self
                    .pods()
                    .delete_collection(
                        &params,
                        &ListParams::default().labels(&selector(JOB_LABEL, name)),
                    )
                    .await
                    .map(drop);
                let services: Api<Service> = Api::namespaced(self.client.clone(), &self.namespace);
                pods.and(services.delete(name, &params).await.map(drop))
            }
        };
        if let Err(e) = outcome {
            eprintln!("vans-master: deleting the objects of {name}: {e}");
        }
    }

    /// Lists the job's pods until every task ended (or the job is stopped): records each
    /// task's state, exit code and, when it ends, its log; deletes the job's objects when a
    /// task fails or the job is stopped.
    async fn follow(&self, jobs: Jobs, id: u64, name: String, dir: PathBuf, stop: Arc<AtomicBool>) {
        let label = match self.layout {
            Layout::Pods => JOB_LABEL,
            Layout::TfJob => KUBEFLOW_JOB_LABEL,
        };
        let params = ListParams::default().labels(&selector(label, &name));
        let mut failing_since: Option<tokio::time::Instant> = None;
        let outcome = loop {
            if stop.load(Ordering::Acquire) {
                break Outcome::Stopped;
            }
            let pods = match self.pods().list(&params).await {
                Ok(list) => {
                    failing_since = None;
                    list.items
                }
                Err(e) => {
                    let since = *failing_since.get_or_insert_with(tokio::time::Instant::now);
                    if since.elapsed() > LIST_RETRY_BUDGET {
                        break Outcome::Failed(format!("cannot list the pods of {name}: {e}"));
                    }
                    tokio::time::sleep(POLL).await;
                    continue;
                }
            };
            let mut ended = Vec::new();
            for pod in &pods {
                let Some(task) = pod
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(examples::master::kubernetes::task_of_pod)
                else {
                    continue;
                };
                let (state, code) = pod_state(pod);
                let mut first_end = false;
                jobs.update(id, |job| {
                    if let Some(t) = job.status.tasks.iter_mut().find(|t| t.name == task) {
                        first_end = state.is_final() && !t.state.is_final();
                        if !t.state.is_final() {
                            t.state = state;
                            t.exit_code = code;
                        }
                    }
                });
                if first_end {
                    ended.push((task, pod.metadata.name.clone().unwrap_or_default()));
                }
            }
            for (task, pod) in ended {
                self.save_log(&dir, &task, &pod).await;
            }
            let mut tasks = Vec::new();
            jobs.update(id, |job| tasks = job.status.tasks.clone());
            if let Some(failed) = tasks.iter().find(|t| t.state == State::Failed) {
                break Outcome::Failed(format!(
                    "task {} failed (exit code {})",
                    failed.name,
                    failed
                        .exit_code
                        .map_or("unknown".to_owned(), |c| c.to_string())
                ));
            }
            if !tasks.is_empty() && tasks.iter().all(|t| t.state == State::Succeeded) {
                break Outcome::Succeeded;
            }
            tokio::time::sleep(POLL).await;
        };
        if !matches!(outcome, Outcome::Succeeded) {
            self.delete(&name).await;
        }
        jobs.update(id, |job| {
            job.stop = None;
            for task in &mut job.status.tasks {
                if !task.state.is_final() {
                    task.state = State::Stopped;
                }
            }
            (job.status.state, job.status.error) = match outcome {
                Outcome::Succeeded => (State::Succeeded, None),
                Outcome::Stopped => (State::Stopped, None),
                Outcome::Failed(e) => (State::Failed, Some(e)),
            };
        });
    }

    /// Writes a pod's log to `<task>.log` in the job's folder (a note when it cannot).
    async fn save_log(&self, dir: &Path, task: &str, pod: &str) {
        let text = match self.pods().logs(pod, &LogParams::default()).await {
            Ok(text) => text,
            Err(e) => format!("vans-master: cannot fetch the log of pod {pod}: {e}\n"),
        };
        if let Err(e) = std::fs::write(dir.join(format!("{task}.log")), text) {
            eprintln!("vans-master: cannot write the log of {task}: {e}");
        }
    }
}

/// How following a job ended.
enum Outcome {
    Succeeded,
    Stopped,
    Failed(String),
}

fn selector(label: &str, value: &str) -> String {
    format!("{label}={value}")
}

/// A pod's task state and, once it ended, its container's exit code.
fn pod_state(pod: &Pod) -> (State, Option<i32>) {
    let status = pod.status.as_ref();
    let code = status
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.terminated.as_ref())
        .map(|t| t.exit_code);
    let state = match status.and_then(|s| s.phase.as_deref()) {
        Some("Running") => State::Running,
        Some("Succeeded") => State::Succeeded,
        Some("Failed") => State::Failed,
        _ => State::Pending,
    };
    (state, code)
}
