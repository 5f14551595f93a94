//! `VANS_RANK` (and [`ConfigBuilder::rank`](super::ConfigBuilder::rank)): a worker or server
//! asks the scheduler for its rank within its role, as a framework that numbers its own
//! processes (a PyTorch process group's `RANK`) needs the parameter server to number them
//! the same way.
//!
//! The rank is announced as the TensorFlow task of the role's job that has that index
//! (`worker:N` for a worker, `ps:N` for a server), through [`Config::tf_task`]: the scheduler
//! already numbers nodes that announce tasks in task order, refuses a task that a live
//! process at another address holds while the cluster forms, and gives a task's place to a
//! new process announcing it (recovery). So ranks reuse that machinery instead of adding a
//! second one, and the rendezvous finds `/job:worker/task:N` at worker rank N, as it does
//! without tasks.
//!
//! Rules:
//!
//! - The scheduler has no rank (it is always node 1): `VANS_RANK` there is an error, not
//!   ignored, since a launcher that sets it there has mistaken one process for another.
//!   Without a role (a single-process run) it is an error too.
//! - The rank counts from 0 and must be below `DMLC_NUM_WORKER` (a worker) or
//!   `DMLC_NUM_SERVER` (a server).
//! - When `TF_CONFIG` also gives this node a task, the two must be the same task, or it is an
//!   error naming both: the rank would otherwise silently move the process away from the
//!   task TensorFlow's device names point at (the rendezvous resolves them by task).
//!   Agreeing is allowed so that a launcher can set both; a chief (`chief:0`) is never the
//!   task of a rank.
//! - Only nodes that give a rank are numbered by it: they come before the nodes of their role
//!   that give none (as tasks do), so give one to every node of a role or to none.

use super::error::ConfigError;
use super::Config;
use crate::message::{Role, TfTask};

/// What `VANS_RANK` accepts.
pub(super) const RANK_EXPECTED: &str =
    "a whole number of at least 0: this node's rank within its role (worker or server)";

/// Sets `config.tf_task` to the task that stands for `rank` within `config.role`, after
/// checking it against the role, its count and a task `TF_CONFIG` gave (see the
/// [module docs](self)).
pub(super) fn apply_rank(config: &mut Config, rank: u32) -> Result<(), ConfigError> {
    let contradiction = |vars, reason| Err(ConfigError::Contradiction { vars, reason });
    let (job, count) = match config.role {
        Some(Role::Worker) => ("worker", config.num_workers),
        Some(Role::Server) => ("ps", config.num_servers),
        Some(Role::Scheduler) => {
            return contradiction(
                &["VANS_RANK", "DMLC_ROLE"],
                "the scheduler has no rank (it is always node 1); set VANS_RANK only for \
                 workers and servers",
            )
        }
        None => {
            return contradiction(
                &["VANS_RANK", "DMLC_ROLE"],
                "a rank is a place within a role; set DMLC_ROLE to worker or server, or \
                 unset VANS_RANK for a single-process run",
            )
        }
    };
    if rank >= count {
        return match config.role {
            Some(Role::Worker) => contradiction(
                &["VANS_RANK", "DMLC_NUM_WORKER"],
                "a worker's rank counts from 0 and must be below DMLC_NUM_WORKER; lower \
                 VANS_RANK or raise DMLC_NUM_WORKER",
            ),
            _ => contradiction(
                &["VANS_RANK", "DMLC_NUM_SERVER"],
                "a server's rank counts from 0 and must be below DMLC_NUM_SERVER; lower \
                 VANS_RANK or raise DMLC_NUM_SERVER",
            ),
        };
    }
    let task = TfTask {
        job: job.to_owned(),
        index: rank,
    };
    if config.tf_task.as_ref().is_some_and(|given| *given != task) {
        return contradiction(
            &["VANS_RANK", "TF_CONFIG"],
            "both give this node's task and they differ (VANS_RANK=N is task worker:N of a \
             worker, ps:N of a server; a chief is no rank's task); unset VANS_RANK, as \
             TF_CONFIG's task already fixes the rank",
        );
    }
    config.tf_task = Some(task);
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::config::tests::{err, with};
    use crate::config::{Config, ConfigError};
    use crate::message::{Role, TfTask};

    fn task(job: &str, index: u32) -> Option<TfTask> {
        Some(TfTask {
            job: job.to_owned(),
            index,
        })
    }

    /// The error of `vars`, checked to be a contradiction naming each of `names`.
    fn contradiction(vars: &[(&str, &str)], names: [&str; 2]) -> String {
        let e = Config::from_vars(vars.iter().copied()).unwrap_err();
        assert!(matches!(e, ConfigError::Contradiction { .. }), "{e:?}");
        let message = e.to_string();
        assert!(names.iter().all(|n| message.contains(n)), "{message}");
        message
    }

    #[test]
    fn a_rank_is_announced_as_the_task_of_the_roles_job() {
        // PS_LITE_WORKER: a worker of 2 workers and 2 servers.
        for (rank, index) in [("0", 0), ("1", 1), (" 1 ", 1), ("+1", 1)] {
            let c = Config::from_vars(with(&[("VANS_RANK", rank)])).unwrap();
            assert_eq!(c.tf_task, task("worker", index), "{rank:?}");
        }
        let c = Config::from_vars(with(&[("DMLC_ROLE", "server"), ("VANS_RANK", "1")])).unwrap();
        assert_eq!(c.tf_task, task("ps", 1));
        // Empty is unset, as for every variable.
        let c = Config::from_vars(with(&[("VANS_RANK", "")])).unwrap();
        assert_eq!(c.tf_task, None);
    }

    #[test]
    fn a_rank_that_is_not_a_whole_number_names_the_variable_and_value() {
        for value in ["-1", "1.0", "one", "4294967296"] {
            let e = Config::from_vars(with(&[("VANS_RANK", value)])).unwrap_err();
            assert!(
                matches!(&e, ConfigError::Invalid { var: "VANS_RANK", value: v, .. } if v == value),
                "{e:?}"
            );
            let message = e.to_string();
            assert!(message.contains("rank within its role"), "{message}");
        }
    }

    #[test]
    fn a_rank_must_be_below_the_roles_count() {
        let message = contradiction(
            &with(&[("VANS_RANK", "2")]),
            ["VANS_RANK", "DMLC_NUM_WORKER"],
        );
        assert!(message.contains("below"), "{message}");
        contradiction(
            &with(&[
                ("DMLC_ROLE", "server"),
                ("DMLC_NUM_SERVER", "1"),
                ("VANS_RANK", "1"),
            ]),
            ["VANS_RANK", "DMLC_NUM_SERVER"],
        );
        // A server's rank is checked against the servers, not the workers.
        let c = Config::from_vars(with(&[
            ("DMLC_ROLE", "server"),
            ("DMLC_NUM_WORKER", "1"),
            ("DMLC_NUM_SERVER", "3"),
            ("VANS_RANK", "2"),
        ]))
        .unwrap();
        assert_eq!(c.tf_task, task("ps", 2));
    }

    #[test]
    fn the_scheduler_and_a_single_process_have_no_rank() {
        let message = contradiction(
            &with(&[("DMLC_ROLE", "scheduler"), ("VANS_RANK", "0")]),
            ["VANS_RANK", "DMLC_ROLE"],
        );
        assert!(message.contains("scheduler has no rank"), "{message}");
        contradiction(&[("VANS_RANK", "0")], ["VANS_RANK", "DMLC_ROLE"]);
        // A value that does not parse is reported as such first, whatever the role.
        assert!(err(&[("VANS_RANK", "x")]).contains("invalid value \"x\" for VANS_RANK"));
    }

    #[test]
    fn tf_config_and_vans_rank_must_give_the_same_task() {
        const CLUSTER: &str = r#""cluster": {"chief": ["c:2222"], "worker": ["w0:2222",
            "w1:2222"], "ps": ["p0:2222"]}"#;
        let tf = |job: &str, index: u32| {
            format!(r#"{{{CLUSTER}, "task": {{"type": "{job}", "index": {index}}}}}"#)
        };
        let from =
            |json: &str, rank: &str| Config::from_vars([("TF_CONFIG", json), ("VANS_RANK", rank)]);
        // The same task: fine, and unchanged.
        let c = from(&tf("worker", 1), "1").unwrap();
        assert_eq!((c.role, c.tf_task), (Some(Role::Worker), task("worker", 1)));
        let c = from(&tf("ps", 0), "0").unwrap();
        assert_eq!(c.tf_task, task("ps", 0));
        // Another task, or the chief (worker rank 0 by TF_CONFIG, but not task worker:0).
        for (json, rank) in [(tf("worker", 1), "0"), (tf("chief", 0), "0")] {
            let e = from(&json, rank).unwrap_err();
            assert!(matches!(e, ConfigError::Contradiction { .. }), "{e:?}");
            let message = e.to_string();
            assert!(
                message.contains("VANS_RANK and TF_CONFIG") && message.contains("unset VANS_RANK"),
                "{message}"
            );
        }
        // TF_CONFIG gives no task when the role is explicit: the rank is the task.
        let c = Config::from_vars([
            ("TF_CONFIG", tf("worker", 1).as_str()),
            ("DMLC_ROLE", "worker"),
            ("VANS_RANK", "2"),
        ])
        .unwrap();
        assert_eq!(c.tf_task, task("worker", 2));
    }

    #[test]
    fn the_builder_asks_for_a_rank_with_the_same_checks() {
        let node = |role| {
            Config::builder()
                .role(role)
                .num_workers(3)
                .num_servers(2)
                .root_port(8123)
        };
        let c = node(Role::Worker).rank(Some(2)).build().unwrap();
        assert_eq!(c.tf_task, task("worker", 2));
        let c = node(Role::Server).rank(Some(1)).build().unwrap();
        assert_eq!(c.tf_task, task("ps", 1));
        // The same configuration as the environment gives.
        let env = Config::from_vars([
            ("DMLC_ROLE", "worker"),
            ("DMLC_NUM_WORKER", "3"),
            ("DMLC_NUM_SERVER", "2"),
            ("DMLC_PS_ROOT_URI", "127.0.0.1"),
            ("DMLC_PS_ROOT_PORT", "8123"),
            ("VANS_RANK", "2"),
        ])
        .unwrap();
        assert_eq!(node(Role::Worker).rank(Some(2)).build().unwrap(), env);
        // None asks for nothing; the last call wins.
        let c = node(Role::Worker).rank(Some(1)).rank(None).build().unwrap();
        assert_eq!(c.tf_task, None);
        let cases = [
            (node(Role::Worker).rank(Some(3)), "DMLC_NUM_WORKER"),
            (node(Role::Server).rank(Some(2)), "DMLC_NUM_SERVER"),
            (node(Role::Scheduler).rank(Some(0)), "DMLC_ROLE"),
            (Config::builder().rank(Some(0)), "DMLC_ROLE"),
        ];
        for (builder, var) in cases {
            let e = builder.build().unwrap_err();
            assert!(matches!(e, ConfigError::Contradiction { .. }), "{e:?}");
            let message = e.to_string();
            assert!(
                message.contains("VANS_RANK") && message.contains(var),
                "{message}"
            );
        }
    }
}
