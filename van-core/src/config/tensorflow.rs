//! What TensorFlow deployments give a node: `TF_CONFIG`, which stands in for the `DMLC_*`
//! variables that are not set, and the endpoint map (`VANS_ENDPOINT_MAP`, or
//! `./.endpoint_map` with [`Config::from_env`]).

use std::path::Path;

use super::error::ConfigError;
use super::reader::Vars;
use super::tf_server::{data_addresses, CLUSTER_VARS};
use super::variables::known_name;
use crate::endpoint_map::EndpointMap;
use crate::message::{Role, TfTask};
use crate::tf_config::TfConfig;

/// What `TF_CONFIG` says of this process beyond the `DMLC_*` variables.
#[derive(Debug, Default)]
pub(super) struct FromTfConfig {
    /// It also runs the scheduler.
    pub(super) hosts_scheduler: bool,
    /// Its task and the role that task maps to.
    pub(super) task: Option<(Role, TfTask)>,
    /// The endpoint map, when a TensorFlow server's addresses needed it already (read once).
    pub(super) endpoint_map: Option<EndpointMap>,
}

/// The endpoint map [`Config::from_env`](super::Config::from_env) reads from the current
/// directory when `VANS_ENDPOINT_MAP` is unset and the file exists.
pub const DEFAULT_ENDPOINT_MAP: &str = ".endpoint_map";

impl Vars {
    /// Fills the `DMLC_*` variables that `TF_CONFIG` stands for and that are not set
    /// explicitly; returns what else `TF_CONFIG` says of this process.
    pub(super) fn apply_tf_config(&mut self) -> Result<FromTfConfig, ConfigError> {
        // A TensorFlow server's cluster decides the node's place, whatever else says.
        let tf_server = self.flag("VANS_TF_SERVER")?.unwrap_or(false);
        let Some(json) = self.get("TF_CONFIG") else {
            return Ok(FromTfConfig::default());
        };
        // `{}` and the like: TensorFlow's "no cluster", so nothing to stand for.
        if crate::tf_config::declares_no_cluster(json) {
            return Ok(FromTfConfig::default());
        }
        let json = json.to_owned();
        let wrap = |error| ConfigError::TfConfig {
            value: json.chars().take(1000).collect(),
            error: Box::new(error),
        };
        let tf = TfConfig::parse(&json).map_err(wrap)?;
        if tf_server {
            for var in CLUSTER_VARS {
                self.map.remove(var);
            }
            // A cluster of TensorFlow servers may have no ps task (MultiWorkerMirroredStrategy
            // has workers only): its vans cluster is then workers only too.
            if tf.num_servers() == 0 {
                self.map.insert("DMLC_NUM_SERVER", "0".to_owned());
            }
        }
        let derived = tf
            .dmlc_vars_except(|var| self.map.contains_key(var))
            .map_err(wrap)?;
        // The task is this process's only when TF_CONFIG chose its role: processes given
        // their roles explicitly (a launcher started inside a TFJob pod, which exports the
        // pod's TF_CONFIG to all of them) are not that task.
        let role_from_tf = !self.map.contains_key("DMLC_ROLE");
        // An explicit root address points at a scheduler run elsewhere.
        let hosts = tf.hosts_scheduler()
            && self.get("DMLC_PS_ROOT_URI").is_none()
            && self.get("DMLC_PS_ROOT_PORT").is_none();
        for (var, value) in derived {
            if let Some(var) = known_name(var) {
                self.map.insert(var, value);
            }
        }
        let mut endpoint_map = None;
        if tf_server {
            endpoint_map = self.endpoint_map()?;
            let map = &endpoint_map;
            let path = self
                .get("VANS_ENDPOINT_MAP")
                .unwrap_or(DEFAULT_ENDPOINT_MAP);
            let data = data_addresses(&tf, &json, map.as_ref().map(|map| (map, path)))?;
            self.map.insert("DMLC_PS_ROOT_URI", data.scheduler.host);
            self.map
                .insert("DMLC_PS_ROOT_PORT", data.scheduler.port.to_string());
            if self.get("DMLC_INTERFACE").is_none() {
                self.map.insert("DMLC_NODE_HOST", data.own.host);
            }
            self.map.insert("DMLC_PORT", data.own.port.to_string());
        }
        let task = tf.role().ok().filter(|_| role_from_tf).map(|role| {
            let task = TfTask {
                job: tf.task_type.clone(),
                index: tf.task_index,
            };
            (role, task)
        });
        Ok(FromTfConfig {
            hosts_scheduler: hosts,
            task,
            endpoint_map,
        })
    }

    /// The endpoint map named by `VANS_ENDPOINT_MAP`, if set.
    pub(super) fn endpoint_map(&self) -> Result<Option<EndpointMap>, ConfigError> {
        let Some(path) = self.get("VANS_ENDPOINT_MAP") else {
            return Ok(None);
        };
        EndpointMap::load(Path::new(path))
            .map(Some)
            .map_err(|error| ConfigError::EndpointMap {
                origin: "from VANS_ENDPOINT_MAP",
                path: path.to_owned(),
                error: Box::new(error),
            })
    }
}

/// The endpoint map at `path` if that file exists (`./.endpoint_map` for
/// [`Config::from_env`]).
pub(super) fn default_endpoint_map(path: &Path) -> Result<Option<EndpointMap>, ConfigError> {
    if !path.exists() {
        return Ok(None);
    }
    EndpointMap::load(path)
        .map(Some)
        .map_err(|error| ConfigError::EndpointMap {
            origin: "found in the current directory; set VANS_ENDPOINT_MAP to use another file",
            path: path.display().to_string(),
            error: Box::new(error),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::rdma::RdmaMode;
    use crate::config::Config;
    use crate::endpoint_map::EndpointMapError;
    use crate::message::Role;

    const TF_CLUSTER: &str = r#""cluster": {"chief": ["chief-0.ns:2222"],
        "worker": ["worker-0.ns:2222", "worker-1.ns:2222"], "ps": ["ps-0.ns:2222"],
        "evaluator": ["eval-0.ns:2222"]}"#;

    fn tf_config(task_type: &str, index: u32, rest: &str) -> String {
        format!(r#"{{{TF_CLUSTER}, "task": {{"type": "{task_type}", "index": {index}}}{rest}}}"#)
    }

    fn from_tf(json: &str, extra: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let mut vars = vec![("TF_CONFIG", json)];
        vars.extend_from_slice(extra);
        Config::from_vars(vars)
    }

    #[test]
    fn the_task_is_the_nodes_when_its_role_is_the_tasks() {
        let task = |job: &str, index| {
            Some(TfTask {
                job: job.into(),
                index,
            })
        };
        let c = from_tf(&tf_config("chief", 0, ""), &[]).unwrap();
        assert_eq!(c.tf_task, task("chief", 0));
        let c = from_tf(&tf_config("worker", 1, ""), &[]).unwrap();
        assert_eq!(c.tf_task, task("worker", 1));
        let c = from_tf(&tf_config("ps", 0, ""), &[]).unwrap();
        assert_eq!(c.tf_task, task("ps", 0));
        // An explicit role: the process did not take its role from TF_CONFIG, so it is not
        // the task (every process a launcher starts in a TFJob pod sees the pod's TF_CONFIG).
        let c = from_tf(&tf_config("chief", 0, ""), &[("DMLC_ROLE", "scheduler")]).unwrap();
        assert_eq!((c.role, c.tf_task), (Some(Role::Scheduler), None));
        let c = from_tf(&tf_config("worker", 1, ""), &[("DMLC_ROLE", "server")]).unwrap();
        assert_eq!(c.tf_task, None);
        let c = from_tf(&tf_config("worker", 1, ""), &[("DMLC_ROLE", "worker")]).unwrap();
        assert_eq!((c.role, c.tf_task), (Some(Role::Worker), None));
        assert_eq!(
            Config::from_vars([("TF_CONFIG", "{}")]).unwrap().tf_task,
            None
        );
    }

    #[test]
    fn a_sparse_worker_job_needs_the_worker_count() {
        let json = r#"{"cluster": {"chief": ["c:2222"], "ps": ["p:2222"],
                       "worker": {"2": "w2:2222"}}, "task": {"type": "worker", "index": 2}}"#;
        let e = from_tf(json, &[])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("set DMLC_NUM_WORKER") && e.contains("TF_CONFIG="),
            "{e}"
        );
        let c = from_tf(json, &[("DMLC_NUM_WORKER", "4")]).unwrap();
        assert_eq!(
            (c.role, c.num_workers, c.num_servers),
            (Some(Role::Worker), 4, 1)
        );
        assert_eq!(c.node_host.as_deref(), Some("w2"));
        assert_eq!((c.root_uri.as_str(), c.root_port), ("c", 2222));
    }

    #[test]
    fn tf_config_supplies_the_cluster_variables() {
        let c = from_tf(
            &tf_config("worker", 1, r#", "rpc_layer": "grpc+verbs""#),
            &[],
        )
        .unwrap();
        let mut expected = Config::builder()
            .role(Role::Worker)
            .num_workers(3)
            .num_servers(1)
            .root_uri("chief-0.ns")
            .root_port(2222)
            .node_host("worker-1.ns")
            .enable_rdma(RdmaMode::Ibverbs)
            .build()
            .unwrap();
        expected.tf_task = Some(TfTask {
            job: "worker".into(),
            index: 1,
        });
        assert_eq!(c, expected);
        assert!(!c.hosts_scheduler);

        let c = from_tf(&tf_config("ps", 0, r#", "environment": "cloud""#), &[]).unwrap();
        assert_eq!(c.role, Some(Role::Server));
        assert_eq!(c.node_host.as_deref(), Some("ps-0.ns"));
        assert_eq!(c.enable_rdma, RdmaMode::Off);
        assert!(!c.hosts_scheduler);

        // The chief hosts the scheduler on its own cluster address.
        let c = from_tf(&tf_config("chief", 0, ""), &[]).unwrap();
        assert_eq!(c.role, Some(Role::Worker));
        assert!(c.hosts_scheduler);
        assert_eq!((c.root_uri.as_str(), c.root_port), ("chief-0.ns", 2222));
        assert_eq!(c.host(), Some("chief-0.ns"));
        assert_eq!(c.port, 0);
        // An empty TF_CONFIG is unset, and so is one that declares no cluster (TensorFlow's
        // single-machine setting), with or without a task.
        assert_eq!(from_tf(" ", &[]).unwrap(), Config::default());
        for no_cluster in [
            "{}",
            r#"{"cluster": {}}"#,
            r#"{"cluster": null, "task": {"type": "worker", "index": 0}}"#,
            r#"{"cluster": {"worker": []}, "task": {}}"#,
            r#"{"task": {"type": "chief", "index": 0}, "rpc_layer": "grpc"}"#,
        ] {
            assert_eq!(
                from_tf(no_cluster, &[]).unwrap(),
                Config::default(),
                "{no_cluster}"
            );
        }
        // A cluster with tasks is still checked.
        assert!(from_tf(r#"{"cluster": {"worker": ["w:1"]}}"#, &[]).is_err());
    }

    #[test]
    fn explicit_dmlc_variables_override_tf_config() {
        let c = from_tf(
            &tf_config("worker", 0, r#", "rpc_layer": "grpc+verbs""#),
            &[
                ("DMLC_NUM_SERVER", "4"),
                ("DMLC_NODE_HOST", "10.1.1.1"),
                ("DMLC_ENABLE_RDMA", "0"),
                ("DMLC_ROLE", "server"),
            ],
        )
        .unwrap();
        assert_eq!(c.role, Some(Role::Server));
        assert_eq!((c.num_workers, c.num_servers), (3, 4));
        assert_eq!(c.node_host.as_deref(), Some("10.1.1.1"));
        assert_eq!(c.enable_rdma, RdmaMode::Off);
        assert_eq!(c.root_uri, "chief-0.ns");

        // An explicit root points at a scheduler elsewhere: the chief does not host one.
        for root in [("DMLC_PS_ROOT_URI", "sched"), ("DMLC_PS_ROOT_PORT", "9000")] {
            let c = from_tf(&tf_config("chief", 0, ""), &[root]).unwrap();
            assert!(!c.hosts_scheduler, "{root:?}");
        }
        // A scheduler role does not host a second scheduler.
        let c = from_tf(&tf_config("chief", 0, ""), &[("DMLC_ROLE", "scheduler")]).unwrap();
        assert_eq!((c.role, c.hosts_scheduler), (Some(Role::Scheduler), false));
        // DMLC_INTERFACE keeps TF_CONFIG from setting DMLC_NODE_HOST.
        let c = from_tf(&tf_config("ps", 0, ""), &[("DMLC_INTERFACE", "eth0")]).unwrap();
        assert_eq!((c.interface.as_deref(), c.host()), (Some("eth0"), None));
        // Explicit variables are not even derived: an evaluator with a role joins, and an
        // unknown rpc_layer is ignored when DMLC_ENABLE_RDMA is set.
        let c = from_tf(
            &tf_config("evaluator", 0, r#", "rpc_layer": "grpc+gdr""#),
            &[("DMLC_ROLE", "worker"), ("DMLC_ENABLE_RDMA", "1")],
        )
        .unwrap();
        assert_eq!(c.node_host.as_deref(), Some("eval-0.ns"));
        assert_eq!(c.enable_rdma, RdmaMode::Ibverbs);
        // The chief's own role cannot take the scheduler's port.
        let e = from_tf(&tf_config("chief", 0, ""), &[("DMLC_PORT", "2222")]).unwrap_err();
        assert!(matches!(e, ConfigError::Contradiction { .. }), "{e:?}");
        from_tf(&tf_config("chief", 0, ""), &[("DMLC_PORT", "2223")]).unwrap();
    }

    #[test]
    fn tf_config_errors_name_tf_config() {
        let cases = [
            ("{not json".to_owned(), "not a valid TF_CONFIG"),
            (tf_config("evaluator", 0, ""), "evaluators"),
            (tf_config("worker", 5, ""), "worker:5"),
            (
                tf_config("ps", 0, r#", "rpc_layer": "carrier-pigeon""#),
                "grpc+seastar",
            ),
        ];
        for (json, expected) in cases {
            let e = from_tf(&json, &[]).unwrap_err();
            assert!(matches!(e, ConfigError::TfConfig { .. }), "{e:?}");
            let message = e.to_string();
            assert!(
                message.contains("TF_CONFIG") && message.contains(expected),
                "{message}"
            );
        }
    }

    fn temp_file(name: &str, text: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("vans-config-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(DEFAULT_ENDPOINT_MAP);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn endpoint_map_from_variable_and_default_file() {
        let good = temp_file("good", "127.0.0.1:3333=127.0.0.1:5555\n");
        let path = good.to_str().unwrap();
        let c = Config::from_vars([("VANS_ENDPOINT_MAP", path)]).unwrap();
        let map = c.endpoint_map.as_ref().unwrap();
        assert_eq!(map.len(), 1);
        assert_eq!(map.get("127.0.0.1", 3333).map(|d| d.port), Some(5555));
        assert_eq!(
            Config::builder().endpoint_map(map.clone()).build().unwrap(),
            c
        );
        assert_eq!(default_endpoint_map(&good).unwrap().as_ref(), Some(map));
        assert_eq!(
            default_endpoint_map(&good.with_extension("missing")).unwrap(),
            None
        );

        let bad = temp_file("bad", "# header\n127.0.0.1:3333=127.0.0.1\n");
        let bad_path = bad.to_str().unwrap();
        let message = Config::from_vars([("VANS_ENDPOINT_MAP", bad_path)])
            .unwrap_err()
            .to_string();
        for part in ["VANS_ENDPOINT_MAP", bad_path, "line 2", "port is missing"] {
            assert!(message.contains(part), "{message:?} lacks {part:?}");
        }
        let message = default_endpoint_map(&bad).unwrap_err().to_string();
        assert!(message.contains("current directory") && message.contains("line 2"));

        let missing = "/nonexistent/vans/.endpoint_map";
        let e = Config::from_vars([("VANS_ENDPOINT_MAP", missing)]).unwrap_err();
        assert!(
            matches!(&e, ConfigError::EndpointMap { error, .. }
                if matches!(**error, EndpointMapError::Io { .. })),
            "{e:?}"
        );
        let message = e.to_string();
        assert!(message.contains("VANS_ENDPOINT_MAP") && message.contains(missing));
        for file in [good, bad] {
            std::fs::remove_dir_all(file.parent().unwrap()).unwrap();
        }
        // Without the variable, from_vars reads no file.
        let none: [(&str, &str); 0] = [];
        assert_eq!(Config::from_vars(none).unwrap().endpoint_map, None);
    }
}
