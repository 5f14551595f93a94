//! Kubernetes, as far as it can be checked without an API server (none can run on these
//! machines): the manifests under `deploy/kubernetes/` and the objects `vans-submit
//! --dry-run` prints are checked against the Kubernetes API types (k8s-openapi; Kubeflow's
//! jobs against a typed mirror that refuses unknown fields) by a round trip that must give
//! back every field; and `vans-master --backend kubernetes` runs jobs against a fake API
//! server in this test, which takes the objects the master's kube-rs client creates (each
//! checked the same way), plays the pods through Pending, Running and an exit, serves their
//! logs and records deletions. What a real cluster does with the objects (scheduling, DNS,
//! the training operator) is not exercised here.

#![cfg(feature = "kubernetes")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path as UrlPath, RawQuery, State};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use common::master::{Master, MASTER, SUBMIT};
use jobs::kubernetes::KubeflowJob;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

/// Parses `object` as `T` and checks that serializing it again gives back every field
/// (k8s-openapi ignores unknown fields, so a misspelt one would otherwise pass unseen).
fn typed<T: DeserializeOwned + Serialize>(object: &Value) -> Result<T, String> {
    let parsed: T = serde_json::from_value(object.clone()).map_err(|e| e.to_string())?;
    let again = serde_json::to_value(&parsed).map_err(|e| e.to_string())?;
    if &again != object {
        return Err(format!(
            "fields lost in a round trip through the API type:\n sent {object}\n kept {again}"
        ));
    }
    Ok(parsed)
}

/// Checks one object by its kind; returns the kind.
fn check_object(object: &Value) -> Result<String, String> {
    let kind = object["kind"].as_str().unwrap_or_default().to_owned();
    match kind.as_str() {
        "Service" => typed::<Service>(object).map(drop),
        "Pod" => typed::<Pod>(object).map(drop),
        "Job" => typed::<Job>(object).map(drop),
        "Secret" => typed::<Secret>(object).map(drop),
        "ServiceAccount" => typed::<ServiceAccount>(object).map(drop),
        "Role" => typed::<Role>(object).map(drop),
        "RoleBinding" => typed::<RoleBinding>(object).map(drop),
        "Deployment" => typed::<Deployment>(object).map(drop),
        "TFJob" | "MXJob" => typed::<KubeflowJob>(object).map(drop),
        other => Err(format!("no check for kind {other:?}")),
    }
    .map(|()| kind)
}

/// The environment of a container as a map (values only).
fn env_of(container: &Value) -> BTreeMap<String, String> {
    container["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| {
            Some((
                e["name"].as_str()?.to_owned(),
                e["value"].as_str()?.to_owned(),
            ))
        })
        .collect()
}

/// The master's own manifest: its token comes from a Secret, it listens beyond loopback only
/// with it, and its Role stays in its namespace with the verbs its backend uses.
#[test]
fn the_master_runs_in_the_cluster_with_a_token_and_a_namespaced_role() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes/master.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let objects: Vec<Value> = serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect();
    let of = |kind: &str| objects.iter().find(|o| o["kind"] == kind).unwrap().clone();
    let deployment: Deployment = typed(&of("Deployment")).unwrap();
    let pod = deployment.spec.unwrap().template.spec.unwrap();
    assert_eq!(pod.service_account_name.as_deref(), Some("vans-master"));
    let container = &pod.containers[0];
    let command = container.command.clone().unwrap();
    assert_eq!(
        &command[..5],
        ["vans-master", "--host", "0.0.0.0", "--port", "8470"]
    );
    assert!(command.windows(2).any(|w| w == ["--backend", "kubernetes"]));
    let token = container
        .env
        .as_ref()
        .unwrap()
        .iter()
        .find(|e| e.name == jobs::token::TOKEN_ENV)
        .expect("the token variable");
    assert!(
        token.value.is_none(),
        "the token is not written in the manifest"
    );
    let from = token
        .value_from
        .as_ref()
        .unwrap()
        .secret_key_ref
        .as_ref()
        .unwrap();
    assert_eq!(
        (from.name.as_str(), from.key.as_str()),
        ("vans-master-token", "token")
    );
    let role: Role = typed(&of("Role")).unwrap();
    let rules = role.rules.unwrap();
    let verbs = |resource: &str| -> Vec<String> {
        rules
            .iter()
            .filter(|r| {
                r.resources
                    .as_ref()
                    .is_some_and(|rs| rs.iter().any(|x| x == resource))
            })
            .flat_map(|r| r.verbs.clone())
            .collect()
    };
    for resource in ["pods", "services", "tfjobs"] {
        for verb in ["create", "get", "list", "delete"] {
            assert!(
                verbs(resource).iter().any(|v| v == verb),
                "{verb} {resource}"
            );
        }
    }
    assert_eq!(verbs("pods/log"), ["get"]);
    assert!(
        rules.iter().all(|r| !r.verbs.iter().any(|v| v == "*")),
        "no wildcard verbs"
    );
    assert!(
        rules.iter().all(|r| !r
            .resources
            .iter()
            .flatten()
            .any(|x| x == "secrets" || x == "*")),
        "no access to secrets"
    );
    let binding: RoleBinding = typed(&of("RoleBinding")).unwrap();
    assert_eq!(
        binding.role_ref.kind, "Role",
        "namespaced, not a ClusterRole"
    );
}

#[test]
fn the_deploy_manifests_are_valid_kubernetes_objects() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes");
    let mut kinds = BTreeMap::<String, Vec<String>>::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        for document in serde_yaml_ng::Deserializer::from_str(&text) {
            let object: Value = serde::Deserialize::deserialize(document).unwrap();
            if object.is_null() {
                continue;
            }
            let kind = check_object(&object).unwrap_or_else(|e| panic!("{file}: {e}"));
            kinds.entry(file.clone()).or_default().push(kind.clone());
            // Every container of a Kubeflow job has the name its operator looks for.
            let replicas = match kind.as_str() {
                "TFJob" => Some(("tfReplicaSpecs", "tensorflow")),
                "MXJob" => Some(("mxReplicaSpecs", "mxnet")),
                _ => None,
            };
            if let Some((field, container)) = replicas {
                for (replica, spec) in object["spec"][field].as_object().unwrap() {
                    let name = &spec["template"]["spec"]["containers"][0]["name"];
                    assert_eq!(name, container, "{file}: {replica}");
                }
            }
            // The plain jobs give every pod the same cluster size as the Jobs have pods.
            if kind == "Job" {
                let env = env_of(&object["spec"]["template"]["spec"]["containers"][0]);
                assert_eq!(env.get("DMLC_NUM_SERVER").map(String::as_str), Some("2"));
                assert_eq!(env.get("DMLC_NUM_WORKER").map(String::as_str), Some("2"));
                let role = env.get("DMLC_ROLE").cloned().unwrap_or_default();
                let count = object["spec"]["completions"].as_i64().unwrap_or(1);
                let expected = if role == "scheduler" { 1 } else { 2 };
                assert_eq!(count, expected, "{file}: pods of the {role} Job");
            }
        }
    }
    for (file, expected) in [
        ("tfjob.yaml", vec!["TFJob"]),
        ("mxjob.yaml", vec!["MXJob"]),
        ("jobs.yaml", vec!["Service", "Job", "Job", "Job"]),
        ("secret.example.yaml", vec!["Secret"]),
        (
            "master.yaml",
            vec![
                "ServiceAccount",
                "Role",
                "RoleBinding",
                "Deployment",
                "Service",
            ],
        ),
    ] {
        assert_eq!(
            kinds
                .get(file)
                .map(|k| k.iter().map(String::as_str).collect::<Vec<_>>()),
            Some(expected),
            "{file}"
        );
    }
}

/// `vans-submit --dry-run` with `args`: the items of the List it prints.
fn dry_run(args: &[&str]) -> Vec<Value> {
    let child = std::process::Command::new(SUBMIT)
        .args(["--dry-run", "--image", "vans:latest", "--namespace", "ml"])
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = common::wait_output(child, "vans-submit --dry-run");
    assert!(out.status.success(), "{}", common::text(&out));
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (&list["apiVersion"], &list["kind"]),
        (&json!("v1"), &json!("List"))
    );
    list["items"].as_array().unwrap().clone()
}

#[test]
fn a_dry_run_prints_valid_objects_for_each_layout() {
    let job = [
        "--strategy",
        "ParameterServer",
        "--ps-num",
        "2",
        "--worker-num",
        "3",
        "--task",
        "Demo_Job",
        "--kube-secret",
        "vans-cluster-secret",
        "--",
        "ps-bench",
        "--mode",
        "check",
    ];
    let items = dry_run(&job);
    let kinds: Vec<String> = items.iter().map(|o| check_object(o).unwrap()).collect();
    assert_eq!(kinds, ["Service", "Pod", "Pod", "Pod", "Pod", "Pod", "Pod"]);
    let service = &items[0];
    assert_eq!(service["metadata"]["name"], "vans-demo-job-0");
    assert_eq!(service["spec"]["clusterIP"], "None");
    let pods: BTreeMap<String, &Value> = items[1..]
        .iter()
        .map(|p| (p["spec"]["hostname"].as_str().unwrap().to_owned(), p))
        .collect();
    let names: Vec<&str> = pods.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "scheduler",
            "server-0",
            "server-1",
            "worker-0",
            "worker-1",
            "worker-2"
        ]
    );
    for (task, pod) in &pods {
        assert_eq!(pod["metadata"]["namespace"], "ml");
        assert_eq!(pod["spec"]["subdomain"], "vans-demo-job-0");
        assert_eq!(pod["spec"]["restartPolicy"], "Never");
        let container = &pod["spec"]["containers"][0];
        assert_eq!(container["image"], "vans:latest");
        assert_eq!(container["command"], json!(["ps-bench", "--mode", "check"]));
        let env = env_of(container);
        assert_eq!(
            env["DMLC_PS_ROOT_URI"], "scheduler.vans-demo-job-0",
            "{task}"
        );
        assert_eq!(env["DMLC_PS_ROOT_PORT"], "9000");
        assert_eq!(
            (
                env["DMLC_NUM_SERVER"].as_str(),
                env["DMLC_NUM_WORKER"].as_str()
            ),
            ("2", "3")
        );
        assert_eq!(env["VANS_CLUSTER_SECRET_FILE"], "/etc/vans/secret");
        assert_eq!(
            pod["spec"]["volumes"][0]["secret"]["secretName"],
            "vans-cluster-secret"
        );
        // DMLC_NODE_HOST comes from the downward API: the pod's IP.
        let host = container["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "DMLC_NODE_HOST")
            .unwrap();
        assert_eq!(host["valueFrom"]["fieldRef"]["fieldPath"], "status.podIP");
        if task != "scheduler" {
            let tf: Value = serde_json::from_str(&env["TF_CONFIG"]).unwrap();
            let (kind, index) = task.split_once('-').unwrap();
            let kind = if kind == "server" { "ps" } else { "worker" };
            assert_eq!(
                tf["task"],
                json!({"type": kind, "index": index.parse::<u32>().unwrap()})
            );
            assert_eq!(tf["cluster"]["worker"][2], "worker-2.vans-demo-job-0:9000");
            assert_eq!(tf["cluster"]["ps"][1], "server-1.vans-demo-job-0:9000");
        }
    }

    let items = dry_run(&[&["--layout", "tfjob"][..], &job[..]].concat());
    let [tfjob] = items.as_slice() else {
        panic!("one TFJob expected, got {} objects", items.len())
    };
    let parsed: KubeflowJob = typed(tfjob).unwrap();
    let replicas = parsed.spec.tf_replica_specs.unwrap();
    let counts: Vec<(&str, i32)> = replicas
        .iter()
        .map(|(k, r)| (k.as_str(), r.replicas))
        .collect();
    assert_eq!(counts, [("Chief", 1), ("PS", 2), ("Worker", 2)]);
    for replica in replicas.values() {
        let container = &replica.template.spec.as_ref().unwrap().containers[0];
        assert_eq!(container.name, "tensorflow");
    }

    // Without an image there is nothing to run on Kubernetes.
    let child = std::process::Command::new(SUBMIT)
        .args([
            "--dry-run",
            "--strategy",
            "AllReduce",
            "--worker-num",
            "2",
            "--task",
            "x",
            "--",
            "true",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = common::wait_output(child, "vans-submit --dry-run without --image");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        common::text(&out).contains("needs --image"),
        "{}",
        common::text(&out)
    );
}

/// What the fake API server saw and how its pods go.
#[derive(Default)]
struct Api {
    /// Objects created, in order (checked against the API types as they came).
    created: Vec<Value>,
    /// Objects that failed the check, with why.
    invalid: Vec<String>,
    /// Pods: name → (labels, times listed).
    pods: BTreeMap<String, (BTreeMap<String, String>, u32)>,
    /// Deletions, as `kind/name` or `pods?selector`.
    deleted: Vec<String>,
}

type Shared = Arc<Mutex<Api>>;

fn labels_of(object: &Value) -> BTreeMap<String, String> {
    serde_json::from_value(object["metadata"]["labels"].clone()).unwrap_or_default()
}

fn record(api: &Shared, object: &Value) {
    let mut api = api.lock().unwrap();
    if let Err(e) = check_object(object) {
        api.invalid.push(e);
    }
    api.created.push(object.clone());
}

/// A service; a name already taken is refused with 409, as the API server does.
async fn create_service(
    State(api): State<Shared>,
    Json(object): Json<Value>,
) -> (axum::http::StatusCode, Json<Value>) {
    let name = object["metadata"]["name"].clone();
    let taken = api
        .lock()
        .unwrap()
        .created
        .iter()
        .any(|o| o["kind"] == "Service" && o["metadata"]["name"] == name);
    if taken {
        let status = json!({"apiVersion": "v1", "kind": "Status", "metadata": {},
            "status": "Failure", "reason": "AlreadyExists", "code": 409,
            "message": format!("services {name} already exists")});
        return (axum::http::StatusCode::CONFLICT, Json(status));
    }
    record(&api, &object);
    (axum::http::StatusCode::CREATED, Json(object))
}

async fn create_pod(
    State(api): State<Shared>,
    Json(object): Json<Value>,
) -> (axum::http::StatusCode, Json<Value>) {
    record(&api, &object);
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    api.lock()
        .unwrap()
        .pods
        .insert(name, (labels_of(&object), 0));
    (axum::http::StatusCode::CREATED, Json(object))
}

/// A TFJob: the operator's pods appear, labelled as the training operator labels them.
async fn create_tfjob(
    State(api): State<Shared>,
    Json(object): Json<Value>,
) -> (axum::http::StatusCode, Json<Value>) {
    record(&api, &object);
    let job = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let mut shared = api.lock().unwrap();
    for (kind, spec) in object["spec"]["tfReplicaSpecs"]
        .as_object()
        .into_iter()
        .flatten()
    {
        for index in 0..spec["replicas"].as_i64().unwrap_or(0) {
            let labels = BTreeMap::from([
                ("training.kubeflow.org/job-name".to_owned(), job.clone()),
                (
                    "training.kubeflow.org/replica-type".to_owned(),
                    kind.to_lowercase(),
                ),
                (
                    "training.kubeflow.org/replica-index".to_owned(),
                    index.to_string(),
                ),
            ]);
            shared.pods.insert(
                format!("{job}-{}-{index}", kind.to_lowercase()),
                (labels, 0),
            );
        }
    }
    (axum::http::StatusCode::CREATED, Json(object))
}

/// `labelSelector=k%3Dv` of a query: (k, v).
fn selector(query: Option<&str>) -> Option<(String, String)> {
    let raw = query?
        .split('&')
        .find_map(|p| p.strip_prefix("labelSelector="))?;
    let decoded = raw
        .replace("%3D", "=")
        .replace("%3d", "=")
        .replace("%2F", "/")
        .replace("%2f", "/");
    let (k, v) = decoded.split_once('=')?;
    Some((k.to_owned(), v.to_owned()))
}

/// Lists pods; each listing moves a pod on: Pending, Running, then it exits — with code 3
/// for a `worker-1` of a job named `…fail…`, else 0.
async fn list_pods(State(api): State<Shared>, RawQuery(query): RawQuery) -> Json<Value> {
    let (key, value) = selector(query.as_deref()).unwrap_or_default();
    let mut api = api.lock().unwrap();
    let mut items = Vec::new();
    for (name, (labels, listed)) in api.pods.iter_mut() {
        if labels.get(&key) != Some(&value) {
            continue;
        }
        *listed += 1;
        let fails = name.contains("fail") && name.ends_with("worker-1");
        let stuck = name.contains("stuck") && name.ends_with("worker-0");
        let (phase, state) = match *listed {
            _ if stuck => (
                "Pending",
                json!({"waiting": {"reason": "ImagePullBackOff"}}),
            ),
            1 => (
                "Pending",
                json!({"waiting": {"reason": "ContainerCreating"}}),
            ),
            2 => ("Running", json!({"running": {}})),
            _ if fails => ("Failed", json!({"terminated": {"exitCode": 3}})),
            _ => ("Succeeded", json!({"terminated": {"exitCode": 0}})),
        };
        items.push(json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": labels},
            "status": {"phase": phase, "containerStatuses": [{
                "name": "vans", "ready": false, "restartCount": 0, "image": "vans:latest",
                "imageID": "", "state": state,
            }]},
        }));
    }
    Json(json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items}))
}

async fn pod_log(UrlPath((_, name)): UrlPath<(String, String)>) -> String {
    format!("log of pod {name}\n")
}

async fn delete_pods(State(api): State<Shared>, RawQuery(query): RawQuery) -> Json<Value> {
    let (key, value) = selector(query.as_deref()).unwrap_or_default();
    api.lock()
        .unwrap()
        .deleted
        .push(format!("pods?{key}={value}"));
    Json(json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": []}))
}

async fn delete_named(
    State(api): State<Shared>,
    UrlPath((_, kind, name)): UrlPath<(String, String, String)>,
) -> Json<Value> {
    api.lock().unwrap().deleted.push(format!("{kind}/{name}"));
    Json(json!({"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Success"}))
}

/// Kubeflow's API group as the training operator's CRDs make an API server serve it
/// (`GET /apis/kubeflow.org/v1`), checked against the discovery type.
async fn kubeflow_resources() -> Json<Value> {
    let list = json!({
        "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "kubeflow.org/v1",
        "resources": [
            {"name": "tfjobs", "singularName": "tfjob", "namespaced": true, "kind": "TFJob",
             "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]},
            {"name": "tfjobs/status", "singularName": "", "namespaced": true, "kind": "TFJob",
             "verbs": ["get", "patch", "update"]},
        ],
    });
    typed::<k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResourceList>(&list).unwrap();
    Json(list)
}

/// Starts the fake API server on a runtime of its own; returns its state, its port and the
/// runtime (which must outlive the test). With `kubeflow`, it serves Kubeflow's API group's
/// discovery document (the training operator is installed); without, that path is a 404, as
/// on a cluster without the operator.
fn fake_api(kubeflow: bool) -> (Shared, u16, tokio::runtime::Runtime) {
    let api = Shared::default();
    let router = Router::new()
        .route("/api/v1/namespaces/{ns}/services", post(create_service))
        .route(
            "/api/v1/namespaces/{ns}/pods",
            post(create_pod).get(list_pods).delete(delete_pods),
        )
        .route("/api/v1/namespaces/{ns}/pods/{name}/log", get(pod_log))
        .route(
            "/api/v1/namespaces/{ns}/{kind}/{name}",
            delete(delete_named),
        )
        .route(
            "/apis/kubeflow.org/v1/namespaces/{ns}/tfjobs",
            post(create_tfjob),
        )
        .route(
            "/apis/kubeflow.org/v1/namespaces/{ns}/{kind}/{name}",
            delete(delete_named),
        );
    let router = if kubeflow {
        router.route("/apis/kubeflow.org/v1", get(kubeflow_resources))
    } else {
        router
    }
    .with_state(Arc::clone(&api));
    let (port, runtime) = serve(router);
    (api, port, runtime)
}

/// Serves `router` on 127.0.0.1 from a runtime of its own; the port and the runtime (which
/// must outlive the test).
fn serve(router: Router) -> (u16, tokio::runtime::Runtime) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    runtime.spawn(async move { axum::serve(listener, router).await });
    (port, runtime)
}

/// A kubeconfig for the fake API server, namespace `ml`.
fn kubeconfig(port: u16) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("vans-kubeconfig-{}-{port}", std::process::id()));
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://127.0.0.1:{port}\nusers:\n- name: test\n  user:\n    token: not-a-secret\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: test\n    namespace: ml\ncurrent-context: fake\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// Submits a job over HTTP and waits for it to end; its final status.
fn run_job(master: &Master, name: &str, workers: u32) -> Value {
    let spec = json!({
        "name": name, "strategy": "ParameterServer", "ps_num": 1, "worker_num": workers,
        "command": ["ps-bench", "--mode", "check"], "image": "vans:latest",
    });
    let (code, body) = master.get("POST", "/jobs", Some(&spec.to_string()));
    assert_eq!(code, 201, "{body}");
    let id = serde_json::from_str::<Value>(&body).unwrap()["id"]
        .as_u64()
        .unwrap();
    let started = Instant::now();
    loop {
        let (code, body) = master.get("GET", &format!("/jobs/{id}"), None);
        assert_eq!(code, 200, "{body}");
        let status: Value = serde_json::from_str(&body).unwrap();
        if ["succeeded", "failed", "stopped"].contains(&status["state"].as_str().unwrap()) {
            return status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "job did not end: {status}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn the_master_runs_jobs_through_the_kubernetes_api() {
    // No Kubeflow on this cluster: the default layout (auto) is pods.
    let (api, port, _runtime) = fake_api(false);
    let config = kubeconfig(port);
    let config = config.to_str().unwrap();
    let master = Master::start_with(
        "kubernetes",
        &["--instance", "t1"],
        &[("KUBECONFIG", config)],
    );

    // TensorFlow jobs are refused before anything reaches the API server: a TFJob's operator
    // sets TF_CONFIG there.
    let refused = master.submit(&[
        "--strategy",
        "ParameterServer",
        "--worker-num",
        "1",
        "--tensorflow",
        "--task",
        "tf",
        "--",
        "true",
    ]);
    let text = common::text(&refused);
    assert!(!refused.status.success(), "{text}");
    assert!(
        text.contains("run on the local and Slurm backends") && text.contains("TFJob"),
        "{text}"
    );

    // A job that succeeds: a service and a pod per task, each exiting 0, logs fetched.
    let status = run_job(&master, "good", 2);
    assert_eq!(status["state"], "succeeded", "{status}");
    let tasks = common::master::task_states(&status);
    assert_eq!(tasks.len(), 4, "{tasks:?}");
    assert!(
        tasks
            .iter()
            .all(|(_, s, c)| s == "succeeded" && *c == Some(0)),
        "{tasks:?}"
    );
    let (code, log) = master.get(
        "GET",
        &format!("/jobs/{}/logs/worker-1", status["id"]),
        None,
    );
    assert_eq!(
        (code, log.as_str()),
        (200, "log of pod vans-good-1-t1-worker-1\n")
    );
    {
        let api = api.lock().unwrap();
        assert!(api.invalid.is_empty(), "{:?}", api.invalid);
        let made: Vec<(&str, &str)> = api
            .created
            .iter()
            .map(|o| {
                (
                    o["kind"].as_str().unwrap(),
                    o["metadata"]["name"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            made,
            [
                ("Service", "vans-good-1-t1"),
                ("Pod", "vans-good-1-t1-scheduler"),
                ("Pod", "vans-good-1-t1-server-0"),
                ("Pod", "vans-good-1-t1-worker-0"),
                ("Pod", "vans-good-1-t1-worker-1"),
            ]
        );
        assert!(api
            .created
            .iter()
            .all(|o| o["metadata"]["namespace"] == "ml"));
        assert!(
            api.deleted.is_empty(),
            "a finished job keeps its pods: {:?}",
            api.deleted
        );
    }

    // A job whose worker-1 exits 3: failed, named, and its objects deleted.
    let status = run_job(&master, "fail", 2);
    assert_eq!(status["state"], "failed", "{status}");
    let error = status["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("worker-1") && error.contains("exit code 3"),
        "{error}"
    );
    let tasks = common::master::task_states(&status);
    assert!(
        tasks.contains(&("worker-1".into(), "failed".into(), Some(3))),
        "{tasks:?}"
    );
    let deleted = api.lock().unwrap().deleted.clone();
    assert!(
        deleted.contains(&"pods?vans-job=vans-fail-2-t1".to_owned()),
        "{deleted:?}"
    );
    assert!(
        deleted.contains(&"services/vans-fail-2-t1".to_owned()),
        "{deleted:?}"
    );
    // The logs of tasks that had not ended were saved before their pods went.
    let (code, log) = master.get(
        "GET",
        &format!("/jobs/{}/logs/scheduler", status["id"]),
        None,
    );
    assert_eq!(
        (code, log.as_str()),
        (200, "log of pod vans-fail-2-t1-scheduler\n")
    );

    // A task whose image never comes fails the job, named with the reason.
    let status = run_job(&master, "stuck", 1);
    assert_eq!(status["state"], "failed", "{status}");
    let error = status["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("worker-0") && error.contains("ImagePullBackOff"),
        "{error}"
    );

    // Another master with the same instance name (as one started again): its job 1 has the
    // name of a job that exists; creating it fails, and nothing of the first is deleted.
    let again = Master::start_with(
        "kubernetes",
        &["--instance", "t1"],
        &[("KUBECONFIG", config)],
    );
    let before = api.lock().unwrap().deleted.len();
    let spec = json!({"name": "good", "strategy": "ParameterServer", "ps_num": 1,
                      "worker_num": 2, "command": ["true"], "image": "vans:latest"});
    let (code, body) = again.get("POST", "/jobs", Some(&spec.to_string()));
    assert_eq!(code, 400, "{body}");
    assert!(
        body.contains("cannot create service vans-good-1-t1"),
        "{body}"
    );
    let deleted = api.lock().unwrap().deleted.clone();
    assert_eq!(
        deleted.len(),
        before,
        "deleted another job's objects: {deleted:?}"
    );

    // The image is required.
    let spec = json!({"name": "noimage", "strategy": "AllReduce", "ps_num": 0, "worker_num": 1,
                      "command": ["true"]});
    let (code, body) = master.get("POST", "/jobs", Some(&spec.to_string()));
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("needs --image"), "{body}");
}

#[test]
fn the_master_runs_a_tfjob_through_the_kubernetes_api() {
    // The training operator is installed: the default layout (auto) is a TFJob.
    let (api, port, _runtime) = fake_api(true);
    let config = kubeconfig(port);
    let master = Master::start_with(
        "kubernetes",
        &["--instance", "t2"],
        &[("KUBECONFIG", config.to_str().unwrap())],
    );
    let status = run_job(&master, "tf", 3);
    assert_eq!(status["state"], "succeeded", "{status}");
    // The chief hosts the scheduler: no scheduler task; the chief is worker-0.
    let names: Vec<String> = common::master::task_states(&status)
        .into_iter()
        .map(|(n, _, _)| n)
        .collect();
    assert_eq!(names, ["server-0", "worker-0", "worker-1", "worker-2"]);
    let (code, log) = master.get(
        "GET",
        &format!("/jobs/{}/logs/worker-0", status["id"]),
        None,
    );
    assert_eq!(
        (code, log.as_str()),
        (200, "log of pod vans-tf-1-t2-chief-0\n")
    );
    let api = api.lock().unwrap();
    assert!(api.invalid.is_empty(), "{:?}", api.invalid);
    assert_eq!(api.created.len(), 1);
    assert_eq!(api.created[0]["kind"], "TFJob");
}

/// An API server that cannot say whether it serves Kubeflow's group (it answers 500): with
/// the default `--layout auto` the master refuses to start and says to choose a layout,
/// rather than guess and fail every job later.
#[test]
fn a_master_that_cannot_tell_the_layout_refuses_to_start() {
    let (port, _runtime) = serve(Router::new().route(
        "/apis/kubeflow.org/v1",
        get(|| async {
            (
                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                "etcd is down",
            )
        }),
    ));
    let config = kubeconfig(port);
    let master = std::process::Command::new(MASTER)
        .args(["--port", &common::free_port().to_string()])
        .args(["--backend", "kubernetes", "--instance", "t3"])
        .env("KUBECONFIG", &config)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // A master that started would serve until killed: the deadline fails the test instead.
    let out = common::wait_output_within(master, "vans-master", Duration::from_secs(60));
    let text = common::text(&out);
    assert!(!out.status.success(), "the master started: {text}");
    assert!(
        text.contains("cannot tell whether the cluster serves Kubeflow's TFJob")
            && text.contains("--layout pods or --layout tfjob"),
        "{text}"
    );
}
