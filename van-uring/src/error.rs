//! [`UringError`]: why the io_uring van cannot start, and the probe that finds out.

use std::io;

use van_core::{VanError, VanKind};

/// The setting that selects the TCP van instead, named in every "unavailable" error.
pub const FALLBACK_SETTING: &str = "VANS_STREAM_VAN=tcp";

/// Oldest kernel with everything the van uses (multishot receive needs 6.0).
pub const MIN_KERNEL: (u32, u32) = (6, 0);

/// What can go wrong when starting the io_uring van. Every variant says what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UringError {
    /// io_uring cannot be used on this machine or in this process: disabled by
    /// `/proc/sys/kernel/io_uring_disabled`, refused by a seccomp filter (containers often
    /// block it), or a kernel too old. Use the TCP van.
    #[error(
        "io_uring is unavailable: {reason}; use the TCP van instead ({FALLBACK_SETTING}, the \
         default)"
    )]
    Unavailable {
        /// What failed, with what the system says about it.
        reason: String,
    },
    /// An I/O thread could not be started (out of threads or memory).
    #[error("cannot start an io_uring I/O thread: {0}")]
    Thread(#[source] io::Error),
}

impl From<UringError> for VanError {
    fn from(e: UringError) -> VanError {
        match e {
            UringError::Unavailable { .. } => VanError::Unsupported {
                kind: VanKind::Uring,
                reason: e.to_string(),
            },
            UringError::Thread(source) => VanError::Io {
                kind: VanKind::Uring,
                source,
            },
        }
    }
}

/// The kernel release as (major, minor), if `uname` says.
fn kernel_release() -> Option<(u32, u32, String)> {
    let release = rustix::system::uname()
        .release()
        .to_string_lossy()
        .into_owned();
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor, release))
}

/// Fails when the kernel is older than [`MIN_KERNEL`].
pub(crate) fn check_kernel() -> Result<(), UringError> {
    match kernel_release() {
        Some((major, minor, release)) if (major, minor) < MIN_KERNEL => {
            Err(UringError::Unavailable {
                reason: format!(
                    "kernel {release} is older than {}.{} (multishot receive and provided-buffer \
                     rings)",
                    MIN_KERNEL.0, MIN_KERNEL.1
                ),
            })
        }
        _ => Ok(()),
    }
}

/// The error for a failed `io_uring_setup`, with what the system says about why.
pub(crate) fn setup_failed(error: &io::Error) -> UringError {
    let disabled = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        .ok()
        .and_then(|s| s.trim().parse::<u8>().ok());
    let why = match (error.raw_os_error(), disabled) {
        (_, Some(2)) => "/proc/sys/kernel/io_uring_disabled is 2 (disabled for everyone)".into(),
        (Some(libc::EPERM), Some(1)) => "/proc/sys/kernel/io_uring_disabled is 1 (only \
             processes in kernel.io_uring_group may use it)"
            .into(),
        (Some(libc::EPERM), _) => {
            "not permitted: a seccomp filter (container runtimes often block io_uring) or a \
             security module refused it"
                .into()
        }
        (Some(libc::ENOSYS), _) => "the kernel has no io_uring (built without it, or a \
             seccomp filter hides it)"
            .into(),
        _ => "the system refused to create a ring".to_owned(),
    };
    UringError::Unavailable {
        reason: format!("io_uring_setup failed: {error}: {why}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unavailable_names_the_cause_and_the_fallback() {
        let e = setup_failed(&io::Error::from_raw_os_error(libc::EPERM));
        let text = VanError::from(e).to_string();
        assert!(text.contains("io_uring is unavailable"), "{text}");
        assert!(text.contains("Operation not permitted"), "{text}");
        assert!(text.contains(FALLBACK_SETTING), "{text}");
        let e = setup_failed(&io::Error::from_raw_os_error(libc::ENOSYS));
        assert!(e.to_string().contains("no io_uring"), "{e}");
    }
}
