//! Reading the environment: [`Config::from_env`], [`Config::from_vars`], and which
//! variable sets which field of [`Config`] (ps-lite's `DMLC_*`/`PS_*`, wire limits and
//! timeouts here; `TF_CONFIG` and the endpoint map in `tensorflow`, the vans' own knobs
//! in `van_knobs`, the collectives' `VANS_COLLECTIVE_*` in `collective`).

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

use super::collective::CollectiveSettings;
use super::error::ConfigError;
use super::rank::{apply_rank, RANK_EXPECTED};
use super::rdma::RdmaMode;
use super::reader::Vars;
use super::tensorflow::{default_endpoint_map, FromTfConfig, DEFAULT_ENDPOINT_MAP};
use super::variables::known_name;
use super::{non_zero, Config, PORT_EXPECTED, SECONDS_EXPECTED, STREAM_VAN_EXPECTED};
use crate::message::Role;

impl Config {
    /// Reads the process environment (see [`VARIABLES`](super::VARIABLES)), and
    /// `./.endpoint_map` when `VANS_ENDPOINT_MAP` is unset and that file exists.
    ///
    /// A variable of [`VARIABLES`](super::VARIABLES) whose value is not UTF-8 is
    /// [`ConfigError::Invalid`].
    pub fn from_env() -> Result<Config, ConfigError> {
        let mut config = Config::from_os_vars(std::env::vars_os())?;
        if config.endpoint_map.is_none() {
            config.endpoint_map = default_endpoint_map(Path::new(DEFAULT_ENDPOINT_MAP))?;
        }
        Ok(config)
    }

    /// Parses variables given as name–value pairs, exactly as [`Config::from_env`] would;
    /// tests use it so they never touch the process environment. Later pairs override
    /// earlier ones with the same name; unknown names are ignored. The file system is only
    /// read for `VANS_ENDPOINT_MAP` (no `./.endpoint_map` lookup).
    pub fn from_vars<I, K, V>(vars: I) -> Result<Config, ConfigError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut map = HashMap::new();
        for (name, value) in vars {
            if let Some(known) = known_name(name.as_ref()) {
                map.insert(known, value.as_ref().trim().to_owned());
            }
        }
        map.retain(|_, value| !value.is_empty());
        let mut vars = Vars { map };
        let tf = vars.apply_tf_config()?;
        vars.apply_engine()?;
        vars.parse(tf)
    }

    fn from_os_vars(
        vars: impl IntoIterator<Item = (OsString, OsString)>,
    ) -> Result<Config, ConfigError> {
        let mut pairs = Vec::new();
        for (name, value) in vars {
            // A name that is not UTF-8 is not one of ours.
            let Some(name) = name.to_str().and_then(known_name) else {
                continue;
            };
            match value.into_string() {
                Ok(value) => pairs.push((name, value)),
                Err(value) => {
                    return Err(ConfigError::Invalid {
                        var: name,
                        value: value.to_string_lossy().into_owned(),
                        expected: "valid UTF-8",
                    })
                }
            }
        }
        Config::from_vars(pairs)
    }
}

impl Vars {
    fn parse(&self, tf: FromTfConfig) -> Result<Config, ConfigError> {
        let mut c = Config {
            role: self.role()?,
            ..Config::default()
        };
        // `DMLC_ROLE=scheduler` with the chief's TF_CONFIG: the process is the scheduler.
        c.hosts_scheduler =
            tf.hosts_scheduler && matches!(c.role, Some(Role::Worker | Role::Server));
        // The task is this node's only when its role is the one the task maps to.
        c.tf_task = tf
            .task
            .filter(|(role, _)| c.role == Some(*role))
            .map(|(_, task)| task);
        let required = |var| match (c.role, self.get(var)) {
            (Some(_), None) => Err(ConfigError::Missing { var }),
            _ => Ok(()),
        };
        for var in [
            "DMLC_NUM_WORKER",
            "DMLC_NUM_SERVER",
            "DMLC_PS_ROOT_URI",
            "DMLC_PS_ROOT_PORT",
        ] {
            required(var)?;
        }
        let count = "a whole number of processes";
        if let Some(n) = self.number("DMLC_NUM_WORKER", count)? {
            c.num_workers = n;
        }
        if let Some(n) = self.number("DMLC_NUM_SERVER", count)? {
            c.num_servers = n;
        }
        if let Some(rank) = self.number("VANS_RANK", RANK_EXPECTED)? {
            apply_rank(&mut c, rank)?;
        }
        if let Some(uri) = self.get("DMLC_PS_ROOT_URI") {
            c.root_uri = uri.to_owned();
        }
        let root_expected = "the scheduler's port, 1..=65535";
        match self.number::<u16>("DMLC_PS_ROOT_PORT", root_expected)? {
            Some(0) => return Err(self.invalid("DMLC_PS_ROOT_PORT", root_expected)),
            Some(port) => c.root_port = port,
            None => {}
        }
        c.interface = self.get("DMLC_INTERFACE").map(str::to_owned);
        c.node_host = self.get("DMLC_NODE_HOST").map(str::to_owned);
        // DMLC_PORT wins; the legacy PORT is not even parsed when DMLC_PORT is set.
        let port_var = match self.get("DMLC_PORT") {
            Some(_) => "DMLC_PORT",
            None => "PORT",
        };
        if let Some(port) = self.number(port_var, PORT_EXPECTED)? {
            c.port = port;
        }
        c.enable_rdma = self.rdma()?;
        if let Some(level) = self.get("PS_VERBOSE") {
            c.verbose = match level {
                "0" => 0,
                "1" => 1,
                "2" => 2,
                _ => return Err(self.invalid("PS_VERBOSE", "0, 1 or 2")),
            };
        }
        let seconds = |var| -> Result<_, ConfigError> {
            Ok(self
                .number(var, SECONDS_EXPECTED)?
                .and_then(|s| non_zero(Duration::from_secs(s))))
        };
        c.heartbeat_interval = seconds("PS_HEARTBEAT_INTERVAL")?;
        c.heartbeat_timeout = seconds("PS_HEARTBEAT_TIMEOUT")?;
        let resend_after = self
            .positive("PS_RESEND_TIMEOUT")?
            .map_or(super::DEFAULT_RESEND_TIMEOUT, Duration::from_millis);
        c.resend_timeout = self
            .flag("PS_RESEND")?
            .unwrap_or(false)
            .then_some(resend_after);
        if let Some(name) = self.get("VANS_STREAM_VAN") {
            c.stream_van = name
                .parse()
                .map_err(|_| self.invalid("VANS_STREAM_VAN", STREAM_VAN_EXPECTED))?;
        }
        if let Some(n) = self.positive("VANS_MAX_FRAME_BYTES")? {
            c.limits.max_frame = n;
        }
        let u32_expected = "a whole number from 1 to 4294967295";
        if let Some(n) = self.number::<u32>("VANS_MAX_SEGMENTS", u32_expected)? {
            c.limits.max_segments = n;
        }
        if let Some(n) = self.number::<u32>("VANS_MAX_META_BYTES", u32_expected)? {
            c.limits.max_meta = n;
        }
        if let Some(ms) = self.positive("VANS_CONNECT_TIMEOUT_MS")? {
            c.connect_timeout = Duration::from_millis(ms);
        }
        if let Some(s) = self.positive("VANS_BOOTSTRAP_TIMEOUT_SECS")? {
            c.bootstrap_timeout = Duration::from_secs(s);
        }
        if let Some(s) = self.number::<u64>("VANS_REPLACEMENT_GRACE_SECS", SECONDS_EXPECTED)? {
            c.replacement_grace = Duration::from_secs(s);
        }
        if let Some(value) = self.get("VANS_UNPUSHED_KEYS") {
            c.unpushed_keys = value
                .parse()
                .map_err(|_| self.invalid("VANS_UNPUSHED_KEYS", "`zeros` or `error`"))?;
        }
        c.endpoint_map = match tf.endpoint_map {
            Some(map) => Some(map),
            None => self.endpoint_map()?,
        };
        self.van_knobs(&mut c)?;
        c.collective = CollectiveSettings::parse(|var| self.get(var))?;
        if let Some(on) = self.flag("VANS_COLLECTIVE_MESH")? {
            c.collective.mesh = on;
        }
        c.validate()?;
        Ok(c)
    }

    fn role(&self) -> Result<Option<Role>, ConfigError> {
        let Some(value) = self.get("DMLC_ROLE") else {
            return Ok(None);
        };
        [Role::Scheduler, Role::Server, Role::Worker]
            .into_iter()
            .find(|role| role.as_str().eq_ignore_ascii_case(value))
            .map(Some)
            .ok_or_else(|| self.invalid("DMLC_ROLE", "`scheduler`, `server` or `worker`"))
    }

    fn rdma(&self) -> Result<RdmaMode, ConfigError> {
        let Some(value) = self.get("DMLC_ENABLE_RDMA") else {
            return Ok(RdmaMode::Off);
        };
        match value.to_ascii_lowercase().as_str() {
            "0" | "false" => Ok(RdmaMode::Off),
            "1" | "true" | "ibverbs" => Ok(RdmaMode::Ibverbs),
            _ => Err(self.invalid(
                "DMLC_ENABLE_RDMA",
                "`0`, `false` (off) or `1`, `true`, `ibverbs` (RDMA verbs)",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{err, with, PS_LITE_WORKER};
    use crate::config::variables::VARIABLES;
    use crate::message::VanKind;
    use crate::wire::Limits;

    #[test]
    fn documented_defaults_match_default_config() {
        // Every default that is a value parses to `Config::default()`.
        let vars: Vec<_> = VARIABLES
            .iter()
            .filter(|v| !v.default.starts_with("unset") && v.name != "VANS_HOST_ID")
            .map(|v| (v.name, v.default.split(' ').next().unwrap()))
            .collect();
        assert_eq!(Config::from_vars(vars).unwrap(), Config::default());
    }

    #[test]
    fn every_listed_variable_is_read() {
        let free_text = [
            "DMLC_PS_ROOT_URI",
            "DMLC_INTERFACE",
            "DMLC_NODE_HOST",
            "VANS_HOST_ID",
            "VANS_RDMA_DEVICE",
        ];
        // Read only with an engine's rank (and what else makes a role).
        let engine = |var: &'static str| -> Option<Vec<(&'static str, &'static str)>> {
            let rank = match var {
                "SLURM_NTASKS" | "SLURM_STEP_NODELIST" | "SLURM_JOB_NODELIST" => "SLURM_PROCID",
                "OMPI_COMM_WORLD_SIZE" => "OMPI_COMM_WORLD_RANK",
                "PMI_SIZE" => "PMI_RANK",
                "WORLD_SIZE" | "MASTER_ADDR" | "MASTER_PORT" => "RANK",
                _ => return None,
            };
            let size = match rank {
                "SLURM_PROCID" => "SLURM_NTASKS",
                "OMPI_COMM_WORLD_RANK" => "OMPI_COMM_WORLD_SIZE",
                "PMI_RANK" => "PMI_SIZE",
                _ => "WORLD_SIZE",
            };
            let mut vars = vec![(rank, "0"), (size, "3"), ("DMLC_NUM_SERVER", "1")];
            if var != "MASTER_ADDR" && !var.ends_with("NODELIST") {
                vars.push(("DMLC_PS_ROOT_URI", "h"));
            }
            if var != "MASTER_PORT" {
                vars.push(("DMLC_PS_ROOT_PORT", "1"));
            }
            vars.push((var, "bogus"));
            Some(vars)
        };
        for var in VARIABLES.iter().map(|v| v.name) {
            if let Some(vars) = engine(var) {
                match Config::from_vars(vars) {
                    Ok(c) => assert_eq!(c.root_uri, "bogus", "{var}"),
                    Err(e) => {
                        let message = e.to_string();
                        assert!(
                            message.contains(var) && message.contains("bogus"),
                            "{message}"
                        );
                    }
                }
            } else if free_text.contains(&var) {
                let c = Config::from_vars([(var, "x")]).unwrap();
                assert!([
                    c.root_uri,
                    c.interface.unwrap_or_default(),
                    c.node_host.unwrap_or_default(),
                    c.host_id.unwrap_or_default(),
                    c.rdma.device.unwrap_or_default()
                ]
                .contains(&"x".to_owned()));
            } else if var == "VANS_CLUSTER_SECRET" {
                // Named, but the value is never shown.
                let message = err(&[(var, "bogus")]);
                assert!(
                    message.contains(var) && !message.contains("bogus"),
                    "{message}"
                );
            } else {
                let message = err(&[(var, "bogus")]);
                assert!(
                    message.contains(var) && message.contains("bogus"),
                    "{message}"
                );
            }
        }
    }

    #[test]
    fn full_ps_lite_environment() {
        let c = Config::from_vars(with(&[
            ("DMLC_NODE_HOST", "10.0.0.7"),
            ("DMLC_PORT", "9000"),
            ("PS_VERBOSE", "2"),
            ("PS_HEARTBEAT_INTERVAL", "5"),
            ("PS_HEARTBEAT_TIMEOUT", "30"),
            ("VANS_STREAM_VAN", "URING"),
            ("VANS_MAX_FRAME_BYTES", "4096"),
            ("VANS_MAX_SEGMENTS", "8"),
            ("VANS_MAX_META_BYTES", "1024"),
            ("VANS_CONNECT_TIMEOUT_MS", "250"),
            ("VANS_BOOTSTRAP_TIMEOUT_SECS", "30"),
            ("BYTEPS_LOCAL_SIZE", "8"),
        ]))
        .unwrap();
        let expected = Config::builder()
            .role(Role::Worker)
            .num_workers(2)
            .num_servers(2)
            .root_uri("10.0.0.2")
            .root_port(8123)
            .interface("eth5")
            .node_host("10.0.0.7")
            .port(9000)
            .enable_rdma(RdmaMode::Ibverbs)
            .verbose(2)
            .heartbeat_interval(Duration::from_secs(5))
            .heartbeat_timeout(Duration::from_secs(30))
            .stream_van(VanKind::Uring)
            .limits(Limits {
                max_frame: 4096,
                max_segments: 8,
                max_meta: 1024,
            })
            .connect_timeout(Duration::from_millis(250))
            .bootstrap_timeout(Duration::from_secs(30))
            .build()
            .unwrap();
        assert_eq!(c, expected);
        assert_eq!(c.host(), Some("10.0.0.7"));
    }

    #[test]
    fn role_is_case_insensitive_and_empty_is_unset() {
        for (value, role) in [("Scheduler", Role::Scheduler), (" SERVER ", Role::Server)] {
            let c = Config::from_vars(with(&[("DMLC_ROLE", value)])).unwrap();
            assert_eq!(c.role, Some(role));
        }
        let c = Config::from_vars([("DMLC_ROLE", ""), ("DMLC_PORT", "  ")]).unwrap();
        assert_eq!(c, Config::default());
    }

    #[test]
    fn later_pairs_override_earlier_ones() {
        let c = Config::from_vars(with(&[("DMLC_NUM_WORKER", "5")])).unwrap();
        assert_eq!(c.num_workers, 5);
    }

    #[test]
    fn a_role_requires_the_cluster_variables() {
        for var in [
            "DMLC_NUM_WORKER",
            "DMLC_NUM_SERVER",
            "DMLC_PS_ROOT_URI",
            "DMLC_PS_ROOT_PORT",
        ] {
            let vars: Vec<_> = PS_LITE_WORKER
                .into_iter()
                .filter(|(n, _)| *n != var)
                .collect();
            let e = Config::from_vars(vars).unwrap_err();
            assert_eq!(e, ConfigError::Missing { var });
            assert!(e.to_string().contains(var));
        }
    }

    #[test]
    fn invalid_values_name_variable_value_and_expectation() {
        let cases = [
            ("DMLC_ROLE", "master", "scheduler"),
            ("DMLC_NUM_WORKER", "-1", "whole number"),
            ("DMLC_PS_ROOT_PORT", "0", "1..=65535"),
            ("DMLC_PS_ROOT_PORT", "70000", "1..=65535"),
            ("DMLC_PORT", "http", "0..=65535"),
            ("PS_VERBOSE", "3", "0, 1 or 2"),
            ("PS_HEARTBEAT_INTERVAL", "1.5", "seconds"),
            ("VANS_MAX_FRAME_BYTES", "0", "at least 1"),
            ("VANS_MAX_SEGMENTS", "0", "at least 1"),
            ("VANS_MAX_META_BYTES", "0", "at least 1"),
            ("VANS_CONNECT_TIMEOUT_MS", "0", "at least 1"),
            ("VANS_BOOTSTRAP_TIMEOUT_SECS", "0", "at least 1"),
            ("DMLC_NUM_SERVER", "2000000", "MAX_NODES_PER_ROLE"),
        ];
        for (var, value, expected) in cases {
            let e = Config::from_vars(with(&[(var, value)])).unwrap_err();
            assert!(
                matches!(e, ConfigError::Invalid { var: v, .. } if v == var),
                "{e:?}"
            );
            let message = e.to_string();
            for part in [var, value, expected] {
                assert!(message.contains(part), "{message:?} lacks {part:?}");
            }
        }
    }

    #[test]
    fn unpushed_keys_are_zeros_or_an_error() {
        use crate::config::UnpushedKeys;
        let none: [(&str, &str); 0] = [];
        assert_eq!(
            Config::from_vars(none).unwrap().unpushed_keys,
            UnpushedKeys::Zeros
        );
        for (value, want) in [
            ("error", UnpushedKeys::Error),
            ("ZEROS", UnpushedKeys::Zeros),
        ] {
            let c = Config::from_vars([("VANS_UNPUSHED_KEYS", value)]).unwrap();
            assert_eq!(c.unpushed_keys, want);
        }
        let message = err(&[("VANS_UNPUSHED_KEYS", "empty")]);
        assert!(message.contains("VANS_UNPUSHED_KEYS") && message.contains("`zeros` or `error`"));
    }

    #[test]
    fn rdma_and_ipc_are_not_stream_vans() {
        for value in ["rdma", "ipc"] {
            let message = err(&[("VANS_STREAM_VAN", value)]);
            assert!(message.contains("VANS_STREAM_VAN") && message.contains("DMLC_ENABLE_RDMA"));
        }
        let c = Config::from_vars([("VANS_STREAM_VAN", "inproc")]).unwrap();
        assert_eq!(c.stream_van, VanKind::InProcess);
    }

    #[test]
    fn enable_rdma_variants() {
        for (value, mode) in [
            ("0", RdmaMode::Off),
            ("false", RdmaMode::Off),
            ("FALSE", RdmaMode::Off),
            ("1", RdmaMode::Ibverbs),
            ("true", RdmaMode::Ibverbs),
            ("ibverbs", RdmaMode::Ibverbs),
            ("IBVerbs", RdmaMode::Ibverbs),
        ] {
            let c = Config::from_vars([("DMLC_ENABLE_RDMA", value)]).unwrap();
            assert_eq!(c.enable_rdma, mode, "{value}");
        }
        assert!(RdmaMode::Ibverbs.is_enabled() && !RdmaMode::Off.is_enabled());
        for value in ["2", "yes", "ucx"] {
            let message = err(&[("DMLC_ENABLE_RDMA", value)]);
            assert!(message.contains("DMLC_ENABLE_RDMA") && message.contains("ibverbs"));
        }
    }

    #[test]
    fn dmlc_port_wins_over_legacy_port() {
        let port = |vars: &[(&str, &str)]| Config::from_vars(vars.iter().copied()).unwrap().port;
        assert_eq!(port(&[("PORT", "7000")]), 7000);
        assert_eq!(port(&[("PORT", "7000"), ("DMLC_PORT", "7001")]), 7001);
        // The legacy name is not parsed when DMLC_PORT is set.
        assert_eq!(port(&[("PORT", "web"), ("DMLC_PORT", "7001")]), 7001);
        assert!(err(&[("PORT", "web")]).contains("PORT"));
        assert!(err(&[("PORT", "7000"), ("DMLC_PORT", "x")]).contains("DMLC_PORT"));
    }

    #[cfg(unix)]
    #[test]
    fn non_utf8_value_is_invalid() {
        use std::os::unix::ffi::OsStringExt;
        let bad = OsString::from_vec(vec![b'e', b't', 0xff]);
        let e = Config::from_os_vars([("DMLC_INTERFACE".into(), bad.clone())]).unwrap_err();
        assert!(e.to_string().contains("DMLC_INTERFACE") && e.to_string().contains("UTF-8"));
        // Variables vans does not read may hold anything.
        Config::from_os_vars([("OTHER".into(), bad)]).unwrap();
    }
}
