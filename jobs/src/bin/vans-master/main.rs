//! `vans-master`: the ElasticDL-style master. An HTTP service that takes job submissions
//! (`vans-submit`, or any HTTP client), starts each job's tasks through a backend, and
//! reports job and task status as JSON and each task's log as text.
//!
//! ```text
//! vans-master --port 8470 [--backend local|slurm] [--jobs-dir DIR]
//! POST   /jobs                       a JobSpec (JSON) -> 201 and the JobStatus
//! GET    /jobs                       every JobStatus
//! GET    /jobs/{id}                  one JobStatus
//! GET    /jobs/{id}/logs/{task}      the task's output (scheduler, server-0, worker-1, ...)
//! DELETE /jobs/{id}                  stops the job (answers once its tasks are stopped)
//! ```
//!
//! Every call presents the master's token (`Authorization: Bearer <token>`) when it has one:
//! `VANS_MASTER_TOKEN` or `--token-file` (`vans-submit` reads the same). Without a token
//! the master listens on loopback only: anyone who can reach it can run commands. A
//! request body is at most 1 MiB, and a request's headers and then its body must each
//! arrive within `--read-timeout` (10 s); an answer the client stops reading is cut off after
//! `--write-timeout` (30 s); beyond `--max-connections` (256) at once, a connection is
//! answered 503 and closed. `--tls-cert` and `--tls-key` (feature `tls`)
//! serve HTTPS; `vans-submit --master https://… --ca-file CERT` trusts it.
//!
//! Backends: `local` starts the tasks as processes on this machine (each with `DMLC_*`
//! including its role, `NUM_WORKERS`, its index as `VANS_RANK` and a `TF_CONFIG` naming its
//! task); `slurm` submits one batch job whose
//! `srun` tasks take their roles from their Slurm ranks (`sbatch`, `scontrol`, `scancel` on
//! the PATH, `SLURM_CONF` as for any Slurm client); `kubernetes` (feature `kubernetes`)
//! creates a headless service and a pod per task, or a Kubeflow `TFJob` (`--layout tfjob`, or
//! by default when the cluster serves the `tfjobs` resource), through the API, for jobs that
//! name an `--image`.

mod follow; // the one loop that follows a job through its backend
#[cfg(feature = "kubernetes")]
mod kube;
mod listen;
mod local;
mod slurm;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use clap::Parser;
use jobs::token::{Token, TOKEN_ENV};
use jobs::BoxError;
use jobs::{JobSpec, JobStatus, State as JobState};

/// The master's options.
#[derive(Parser, Debug)]
#[command(name = "vans-master", version)]
struct Options {
    /// Port to listen on, on 127.0.0.1 unless --host says otherwise.
    #[arg(long, default_value = "8470")]
    port: u16,
    /// Address to listen on; beyond loopback only with a token.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// A file holding the token every call must present (instead of VANS_MASTER_TOKEN).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Serve HTTPS with this PEM certificate chain (with --tls-key; a build with the `tls`
    /// feature). Clients then name the certificate to trust (`vans-submit --ca-file`).
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Seconds a request's headers, and then its body, may take to arrive: a client that
    /// sends half a request is answered 408 or cut off after this, not held for ever.
    #[arg(long, default_value = "10", value_parser = seconds)]
    read_timeout: std::time::Duration,
    /// Seconds an answer may take to be written once the client stops reading it: a client
    /// that never reads is cut off after this, not held for ever.
    #[arg(long, default_value = "30", value_parser = seconds)]
    write_timeout: std::time::Duration,
    /// Connections served at once; one more is answered 503 and closed (over TLS: closed).
    #[arg(long, default_value = "256", value_parser = clap::value_parser!(u32).range(1..))]
    max_connections: u32,
    /// How jobs are started: local (processes on this machine), slurm, or kubernetes (a
    /// build with the `kubernetes` feature).
    #[arg(long, default_value = "local", value_parser = ["local", "slurm", "kubernetes"])]
    backend: String,
    /// Where each job's files (logs, batch script) go [default: a new folder
    /// vans-master-PID in the system's temporary directory, left there when the master
    /// exits, so the logs can be read afterwards].
    #[arg(long)]
    jobs_dir: Option<PathBuf>,
    /// Kubernetes: the namespace of the jobs' objects (default: the configuration's).
    #[arg(long)]
    namespace: Option<String>,
    /// Kubernetes: `pods` (a headless service and a pod per task; no operator needed),
    /// `tfjob` (a Kubeflow TFJob; the training operator must be installed) or `auto` (`tfjob`
    /// when the cluster serves Kubeflow's `tfjobs` resource, else `pods`).
    #[arg(long, default_value = "auto", value_parser = ["auto", "pods", "tfjob"])]
    layout: String,
    /// Kubernetes: a Secret (key `secret`) with the cluster secret, mounted into every pod.
    #[arg(long)]
    kube_secret: Option<String>,
    /// Kubernetes: a name for this master, part of its objects' names, so that masters
    /// sharing a namespace (or one started again) never take each other's objects: 1 to 8
    /// lower-case letters and digits (default: 4 random hex digits).
    #[arg(long)]
    instance: Option<String>,
}

/// A positive number of seconds (`--read-timeout`).
fn seconds(text: &str) -> Result<std::time::Duration, String> {
    match text.parse::<f64>() {
        Ok(s) if s > 0.0 && s.is_finite() => Ok(std::time::Duration::from_secs_f64(s)),
        _ => Err(format!("{text}: expected a positive number of seconds")),
    }
}

/// `--instance`, or 4 random hex digits.
#[cfg(feature = "kubernetes")]
fn instance(given: Option<&str>) -> Result<String, String> {
    use std::hash::BuildHasher;
    match given {
        Some(name)
            if (1..=8).contains(&name.len())
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()) =>
        {
            Ok(name.to_owned())
        }
        Some(name) => Err(format!(
            "--instance {name:?}: 1 to 8 lower-case letters and digits"
        )),
        None => {
            let random = std::collections::hash_map::RandomState::new()
                .hash_one((std::process::id(), std::time::SystemTime::now()));
            Ok(format!("{:04x}", random & 0xffff))
        }
    }
}

/// A job the master knows: its status and how to stop it.
pub(crate) struct Job {
    pub(crate) status: JobStatus,
    pub(crate) dir: PathBuf,
    /// Set when the job is asked to stop; its follow loop stops the tasks.
    pub(crate) stop: Arc<AtomicBool>,
}

/// Every job, by id.
#[derive(Clone)]
pub(crate) struct Jobs {
    inner: Arc<Mutex<BTreeMap<u64, Job>>>,
}

impl Jobs {
    pub(crate) fn update(&self, id: u64, f: impl FnOnce(&mut Job)) {
        if let Some(job) = self
            .inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(&id)
        {
            f(job);
        }
    }
}

struct App {
    jobs: Jobs,
    backend: String,
    #[cfg(feature = "kubernetes")]
    kube: Option<kube::Kube>,
    jobs_dir: PathBuf,
    next: Mutex<u64>,
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(serde_json::json!({ "error": message.into() }))).into_response()
}

async fn submit(State(app): State<Arc<App>>, Json(spec): Json<JobSpec>) -> Response {
    if let Err(e) = spec.check() {
        return error(StatusCode::BAD_REQUEST, e);
    }
    if spec.tensorflow && app.backend == "kubernetes" {
        return error(
            StatusCode::BAD_REQUEST,
            "TensorFlow jobs (--tensorflow) run on the local and Slurm backends; this \
             master's is kubernetes, where a TFJob's operator sets TF_CONFIG (vans-submit \
             --dry-run --layout tfjob writes one)",
        );
    }
    if spec.elastic && app.backend != "local" {
        return error(
            StatusCode::BAD_REQUEST,
            format!(
                "elastic jobs (workers started again when they fail) run on the local \
                 backend; this master's is {}",
                app.backend
            ),
        );
    }
    if app.backend != "kubernetes" {
        if let Some(image) = &spec.image {
            return error(
                StatusCode::BAD_REQUEST,
                format!(
                    "image {image}: images run on the kubernetes backend; this master's {} \
                     backend runs commands (give the command instead)",
                    app.backend
                ),
            );
        }
    }
    let id = {
        let mut next = app.next.lock().unwrap_or_else(|e| e.into_inner());
        *next += 1;
        *next
    };
    let dir = app.jobs_dir.join(format!("{id}-{}", spec.name));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot create {}: {e}", dir.display()),
        );
    }
    eprintln!(
        "vans-master: job {id} ({}): submitted, {} tasks on the {} backend",
        spec.name,
        spec.tasks().len(),
        app.backend
    );
    let status = JobStatus {
        id,
        backend: app.backend.clone(),
        state: JobState::Pending,
        tasks: spec
            .tasks()
            .into_iter()
            .map(|(name, role, _)| jobs::TaskStatus {
                name,
                role: role.into(),
                state: JobState::Pending,
                exit_code: None,
                restarts: 0,
                pid: None,
            })
            .collect(),
        error: None,
        spec,
    };
    let stop = Arc::new(AtomicBool::new(false));
    app.jobs
        .inner
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(
            id,
            Job {
                status: status.clone(),
                dir: dir.clone(),
                stop: Arc::clone(&stop),
            },
        );
    let started = match app.backend.as_str() {
        "slurm" => slurm::start(app.jobs.clone(), id, &status.spec, &dir, stop).await,
        #[cfg(feature = "kubernetes")]
        "kubernetes" => match &app.kube {
            Some(kube) => {
                kube.start(app.jobs.clone(), id, &status.spec, &dir, stop)
                    .await
            }
            None => Err("the kubernetes backend is not connected".into()),
        },
        _ => local::start(app.jobs.clone(), id, &status.spec, &dir, stop),
    };
    if let Err(e) = started {
        app.jobs.update(id, |job| {
            job.status.state = JobState::Failed;
            job.status.error = Some(e.to_string());
        });
        return error(
            StatusCode::BAD_REQUEST,
            format!("job {id} did not start: {e}"),
        );
    }
    eprintln!("vans-master: job {id} ({}) started", status.spec.name);
    match status_of(&app, id) {
        Some(status) => (StatusCode::CREATED, Json(status)).into_response(),
        None => error(StatusCode::NOT_FOUND, format!("no job {id}")),
    }
}

fn status_of(app: &App, id: u64) -> Option<JobStatus> {
    app.jobs
        .inner
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&id)
        .map(|job| job.status.clone())
}

async fn list(State(app): State<Arc<App>>) -> Json<Vec<JobStatus>> {
    let jobs = app.jobs.inner.lock().unwrap_or_else(|e| e.into_inner());
    Json(jobs.values().map(|job| job.status.clone()).collect())
}

async fn show(State(app): State<Arc<App>>, Path(id): Path<u64>) -> Response {
    match status_of(&app, id) {
        Some(status) => Json(status).into_response(),
        None => error(StatusCode::NOT_FOUND, format!("no job {id}")),
    }
}

/// Stops a job and answers once its follow loop has stopped every task (or after
/// [`STOP_WAIT`], with the tasks as they are then), so that the answer's job and task states
/// agree: no `stopped` job with `running` tasks.
async fn stop(State(app): State<Arc<App>>, Path(id): Path<u64>) -> Response {
    {
        let mut jobs = app.jobs.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Some(job) = jobs.get_mut(&id) else {
            return error(StatusCode::NOT_FOUND, format!("no job {id}"));
        };
        if !job.status.state.is_final() {
            job.status.state = JobState::Stopped;
            // The job's follow loop stops its tasks at its next turn.
            job.stop.store(true, Ordering::Release);
            eprintln!("vans-master: job {id}: asked to stop");
        }
    }
    let deadline = tokio::time::Instant::now() + STOP_WAIT;
    while tokio::time::Instant::now() < deadline {
        let open = {
            let jobs = app.jobs.inner.lock().unwrap_or_else(|e| e.into_inner());
            jobs.get(&id)
                .is_some_and(|job| job.status.tasks.iter().any(|t| !t.state.is_final()))
        };
        if !open {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    show(State(app), Path(id)).await
}

/// How long a stop waits for the job's tasks to be stopped before it answers: the local
/// backend's grace between SIGTERM and SIGKILL, with room to spare.
const STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(15);

async fn log(State(app): State<Arc<App>>, Path((id, task)): Path<(u64, String)>) -> Response {
    let dir = {
        let jobs = app.jobs.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Some(job) = jobs.get(&id) else {
            return error(StatusCode::NOT_FOUND, format!("no job {id}"));
        };
        if !job.status.tasks.iter().any(|t| t.name == task) {
            return error(
                StatusCode::NOT_FOUND,
                format!("job {id} has no task {task:?}"),
            );
        }
        job.dir.clone()
    };
    match std::fs::read_to_string(dir.join(format!("{task}.log"))) {
        Ok(text) => text.into_response(),
        Err(e) => error(StatusCode::NOT_FOUND, format!("no log of {task} yet: {e}")),
    }
}

/// The largest request body the master reads (a job's JSON is a few KiB).
const MAX_BODY_BYTES: usize = 1 << 20;

/// Lets a request through when the master has no token or the request presents it.
async fn authorize(
    State(token): State<Arc<Option<Token>>>,
    request: axum::extract::Request,
    next: middleware::Next,
) -> Response {
    if let Some(token) = token.as_ref() {
        let presented = request
            .headers()
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if !presented.is_some_and(|p| token.matches(p)) {
            return error(
                StatusCode::UNAUTHORIZED,
                format!(
                    "this master needs its token: Authorization: Bearer <token> \
                     ({TOKEN_ENV} or --token-file for vans-submit)"
                ),
            );
        }
    }
    next.run(request).await
}

#[tokio::main]
async fn main() {
    node::logging::init(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let options = Options::parse();
    if let Err(e) = serve(options).await {
        eprintln!("vans-master: {e}");
        std::process::exit(1);
    }
}

async fn serve(o: Options) -> Result<(), BoxError> {
    let token = Token::from_env_or_file(o.token_file.as_deref())?;
    if token.is_none() && !launcher::is_loopback(&o.host) {
        return Err(format!(
            "--host {} reaches beyond this machine, and without a token anyone who reaches the \
             master runs commands through it: set {TOKEN_ENV} or --token-file, or listen on \
             127.0.0.1",
            o.host
        )
        .into());
    }
    let jobs_dir = match o.jobs_dir {
        Some(dir) => dir,
        None => std::env::temp_dir().join(format!("vans-master-{}", std::process::id())),
    };
    std::fs::create_dir_all(&jobs_dir)
        .map_err(|e| format!("cannot create {}: {e}", jobs_dir.display()))?;
    #[cfg(feature = "kubernetes")]
    let kube = match o.backend.as_str() {
        "kubernetes" => {
            let layout = match o.layout.as_str() {
                "auto" => None,
                given => Some(given.parse().map_err(|e: String| format!("--layout {e}"))?),
            };
            let instance = instance(o.instance.as_deref())?;
            let kube =
                kube::Kube::connect(o.namespace.clone(), layout, o.kube_secret.clone(), instance)
                    .await?;
            eprintln!(
                "vans-master: Kubernetes namespace {}, layout {}{}, instance {}",
                kube.namespace,
                kube.layout,
                if layout.is_none() { " (detected)" } else { "" },
                kube.instance
            );
            Some(kube)
        }
        _ => None,
    };
    #[cfg(not(feature = "kubernetes"))]
    if o.backend == "kubernetes" {
        let _ = (&o.namespace, &o.layout, &o.kube_secret, &o.instance);
        return Err(
            "the kubernetes backend needs a build with the `kubernetes` feature \
                    (cargo build --release -p jobs --features kubernetes)"
                .into(),
        );
    }
    let app = Arc::new(App {
        jobs: Jobs {
            inner: Arc::default(),
        },
        #[cfg(feature = "kubernetes")]
        kube,
        backend: o.backend.clone(),
        jobs_dir: jobs_dir.clone(),
        next: Mutex::new(0),
    });
    let token = Arc::new(token);
    let deadline = listen::Deadline {
        read: o.read_timeout,
        max_body: MAX_BODY_BYTES,
    };
    // The last layer runs first: the token is checked before any body is read.
    let router = Router::new()
        .route("/jobs", get(list).post(submit))
        .route("/jobs/{id}", get(show).delete(stop))
        .route("/jobs/{id}/logs/{task}", get(log))
        .layer(middleware::from_fn_with_state(deadline, listen::read_body))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&token),
            authorize,
        ))
        .with_state(app);
    let tls = match (&o.tls_cert, &o.tls_key) {
        (Some(cert), Some(key)) => Some(listen::Tls::load(cert, key)?),
        _ => None,
    };
    let listener = tokio::net::TcpListener::bind((o.host.as_str(), o.port))
        .await
        .map_err(|e| format!("cannot listen on {}:{}: {e}", o.host, o.port))?;
    eprintln!(
        "vans-master: listening on {}://{} ({} backend, jobs in {}, {})",
        if tls.is_some() { "https" } else { "http" },
        listener.local_addr()?,
        o.backend,
        jobs_dir.display(),
        if token.is_some() {
            "every call needs the token"
        } else {
            "no token: loopback only"
        }
    );
    let limits = listen::Limits {
        read: o.read_timeout,
        write: o.write_timeout,
        connections: o.max_connections as usize,
    };
    listen::serve(listener, router, tls, limits).await
}
