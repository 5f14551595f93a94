//! `vans-doctor`: what this machine offers the vans and which van each peer would get.
//!
//! ```text
//! DMLC_ENABLE_RDMA=1 vans-doctor
//! ```
//!
//! Reports the RDMA devices, ports and GIDs the kernel shows (sysfs), what the RDMA van would
//! open and with which GID (builds with the `rdma` feature), the memlock limit against what
//! the RDMA van registers, the vans compiled in, and — from the same environment a node reads
//! (`DMLC_*`, `VANS_*`) — which van a worker here would use for the scheduler, a server on
//! this host and a server on another host. Exit code: 0 when a node with this environment can
//! start, 1 when it would fail (the reason is printed), 2 for an invalid environment or
//! command line (it takes none but `--help`).

use std::process::ExitCode;

use clap::Parser;
use van_core::config::RdmaFallback;
use van_core::select::{select_van, Available};
use van_core::{Config, Endpoint, Node, Role, VanKind};
use van_rdma::{memlock, sysfs, RdmaError};

/// What this machine offers the vans and which van each peer would get.
///
/// Reports the RDMA devices, ports and GIDs the kernel shows (sysfs), what the RDMA van would
/// open and with which GID (builds with the `rdma` feature), the memlock limit against what
/// the RDMA van registers, the vans compiled in, and which van a worker here would use for
/// the scheduler, a server on this host and a server on another host. It takes no arguments:
/// it reads the node environment (DMLC_*, VANS_*), as a node would.
#[derive(Debug, Parser)]
#[command(
    name = "vans-doctor",
    override_usage = "vans-doctor   (reads the node environment: DMLC_*, VANS_*)",
    after_help = "Example: DMLC_ENABLE_RDMA=1 vans-doctor\n\nExit code: 0 when a node with this \
                  environment can start, 1 when it would fail (the reason is printed), 2 for \
                  an invalid environment or command line."
)]
struct Options {}

fn main() -> ExitCode {
    let Options {} = Options::parse();
    let config = match Config::from_env() {
        Ok(config) => config,
        Err(e) => {
            eprintln!("vans-doctor: invalid environment: {e}");
            return ExitCode::from(2);
        }
    };
    let mut fatal = None;

    println!("== RDMA in the kernel (sysfs)");
    let view = sysfs::kernel_view();
    println!(
        "RDMA core (ib_core): {}; user-space verbs (ib_uverbs): {}",
        yes(view.core_loaded),
        yes(view.uverbs_loaded)
    );
    if view.devices.is_empty() {
        println!("devices: none ({})", sysfs::no_device_cause(&view));
    }
    for device in &view.devices {
        println!(
            "device {} (driver {})",
            device.name,
            or_unknown(&device.driver)
        );
        for port in &device.ports {
            println!(
                "  port {}: {}, {}, {}",
                port.number,
                or_unknown(&port.state),
                or_unknown(&port.link_layer),
                or_unknown(&port.rate)
            );
            for gid in &port.gids {
                println!(
                    "    GID {:>3} {} {}{}{}",
                    gid.index,
                    gid.gid,
                    or_unknown(&gid.kind),
                    if gid.netdev.is_empty() { "" } else { " on " },
                    gid.netdev,
                );
            }
        }
    }

    println!("\n== the RDMA van");
    println!(
        "compiled in: {}",
        if van_rdma::COMPILED {
            "yes"
        } else {
            "no (build with the Cargo feature `rdma`)"
        }
    );
    let probe = van_rdma::probe(&config.rdma);
    let rdma_usable = match &probe {
        Ok(device) => {
            println!("would open: {device}");
            true
        }
        Err(RdmaError::NotCompiled) => false,
        Err(e) => {
            println!("cannot start: {e}");
            false
        }
    };
    let limit = memlock::current();
    let needed =
        config.rdma.pool_bytes as u64 + 2 * u64::from(config.rdma.rx_depth) * van_rdma_slot_bytes();
    let memlock_ok = limit.check(needed);
    println!(
        "memlock limit: {}; the RDMA van registers {} up front (VANS_RDMA_POOL_BYTES + one \
         connection's rings): {}",
        limit.describe(),
        memlock::readable(needed),
        match &memlock_ok {
            Ok(()) => "enough".to_owned(),
            Err(e) => e.to_string(),
        }
    );

    println!("\n== van selection (a worker here, with this environment)");
    println!(
        "DMLC_ENABLE_RDMA: {}; VANS_RDMA_FALLBACK: {}; DMLC_ENABLE_IPC: {}; stream van: {}",
        if config.enable_rdma.is_enabled() {
            "on"
        } else {
            "off"
        },
        match config.rdma.fallback {
            RdmaFallback::None => "none",
            RdmaFallback::Stream => "tcp",
        },
        if config.enable_ipc { "on" } else { "off" },
        config.stream_van
    );
    let rdma_runs = config.enable_rdma.is_enabled() && rdma_usable && memlock_ok.is_ok();
    if config.enable_rdma.is_enabled() && !rdma_runs && config.rdma.fallback == RdmaFallback::None {
        fatal = Some(match (&probe, &memlock_ok) {
            (Err(e), _) => e.to_string(),
            (_, Err(e)) => e.to_string(),
            _ => "RDMA cannot be used".to_owned(),
        });
    }
    let ipc = cfg!(feature = "ipc") && config.enable_ipc;
    let available = Available {
        tcp: true,
        // Whether io_uring is compiled in is not known here; ps-bench --van uring says.
        uring: config.stream_van == VanKind::Uring,
        rdma: rdma_runs,
        ipc: cfg!(feature = "ipc"),
        inproc: false,
    };
    // A node announces an endpoint for each van it runs.
    let announced = |role: Role, host: &str| {
        let mut node = Node::new(role, "10.0.0.1", 9000).with_id(8);
        node.host_identity = host.to_owned();
        node.endpoints
            .push(Endpoint::stream(config.stream_van, "10.0.0.1", 9000));
        if ipc {
            node.endpoints.push(Endpoint {
                kind: VanKind::Ipc,
                address: "@vans-example".into(),
            });
        }
        if rdma_runs {
            node.endpoints
                .push(Endpoint::stream(VanKind::Rdma, "10.0.0.1", 9001));
        }
        node
    };
    let me = announced(Role::Worker, "this-host");
    let peers = [
        (
            "the scheduler",
            announced(Role::Scheduler, "other-host").with_id(1),
        ),
        (
            "a server on this host",
            announced(Role::Server, "this-host"),
        ),
        (
            "a server on another host",
            announced(Role::Server, "other-host"),
        ),
    ];
    for (what, peer) in &peers {
        match select_van(&config, available, &me, peer) {
            Ok(kind) => println!("{what:<26} -> {kind}"),
            Err(van_core::VanError::NotCompiled {
                kind: VanKind::Rdma,
            }) if van_rdma::COMPILED => {
                println!("{what:<26} -> error: the RDMA van cannot start here (see above)")
            }
            Err(e) => println!("{what:<26} -> error: {e}"),
        }
    }
    match fatal {
        Some(reason) => {
            println!("\nverdict: a server or worker with this environment would fail: {reason}");
            ExitCode::FAILURE
        }
        None => {
            println!("\nverdict: a node with this environment can start");
            ExitCode::SUCCESS
        }
    }
}

/// Bytes of one receive buffer of the RDMA van.
fn van_rdma_slot_bytes() -> u64 {
    #[cfg(feature = "rdma")]
    {
        van_rdma::DEFAULT_SLOT_BYTES as u64
    }
    #[cfg(not(feature = "rdma"))]
    {
        8192
    }
}

fn yes(on: bool) -> &'static str {
    if on {
        "loaded"
    } else {
        "not loaded"
    }
}

fn or_unknown(s: &str) -> &str {
    if s.is_empty() {
        "?"
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn it_takes_no_arguments_but_help() {
        Options::command().debug_assert();
        assert!(Options::try_parse_from(["vans-doctor"]).is_ok());
        assert!(Options::try_parse_from(["vans-doctor", "--verbose"]).is_err());
        let help = Options::command().render_long_help().to_string();
        assert!(help.contains("DMLC_*, VANS_*"), "{help}");
    }
}
