//! Roles from the launch engine: when `DMLC_ROLE` is not set (nor supplied by `TF_CONFIG`),
//! a process started by Slurm (`srun`), Open MPI (`mpirun`), a PMI launcher or a
//! PyTorch-style launcher (`torchrun`, the Kubeflow PyTorchJob) takes its role from its rank
//! and the job's size, by one rule:
//!
//! - rank 0 is the scheduler, ranks 1 to `DMLC_NUM_SERVER` the servers, the rest the
//!   workers (so `DMLC_NUM_SERVER` must be set, and `DMLC_NUM_WORKER`, when set, must be
//!   the size minus the servers minus one);
//! - the scheduler's address is `DMLC_PS_ROOT_URI`, else `MASTER_ADDR`, else (Slurm) the
//!   first host of the step's node list, where Slurm places rank 0;
//! - its port is `DMLC_PS_ROOT_PORT`, else `MASTER_PORT`.

use super::error::ConfigError;
use super::reader::Vars;
use super::variables::known_name;

/// The engines, in the order their variables are looked for: (name, rank, size).
const ENGINES: [(&str, &str, &str); 4] = [
    ("Slurm", "SLURM_PROCID", "SLURM_NTASKS"),
    ("Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI", "PMI_RANK", "PMI_SIZE"),
    ("PyTorch", "RANK", "WORLD_SIZE"),
];

impl Vars {
    /// Fills `DMLC_ROLE`, `DMLC_NUM_WORKER`, `DMLC_PS_ROOT_URI` and `DMLC_PS_ROOT_PORT` from
    /// the engine's rank and size (see the [module docs](self)) when `DMLC_ROLE` is not set.
    pub(super) fn apply_engine(&mut self) -> Result<(), ConfigError> {
        if self.get("DMLC_ROLE").is_some() {
            return Ok(());
        }
        let mut found: Option<(&'static str, u64, u64)> = None;
        for (engine, rank_var, size_var) in ENGINES {
            let Some(rank) = self.number::<u64>(rank_var, "a rank, 0 or more")? else {
                continue;
            };
            let fail = |reason: String| ConfigError::Engine { engine, reason };
            let size = self
                .number::<u64>(size_var, "a number of processes")?
                .ok_or_else(|| fail(format!("{rank_var} is set but {size_var} is not")))?;
            if rank >= size {
                return Err(fail(format!(
                    "{rank_var}={rank} is not below {size_var}={size}"
                )));
            }
            match found {
                None => found = Some((engine, rank, size)),
                // Engines stacked (srun starting an MPI program sets both): they must agree.
                Some((first, r, s)) if (r, s) != (rank, size) => {
                    return Err(ConfigError::Engine {
                        engine: first,
                        reason: format!(
                            "rank {r} of {s}, but {engine} says {rank_var}={rank} of \
                             {size_var}={size}"
                        ),
                    })
                }
                Some(_) => {}
            }
        }
        let Some((engine, rank, size)) = found else {
            return Ok(());
        };
        let fail = |reason: String| ConfigError::Engine { engine, reason };
        let servers = self
            .number::<u64>("DMLC_NUM_SERVER", "a whole number of processes")?
            .ok_or_else(|| {
                fail(format!(
                    "rank {rank} of {size}: set DMLC_NUM_SERVER to the number of servers among \
                     the {size} processes (rank 0 is the scheduler, ranks 1 to DMLC_NUM_SERVER \
                     the servers, the rest the workers)"
                ))
            })?;
        let workers = size
            .checked_sub(1 + servers)
            .filter(|w| *w > 0)
            .ok_or_else(|| {
                fail(format!(
                    "{size} processes cannot hold a scheduler, {servers} servers and a worker"
                ))
            })?;
        if let Some(n) = self.number::<u64>("DMLC_NUM_WORKER", "a whole number of processes")? {
            if n != workers {
                return Err(fail(format!(
                    "DMLC_NUM_WORKER={n}, but {size} processes minus the scheduler and \
                     {servers} servers leave {workers} workers"
                )));
            }
        }
        let role = match rank {
            0 => "scheduler",
            r if r <= servers => "server",
            _ => "worker",
        };
        let root_uri = match self.get("DMLC_PS_ROOT_URI").or(self.get("MASTER_ADDR")) {
            Some(uri) => uri.to_owned(),
            None => self.slurm_first_host(engine).ok_or_else(|| {
                fail(format!(
                    "set DMLC_PS_ROOT_URI (or MASTER_ADDR) to the address of rank 0, the \
                     scheduler{}",
                    if engine == "Slurm" {
                        " (SLURM_STEP_NODELIST and SLURM_JOB_NODELIST are unset)"
                    } else {
                        ""
                    }
                ))
            })?,
        };
        let port_var = match self.get("DMLC_PS_ROOT_PORT") {
            Some(_) => "DMLC_PS_ROOT_PORT",
            None => "MASTER_PORT",
        };
        let root_port = self
            .number::<u16>(port_var, "the scheduler's port, 1..=65535")?
            .ok_or_else(|| {
                fail("set DMLC_PS_ROOT_PORT (or MASTER_PORT) to the scheduler's port".into())
            })?
            .to_string();
        for (var, value) in [
            ("DMLC_ROLE", role.to_owned()),
            ("DMLC_NUM_WORKER", workers.to_string()),
            ("DMLC_PS_ROOT_URI", root_uri),
            ("DMLC_PS_ROOT_PORT", root_port),
        ] {
            if let Some(var) = known_name(var) {
                self.map.insert(var, value);
            }
        }
        Ok(())
    }

    /// Under Slurm, the first host of the step's (else the job's) node list.
    fn slurm_first_host(&self, engine: &str) -> Option<String> {
        if engine != "Slurm" {
            return None;
        }
        let list = self
            .get("SLURM_STEP_NODELIST")
            .or(self.get("SLURM_JOB_NODELIST"))?;
        first_host(list)
    }
}

/// The first host of a Slurm host list: `n[3-5,9],gpu1` → `n3`, `node[007-009]` →
/// `node007`, `a,b` → `a`.
pub(crate) fn first_host(list: &str) -> Option<String> {
    let first = list.trim();
    let (prefix, rest) = match first.find(['[', ',']) {
        Some(at) if first[at..].starts_with('[') => (&first[..at], &first[at + 1..]),
        Some(at) => return Some(first[..at].to_owned()).filter(|h| !h.is_empty()),
        None => return Some(first.to_owned()).filter(|h| !h.is_empty()),
    };
    let end = rest.find([',', '-', ']'])?;
    let number = &rest[..end];
    if prefix.is_empty() || number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(format!("{prefix}{number}"))
}

#[cfg(test)]
mod tests {
    use super::super::Config;
    use super::*;
    use crate::message::Role;

    fn config(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        Config::from_vars(vars.iter().copied())
    }

    #[test]
    fn slurm_host_lists() {
        assert_eq!(first_host("n[3-5,9],gpu1").as_deref(), Some("n3"));
        assert_eq!(first_host("node[007-009]").as_deref(), Some("node007"));
        assert_eq!(first_host("a,b").as_deref(), Some("a"));
        assert_eq!(first_host("solo").as_deref(), Some("solo"));
        for bad in ["", "[1-2]", "n[x-2]", "n["] {
            assert_eq!(first_host(bad), None, "{bad}");
        }
    }

    #[test]
    fn ranks_map_to_scheduler_servers_then_workers() {
        let slurm = |rank: &str| {
            config(&[
                ("SLURM_PROCID", rank),
                ("SLURM_NTASKS", "5"),
                ("SLURM_JOB_NODELIST", "n[3-4]"),
                ("DMLC_NUM_SERVER", "2"),
                ("DMLC_PS_ROOT_PORT", "9000"),
            ])
            .unwrap_or_else(|e| panic!("{e}"))
        };
        let roles: Vec<_> = ["0", "1", "2", "3", "4"]
            .iter()
            .map(|r| slurm(r).role)
            .collect();
        assert_eq!(
            roles,
            [
                Some(Role::Scheduler),
                Some(Role::Server),
                Some(Role::Server),
                Some(Role::Worker),
                Some(Role::Worker)
            ]
        );
        let c = slurm("3");
        assert_eq!((c.num_servers, c.num_workers), (2, 2));
        assert_eq!((c.root_uri.as_str(), c.root_port), ("n3", 9000));
    }

    #[test]
    fn each_engine_and_pytorch_addresses() {
        for (rank, size) in [
            ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
            ("PMI_RANK", "PMI_SIZE"),
            ("RANK", "WORLD_SIZE"),
        ] {
            let c = config(&[
                (rank, "1"),
                (size, "3"),
                ("DMLC_NUM_SERVER", "1"),
                ("MASTER_ADDR", "10.0.0.7"),
                ("MASTER_PORT", "29500"),
            ])
            .unwrap_or_else(|e| panic!("{rank}: {e}"));
            assert_eq!(c.role, Some(Role::Server), "{rank}");
            assert_eq!((c.root_uri.as_str(), c.root_port), ("10.0.0.7", 29500));
            assert_eq!(c.num_workers, 1);
        }
    }

    #[test]
    fn explicit_dmlc_role_wins_and_nothing_set_is_no_role() {
        let c = config(&[
            ("DMLC_ROLE", "worker"),
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "3"),
            ("DMLC_NUM_SERVER", "1"),
            ("DMLC_NUM_WORKER", "1"),
            ("DMLC_PS_ROOT_URI", "127.0.0.1"),
            ("DMLC_PS_ROOT_PORT", "9000"),
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.role, Some(Role::Worker));
        assert_eq!(config(&[]).map(|c| c.role), Ok(None));
    }

    #[test]
    fn inconsistent_environments_are_named() {
        let err = |vars: &[(&str, &str)]| {
            config(vars)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        let base = [
            ("DMLC_PS_ROOT_URI", "h"),
            ("DMLC_PS_ROOT_PORT", "1"),
            ("DMLC_NUM_SERVER", "1"),
        ];
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut v = base.to_vec();
            v.extend_from_slice(extra);
            err(&v)
        };
        let e = with(&[("SLURM_PROCID", "1")]);
        assert!(
            e.contains("SLURM_PROCID is set but SLURM_NTASKS is not"),
            "{e}"
        );
        let e = with(&[("RANK", "4"), ("WORLD_SIZE", "4")]);
        assert!(e.contains("RANK=4 is not below WORLD_SIZE=4"), "{e}");
        let e = with(&[("RANK", "1"), ("WORLD_SIZE", "2")]);
        assert!(
            e.contains("cannot hold a scheduler, 1 servers and a worker"),
            "{e}"
        );
        let e = with(&[("RANK", "1"), ("WORLD_SIZE", "4"), ("DMLC_NUM_WORKER", "3")]);
        assert!(e.contains("DMLC_NUM_WORKER=3"), "{e}");
        let e = with(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "4"),
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
        ]);
        assert!(e.contains("Open MPI says OMPI_COMM_WORLD_RANK=2"), "{e}");
        let e = err(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "4"),
            ("DMLC_PS_ROOT_PORT", "1"),
        ]);
        assert!(e.contains("set DMLC_NUM_SERVER"), "{e}");
        let e = err(&[("RANK", "1"), ("WORLD_SIZE", "4"), ("DMLC_NUM_SERVER", "1")]);
        assert!(e.contains("set DMLC_PS_ROOT_URI (or MASTER_ADDR)"), "{e}");
    }
}
