//! Finding and removing what crashed processes left in `/dev/shm`.
//!
//! A named segment outlives its creator only when the creator died before the handshake
//! removed the name (a listener's accept queue, a dialer's connection segment never taken).
//! The owner is judged by the pid in the name with `kill(pid, 0)`: `ESRCH` means dead. That
//! is only meaningful in the creator's pid namespace, which the name also records; a segment
//! from another pid namespace (or when `/proc` cannot tell ours) is reported as unknown and
//! never removed. Only segments of our own uid are ever removed.

use std::fmt;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use rustix::io::Errno;
use rustix::process::Pid;

use super::{effective_uid, pid_namespace, SegmentName, NAME_PREFIX, SHM_DIR};
use crate::error::IpcError;

/// Whether the creator of a listed segment still runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerStatus {
    /// `kill(pid, 0)` found the process (an unreaped zombie counts as alive).
    Alive,
    /// `kill(pid, 0)` said `ESRCH`: no such process in our pid namespace.
    Dead,
    /// Liveness cannot be judged from here (another pid namespace): never removed.
    Unknown {
        /// Why.
        reason: String,
    },
    /// The entry starts with `vans-` but is not a valid segment (bad name, not a regular
    /// file): reported, never removed.
    Malformed {
        /// What is wrong with it.
        reason: String,
    },
}

impl fmt::Display for OwnerStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OwnerStatus::Alive => f.write_str("alive"),
            OwnerStatus::Dead => f.write_str("dead (stale)"),
            OwnerStatus::Unknown { reason } => write!(f, "unknown: {reason}"),
            OwnerStatus::Malformed { reason } => write!(f, "malformed: {reason}"),
        }
    }
}

/// One `vans-*` entry of `/dev/shm`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShmEntry {
    /// The file name (lossily converted when not UTF-8).
    pub file_name: String,
    /// The full path.
    pub path: PathBuf,
    /// Size in bytes.
    pub size: u64,
    /// Owner of the file.
    pub file_uid: u32,
    /// The parsed name, `None` when malformed.
    pub name: Option<SegmentName>,
    /// Whether its creator still runs.
    pub owner: OwnerStatus,
}

impl ShmEntry {
    /// The creator's pid, from the name.
    pub fn owner_pid(&self) -> Option<u32> {
        self.name.map(|n| n.pid)
    }

    /// Whether it belongs to our effective uid (by name and by file owner).
    pub fn is_ours(&self) -> bool {
        let me = effective_uid();
        self.file_uid == me && self.name.is_some_and(|n| n.uid == me)
    }

    /// Whether [`clean_stale`] removes it: ours, and its creator is dead.
    pub fn is_stale(&self) -> bool {
        self.is_ours() && self.owner == OwnerStatus::Dead
    }
}

/// What [`clean_stale`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CleanReport {
    /// Segments removed.
    pub removed: Vec<ShmEntry>,
    /// Stale segments that could not be removed, with the reason.
    pub failed: Vec<(ShmEntry, String)>,
}

/// Every `vans-*` entry in `/dev/shm`, sorted by name, with its size, owner pid and
/// whether the owner is alive. Malformed entries are listed as
/// [`OwnerStatus::Malformed`]; entries that vanish while listing are skipped.
///
/// # Errors
///
/// [`IpcError::Os`] (`opendir`) when `/dev/shm` cannot be read.
pub fn list_segments() -> Result<Vec<ShmEntry>, IpcError> {
    let entries = std::fs::read_dir(SHM_DIR).map_err(|e| IpcError::Os {
        call: "opendir",
        source: io::Error::new(e.kind(), format!("{SHM_DIR}: {e}")),
    })?;
    let mut listed = Vec::new();
    for entry in entries {
        // An entry can disappear between readdir and stat: that is not an error.
        let Ok(entry) = entry else { continue };
        let os_name = entry.file_name();
        if !os_name
            .as_encoded_bytes()
            .starts_with(NAME_PREFIX.as_bytes())
        {
            continue;
        }
        let path = entry.path();
        let file_name = os_name.to_string_lossy().into_owned();
        let metadata = match std::fs::symlink_metadata(&path) {
            Ok(metadata) => metadata,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => {
                listed.push(ShmEntry {
                    file_name,
                    path,
                    size: 0,
                    file_uid: u32::MAX,
                    name: None,
                    owner: OwnerStatus::Malformed {
                        reason: format!("cannot stat it: {e}"),
                    },
                });
                continue;
            }
        };
        let parsed = match os_name.to_str() {
            None => Err("the name is not UTF-8".to_owned()),
            Some(text) => SegmentName::parse(text).map_err(|e| match e {
                IpcError::BadName { reason, .. } => reason,
                other => other.to_string(),
            }),
        };
        let (name, owner) = match parsed {
            _ if !metadata.file_type().is_file() => (
                None,
                OwnerStatus::Malformed {
                    reason: "not a regular file".into(),
                },
            ),
            Err(reason) => (None, OwnerStatus::Malformed { reason }),
            Ok(name) => (Some(name), owner_status(&name)),
        };
        listed.push(ShmEntry {
            file_name,
            path,
            size: metadata.len(),
            file_uid: metadata.uid(),
            name,
            owner,
        });
    }
    listed.sort_by(|a, b| a.file_name.cmp(&b.file_name));
    Ok(listed)
}

/// The entries [`clean_stale`] would remove now (for a dry run).
///
/// # Errors
///
/// As [`list_segments`].
pub fn stale_segments() -> Result<Vec<ShmEntry>, IpcError> {
    Ok(list_segments()?
        .into_iter()
        .filter(ShmEntry::is_stale)
        .collect())
}

/// Removes every segment of our uid whose creator is dead (re-checked right before the
/// removal), and reports what it removed and what it could not.
///
/// ```no_run
/// # fn main() -> Result<(), van_ipc::IpcError> {
/// let report = van_ipc::named::clean_stale()?;
/// for entry in &report.removed {
///     println!("removed {} ({} bytes)", entry.file_name, entry.size);
/// }
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// As [`list_segments`]; a segment that cannot be removed is listed in
/// [`CleanReport::failed`] instead.
pub fn clean_stale() -> Result<CleanReport, IpcError> {
    let mut report = CleanReport::default();
    for entry in stale_segments()? {
        // A pid reused since the listing makes the owner look alive: keep the segment.
        if entry.name.is_some_and(|n| pid_alive(n.pid)) {
            continue;
        }
        match std::fs::remove_file(&entry.path) {
            Ok(()) => report.removed.push(entry),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => report.failed.push((entry, e.to_string())),
        }
    }
    Ok(report)
}

/// Whether the creator named by `name` still runs, as far as this process can tell.
fn owner_status(name: &SegmentName) -> OwnerStatus {
    let ours = pid_namespace();
    if ours == 0 {
        return OwnerStatus::Unknown {
            reason: "this process cannot read its pid namespace (/proc/self/ns/pid)".into(),
        };
    }
    if name.pid_namespace != ours {
        return OwnerStatus::Unknown {
            reason: format!(
                "created in pid namespace {}, we are in {ours}",
                name.pid_namespace
            ),
        };
    }
    if pid_alive(name.pid) {
        OwnerStatus::Alive
    } else {
        OwnerStatus::Dead
    }
}

/// `kill(pid, 0)`: only `ESRCH` means dead (`EPERM` means it exists under another uid;
/// anything else is taken as alive, to be safe).
fn pid_alive(pid: u32) -> bool {
    let Some(pid) = i32::try_from(pid)
        .ok()
        .filter(|pid| *pid > 0)
        .and_then(Pid::from_raw)
    else {
        return true;
    };
    rustix::process::test_kill_process(pid) != Err(Errno::SRCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_own_pid_is_alive() {
        assert!(pid_alive(std::process::id()));
        assert!(pid_alive(0), "never judged dead");
        let name = SegmentName::fresh().unwrap();
        if pid_namespace() != 0 {
            assert_eq!(owner_status(&name), OwnerStatus::Alive);
        }
        let elsewhere = SegmentName {
            pid_namespace: name.pid_namespace.wrapping_add(1),
            ..name
        };
        assert!(matches!(
            owner_status(&elsewhere),
            OwnerStatus::Unknown { .. }
        ));
    }
}
