//! The variables that tune the vans themselves: shared memory (`DMLC_ENABLE_IPC`,
//! `VANS_IPC_*`), polling, `VANS_HOST_ID`, `VANS_EAGER_CONNECT`, the io_uring van's
//! threads, pinning and zero-copy threshold (with the Seastar and StarServer names), and
//! the RDMA van's settings (with BytePS's names).

use super::error::ConfigError;
use super::rdma::{RdmaFallback, RdmaSettings};
use super::reader::Vars;
use super::{Config, RX_DEPTH_EXPECTED, START_DEPTH_EXPECTED};
use crate::auth::ClusterSecret;
use crate::message::Role;

impl Vars {
    /// The variables that tune the vans themselves (shared memory, polling, connection
    /// set-up, io_uring threads, RDMA), read after the cluster variables.
    pub(super) fn van_knobs(&self, c: &mut Config) -> Result<(), ConfigError> {
        c.enable_ipc = self.ipc()?;
        for var in [
            "VANS_BUSY_POLLING",
            "PS_ENABLE_POLLING",
            "WORKER_ENABLE_POLLING",
        ] {
            if let Some(on) = self.flag(var)? {
                c.busy_polling |= on;
            }
        }
        c.host_id = self.get("VANS_HOST_ID").map(str::to_owned);
        if let Some(n) = self.number::<usize>("VANS_IPC_ARENA_BYTES", "a whole number of bytes")? {
            c.ipc_arena_bytes = n;
        }
        c.eager_connect = self.flag("VANS_EAGER_CONNECT")?.unwrap_or(false);
        self.io_threads(c)?;
        c.ipc_named = self.flag("VANS_IPC_NAMED")?.unwrap_or(false);
        if let Some(n) = self.number::<usize>("VANS_FRAME_POOL_BYTES", "a whole number of bytes")? {
            c.frame_pool_bytes = n;
        }
        if let Some(n) =
            self.number::<usize>("VANS_PEER_BUDGET_BYTES", "a whole number of bytes")?
        {
            c.peer_budget_bytes = n;
        }
        c.rdma = self.rdma_settings()?;
        self.authentication(c)?;
        Ok(())
    }

    /// The cluster secret (from the variable or a file, not both), the handshake timeout and
    /// the bound on connections authenticating at once per address. Errors about the secret
    /// never show its value.
    fn authentication(&self, c: &mut Config) -> Result<(), ConfigError> {
        let secret = match (
            self.get("VANS_CLUSTER_SECRET"),
            self.get("VANS_CLUSTER_SECRET_FILE"),
        ) {
            (Some(_), Some(_)) => {
                return Err(ConfigError::Contradiction {
                    vars: &["VANS_CLUSTER_SECRET", "VANS_CLUSTER_SECRET_FILE"],
                    reason: "set one of them, not both",
                })
            }
            (Some(value), None) => {
                Some(
                    ClusterSecret::new(value).map_err(|error| ConfigError::Secret {
                        var: "VANS_CLUSTER_SECRET",
                        error,
                    })?,
                )
            }
            (None, Some(path)) => Some(
                ClusterSecret::from_file(std::path::Path::new(path)).map_err(|error| {
                    ConfigError::Secret {
                        var: "VANS_CLUSTER_SECRET_FILE",
                        error,
                    }
                })?,
            ),
            (None, None) => None,
        };
        c.cluster_secret = secret;
        if let Some(ms) = self.positive("VANS_HANDSHAKE_TIMEOUT_MS")? {
            c.handshake_timeout = std::time::Duration::from_millis(ms);
        }
        if let Some(n) = self.positive("VANS_MAX_PENDING_PER_ADDRESS")? {
            c.max_pending_per_address = usize::try_from(n).unwrap_or(usize::MAX);
        }
        if let Some(n) = self.positive("VANS_MAX_CONNECTIONS")? {
            c.max_connections = usize::try_from(n).unwrap_or(usize::MAX);
        }
        if let Some(n) = self.positive("VANS_MAX_CONNECTIONS_PER_ADDRESS")? {
            c.max_connections_per_address = usize::try_from(n).unwrap_or(usize::MAX);
        }
        Ok(())
    }

    /// The io_uring van's threads, pinning and zero-copy threshold. Every variable is
    /// checked whatever the role; the role picks which StarServer name applies.
    fn io_threads(&self, c: &mut Config) -> Result<(), ConfigError> {
        let mut threads = [None; 4];
        for (slot, var) in threads.iter_mut().zip([
            "VANS_URING_THREADS",
            "NETWORK_PS_CORE_NUMBER",
            "NETWORK_WORKER_CORE_NUMBER",
            "SEASTAR_CORE_NUMBER",
        ]) {
            *slot = self
                .positive(var)?
                .map(|n| u32::try_from(n).map_err(|_| self.invalid(var, "at most 4294967295")))
                .transpose()?;
        }
        let [ours, ps, worker, seastar] = threads;
        let by_role = match c.role {
            Some(Role::Server) => ps,
            Some(Role::Worker) => worker,
            _ => None,
        };
        c.io_threads = ours.or(by_role).or(seastar);
        let ps_off = self.flag("PS_DISABLE_PIN_CORES")?;
        let worker_off = self.flag("WORKER_DISABLE_PIN_CORES")?;
        let off_by_role = match c.role {
            Some(Role::Server) => ps_off,
            Some(Role::Worker) => worker_off,
            _ => None,
        };
        c.pin_io_threads = match (self.flag("VANS_PIN_CORES")?, off_by_role) {
            (Some(on), _) => on,
            (None, Some(off)) => !off,
            (None, None) => false,
        };
        if let Some(n) = self.number::<usize>("VANS_URING_ZC_BYTES", "a whole number of bytes")? {
            c.uring_zc_bytes = (n > 0).then_some(n);
        }
        Ok(())
    }

    fn ipc(&self) -> Result<bool, ConfigError> {
        match (
            self.flag("DMLC_ENABLE_IPC")?,
            self.flag("BYTEPS_ENABLE_IPC")?,
        ) {
            (Some(a), Some(b)) if a != b => Err(ConfigError::Contradiction {
                vars: &["DMLC_ENABLE_IPC", "BYTEPS_ENABLE_IPC"],
                reason: "one turns shared memory on and the other off; set one of them",
            }),
            (Some(a), _) | (None, Some(a)) => Ok(a),
            (None, None) => Ok(true),
        }
    }

    fn rdma_settings(&self) -> Result<RdmaSettings, ConfigError> {
        let mut r = RdmaSettings::default();
        if let Some(value) = self.get("VANS_RDMA_FALLBACK") {
            r.fallback = match value.to_ascii_lowercase().as_str() {
                "none" | "0" | "off" => RdmaFallback::None,
                "tcp" | "stream" => RdmaFallback::Stream,
                _ => {
                    return Err(self.invalid(
                        "VANS_RDMA_FALLBACK",
                        "`none` (fail when RDMA cannot be used) or `tcp` (warn and use the \
                         stream van)",
                    ))
                }
            };
        }
        r.device = self.get("VANS_RDMA_DEVICE").map(str::to_owned);
        r.gid_index = self.number("VANS_RDMA_GID_INDEX", "a GID table index, 0 or more")?;
        let rx = &["VANS_RDMA_RX_DEPTH", "BYTEPS_RDMA_RX_DEPTH"];
        if let Some(depth) = self.alias_number(rx, RX_DEPTH_EXPECTED)? {
            r.rx_depth = depth;
        }
        let start = &["VANS_RDMA_START_DEPTH", "BYTEPS_RDMA_START_DEPTH"];
        if let Some(depth) = self.alias_number(start, START_DEPTH_EXPECTED)? {
            r.start_depth = depth;
        }
        if let Some(n) = self.number::<usize>("VANS_RDMA_POOL_BYTES", "a whole number of bytes")? {
            r.pool_bytes = n;
        }
        if let Some(n) = self.positive("VANS_RDMA_MAX_HANDSHAKES")? {
            r.max_handshakes = usize::try_from(n).unwrap_or(usize::MAX);
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{err, with};

    #[test]
    fn frame_pool_and_peer_budget_bytes() {
        let c = Config::default();
        assert_eq!(c.frame_pool_bytes, crate::pool::DEFAULT_POOL_BYTES);
        assert_eq!(c.peer_budget_bytes, crate::budget::DEFAULT_BUDGET_BYTES);
        let c = Config::from_vars([
            ("VANS_FRAME_POOL_BYTES", "0"),
            ("VANS_PEER_BUDGET_BYTES", "1048576"),
        ])
        .unwrap();
        assert_eq!((c.frame_pool_bytes, c.peer_budget_bytes), (0, 1 << 20));
        let message = err(&[("VANS_PEER_BUDGET_BYTES", "lots")]);
        assert!(message.contains("VANS_PEER_BUDGET_BYTES"), "{message}");
        assert!(message.contains("whole number of bytes"), "{message}");
    }

    #[test]
    fn the_cluster_secret_from_the_variable_or_a_file_never_shown_in_errors() {
        let c = Config::from_vars([
            ("VANS_CLUSTER_SECRET", "0123456789abcdef"),
            ("VANS_HANDSHAKE_TIMEOUT_MS", "250"),
            ("VANS_MAX_PENDING_PER_ADDRESS", "3"),
        ])
        .unwrap();
        assert_eq!(
            c.cluster_secret,
            Some(ClusterSecret::new("0123456789abcdef").unwrap())
        );
        assert_eq!(c.handshake_timeout, std::time::Duration::from_millis(250));
        assert_eq!(c.max_pending_per_address, 3);
        assert_eq!(Config::default().cluster_secret, None);

        let message = err(&[("VANS_CLUSTER_SECRET", "hunter2")]);
        assert!(message.contains("VANS_CLUSTER_SECRET"), "{message}");
        assert!(message.contains("at least 16"), "{message}");
        assert!(!message.contains("hunter2"), "the secret leaked: {message}");

        let file = std::env::temp_dir().join(format!("vans-config-secret-{}", std::process::id()));
        std::fs::write(&file, "fedcba9876543210\n").unwrap();
        let path = file.display().to_string();
        let c = Config::from_vars([("VANS_CLUSTER_SECRET_FILE", path.as_str())]).unwrap();
        assert_eq!(
            c.cluster_secret,
            Some(ClusterSecret::new("fedcba9876543210").unwrap())
        );
        let both = err(&[
            ("VANS_CLUSTER_SECRET_FILE", path.as_str()),
            ("VANS_CLUSTER_SECRET", "0123456789abcdef"),
        ]);
        assert!(both.contains("not both"), "{both}");
        std::fs::remove_file(&file).unwrap();
        let gone = err(&[("VANS_CLUSTER_SECRET_FILE", path.as_str())]);
        assert!(
            gone.contains("cannot read the cluster secret file"),
            "{gone}"
        );
    }

    #[test]
    fn rdma_settings_with_byteps_names_and_the_fallback() {
        let c = Config::from_vars([
            ("BYTEPS_RDMA_RX_DEPTH", "256"),
            ("BYTEPS_RDMA_START_DEPTH", "8"),
            ("VANS_RDMA_GID_INDEX", "3"),
            ("VANS_RDMA_DEVICE", "rxe0"),
            ("VANS_RDMA_FALLBACK", "tcp"),
            ("VANS_RDMA_POOL_BYTES", "1048576"),
            ("VANS_RDMA_MAX_HANDSHAKES", "4"),
        ])
        .unwrap();
        assert_eq!(
            c.rdma,
            RdmaSettings {
                fallback: RdmaFallback::Stream,
                device: Some("rxe0".into()),
                gid_index: Some(3),
                rx_depth: 256,
                start_depth: 8,
                pool_bytes: 1 << 20,
                max_handshakes: 4,
            }
        );
        // Ours and BytePS's names may both be set when they agree.
        let c = Config::from_vars([("VANS_RDMA_RX_DEPTH", "64"), ("BYTEPS_RDMA_RX_DEPTH", "64")]);
        assert_eq!(c.unwrap().rdma.rx_depth, 64);
        let message = err(&[("VANS_RDMA_RX_DEPTH", "64"), ("BYTEPS_RDMA_RX_DEPTH", "32")]);
        assert!(message.contains("BYTEPS_RDMA_RX_DEPTH"), "{message}");
        let message = err(&[("VANS_RDMA_RX_DEPTH", "2")]);
        assert!(message.contains("from 4 to 32768"), "{message}");
        let message = err(&[("BYTEPS_RDMA_START_DEPTH", "0")]);
        assert!(message.contains("VANS_RDMA_START_DEPTH"), "{message}");
        let message = err(&[("VANS_RDMA_MAX_HANDSHAKES", "0")]);
        assert!(message.contains("VANS_RDMA_MAX_HANDSHAKES"), "{message}");
        let message = err(&[("VANS_RDMA_FALLBACK", "udp")]);
        assert!(message.contains("`tcp`"), "{message}");
    }

    #[test]
    fn ipc_and_polling_switches() {
        assert!(Config::from_vars([("DMLC_ENABLE_IPC", "0")])
            .map(|c| !c.enable_ipc)
            .unwrap());
        assert!(Config::from_vars([("BYTEPS_ENABLE_IPC", "false")])
            .map(|c| !c.enable_ipc)
            .unwrap());
        let message = err(&[("DMLC_ENABLE_IPC", "1"), ("BYTEPS_ENABLE_IPC", "0")]);
        assert!(message.contains("DMLC_ENABLE_IPC") && message.contains("BYTEPS_ENABLE_IPC"));
        for var in [
            "VANS_BUSY_POLLING",
            "PS_ENABLE_POLLING",
            "WORKER_ENABLE_POLLING",
        ] {
            assert!(
                Config::from_vars([(var, "1")]).unwrap().busy_polling,
                "{var}"
            );
        }
        assert!(!Config::default().busy_polling && Config::default().enable_ipc);
    }

    #[test]
    fn uring_threads_and_pinning_follow_the_seed_deployments_names_by_role() {
        let server = |extra: &[(&'static str, &'static str)]| {
            let mut vars = with(&[("DMLC_ROLE", "server"), ("DMLC_ENABLE_RDMA", "0")]);
            vars.extend_from_slice(extra);
            Config::from_vars(vars).unwrap()
        };
        let worker = |extra: &[(&'static str, &'static str)]| {
            let mut vars = with(&[("DMLC_ENABLE_RDMA", "0")]);
            vars.extend_from_slice(extra);
            Config::from_vars(vars).unwrap()
        };
        assert_eq!(Config::default().io_threads, None);
        assert!(!Config::default().pin_io_threads);
        let all = [
            ("SEASTAR_CORE_NUMBER", "2"),
            ("NETWORK_PS_CORE_NUMBER", "3"),
            ("NETWORK_WORKER_CORE_NUMBER", "4"),
        ];
        assert_eq!(server(&all).io_threads, Some(3));
        assert_eq!(worker(&all).io_threads, Some(4));
        assert_eq!(server(&all[..1]).io_threads, Some(2));
        let mut ours = all.to_vec();
        ours.push(("VANS_URING_THREADS", "5"));
        assert_eq!(worker(&ours).io_threads, Some(5));
        assert!(err(&[("VANS_URING_THREADS", "0")]).contains("VANS_URING_THREADS"));
        // StarServer pins by default and turns it off per role; ours wins when set.
        assert!(server(&[("PS_DISABLE_PIN_CORES", "0")]).pin_io_threads);
        assert!(!server(&[("PS_DISABLE_PIN_CORES", "1")]).pin_io_threads);
        assert!(!server(&[("WORKER_DISABLE_PIN_CORES", "0")]).pin_io_threads);
        assert!(worker(&[("WORKER_DISABLE_PIN_CORES", "0")]).pin_io_threads);
        assert!(
            !worker(&[("WORKER_DISABLE_PIN_CORES", "0"), ("VANS_PIN_CORES", "0")]).pin_io_threads
        );
        assert!(worker(&[("VANS_PIN_CORES", "1")]).pin_io_threads);
        assert_eq!(
            Config::from_vars([("VANS_URING_ZC_BYTES", "0")])
                .unwrap()
                .uring_zc_bytes,
            None
        );
    }
}
