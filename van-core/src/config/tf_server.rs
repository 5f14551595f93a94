//! `VANS_TF_SERVER=1`: the node of a process whose TensorFlow server (`grpc+vans` and the
//! other protocols of `vans.tensorflow`) listens on its `TF_CONFIG` address, so vans must
//! listen elsewhere.
//!
//! The cluster is the server's (`TF_CONFIG`, which the plugin writes from the `ServerDef`):
//! `DMLC_ROLE`, the counts, the root address, `DMLC_NODE_HOST` and `DMLC_PORT` given any
//! other way are ignored, so a process started under a launcher that exports them for
//! another purpose still joins as its TensorFlow task. Where vans listens:
//!
//! - with an endpoint map (`.endpoint_map` of the Seastar and StarServer deployments), it
//!   must map every task's address; each task's node listens on its data address, except
//!   the task that hosts the scheduler, whose data address is the scheduler's (its own node
//!   then takes a free port on that host);
//! - without one, the scheduler listens on the first port above its task's gRPC port that
//!   no task of the cluster uses on that host (`chief:0` at `h:2222` with workers at
//!   `h:2223` and `h:2224`: `h:2225`), and every node on a free port. Every task derives
//!   the same address from the same cluster; an operator whose port is taken writes an
//!   endpoint map.

use std::collections::BTreeSet;

use super::error::ConfigError;
use crate::endpoint_map::{EndpointMap, HostPort};
use crate::tf_config::TfConfig;

/// The variables the server's cluster decides; any other source of them is ignored.
pub(super) const CLUSTER_VARS: &[&str] = &[
    "DMLC_ROLE",
    "DMLC_NUM_WORKER",
    "DMLC_NUM_SERVER",
    "DMLC_PS_ROOT_URI",
    "DMLC_PS_ROOT_PORT",
    "DMLC_NODE_HOST",
    "DMLC_PORT",
    "PORT",
    "VANS_RANK",
];

/// Where vans listens in a cluster of TensorFlow servers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct DataAddresses {
    /// The scheduler's address.
    pub(super) scheduler: HostPort,
    /// This task's node: its host, and its port (0: any free one).
    pub(super) own: HostPort,
}

/// Every task's `(job, index, address)` in the cluster spec.
fn tasks(tf: &TfConfig) -> Vec<(String, u32, String)> {
    let mut tasks = Vec::new();
    for (job, addresses) in &tf.cluster {
        for (index, address) in addresses.iter().enumerate() {
            tasks.push((job.clone(), index as u32, address.clone()));
        }
    }
    for (job, addresses) in &tf.sparse {
        for (index, address) in addresses {
            tasks.push((job.clone(), *index, address.clone()));
        }
    }
    tasks
}

/// Where the scheduler and this task's node listen (see the module's documentation):
/// `tf` parsed from `json`, with the endpoint map and its path (named in errors), if any.
pub(super) fn data_addresses(
    tf: &TfConfig,
    json: &str,
    map: Option<(&EndpointMap, &str)>,
) -> Result<DataAddresses, ConfigError> {
    let wrap = |error| ConfigError::TfConfig {
        value: json.chars().take(1000).collect(),
        error: Box::new(error),
    };
    let (job, index) = tf.scheduler_task().map_err(wrap)?;
    let scheduler_task = tf.address_of(job, index).map_err(wrap)?;
    let own_task = tf.address().map_err(wrap)?;
    if let Some((map, path)) = map {
        for (job, index, address) in tasks(tf) {
            if map.lookup(&address).is_none() {
                return Err(ConfigError::EndpointMapMissesTask {
                    path: path.to_owned(),
                    task: format!("{job}:{index}"),
                    address,
                });
            }
        }
        let data = |task: &HostPort| map.get(&task.host, task.port).cloned();
        let (Some(scheduler), Some(mut own)) = (data(&scheduler_task), data(&own_task)) else {
            // Every address was checked above.
            return Err(ConfigError::EndpointMapMissesTask {
                path: path.to_owned(),
                task: format!("{job}:{index}"),
                address: scheduler_task.to_string(),
            });
        };
        if tf.hosts_scheduler() {
            own.port = 0;
        }
        return Ok(DataAddresses { scheduler, own });
    }
    let taken: BTreeSet<u16> = tasks(tf)
        .iter()
        .filter_map(|(_, _, address)| address.parse::<HostPort>().ok())
        .filter(|address| address.host == scheduler_task.host)
        .map(|address| address.port)
        .collect();
    let port = (scheduler_task.port.saturating_add(1)..=u16::MAX)
        .find(|port| !taken.contains(port))
        .ok_or_else(|| ConfigError::NoSchedulerPort {
            task: format!("{job}:{index}"),
            address: scheduler_task.to_string(),
        })?;
    Ok(DataAddresses {
        scheduler: HostPort {
            host: scheduler_task.host,
            port,
        },
        own: HostPort {
            host: own_task.host,
            port: 0,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::Role;

    fn tf_config(task: &str, index: u32) -> String {
        format!(
            r#"{{"cluster": {{"chief": ["h:2222"], "worker": ["h:2223", "h:2224"],
                "ps": ["h:2226", "p:2225"]}}, "task": {{"type": "{task}", "index": {index}}},
                "rpc_layer": "grpc+vans"}}"#
        )
    }

    #[test]
    fn without_a_map_the_scheduler_takes_the_first_port_no_task_uses_on_its_host() {
        for (task, index) in [("chief", 0), ("worker", 1), ("ps", 1)] {
            let json = tf_config(task, index);
            let c =
                Config::from_vars([("TF_CONFIG", json.as_str()), ("VANS_TF_SERVER", "1")]).unwrap();
            // 2223, 2224 and 2226 are h's tasks; p:2225 is another host's.
            assert_eq!((c.root_uri.as_str(), c.root_port), ("h", 2225), "{task}");
            assert_eq!(c.port, 0);
            assert_eq!(c.hosts_scheduler, task == "chief");
        }
    }

    #[test]
    fn the_servers_cluster_wins_over_variables_set_for_another_purpose() {
        let json = tf_config("ps", 1);
        let c = Config::from_vars([
            ("TF_CONFIG", json.as_str()),
            ("VANS_TF_SERVER", "1"),
            ("DMLC_ROLE", "worker"),
            ("DMLC_NUM_WORKER", "9"),
            ("DMLC_PS_ROOT_URI", "elsewhere"),
            ("DMLC_PS_ROOT_PORT", "1"),
            ("DMLC_PORT", "7000"),
        ])
        .unwrap();
        assert_eq!(c.role, Some(Role::Server));
        assert_eq!((c.num_workers, c.num_servers), (3, 2));
        assert_eq!((c.root_uri.as_str(), c.root_port, c.port), ("h", 2225, 0));
        assert_eq!(c.node_host.as_deref(), Some("p"));
        assert_eq!(c.tf_task.map(|t| (t.job, t.index)), Some(("ps".into(), 1)));
    }

    #[test]
    fn a_cluster_of_workers_only_is_a_vans_cluster_without_servers() {
        // MultiWorkerMirroredStrategy's cluster; only a TensorFlow server's node takes it
        // (a ps-lite job needs its servers).
        let json = r#"{"cluster": {"worker": ["h:2222", "h:2223"]},
                       "task": {"type": "worker", "index": 1}}"#;
        let c = Config::from_vars([
            ("TF_CONFIG", json),
            ("VANS_TF_SERVER", "1"),
            ("DMLC_NUM_SERVER", "3"),
        ])
        .unwrap();
        assert_eq!(c.role, Some(Role::Worker));
        assert_eq!((c.num_workers, c.num_servers), (2, 0));
        assert_eq!((c.root_uri.as_str(), c.root_port), ("h", 2224));
        let e = Config::from_vars([("TF_CONFIG", json)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("ps"), "{e}");
    }

    fn with_map(task: &str, index: u32, map: &str) -> Result<Config, ConfigError> {
        let dir = std::env::temp_dir().join(format!(
            "vans-tf-server-{}-{task}-{index}-{}",
            std::process::id(),
            map.len()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(".endpoint_map");
        std::fs::write(&path, map).unwrap();
        let json = tf_config(task, index);
        let path_text = path.display().to_string();
        let result = Config::from_vars([
            ("TF_CONFIG", json.as_str()),
            ("VANS_TF_SERVER", "1"),
            ("VANS_ENDPOINT_MAP", path_text.as_str()),
        ]);
        std::fs::remove_dir_all(&dir).unwrap();
        result
    }

    const MAP: &str = "h:2222=h:3222\nh:2223=h:3223\nh:2224=h:3224\nh:2226=h:3226\n\
                       p:2225=q:3225\n";

    #[test]
    fn with_a_map_each_task_listens_on_its_data_address() {
        let c = with_map("worker", 1, MAP).unwrap();
        assert_eq!((c.root_uri.as_str(), c.root_port), ("h", 3222));
        assert_eq!((c.node_host.as_deref(), c.port), (Some("h"), 3224));
        let c = with_map("ps", 1, MAP).unwrap();
        assert_eq!((c.node_host.as_deref(), c.port), (Some("q"), 3225));
        // The chief's data address is the scheduler's: its own node takes a free port.
        let c = with_map("chief", 0, MAP).unwrap();
        assert!(c.hosts_scheduler);
        assert_eq!((c.root_uri.as_str(), c.root_port), ("h", 3222));
        assert_eq!((c.node_host.as_deref(), c.port), (Some("h"), 0));
    }

    #[test]
    fn a_map_missing_a_task_is_an_error_naming_the_file_and_the_task() {
        let e = with_map("worker", 0, "h:2222=h:3222\nh:2223=h:3223\nh:2224=h:3224\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains(".endpoint_map"), "{e}");
        assert!(e.contains("ps:0") && e.contains("h:2226"), "{e}");
    }

    #[test]
    fn no_port_above_the_schedulers_is_an_error() {
        let json = r#"{"cluster": {"chief": ["h:65535"], "ps": ["h:2000"]},
                       "task": {"type": "ps", "index": 0}}"#;
        let e = Config::from_vars([("TF_CONFIG", json), ("VANS_TF_SERVER", "1")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("chief:0") && e.contains("endpoint map"), "{e}");
    }
}
