//! SIGINT and SIGTERM sent to the launcher, when it handles them.

use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::outcome::LaunchError;

/// SIGINT and SIGTERM listeners.
pub(crate) struct Signals {
    interrupt: Signal,
    terminate: Signal,
}

impl Signals {
    pub(crate) fn install() -> Result<Self, LaunchError> {
        let listen = |kind, name: &str| {
            signal(kind).map_err(|source| LaunchError::Io {
                context: format!("could not handle {name}"),
                source,
            })
        };
        Ok(Signals {
            interrupt: listen(SignalKind::interrupt(), "SIGINT")?,
            terminate: listen(SignalKind::terminate(), "SIGTERM")?,
        })
    }
}

/// The name of the next SIGINT or SIGTERM; never resolves when signals are not handled.
pub(crate) async fn next_signal(signals: &mut Option<Signals>) -> &'static str {
    let Some(signals) = signals else {
        return std::future::pending().await;
    };
    tokio::select! {
        Some(()) = signals.interrupt.recv() => "SIGINT",
        Some(()) = signals.terminate.recv() => "SIGTERM",
        else => std::future::pending().await,
    }
}
