//! Finding and removing what crashed processes left in `/dev/shm`.
//!
//! A named segment outlives its creator when the creator died before removing the name: a
//! listener's accept queue (it lives as long as the listener), a dialer's connection segment
//! never taken. Owners are judged first by the **owner lock**: the creator of a segment holds
//! an exclusive `flock` on it for as long as it lives, taken before it writes the magic
//! ([`layout::OWNER_LOCK_VERSION`](super::layout::OWNER_LOCK_VERSION)); the kernel releases
//! it when the creator dies, however it dies. An accept queue or connection segment of such
//! a version whose lock we can take is dead, in whatever pid namespace its creator ran; a
//! lock someone holds means alive. Other files (no magic yet, an earlier build's, a bare
//! [`NamedSegment`](super::NamedSegment)) are judged by the pid in the name with
//! `kill(pid, 0)`: `ESRCH` means dead. That is only meaningful in the creator's pid
//! namespace, which the name also records; such a file from another pid namespace is
//! reported as unknown and never removed. Only segments of our own uid are ever removed.
//!
//! Every named-mode [`IpcVan`](crate::IpcVan) runs [`clean_stale`] when it binds, when it
//! learns of a peer's death and when it stops, so that a crashed node's accept queue goes
//! with the survivors of its job.

use std::fmt;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, FlockOperation, Mode, OFlags};
use rustix::io::Errno;
use rustix::process::Pid;

use super::layout::{accept_queue, connection, OWNER_LOCK_VERSION};
use super::{effective_uid, pid_namespace, SegmentName, NAME_PREFIX, SHM_DIR};
use crate::error::IpcError;

/// Whether the creator of a listed segment still runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerStatus {
    /// Someone holds the owner lock, or `kill(pid, 0)` found the process (an unreaped
    /// zombie counts as alive).
    Alive,
    /// The owner lock of an initialized accept queue or connection segment was free (its
    /// creator is gone, in whatever pid namespace), or `kill(pid, 0)` said `ESRCH`: no such
    /// process in our pid namespace.
    Dead,
    /// Liveness cannot be judged from here (a file the owner lock cannot judge, from
    /// another pid namespace): never removed.
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
            Ok(name) => (Some(name), owner_status(&name, &path)),
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
/// removal: with the owner lock held while the name is removed, or the pid once more), and
/// reports what it removed and what it could not.
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
        let Some(name) = entry.name else { continue };
        // Held until the name is removed, so nobody else judges the file meanwhile.
        let _lock = match probe_lock(&entry.path) {
            Lock::Held => continue,
            // The name must still be the file whose lock we hold.
            Lock::Abandoned(fd) if names_file(&entry.path, &fd) => Some(fd),
            Lock::Abandoned(_) => continue,
            // A pid reused since the listing makes the owner look alive: keep the segment.
            Lock::Silent if pid_alive(name.pid) => continue,
            Lock::Silent => None,
        };
        match std::fs::remove_file(&entry.path) {
            Ok(()) => report.removed.push(entry),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => report.failed.push((entry, e.to_string())),
        }
    }
    Ok(report)
}

/// What the owner lock says about a `vans-*` file.
enum Lock {
    /// Someone holds it: the creator lives (or a cleaner looks at the file this moment).
    Held,
    /// We hold it now, through this descriptor, on an accept queue or connection segment
    /// whose creator took it before writing the magic: the creator is dead.
    Abandoned(OwnedFd),
    /// The lock cannot judge this file (not ours, cannot be opened, no magic yet, an earlier
    /// build's format, a bare named segment): judge by pid.
    Silent,
}

/// Tries the owner lock of the file at `path` (see the [module docs](self)).
fn probe_lock(path: &Path) -> Lock {
    // Read-only suffices for flock; no symlinks; a FIFO must not block the open.
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
    let Ok(fd) = rustix::fs::open(path, flags, Mode::empty()) else {
        return Lock::Silent;
    };
    match rustix::fs::fstat(&fd) {
        Ok(stat)
            if FileType::from_raw_mode(stat.st_mode) == FileType::RegularFile
                && stat.st_uid == effective_uid() => {}
        _ => return Lock::Silent,
    }
    loop {
        match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => break,
            Err(Errno::INTR) => {}
            Err(Errno::WOULDBLOCK) => return Lock::Held,
            Err(_) => return Lock::Silent,
        }
    }
    if locks_its_owner(&fd) {
        Lock::Abandoned(fd)
    } else {
        Lock::Silent
    }
}

/// Whether the file starts with the magic of an accept queue or a connection segment and a
/// version whose creator holds the owner lock.
fn locks_its_owner(fd: &OwnedFd) -> bool {
    let (mut magic, mut version) = ([0u8; 8], [0u8; 4]);
    if !matches!(rustix::io::pread(fd, &mut magic, 0), Ok(8))
        || !matches!(rustix::io::pread(fd, &mut version, 8), Ok(4))
    {
        return false;
    }
    let (magic, version) = (u64::from_ne_bytes(magic), u32::from_ne_bytes(version));
    // Both formats keep the magic at 0 and the version at 8.
    const _: () = assert!(
        accept_queue::MAGIC_OFFSET == 0
            && accept_queue::VERSION_OFFSET == 8
            && connection::MAGIC_OFFSET == 0
            && connection::VERSION_OFFSET == 8
    );
    (magic == accept_queue::MAGIC || magic == connection::MAGIC) && version >= OWNER_LOCK_VERSION
}

/// Whether `path` still names the file open as `fd` (same device and inode).
fn names_file(path: &Path, fd: &OwnedFd) -> bool {
    match (rustix::fs::lstat(path), rustix::fs::fstat(fd)) {
        (Ok(named), Ok(open)) => named.st_dev == open.st_dev && named.st_ino == open.st_ino,
        _ => false,
    }
}

/// Whether the creator of the file at `path`, named `name`, still runs, as far as this
/// process can tell: the owner lock first, then the pid.
fn owner_status(name: &SegmentName, path: &Path) -> OwnerStatus {
    match probe_lock(path) {
        Lock::Held => OwnerStatus::Alive,
        Lock::Abandoned(_) => OwnerStatus::Dead,
        Lock::Silent => pid_status(name),
    }
}

/// Whether the creator named by `name` still runs, judged by its pid.
fn pid_status(name: &SegmentName) -> OwnerStatus {
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
            assert_eq!(pid_status(&name), OwnerStatus::Alive);
        }
        let elsewhere = SegmentName {
            pid_namespace: name.pid_namespace.wrapping_add(1),
            ..name
        };
        assert!(matches!(
            owner_status(&elsewhere, &elsewhere.path()),
            OwnerStatus::Unknown { .. }
        ));
    }

    /// A file of `name` holding `magic` and `version` (as a creator writes them), locked by
    /// nobody.
    fn unlocked_file(name: &SegmentName, magic: u64, version: u32) {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(name.path())
            .unwrap();
        file.write_all(&magic.to_ne_bytes()).unwrap();
        file.write_all(&version.to_ne_bytes()).unwrap();
        file.write_all(&[0; 52]).unwrap();
    }

    #[test]
    fn the_owner_lock_judges_before_the_pid() {
        // Our own segments: the lock is held (by another open file description), alive.
        let queue = super::super::accept_queue::AcceptQueue::create().unwrap();
        let path = queue.name().path();
        assert!(matches!(probe_lock(&path), Lock::Held));
        assert_eq!(owner_status(queue.name(), &path), OwnerStatus::Alive);
        let bare = super::super::NamedSegment::create(4096).unwrap();
        assert_eq!(owner_status(bare.name(), &bare.path()), OwnerStatus::Alive);

        // An initialized accept queue or connection whose lock is free has a dead creator,
        // whatever its pid says (here ours: a pid reused after the creator died).
        for magic in [accept_queue::MAGIC, connection::MAGIC] {
            let name = SegmentName::fresh().unwrap();
            unlocked_file(&name, magic, OWNER_LOCK_VERSION);
            assert!(matches!(probe_lock(&name.path()), Lock::Abandoned(_)));
            assert_eq!(owner_status(&name, &name.path()), OwnerStatus::Dead);
            // Another pid namespace makes no difference to the lock.
            let elsewhere = SegmentName {
                pid_namespace: name.pid_namespace.wrapping_add(1),
                ..name
            };
            assert_eq!(owner_status(&elsewhere, &name.path()), OwnerStatus::Dead);
            // (A named-mode van of another test process may have swept it already.)
            let _ = std::fs::remove_file(name.path());
        }

        // An earlier build's format, or no magic yet (a creator between `open` and its
        // lock): the lock says nothing, the pid decides (ours: alive).
        for (magic, version) in [(accept_queue::MAGIC, 1), (0, OWNER_LOCK_VERSION)] {
            let name = SegmentName::fresh().unwrap();
            unlocked_file(&name, magic, version);
            assert!(matches!(probe_lock(&name.path()), Lock::Silent));
            if pid_namespace() != 0 {
                assert_eq!(owner_status(&name, &name.path()), OwnerStatus::Alive);
            }
            std::fs::remove_file(name.path()).unwrap();
        }
    }
}
