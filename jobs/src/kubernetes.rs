//! The Kubernetes objects of a job (feature `kubernetes`): what `vans-master --backend
//! kubernetes` creates through the API and `vans-submit --dry-run` prints, as the
//! Kubernetes API types of `k8s-openapi` (and, for Kubeflow's `TFJob`, a typed mirror of the
//! training operator's v1 API that refuses unknown fields).
//!
//! Two layouts ([`Layout`]):
//!
//! - **`Pods`** (no operator needed): a headless `Service` named after the job and one `Pod`
//!   per task (`scheduler`, `server-N`, `worker-N`), each with `hostname` = its task and
//!   `subdomain` = the service, so the scheduler is `scheduler.<job>` in the cluster's DNS.
//!   Every pod gets the local backend's environment: `DMLC_NUM_SERVER`, `DMLC_NUM_WORKER`,
//!   `DMLC_PS_ROOT_URI`/`DMLC_PS_ROOT_PORT` (the scheduler, port [`PORT`]), its own port
//!   `DMLC_PORT` = [`PORT`], `DMLC_NODE_HOST` = the pod's IP (downward API), `NUM_WORKERS`,
//!   `VANS_TASK`, the scheduler `DMLC_ROLE`, and servers and workers a `TF_CONFIG` naming
//!   their task, from which they take their role (so ranks follow task indexes), plus the
//!   job's own variables.
//! - **`TfJob`**: a Kubeflow `TFJob` (`kubeflow.org/v1`) with a `Chief`, `Worker`s and `PS`
//!   replicas; the operator creates the pods and the service and sets `TF_CONFIG` in each,
//!   from which vans takes roles, sizes and the scheduler (the chief hosts it).
//!
//! With a cluster secret ([`KubeJob::secret`]), every pod mounts that Kubernetes `Secret`
//! (key `secret`) at `/etc/vans` and gets `VANS_CLUSTER_SECRET_FILE`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, EnvVarSource, ObjectFieldSelector, Pod, PodSpec,
    PodTemplateSpec, SecretVolumeSource, Service, ServicePort, ServiceSpec, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use crate::spec::{JobSpec, Strategy};

/// The port every task listens on (the scheduler's `DMLC_PS_ROOT_PORT`; each pod has its
/// own IP, so one port serves all).
pub const PORT: u16 = 9000;
/// The port of the training operator's services (`tfjob-port`).
pub const TFJOB_PORT: i32 = 2222;
/// Label: the job a pod belongs to.
pub const JOB_LABEL: &str = "vans-job";
/// Label: the task a pod runs (`scheduler`, `server-0`, `worker-1`, …; pods layout).
pub const TASK_LABEL: &str = "vans-task";
/// The Kubeflow operator's labels on its pods: job name, replica type and index.
pub const KUBEFLOW_JOB_LABEL: &str = "training.kubeflow.org/job-name";
/// See [`KUBEFLOW_JOB_LABEL`].
pub const KUBEFLOW_TYPE_LABEL: &str = "training.kubeflow.org/replica-type";
/// See [`KUBEFLOW_JOB_LABEL`].
pub const KUBEFLOW_INDEX_LABEL: &str = "training.kubeflow.org/replica-index";
/// Where the cluster secret is mounted.
const SECRET_DIR: &str = "/etc/vans";

/// How a job is laid out on Kubernetes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// A headless service and a pod per task (no operator needed).
    Pods,
    /// A Kubeflow `TFJob` (the training operator must be installed).
    TfJob,
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Layout::Pods => "pods",
            Layout::TfJob => "tfjob",
        })
    }
}

impl std::str::FromStr for Layout {
    type Err = String;

    fn from_str(s: &str) -> Result<Layout, String> {
        match s {
            "pods" => Ok(Layout::Pods),
            "tfjob" => Ok(Layout::TfJob),
            _ => Err(format!("{s:?}: expected `pods` or `tfjob`")),
        }
    }
}

/// A job as Kubernetes sees it.
#[derive(Debug, Clone)]
pub struct KubeJob<'a> {
    /// The master's id of the job (part of the object names).
    pub id: u64,
    /// The submission; its `image` must be set.
    pub spec: &'a JobSpec,
    /// The namespace the objects go to.
    pub namespace: String,
    /// A Kubernetes `Secret` (key `secret`) holding the cluster secret, if any.
    pub secret: Option<String>,
    /// The master's instance name, part of every object name ([`job_name`]); empty for none.
    pub instance: String,
    /// The layout.
    pub layout: Layout,
}

/// A Kubeflow training job (`TFJob`, `MXJob`, … of `kubeflow.org/v1`): the fields vans uses,
/// unknown ones refused so that a misspelt field fails a test instead of being dropped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubeflowJob {
    /// `kubeflow.org/v1`.
    pub api_version: String,
    /// `TFJob`, `MXJob`, …
    pub kind: String,
    /// Name, namespace, labels.
    pub metadata: ObjectMeta,
    /// The replicas.
    pub spec: KubeflowJobSpec,
}

/// The spec of a [`KubeflowJob`].
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubeflowJobSpec {
    /// `TFJob`: replica type (`Chief`, `Worker`, `PS`, `Evaluator`) → replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tf_replica_specs: Option<BTreeMap<String, ReplicaSpec>>,
    /// `MXJob`: replica type (`Scheduler`, `Server`, `Worker`) → replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mx_replica_specs: Option<BTreeMap<String, ReplicaSpec>>,
    /// `MXJob`: `MXTrain` or `MXTune`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_mode: Option<String>,
    /// Clean-up and back-off policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_policy: Option<RunPolicy>,
}

/// One replica type of a [`KubeflowJob`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReplicaSpec {
    /// How many.
    pub replicas: i32,
    /// `Never`, `OnFailure`, `Always` or `ExitCode`.
    pub restart_policy: String,
    /// The pods.
    pub template: PodTemplateSpec,
}

/// The operator's run policy (the fields vans sets).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunPolicy {
    /// `None`, `Running` or `All`: which pods are deleted when the job ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clean_pod_policy: Option<String>,
    /// Retries before the job is marked failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_limit: Option<i32>,
}

/// The name of job `id` in Kubernetes: `vans-<task name>-<id>[-<instance>]`, lower case,
/// `_` as `-`, at most 52 characters (so `<name>-worker-NNNN` stays within the 63 of a DNS
/// label). `instance` tells apart the jobs of masters that share a namespace, or of one
/// master started again (its ids start at 1 again); empty for none.
pub fn job_name(id: u64, spec: &JobSpec, instance: &str) -> String {
    let suffix = match instance {
        "" => format!("-{id}"),
        instance => format!("-{id}-{instance}"),
    };
    let mut base: String = format!("vans-{}", spec.name)
        .chars()
        .map(|c| match c {
            '_' => '-',
            c => c.to_ascii_lowercase(),
        })
        .collect();
    base.truncate(52 - suffix.len());
    let base = base.trim_end_matches('-');
    format!("{base}{suffix}")
}

impl KubeJob<'_> {
    /// The job's name ([`job_name`]).
    pub fn name(&self) -> String {
        job_name(self.id, self.spec, &self.instance)
    }

    /// Why the job cannot run on Kubernetes, if it cannot.
    pub fn check(&self) -> Result<(), String> {
        match &self.spec.image {
            Some(image) if !image.trim().is_empty() => Ok(()),
            _ => Err("a Kubernetes job needs --image (the container image its tasks run)".into()),
        }
    }

    fn labels(&self, extra: &[(&str, String)]) -> BTreeMap<String, String> {
        let mut labels = BTreeMap::from([
            ("app.kubernetes.io/name".to_owned(), "vans".to_owned()),
            (JOB_LABEL.to_owned(), self.name()),
        ]);
        labels.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
        labels
    }

    fn meta(&self, name: String, extra: &[(&str, String)]) -> ObjectMeta {
        ObjectMeta {
            name: Some(name),
            namespace: Some(self.namespace.clone()),
            labels: Some(self.labels(extra)),
            ..ObjectMeta::default()
        }
    }

    /// The container of every task: the image, the job's command (the image's own when
    /// empty), `env`, and the secret's mount.
    fn container(&self, name: &str, port: (&str, i32), env: Vec<EnvVar>) -> Container {
        let command = (!self.spec.command.is_empty()).then(|| self.spec.command.clone());
        let mut env = env;
        env.extend(self.spec.env.iter().map(|(k, v)| var(k, v)));
        if self.secret.is_some() {
            env.push(var(
                "VANS_CLUSTER_SECRET_FILE",
                &format!("{SECRET_DIR}/secret"),
            ));
        }
        Container {
            name: name.to_owned(),
            image: self.spec.image.clone(),
            command,
            env: Some(env),
            ports: Some(vec![ContainerPort {
                name: Some(port.0.to_owned()),
                container_port: port.1,
                ..ContainerPort::default()
            }]),
            volume_mounts: self.secret.as_ref().map(|_| {
                vec![VolumeMount {
                    name: "vans-secret".to_owned(),
                    mount_path: SECRET_DIR.to_owned(),
                    read_only: Some(true),
                    ..VolumeMount::default()
                }]
            }),
            ..Container::default()
        }
    }

    fn pod_spec(&self, container: Container) -> PodSpec {
        PodSpec {
            containers: vec![container],
            restart_policy: Some("Never".to_owned()),
            volumes: self.secret.as_ref().map(|secret| {
                vec![Volume {
                    name: "vans-secret".to_owned(),
                    secret: Some(SecretVolumeSource {
                        secret_name: Some(secret.clone()),
                        ..SecretVolumeSource::default()
                    }),
                    ..Volume::default()
                }]
            }),
            ..PodSpec::default()
        }
    }

    /// The headless service of the pods layout: DNS names for the pods, the scheduler's
    /// first (addresses published before the pods are ready: nodes register while starting).
    pub fn service(&self) -> Service {
        Service {
            metadata: self.meta(self.name(), &[]),
            spec: Some(ServiceSpec {
                cluster_ip: Some("None".to_owned()),
                publish_not_ready_addresses: Some(true),
                selector: Some(BTreeMap::from([(JOB_LABEL.to_owned(), self.name())])),
                ports: Some(vec![ServicePort {
                    name: Some("ps".to_owned()),
                    port: i32::from(PORT),
                    ..ServicePort::default()
                }]),
                ..ServiceSpec::default()
            }),
            ..Service::default()
        }
    }

    /// The pods of the pods layout, one per task, in the order of [`JobSpec::tasks`].
    pub fn pods(&self) -> Vec<Pod> {
        let name = self.name();
        let address = |task: &str, _| (format!("{task}.{name}"), PORT);
        let environments = self
            .spec
            .task_environments((&format!("scheduler.{name}"), PORT), address);
        self.spec
            .tasks()
            .into_iter()
            .zip(environments)
            .map(|((task, role, _), (_, vars))| {
                let mut env: Vec<EnvVar> = vars.iter().map(|(k, v)| var(k, v)).collect();
                env.push(pod_ip("DMLC_NODE_HOST"));
                let container = self.container("vans", ("ps", i32::from(PORT)), env);
                let mut spec = self.pod_spec(container);
                spec.hostname = Some(task.clone());
                spec.subdomain = Some(name.clone());
                Pod {
                    metadata: self.meta(
                        format!("{name}-{task}"),
                        &[(TASK_LABEL, task.clone()), ("vans-role", role.to_owned())],
                    ),
                    spec: Some(spec),
                    ..Pod::default()
                }
            })
            .collect()
    }

    /// The Kubeflow `TFJob` of the TFJob layout: `Chief` (worker rank 0, which also hosts the
    /// scheduler), `worker_num - 1` `Worker`s and the job's servers as `PS` (one idle `PS`
    /// for `AllReduce`). The operator sets `TF_CONFIG`; the container is named `tensorflow`,
    /// as the operator requires.
    pub fn tfjob(&self) -> KubeflowJob {
        let template = |replica: &str| PodTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some(self.labels(&[])),
                ..ObjectMeta::default()
            }),
            spec: Some(
                self.pod_spec(self.container("tensorflow", ("tfjob-port", TFJOB_PORT), {
                    // The pod's IP rather than the host TF_CONFIG gives (the pod's own
                    // Service name, which resolves only once the pod is Ready).
                    let mut env = vec![
                        var("NUM_WORKERS", &self.spec.worker_num.to_string()),
                        var("VANS_TASK", &format!("{}/{replica}", self.spec.name)),
                        pod_ip("DMLC_NODE_HOST"),
                    ];
                    if self.spec.strategy == Strategy::AllReduce {
                        env.push(var("VANS_STRATEGY", "AllReduce"));
                    }
                    env
                })),
            ),
        };
        let replica = |replicas: u32, name: &str| ReplicaSpec {
            replicas: i32::try_from(replicas).unwrap_or(i32::MAX),
            restart_policy: "Never".to_owned(),
            template: template(name),
        };
        let mut replicas = BTreeMap::from([
            ("Chief".to_owned(), replica(1, "chief")),
            ("PS".to_owned(), replica(self.spec.servers(), "ps")),
        ]);
        if self.spec.worker_num > 1 {
            replicas.insert(
                "Worker".to_owned(),
                replica(self.spec.worker_num - 1, "worker"),
            );
        }
        KubeflowJob {
            api_version: "kubeflow.org/v1".to_owned(),
            kind: "TFJob".to_owned(),
            metadata: self.meta(self.name(), &[]),
            spec: KubeflowJobSpec {
                tf_replica_specs: Some(replicas),
                run_policy: Some(RunPolicy {
                    clean_pod_policy: Some("None".to_owned()),
                    backoff_limit: Some(0),
                }),
                ..KubeflowJobSpec::default()
            },
        }
    }

    /// Every object of the job, as the JSON the API takes (a `List` of them is what
    /// `vans-submit --dry-run` prints, for `kubectl apply -f -`).
    pub fn objects(&self) -> Result<Vec<serde_json::Value>, String> {
        self.check()?;
        let json = |v: Result<serde_json::Value, serde_json::Error>| v.map_err(|e| e.to_string());
        match self.layout {
            Layout::Pods => {
                let mut objects = vec![json(serde_json::to_value(self.service()))?];
                for pod in self.pods() {
                    objects.push(json(serde_json::to_value(pod))?);
                }
                Ok(objects)
            }
            Layout::TfJob => Ok(vec![json(serde_json::to_value(self.tfjob()))?]),
        }
    }
}

/// The task (`scheduler`, `server-N`, `worker-N`) a pod of `job` runs, from its labels: the
/// pods layout's [`TASK_LABEL`], or the training operator's replica type and index (`Chief`
/// is worker 0, `Worker` N is worker N + 1, `PS` N is server N).
pub fn task_of_pod(labels: &BTreeMap<String, String>) -> Option<String> {
    if let Some(task) = labels.get(TASK_LABEL) {
        return Some(task.clone());
    }
    let kind = labels.get(KUBEFLOW_TYPE_LABEL)?.to_ascii_lowercase();
    let index: u32 = labels.get(KUBEFLOW_INDEX_LABEL)?.parse().ok()?;
    match kind.as_str() {
        "chief" | "master" => Some("worker-0".to_owned()),
        "worker" => Some(format!("worker-{}", index.checked_add(1)?)),
        "ps" => Some(format!("server-{index}")),
        _ => None,
    }
}

/// Variable `name` set to the pod's IP (the downward API's `status.podIP`).
fn pod_ip(name: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: "status.podIP".to_owned(),
                ..ObjectFieldSelector::default()
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

fn var(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: Some(value.to_owned()),
        ..EnvVar::default()
    }
}
