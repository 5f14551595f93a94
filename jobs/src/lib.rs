//! # jobs: running vans jobs
//!
//! The programs that start and watch a vans cluster, and the pieces they share:
//!
//! - `vans-launch` (src/bin/vans-launch.rs): a local cluster as processes, over the
//!   [`launcher`] crate, in the manner of dmlc-tracker's local launcher;
//! - `vans-master` (src/bin/vans-master/): an ElasticDL-style job service over HTTP, whose
//!   backends start a job's tasks as local processes, as a Slurm batch job or as Kubernetes
//!   objects, and one follow loop that records what the tasks do;
//! - `vans-submit` (src/bin/vans-submit.rs): its command-line client;
//! - `vans-doctor` (src/bin/vans-doctor.rs): what this host offers a node (RDMA device,
//!   memlock limit, io_uring, shared memory) and which van it would use for a peer.
//!
//! The library holds the job submission and status ([`spec`]), the HTTP client
//! ([`client`]), the master's access token ([`token`]) and, with feature `kubernetes`, a job's Kubernetes objects
//! ([`kubernetes`]).

pub mod client; // the small HTTP/1.1 client of vans-submit and the tests
#[cfg(feature = "kubernetes")]
pub mod kubernetes; // a job as a headless service and pods, or as a Kubeflow TFJob
pub mod spec; // JobSpec, JobStatus, task names and states
#[cfg(feature = "tls")]
pub mod tls;
pub mod token; // the master's access token: from the environment or a file, compared in constant time // rustls on ring and PEM certificates, for the master and its client

pub use spec::*;

/// The error of the programs' fallible steps: any error, with its message.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
