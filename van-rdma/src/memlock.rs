//! The locked-memory limit: RDMA registration pins pages, and the kernel refuses to pin more
//! than `RLIMIT_MEMLOCK` unless the process has `CAP_IPC_LOCK`. The van checks up front so a
//! low limit is a clear error at start instead of a failed registration mid-training.

use crate::RdmaError;

/// The limit that applies to this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemlockLimit {
    /// The soft limit in bytes; `None`: unlimited.
    pub soft: Option<u64>,
    /// The process has `CAP_IPC_LOCK` (root usually does), so the limit does not apply.
    pub cap_ipc_lock: bool,
}

/// `CAP_IPC_LOCK`'s bit in the capability sets.
const CAP_IPC_LOCK: u32 = 14;

/// Reads the limit (`getrlimit`) and the capability (`/proc/self/status`).
pub fn current() -> MemlockLimit {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one `rlimit` into the struct we own; it has no other effect.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) } == 0;
    let soft = if !ok || limit.rlim_cur == libc::RLIM_INFINITY {
        None
    } else {
        Some(limit.rlim_cur)
    };
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    MemlockLimit {
        soft,
        cap_ipc_lock: has_cap(&status, CAP_IPC_LOCK),
    }
}

/// Whether the effective capability set in a `/proc/<pid>/status` text has `bit`.
fn has_cap(status: &str, bit: u32) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << bit) != 0)
}

/// Bytes, readable: `8 MiB`, `1.5 GiB`, `300 B`.
pub fn readable(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if value.fract() == 0.0 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

impl MemlockLimit {
    /// Whether `needed` bytes can be registered; the error says how to raise the limit.
    pub fn check(&self, needed: u64) -> Result<(), RdmaError> {
        match self.soft {
            Some(soft) if !self.cap_ipc_lock && soft < needed => Err(RdmaError::MemlockTooLow {
                limit: readable(soft),
                needed: readable(needed),
            }),
            _ => Ok(()),
        }
    }

    /// One line for diagnostics.
    pub fn describe(&self) -> String {
        let soft = self.soft.map_or_else(|| "unlimited".to_owned(), readable);
        if self.cap_ipc_lock {
            format!("{soft} (not enforced: the process has CAP_IPC_LOCK)")
        } else {
            soft
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_low_limit_is_an_error_with_the_needed_size_and_the_fix() {
        let low = MemlockLimit {
            soft: Some(8 << 20),
            cap_ipc_lock: false,
        };
        let message = low.check(258 << 20).err().map(|e| e.to_string());
        let message = message.unwrap_or_default();
        assert!(message.contains("memlock limit 8 MiB"), "{message}");
        assert!(message.contains("258 MiB"), "{message}");
        assert!(message.contains("ulimit -l unlimited"), "{message}");
        assert!(low.check(8 << 20).is_ok());
        let capable = MemlockLimit {
            cap_ipc_lock: true,
            ..low
        };
        assert!(capable.check(1 << 40).is_ok());
        let unlimited = MemlockLimit {
            soft: None,
            cap_ipc_lock: false,
        };
        assert!(unlimited.check(1 << 40).is_ok());
        assert!(unlimited.describe().contains("unlimited"));
    }

    #[test]
    fn capabilities_and_sizes_read_right() {
        assert!(has_cap(
            "Name:\tx\nCapEff:\t000001ffffffffff\n",
            CAP_IPC_LOCK
        ));
        assert!(!has_cap("CapEff:\t0000000000000000\n", CAP_IPC_LOCK));
        assert!(!has_cap("CapEff:\tzz\n", CAP_IPC_LOCK));
        assert!(!has_cap("", CAP_IPC_LOCK));
        assert_eq!(readable(300), "300 B");
        assert_eq!(readable(8 << 20), "8 MiB");
        assert_eq!(readable(3 << 29), "1.5 GiB");
        let _ = current().describe();
    }
}
