//! Logging for a vans program: [`init`] sends `tracing` events to stderr at the level
//! `PS_VERBOSE` asks for (ps-lite's variable: 0 or unset warn, 1 info, 2 debug), unless
//! `RUST_LOG` says otherwise. The benchmarks, demos and job service call it first thing; a
//! library embedding vans installs its own subscriber instead.

/// Installs the stderr subscriber (colored when `ansi`). Does nothing when the process has
/// a subscriber already.
pub fn init(ansi: bool) {
    let filter = match std::env::var("PS_VERBOSE").as_deref() {
        Ok("2") => "debug",
        Ok("1") => "info",
        _ => "warn",
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter)),
        )
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .try_init();
}
