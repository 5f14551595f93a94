//! The Kubernetes backend (feature `kubernetes`): a job's objects
//! ([`jobs::kubernetes`]: a headless service and a pod per task, or a Kubeflow
//! `TFJob`) created through the API with kube-rs, followed by listing the job's pods, and
//! deleted when the job is stopped or a task fails. The client is configured as `kubectl`
//! is: in a pod from its service account, else from `KUBECONFIG` / `~/.kube/config`.
//! A task's log is fetched from the API when the task ends.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
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

use crate::follow::{self, Look, Seen, Watch};
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

    /// Creates job `id`'s objects and follows its pods ([`follow`]).
    pub(crate) async fn start(
        &self,
        jobs: Jobs,
        id: u64,
        spec: &JobSpec,
        dir: &Path,
        stop: Arc<AtomicBool>,
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
        let mut tasks = Vec::new();
        jobs.update(id, |job| {
            if self.layout == Layout::TfJob {
                // The chief hosts the scheduler: no pod of its own.
                job.status.tasks.retain(|t| t.name != "scheduler");
            }
            tasks = job.status.tasks.iter().map(|t| t.name.clone()).collect();
        });
        let watch = Pods {
            backend: self.clone(),
            name,
            tasks,
            dir: dir.to_owned(),
            started: tokio::time::Instant::now(),
            failing_since: None,
            seen: BTreeMap::new(),
            saved: BTreeSet::new(),
            cleaned: false,
        };
        follow::spawn(jobs, id, spec, stop, watch);
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

/// A job's pods, as [`follow`] sees them: listed by the job's label. A task
/// fails when its pod fails, cannot start (a stuck container: image not pulled, bad secret,
/// …), disappears after it was seen, or is still pending after [`START_DEADLINE`]; its log
/// is fetched when it ends. Stopping saves the logs of the tasks not ended yet and deletes
/// the job's objects.
struct Pods {
    backend: Kube,
    /// The job's objects' name.
    name: String,
    /// The tasks that have pods.
    tasks: Vec<String>,
    dir: PathBuf,
    started: tokio::time::Instant,
    /// Since when listing the pods fails, while it does.
    failing_since: Option<tokio::time::Instant>,
    /// Task → its pod, once seen.
    seen: BTreeMap<String, String>,
    /// Tasks whose log was saved.
    saved: BTreeSet<String>,
    /// The job's objects were deleted.
    cleaned: bool,
}

impl Watch for Pods {
    const EVERY: Duration = POLL;

    async fn look(&mut self) -> Look {
        let label = match self.backend.layout {
            Layout::Pods => JOB_LABEL,
            Layout::TfJob => KUBEFLOW_JOB_LABEL,
        };
        let params = ListParams::default().labels(&selector(label, &self.name));
        let pods = match self.backend.pods().list(&params).await {
            Ok(list) => {
                self.failing_since = None;
                list.items
            }
            Err(e) => {
                let since = *self
                    .failing_since
                    .get_or_insert_with(tokio::time::Instant::now);
                return Look {
                    failed: (since.elapsed() > LIST_RETRY_BUDGET)
                        .then(|| format!("cannot list the pods of {}: {e}", self.name)),
                    ..Look::default()
                };
            }
        };
        let mut states: BTreeMap<String, Seen> = BTreeMap::new();
        for pod in &pods {
            let Some(task) = pod
                .metadata
                .labels
                .as_ref()
                .and_then(jobs::kubernetes::task_of_pod)
            else {
                continue;
            };
            self.seen
                .insert(task.clone(), pod.metadata.name.clone().unwrap_or_default());
            states.insert(task, pod_state(pod));
        }
        let late = self.started.elapsed() > START_DEADLINE;
        let mut look = Look::default();
        for task in &self.tasks {
            let seen = match states.remove(task) {
                Some(seen) => seen,
                None if self.seen.contains_key(task) => Seen {
                    state: State::Failed,
                    exit_code: None,
                    why: "failed: its pod disappeared".to_owned(),
                },
                None => Seen::now(State::Pending),
            };
            let seen = match seen {
                Seen {
                    state: State::Pending,
                    ..
                } if late => Seen {
                    state: State::Failed,
                    exit_code: None,
                    why: format!("failed: still pending after {} s", START_DEADLINE.as_secs()),
                },
                seen => seen,
            };
            if seen.state.is_final() && !self.saved.contains(task) {
                if let Some(pod) = self.seen.get(task) {
                    self.backend.save_log(&self.dir, task, pod).await;
                    self.saved.insert(task.clone());
                }
            }
            look.tasks.push((task.clone(), seen));
        }
        look
    }

    async fn stop(&mut self) -> bool {
        self.clean_up().await;
        true
    }

    async fn clean_up(&mut self) {
        if self.cleaned {
            return;
        }
        self.cleaned = true;
        // What the tasks still running said, before their pods go.
        for (task, pod) in &self.seen {
            if !self.saved.contains(task) {
                self.backend.save_log(&self.dir, task, pod).await;
            }
        }
        self.backend.delete(&self.name).await;
    }
}

fn selector(label: &str, value: &str) -> String {
    format!("{label}={value}")
}

/// A pod's task state, its container's exit code once it ended, and why it failed (a
/// container stuck waiting for what will not come, when the phase does not say).
fn pod_state(pod: &Pod) -> Seen {
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
        return Seen {
            state: State::Failed,
            exit_code: None,
            why: format!("failed: its container is stuck: {reason}"),
        };
    }
    let state = match status.and_then(|s| s.phase.as_deref()) {
        Some("Running") => State::Running,
        Some("Succeeded") => State::Succeeded,
        Some("Failed") => State::Failed,
        _ => State::Pending,
    };
    let why = match (state, code) {
        (State::Failed, Some(c)) => format!("failed (exit code {c})"),
        (State::Failed, None) => "failed (exit code unknown)".to_owned(),
        (_, Some(c)) => format!("exited with code {c}"),
        (_, None) => String::new(),
    };
    Seen {
        state,
        exit_code: code,
        why,
    }
}
