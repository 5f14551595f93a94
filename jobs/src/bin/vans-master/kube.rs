//! The Kubernetes backend (feature `kubernetes`): a job's objects
//! ([`jobs::kubernetes`]: a headless service and a pod per task, or a Kubeflow
//! `TFJob`) created through the API with kube-rs, followed by listing the job's pods, and
//! deleted when the job is stopped or a task fails. The client is configured as `kubectl`
//! is: in a pod from its service account, else from `KUBECONFIG` / `~/.kube/config`.
//! A task's log is fetched from the API when the task ends.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use jobs::kubernetes::{KubeJob, Layout, JOB_LABEL, KUBEFLOW_JOB_LABEL};
use jobs::BoxError;
use jobs::{JobSpec, State};
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
/// How long a task may stay pending (not scheduled, image being pulled, …) before the job
/// is given up as failed.
const START_DEADLINE: Duration = Duration::from_secs(600);
/// Container waiting reasons from which a pod does not start without someone's help.
const STUCK_REASONS: &[&str] = &[
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "CrashLoopBackOff",
];
/// The names of the job's own containers (pods layout, TFJob layout): a sidecar an admission
/// webhook adds is not the task.
const CONTAINER_NAMES: &[&str] = &["vans", "tensorflow"];

/// The backend's settings (`vans-master --namespace`, `--layout`, `--kube-secret`,
/// `--instance`).
#[derive(Clone)]
pub(crate) struct Kube {
    pub(crate) client: Client,
    pub(crate) namespace: String,
    pub(crate) layout: Layout,
    pub(crate) secret: Option<String>,
    pub(crate) instance: String,
}

impl Kube {
    /// Connects as `kubectl` would; `namespace` defaults to the configuration's.
    /// `layout` `None`: [detected](Self::detect_layout).
    pub(crate) async fn connect(
        namespace: Option<String>,
        layout: Option<Layout>,
        secret: Option<String>,
        instance: String,
    ) -> Result<Kube, BoxError> {
        let config = kube::Config::infer().await.map_err(|e| {
            format!("no Kubernetes configuration (in-cluster, KUBECONFIG or ~/.kube/config): {e}")
        })?;
        let namespace = namespace.unwrap_or_else(|| config.default_namespace.clone());
        let client = Client::try_from(config)
            .map_err(|e| format!("cannot make a Kubernetes client: {e}"))?;
        let layout = match layout {
            Some(layout) => layout,
            None => Self::detect_layout(&client).await?,
        };
        Ok(Kube {
            client,
            namespace,
            layout,
            secret,
            instance,
        })
    }

    /// The layout `--layout auto` picks: a `TFJob` when the cluster serves Kubeflow's
    /// `kubeflow.org/v1` `tfjobs` resource (the training operator is installed), else pods.
    /// An API server that cannot say is an error: guessing would fail every job later.
    pub(crate) async fn detect_layout(client: &Client) -> Result<Layout, BoxError> {
        match client.list_api_group_resources("kubeflow.org/v1").await {
            Ok(list) if list.resources.iter().any(|r| r.name == "tfjobs") => Ok(Layout::TfJob),
            Ok(_) => Ok(Layout::Pods),
            // A 404 whatever its body: an API server answers a group it does not serve with
            // a Status, a proxy in front of it may answer with text.
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(Layout::Pods),
            Err(e) => Err(format!(
                "cannot tell whether the cluster serves Kubeflow's TFJob (GET \
                 /apis/kubeflow.org/v1): {e}; choose with --layout pods or --layout tfjob"
            )
            .into()),
        }
    }

    fn job<'a>(&self, id: u64, spec: &'a JobSpec) -> KubeJob<'a> {
        KubeJob {
            id,
            spec,
            namespace: self.namespace.clone(),
            secret: self.secret.clone(),
            instance: self.instance.clone(),
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
        match self.layout {
            Layout::Pods => self.create_pods(&job, &post).await?,
            Layout::TfJob => {
                let object: DynamicObject =
                    serde_json::from_value(serde_json::to_value(job.tfjob())?)?;
                self.tfjobs().create(&post, &object).await.map_err(|e| {
                    format!(
                        "cannot create TFJob {name}: {e} (is the Kubeflow training operator \
                         installed?)"
                    )
                })?;
            }
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

    /// Creates the service and the pods; when one cannot be created, deletes those this
    /// call created (and only those: a name taken by another job is not ours to delete).
    async fn create_pods(&self, job: &KubeJob<'_>, post: &PostParams) -> Result<(), BoxError> {
        let services: Api<Service> = Api::namespaced(self.client.clone(), &self.namespace);
        services
            .create(post, &job.service())
            .await
            .map_err(|e| format!("cannot create service {}: {e}", job.name()))?;
        let mut created: Vec<String> = Vec::new();
        for pod in job.pods() {
            let name = pod.metadata.name.clone().unwrap_or_default();
            if let Err(e) = self.pods().create(post, &pod).await {
                let params = DeleteParams::background();
                for made in &created {
                    if let Err(e) = self.pods().delete(made, &params).await {
                        eprintln!("vans-master: deleting pod {made}: {e}");
                    }
                }
                if let Err(e) = services.delete(&job.name(), &params).await {
                    eprintln!("vans-master: deleting service {}: {e}", job.name());
                }
                return Err(format!("cannot create pod {name}: {e}").into());
            }
            created.push(name);
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
    /// task's state, exit code and, when it ends, its log. A task fails when its pod fails,
    /// cannot start (a stuck container: image not pulled, bad secret, …), disappears after it
    /// was seen, or is still pending after [`START_DEADLINE`]. When a task fails or the job
    /// is stopped, the logs of the tasks not ended yet are saved and the job's objects
    /// deleted.
    async fn follow(&self, jobs: Jobs, id: u64, name: String, dir: PathBuf, stop: Arc<AtomicBool>) {
        let label = match self.layout {
            Layout::Pods => JOB_LABEL,
            Layout::TfJob => KUBEFLOW_JOB_LABEL,
        };
        let params = ListParams::default().labels(&selector(label, &name));
        let started = tokio::time::Instant::now();
        let mut failing_since: Option<tokio::time::Instant> = None;
        // Task → its pod, once seen; tasks whose log was saved.
        let mut seen: BTreeMap<String, String> = BTreeMap::new();
        let mut saved: BTreeSet<String> = BTreeSet::new();
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
            let mut states: BTreeMap<String, (State, Option<i32>, Option<String>)> =
                BTreeMap::new();
            for pod in &pods {
                let Some(task) = pod
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(jobs::kubernetes::task_of_pod)
                else {
                    continue;
                };
                seen.insert(task.clone(), pod.metadata.name.clone().unwrap_or_default());
                states.insert(task, pod_state(pod));
            }
            for task in seen.keys() {
                states.entry(task.clone()).or_insert_with(|| {
                    (State::Failed, None, Some("its pod disappeared".to_owned()))
                });
            }
            let late = started.elapsed() > START_DEADLINE;
            let mut ended = Vec::new();
            let mut failure = None;
            jobs.update(id, |job| {
                for t in &mut job.status.tasks {
                    if t.state.is_final() {
                        continue;
                    }
                    let (state, code, why) = match states.get(&t.name) {
                        Some(found) => found.clone(),
                        None => (State::Pending, None, None),
                    };
                    let (state, why) = match (state, why) {
                        (State::Pending, None) if late => (
                            State::Failed,
                            Some(format!(
                                "still pending after {} s",
                                START_DEADLINE.as_secs()
                            )),
                        ),
                        other => other,
                    };
                    (t.state, t.exit_code) = (state, code);
                    if state.is_final() {
                        ended.push(t.name.clone());
                    }
                    if state == State::Failed && failure.is_none() {
                        let code = code.map_or("unknown".to_owned(), |c| c.to_string());
                        failure = Some(match why {
                            Some(why) => format!("task {} failed: {why}", t.name),
                            None => format!("task {} failed (exit code {code})", t.name),
                        });
                    }
                }
            });
            for task in ended {
                if let Some(pod) = seen.get(&task) {
                    self.save_log(&dir, &task, pod).await;
                    saved.insert(task);
                }
            }
            if let Some(failure) = failure {
                break Outcome::Failed(failure);
            }
            let mut tasks = Vec::new();
            jobs.update(id, |job| tasks = job.status.tasks.clone());
            if !tasks.is_empty() && tasks.iter().all(|t| t.state == State::Succeeded) {
                break Outcome::Succeeded;
            }
            tokio::time::sleep(POLL).await;
        };
        if !matches!(outcome, Outcome::Succeeded) {
            // What the tasks still running said, before their pods go.
            for (task, pod) in &seen {
                if !saved.contains(task) {
                    self.save_log(&dir, task, pod).await;
                }
            }
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

/// A pod's task state, its container's exit code once it ended, and why it failed when the
/// phase does not say (a container stuck waiting for what will not come).
fn pod_state(pod: &Pod) -> (State, Option<i32>, Option<String>) {
    let status = pod.status.as_ref();
    let statuses = status
        .and_then(|s| s.container_statuses.as_deref())
        .unwrap_or_default();
    let container = statuses
        .iter()
        .find(|c| CONTAINER_NAMES.contains(&c.name.as_str()))
        .or(statuses.first());
    let state = container.and_then(|c| c.state.as_ref());
    let code = state
        .and_then(|s| s.terminated.as_ref())
        .map(|t| t.exit_code);
    let stuck = state
        .and_then(|s| s.waiting.as_ref())
        .and_then(|w| w.reason.as_deref())
        .filter(|r| STUCK_REASONS.contains(r));
    if let Some(reason) = stuck {
        return (
            State::Failed,
            None,
            Some(format!("its container is stuck: {reason}")),
        );
    }
    let state = match status.and_then(|s| s.phase.as_deref()) {
        Some("Running") => State::Running,
        Some("Succeeded") => State::Succeeded,
        Some("Failed") => State::Failed,
        _ => State::Pending,
    };
    (state, code, None)
}
