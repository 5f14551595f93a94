//! [`NamedSegment`]: a file in `/dev/shm`, created exclusively and owner-only with its memory
//! reserved, or opened after checking its owner, mode and size; mapped shared through one
//! descriptor (see the [module docs](crate::named) for what it checks and why).

use std::fmt;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use rustix::fs::{FallocateFlags, FileType, FlockOperation, Mode, OFlags};
use rustix::io::Errno;
use rustix::shm::OFlags as ShmFlags;

use super::name::effective_uid;
use super::{SegmentName, SHM_DIR};
use crate::error::IpcError;
use crate::mapping::{file_len, Mapping};

/// How many fresh names [`NamedSegment::create`] tries when one is taken (a 64-bit random
/// collision: in practice never).
const CREATE_ATTEMPTS: u32 = 4;
/// Granularity of tmpfs allocations, for the space check.
const PAGE_BYTES: u64 = 4096;
/// How often [`NamedSegment::create`] retries the creator's lock while a cleaner holds it
/// for a moment (for a few system calls).
const LOCK_ATTEMPTS: u32 = 1000;
/// The pause between those tries.
const LOCK_RETRY_PAUSE: std::time::Duration = std::time::Duration::from_millis(1);

/// Bytes free in `/dev/shm` for unprivileged users (`statvfs`: available blocks × fragment
/// size).
///
/// # Errors
///
/// [`IpcError::Os`] (`statvfs`) when `/dev/shm` does not exist or cannot be queried.
pub fn shm_free_bytes() -> Result<u64, IpcError> {
    let stat = rustix::fs::statvfs(SHM_DIR).map_err(|errno| {
        let err = io::Error::from(errno);
        IpcError::Os {
            call: "statvfs",
            source: io::Error::new(
                err.kind(),
                format!("{SHM_DIR}: {err}; named segments need a tmpfs mounted at {SHM_DIR}"),
            ),
        }
    })?;
    Ok(stat.f_bavail.saturating_mul(stat.f_frsize))
}

/// `len` rounded up to whole pages: what tmpfs charges for a file of `len` bytes.
fn pages(len: usize) -> u64 {
    (len as u64).div_ceil(PAGE_BYTES).saturating_mul(PAGE_BYTES)
}

/// [`IpcError::ShmTooSmall`] for `needed` bytes, with the free space measured now.
fn too_small(needed: u64) -> IpcError {
    IpcError::ShmTooSmall {
        needed,
        available: shm_free_bytes().unwrap_or(0),
        path: PathBuf::from(SHM_DIR),
    }
}

/// A file in `/dev/shm` mapped read-write and shared. See the [module docs](crate::named).
///
/// The mapping lives as long as the value (wrap it in an `Arc` to make ring windows with
/// [`crate::Segment::from_named`]). The creator's value removes the name on drop unless
/// [`NamedSegment::unlink`] already did; removing the name never affects mappings. The
/// creator also holds an exclusive `flock` on the file as long as the value lives (the
/// kernel drops it when the process dies, however it dies), which tells other processes
/// that the creator is alive (see [`crate::named::list_segments`]).
/// Access the bytes only through [`NamedSegment::as_ptr`] with raw-pointer copies or
/// atomics: another process may write them at any time.
pub struct NamedSegment {
    name: SegmentName,
    /// The whole file, mapped shared (unmapped when the value drops, after the name is
    /// removed).
    mapping: Mapping,
    /// The descriptor the file was created or opened, checked and mapped through (for
    /// [`Self::fd`]).
    fd: OwnedFd,
    /// Whether this process created the file (and so removes its name on drop).
    created: bool,
    /// Whether the name was removed already.
    unlinked: AtomicBool,
}

impl fmt::Debug for NamedSegment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NamedSegment")
            .field("name", &self.name.to_string())
            .field("len", &self.mapping.len())
            .field("created", &self.created)
            .field("unlinked", &self.unlinked.load(Ordering::Relaxed))
            .field("os_id", &self.name.os_id())
            .finish()
    }
}

/// Removes the name of a file being created if creation fails half-way.
struct UnlinkOnError<'a>(Option<&'a SegmentName>);

impl Drop for UnlinkOnError<'_> {
    fn drop(&mut self) {
        if let Some(name) = self.0 {
            let _ = unlink_name(name);
        }
    }
}

impl NamedSegment {
    /// Creates `/dev/shm/<fresh name>` of `len` bytes: `shm_open` with `O_CREAT | O_EXCL`,
    /// locked (`flock`, exclusive, held until the value drops), mode 0600, its memory
    /// reserved as `posix_fallocate` does, mapped shared. First checks that `/dev/shm` has
    /// room (`statvfs`).
    ///
    /// ```no_run
    /// # fn main() -> Result<(), van_ipc::IpcError> {
    /// use van_ipc::named::NamedSegment;
    /// let segment = NamedSegment::create(1 << 20)?;
    /// println!("created {}", segment.path().display());
    /// drop(segment); // the creator's drop removes the name
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`IpcError::ShmTooSmall`] when `/dev/shm` has less than `len` (in pages) free or runs
    /// out while reserving; [`IpcError::Os`] naming the call that failed otherwise (`len ==
    /// 0` fails as `shm_open` with [`io::ErrorKind::InvalidInput`]). Nothing is left in
    /// `/dev/shm` after an error.
    pub fn create(len: usize) -> Result<NamedSegment, IpcError> {
        let Some(size) = file_len(len) else {
            return Err(IpcError::Os {
                call: "shm_open",
                source: io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("cannot create a named segment of {len} bytes"),
                ),
            });
        };
        let needed = pages(len);
        if needed > shm_free_bytes()? {
            return Err(too_small(needed));
        }
        let mut attempts = 0;
        let (name, fd) = loop {
            let name = SegmentName::fresh()?;
            let flags = ShmFlags::CREATE | ShmFlags::EXCL | ShmFlags::RDWR;
            match rustix::shm::open(name.os_id(), flags, Mode::RUSR | Mode::WUSR) {
                Ok(fd) => break (name, fd),
                Err(Errno::EXIST) if attempts < CREATE_ATTEMPTS => attempts += 1,
                Err(errno) => return Err(file_error("shm_open", &name, errno.into(), needed)),
            }
        };
        // From here on the name is ours to remove: on any error below, and later as soon as
        // both peers mapped a connection segment (or on the creator's drop).
        let mut guard = UnlinkOnError(Some(&name));
        // Before anything is written: whoever finds the file initialized finds it locked
        // while we live (see `lock_owner`).
        lock_owner(&name, &fd)?;
        // Undoes a umask that removed owner bits, and guarantees nothing beyond 0600.
        rustix::fs::fchmod(&fd, Mode::RUSR | Mode::WUSR).map_err(|e| IpcError::os("fchmod", e))?;
        rustix::fs::ftruncate(&fd, size)
            .map_err(|errno| file_error("ftruncate", &name, errno.into(), needed))?;
        check_file(&name, &fd, len)?;
        match reserve(&fd, size) {
            Ok(()) => {}
            Err(Errno::NOSPC) => return Err(too_small(needed)),
            Err(errno) => {
                let os = io::Error::from(errno);
                return Err(IpcError::Os {
                    call: "posix_fallocate",
                    source: io::Error::new(
                        os.kind(),
                        format!(
                            "reserving {len} bytes for {}: {os}; free memory or raise the memory \
                             limit of this process's cgroup",
                            name.path().display()
                        ),
                    ),
                });
            }
        }
        let mapping = Mapping::shared(fd.as_fd(), len)
            .map_err(|err| file_error("mmap", &name, err, needed))?;
        guard.0 = None;
        Ok(NamedSegment {
            name,
            mapping,
            fd,
            created: true,
            unlinked: AtomicBool::new(false),
        })
    }

    /// Opens and maps the named segment `name` created by another process of this uid. The
    /// file must be a regular file owned by our effective uid with no group or other
    /// permission, and between 1 and `max_len` bytes long.
    ///
    /// # Errors
    ///
    /// [`IpcError::Os`] (`open`, kind [`io::ErrorKind::NotFound`]) when no such file exists;
    /// [`IpcError::BadSegment`] when it belongs to another uid, is not a regular file, has
    /// permissive bits, or has a bad size; [`IpcError::Os`] naming the call that failed
    /// otherwise.
    pub fn open(name: &SegmentName, max_len: usize) -> Result<NamedSegment, IpcError> {
        let me = effective_uid();
        if name.uid != me {
            return Err(IpcError::bad_segment(format!(
                "{name} belongs to uid {}; named segments connect processes of one user (we \
                 are uid {me})",
                name.uid
            )));
        }
        let fd = open_file(name)?;
        let size = file_size(name, &fd)?;
        if size == 0 || size > max_len {
            return Err(IpcError::bad_segment(format!(
                "{name} has {size} bytes; expected 1 to {max_len}"
            )));
        }
        // The very file just checked is mapped, through the same descriptor.
        let mapping =
            Mapping::shared(fd.as_fd(), size).map_err(|err| file_error("mmap", name, err, 0))?;
        let len = file_size(name, &fd)?;
        if len != size {
            return Err(IpcError::bad_segment(format!(
                "{name} changed size from {size} to {len} bytes while being opened"
            )));
        }
        Ok(NamedSegment {
            name: *name,
            mapping,
            fd,
            created: false,
            unlinked: AtomicBool::new(false),
        })
    }

    /// Removes the name from `/dev/shm`; the mapping (ours and the peer's) stays valid.
    /// Returns whether this call removed it (`false` when it was already gone).
    ///
    /// # Errors
    ///
    /// [`IpcError::Os`] (`shm_unlink`) when the name exists but cannot be removed.
    pub fn unlink(&self) -> Result<bool, IpcError> {
        if self.unlinked.swap(true, Ordering::AcqRel) {
            return Ok(false);
        }
        match unlink_name(&self.name) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(source) => Err(IpcError::Os {
                call: "shm_unlink",
                source,
            }),
        }
    }

    /// Whether [`NamedSegment::unlink`] ran (by this handle).
    pub fn is_unlinked(&self) -> bool {
        self.unlinked.load(Ordering::Acquire)
    }

    /// The segment's name.
    pub fn name(&self) -> &SegmentName {
        &self.name
    }

    /// The file behind it: `/dev/shm/<name>` (gone once unlinked).
    pub fn path(&self) -> PathBuf {
        self.name.path()
    }

    /// Whether this handle created the file (and removes its name on drop).
    pub fn is_creator(&self) -> bool {
        self.created
    }

    /// Length of the mapping in bytes (never 0).
    pub fn len(&self) -> usize {
        self.mapping.len()
    }

    /// Always `false`: a segment has at least one byte. Present for symmetry with `len`.
    pub fn is_empty(&self) -> bool {
        self.mapping.len() == 0
    }

    /// Start of the mapping: page-aligned, valid for [`NamedSegment::len`] bytes while
    /// `self` lives. Another process may read and write these bytes concurrently: use
    /// raw-pointer copies or atomics, never references to the bytes themselves.
    pub fn as_ptr(&self) -> *mut u8 {
        self.mapping.ptr().as_ptr()
    }

    /// A descriptor of the file (for `fstat` and the like; peers open named segments by
    /// name, not by descriptor).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The `u32` at `offset`, as an atomic.
    ///
    /// # Safety
    ///
    /// `offset` must be a multiple of 4 with `offset + 4 <= self.len()`.
    pub(crate) unsafe fn atomic_u32(&self, offset: usize) -> &AtomicU32 {
        debug_assert!(offset % 4 == 0 && offset + 4 <= self.len());
        // SAFETY: the caller keeps the 4 bytes inside the mapping and 4-aligned (the mapping
        // is page-aligned); `AtomicU32` has the layout of `u32`, and atomics tolerate the
        // peer writing the bytes concurrently. The reference cannot outlive `self`, which
        // keeps the mapping alive.
        unsafe { &*self.as_ptr().add(offset).cast::<AtomicU32>() }
    }

    /// The `u64` at `offset`, as an atomic.
    ///
    /// # Safety
    ///
    /// `offset` must be a multiple of 8 with `offset + 8 <= self.len()`.
    pub(crate) unsafe fn atomic_u64(&self, offset: usize) -> &AtomicU64 {
        debug_assert!(offset % 8 == 0 && offset + 8 <= self.len());
        // SAFETY: as in `atomic_u32`, with 8 bytes and 8-byte alignment.
        unsafe { &*self.as_ptr().add(offset).cast::<AtomicU64>() }
    }
}

impl Drop for NamedSegment {
    fn drop(&mut self) {
        if self.created && !self.unlinked.load(Ordering::Acquire) {
            let _ = unlink_name(&self.name);
        }
        // Then `mapping` unmaps and `fd` closes.
    }
}

/// Takes the creator's exclusive `flock` on a file just created, held through `fd` (which
/// the segment keeps open) until the segment drops or the process dies, when the kernel
/// releases it whatever killed us. Another process that can take the lock knows the creator
/// is gone, in any pid namespace: that is how [`crate::named::list_segments`] judges the
/// segments that vans' named mode creates.
///
/// A cleaner may hold the lock for a moment while it looks at a file that has no magic yet
/// (and leaves it alone, since its creator lives): retry a bounded number of times.
fn lock_owner(name: &SegmentName, fd: &OwnedFd) -> Result<(), IpcError> {
    let mut attempts = 0;
    loop {
        match rustix::fs::flock(fd, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(()),
            Err(Errno::INTR) => {}
            Err(Errno::WOULDBLOCK) if attempts < LOCK_ATTEMPTS => {
                attempts += 1;
                std::thread::sleep(LOCK_RETRY_PAUSE);
            }
            Err(errno) => {
                let err = io::Error::from(errno);
                return Err(IpcError::Os {
                    call: "flock",
                    source: io::Error::new(
                        err.kind(),
                        format!(
                            "{}: {err}; another process of this user keeps the lock of a file \
                             we just created",
                            name.path().display()
                        ),
                    ),
                });
            }
        }
    }
}

/// Opens `/dev/shm/<name>` read-write without following symlinks and without blocking (a
/// FIFO planted under the name must not hang us; it fails the type check after).
fn open_file(name: &SegmentName) -> Result<OwnedFd, IpcError> {
    let path = name.path();
    let flags = OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
    rustix::fs::open(&path, flags, Mode::empty()).map_err(|errno| {
        let err = io::Error::from(errno);
        IpcError::Os {
            call: "open",
            source: io::Error::new(err.kind(), format!("{}: {err}", path.display())),
        }
    })
}

/// `fstat` of an open named segment, checked: a regular file of our uid, mode 0600 or
/// stricter. Returns its size.
fn file_size(name: &SegmentName, fd: &OwnedFd) -> Result<usize, IpcError> {
    let stat = rustix::fs::fstat(fd).map_err(|e| IpcError::os("fstat", e))?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
        return Err(IpcError::bad_segment(format!(
            "{name} is not a regular file"
        )));
    }
    let me = effective_uid();
    if stat.st_uid != me {
        return Err(IpcError::bad_segment(format!(
            "{name} is owned by uid {}, not by us (uid {me})",
            stat.st_uid
        )));
    }
    if stat.st_mode & 0o077 != 0 {
        return Err(IpcError::bad_segment(format!(
            "{name} has mode {:o}; a named segment must not be open to group or others",
            stat.st_mode & 0o7777
        )));
    }
    usize::try_from(stat.st_size)
        .map_err(|_| IpcError::bad_segment(format!("{name} has size {}", stat.st_size)))
}

/// [`file_size`] of a file just created, which must be exactly `len` bytes.
fn check_file(name: &SegmentName, fd: &OwnedFd, len: usize) -> Result<(), IpcError> {
    let size = file_size(name, fd)?;
    if size != len {
        return Err(IpcError::bad_segment(format!(
            "{name} has {size} bytes right after being created with {len}"
        )));
    }
    Ok(())
}

/// Backs the first `size` bytes of a file just created with memory, as `posix_fallocate`
/// does: `fallocate(2)`, or, on a file system without it, [`write_pages`]. A full `/dev/shm`
/// is `ENOSPC` here rather than a `SIGBUS` on first touch.
fn reserve(fd: &OwnedFd, size: u64) -> Result<(), Errno> {
    loop {
        match rustix::fs::fallocate(fd, FallocateFlags::empty(), 0, size) {
            Err(Errno::INTR) => {}
            Err(Errno::OPNOTSUPP) => return write_pages(fd, size),
            result => return result,
        }
    }
}

/// `posix_fallocate`'s fallback: one zero byte written into every page of the first `size`
/// bytes, which makes the file system allocate each. Only for a file that is new and all
/// zeros, whose contents this leaves unchanged.
fn write_pages(fd: &OwnedFd, size: u64) -> Result<(), Errno> {
    let mut offset = 0;
    while offset < size {
        match rustix::io::pwrite(fd, &[0], offset) {
            Ok(1) => offset = offset.saturating_add(PAGE_BYTES),
            // A one-byte write that wrote nothing: nothing sensible left to try.
            Ok(_) => return Err(Errno::IO),
            Err(Errno::INTR) => {}
            Err(errno) => return Err(errno),
        }
    }
    Ok(())
}

/// `shm_unlink("/<name>")`.
fn unlink_name(name: &SegmentName) -> io::Result<()> {
    rustix::shm::unlink(name.os_id()).map_err(io::Error::from)
}

/// An error of `call` on the file of `name`: `ENOSPC` is [`IpcError::ShmTooSmall`] (when
/// `needed` is known), the rest [`IpcError::Os`] with the path in the message.
fn file_error(call: &'static str, name: &SegmentName, err: io::Error, needed: u64) -> IpcError {
    if err.raw_os_error() == Some(Errno::NOSPC.raw_os_error()) && needed > 0 {
        return too_small(needed);
    }
    IpcError::Os {
        call,
        source: io::Error::new(err.kind(), format!("{}: {err}", name.path().display())),
    }
}

/// Whether `err` says a named segment does not exist (any more).
pub(crate) fn is_not_found(err: &IpcError) -> bool {
    matches!(err, IpcError::Os { source, .. } if source.kind() == io::ErrorKind::NotFound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_space_is_reported() {
        assert!(shm_free_bytes().unwrap() > 0);
        assert_eq!(pages(1), 4096);
        assert_eq!(pages(4096), 4096);
        assert_eq!(pages(4097), 8192);
    }

    #[test]
    fn zero_length_is_rejected() {
        assert!(matches!(
            NamedSegment::create(0),
            Err(IpcError::Os {
                call: "shm_open",
                ..
            })
        ));
    }

    #[test]
    fn the_fallback_reservation_allocates_every_page() {
        let fd =
            rustix::fs::memfd_create("vans-reserve-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        let size = 3 * PAGE_BYTES + 100;
        rustix::fs::ftruncate(&fd, size).unwrap();
        assert_eq!(
            rustix::fs::fstat(&fd).unwrap().st_blocks,
            0,
            "sparse at first"
        );
        write_pages(&fd, size).unwrap();
        let stat = rustix::fs::fstat(&fd).unwrap();
        assert_eq!(stat.st_size, size as i64, "the size is unchanged");
        assert!(
            stat.st_blocks as u64 * 512 >= pages(size as usize),
            "{stat:?}"
        );
        let mut contents = vec![1u8; size as usize];
        assert_eq!(
            rustix::io::pread(&fd, &mut contents, 0).unwrap(),
            contents.len()
        );
        assert!(
            contents.iter().all(|&b| b == 0),
            "the contents are unchanged"
        );
        reserve(&fd, size).unwrap();
    }

    #[test]
    fn segments_are_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<NamedSegment>();
    }
}
