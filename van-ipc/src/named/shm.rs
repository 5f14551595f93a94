//! [`NamedSegment`]: a file in `/dev/shm`, created exclusively and owner-only with its memory
//! reserved, or opened after checking its owner, mode and size; mapped through the
//! `shared_memory` crate (see the [module docs](crate::named) for what that crate does and what
//! this file adds).

use std::ffi::CString;
use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use shared_memory::{Shmem, ShmemConf, ShmemError};

use super::name::effective_uid;
use super::{SegmentName, SHM_DIR};
use crate::error::IpcError;

/// How many fresh names [`NamedSegment::create`] tries when one is taken (a 64-bit random
/// collision: in practice never).
const CREATE_ATTEMPTS: u32 = 4;
/// Granularity of tmpfs allocations, for the space check.
const PAGE_BYTES: u64 = 4096;

/// Bytes free in `/dev/shm` for unprivileged users (`statvfs`: available blocks × fragment
/// size).
///
/// # Errors
///
/// [`IpcError::Os`] (`statvfs`) when `/dev/shm` does not exist or cannot be queried.
pub fn shm_free_bytes() -> Result<u64, IpcError> {
    let path = CString::new(SHM_DIR).map_err(|e| IpcError::Os {
        call: "statvfs",
        source: io::Error::new(io::ErrorKind::InvalidInput, e),
    })?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `path` is NUL-terminated and outlives the call; `stat` is writable memory of
    // the size of `struct statvfs`, which statvfs fills completely when it returns 0.
    if unsafe { libc::statvfs(path.as_ptr(), stat.as_mut_ptr()) } != 0 {
        let err = io::Error::last_os_error();
        return Err(IpcError::Os {
            call: "statvfs",
            source: io::Error::new(
                err.kind(),
                format!("{SHM_DIR}: {err}; named segments need a tmpfs mounted at {SHM_DIR}"),
            ),
        });
    }
    // SAFETY: statvfs returned 0, so it initialised the whole struct.
    let stat = unsafe { stat.assume_init() };
    #[allow(clippy::useless_conversion)] // the field types differ between targets
    let (blocks, size) = (u64::from(stat.f_bavail), u64::from(stat.f_frsize));
    Ok(blocks.saturating_mul(size))
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

/// `shared_memory::Shmem`, made `Send + Sync`.
struct Mapping(Shmem);

// SAFETY: in shared_memory 0.12.4 (pinned with `=` in the workspace manifest) a `Shmem` is
// its configuration (bools, a size, `Option<String>`, `Option<PathBuf>`) and a `MapData`
// (a bool, a `RawFd`, a `String`, a size and the `*mut u8` of the mapping). Only the raw
// pointer keeps it from being `Send`. That pointer is the address of a process-wide
// `MAP_SHARED` mapping, not of thread-local data, and `Shmem`'s drop (`munmap`, `close`,
// and `shm_unlink` only while it owns the name, which we turn off at once) are process-wide
// calls that are valid from any thread. Nothing else in it is tied to the thread that
// created it.
unsafe impl Send for Mapping {}
// SAFETY: through `&Mapping` we only call `Shmem::len`, `Shmem::as_ptr` and
// `Shmem::get_os_id`, which read fields that never change after construction (`Shmem` has
// no interior mutability). The bytes behind the pointer are shared with another process
// anyway and are only ever accessed through raw-pointer copies and atomics.
unsafe impl Sync for Mapping {}

/// A file in `/dev/shm` mapped read-write and shared. See the [module docs](crate::named).
///
/// The mapping lives as long as the value (wrap it in an `Arc` to make ring windows with
/// [`crate::Segment::from_named`]). The creator's value removes the name on drop unless
/// [`NamedSegment::unlink`] already did; removing the name never affects mappings.
/// Access the bytes only through [`NamedSegment::as_ptr`] with raw-pointer copies or
/// atomics: another process may write them at any time.
pub struct NamedSegment {
    name: SegmentName,
    /// The `shared_memory` mapping (it also holds its own descriptor).
    mapping: Mapping,
    /// Start of the mapping (page-aligned).
    ptr: NonNull<u8>,
    /// Length of the mapping (> 0).
    len: usize,
    /// Our own descriptor of the file, for `fstat`, `posix_fallocate` and [`Self::fd`].
    fd: OwnedFd,
    /// Whether this process created the file (and so removes its name on drop).
    created: bool,
    /// Whether the name was removed already.
    unlinked: AtomicBool,
}

// SAFETY: `ptr` points into the mapping owned by `mapping` (itself `Send`, see above), which
// lives exactly as long as the value; the address and length never change after
// construction, and `unlinked` is atomic. The bytes are only ever reached through raw
// pointers and atomics, whose users synchronise as they must with the peer process anyway.
unsafe impl Send for NamedSegment {}
// SAFETY: every `&self` method reads immutable fields or the atomic `unlinked` flag.
unsafe impl Sync for NamedSegment {}

impl fmt::Debug for NamedSegment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NamedSegment")
            .field("name", &self.name.to_string())
            .field("len", &self.len)
            .field("created", &self.created)
            .field("unlinked", &self.unlinked.load(Ordering::Relaxed))
            .field("os_id", &self.mapping.0.get_os_id())
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
    /// Creates `/dev/shm/<fresh name>` of `len` bytes: `O_CREAT | O_EXCL`, mode 0600, its
    /// memory reserved with `posix_fallocate`, mapped shared. First checks that `/dev/shm`
    /// has room (`statvfs`).
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
        let size = match libc::off_t::try_from(len) {
            Ok(size) if size > 0 => size,
            _ => {
                return Err(IpcError::Os {
                    call: "shm_open",
                    source: io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("cannot create a named segment of {len} bytes"),
                    ),
                })
            }
        };
        let needed = pages(len);
        if needed > shm_free_bytes()? {
            return Err(too_small(needed));
        }
        let mut attempts = 0;
        let (name, mut shmem) = loop {
            let name = SegmentName::fresh()?;
            match ShmemConf::new().os_id(name.os_id()).size(len).create() {
                Ok(shmem) => break (name, shmem),
                Err(ShmemError::MappingIdExists) if attempts < CREATE_ATTEMPTS => attempts += 1,
                Err(e) => return Err(shmem_error(&name, e, needed)),
            }
        };
        // We decide when the name goes (as soon as both peers mapped it), not its drop.
        shmem.set_owner(false);
        let mut guard = UnlinkOnError(Some(&name));
        let fd = open_file(&name)?;
        // SAFETY: `fd` is an open descriptor we own; fchmod reads no memory. It undoes a
        // umask that removed owner bits, and guarantees nothing beyond 0600.
        if unsafe { libc::fchmod(fd.as_raw_fd(), 0o600) } != 0 {
            return Err(IpcError::last_os("fchmod"));
        }
        check_file(&name, &fd, len)?;
        // SAFETY: as above; posix_fallocate reads no memory and returns an error number.
        let err = unsafe { libc::posix_fallocate(fd.as_raw_fd(), 0, size) };
        if err == libc::ENOSPC {
            return Err(too_small(needed));
        }
        if err != 0 {
            let os = io::Error::from_raw_os_error(err);
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
        let segment = NamedSegment::from_parts(name, shmem, fd, true, len)?;
        guard.0 = None;
        Ok(segment)
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
        let shmem = ShmemConf::new()
            .os_id(name.os_id())
            .open()
            .map_err(|e| shmem_error(name, e, 0))?;
        let len = shmem.len();
        if len != size {
            return Err(IpcError::bad_segment(format!(
                "{name} changed size from {size} to {len} bytes while being opened"
            )));
        }
        NamedSegment::from_parts(*name, shmem, fd, false, len)
    }

    fn from_parts(
        name: SegmentName,
        shmem: Shmem,
        fd: OwnedFd,
        created: bool,
        len: usize,
    ) -> Result<NamedSegment, IpcError> {
        let ptr = NonNull::new(shmem.as_ptr()).filter(|_| shmem.len() == len && len > 0);
        let Some(ptr) = ptr else {
            return Err(IpcError::Os {
                call: "mmap",
                source: io::Error::other(format!(
                    "{name}: mapped {} bytes at {:p}, expected {len}",
                    shmem.len(),
                    shmem.as_ptr()
                )),
            });
        };
        Ok(NamedSegment {
            name,
            mapping: Mapping(shmem),
            ptr,
            len,
            fd,
            created,
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
        self.len
    }

    /// Always `false`: a segment has at least one byte. Present for symmetry with `len`.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Start of the mapping: page-aligned, valid for [`NamedSegment::len`] bytes while
    /// `self` lives. Another process may read and write these bytes concurrently: use
    /// raw-pointer copies or atomics, never references to the bytes themselves.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
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
        debug_assert!(offset % 4 == 0 && offset + 4 <= self.len);
        // SAFETY: the caller keeps the 4 bytes inside the mapping and 4-aligned (the mapping
        // is page-aligned); `AtomicU32` has the layout of `u32`, and atomics tolerate the
        // peer writing the bytes concurrently. The reference cannot outlive `self`, which
        // keeps the mapping alive.
        unsafe { &*self.ptr.as_ptr().add(offset).cast::<AtomicU32>() }
    }

    /// The `u64` at `offset`, as an atomic.
    ///
    /// # Safety
    ///
    /// `offset` must be a multiple of 8 with `offset + 8 <= self.len()`.
    pub(crate) unsafe fn atomic_u64(&self, offset: usize) -> &AtomicU64 {
        debug_assert!(offset % 8 == 0 && offset + 8 <= self.len);
        // SAFETY: as in `atomic_u32`, with 8 bytes and 8-byte alignment.
        unsafe { &*self.ptr.as_ptr().add(offset).cast::<AtomicU64>() }
    }
}

impl Drop for NamedSegment {
    fn drop(&mut self) {
        if self.created && !self.unlinked.load(Ordering::Acquire) {
            let _ = unlink_name(&self.name);
        }
        // Then `mapping` unmaps and closes its descriptor, and `fd` closes.
    }
}

/// Opens `/dev/shm/<name>` read-write without following symlinks and without blocking (a
/// FIFO planted under the name must not hang us; it fails the type check after).
fn open_file(name: &SegmentName) -> Result<OwnedFd, IpcError> {
    let path = name.path();
    let c_path = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|e| IpcError::Os {
        call: "open",
        source: io::Error::new(io::ErrorKind::InvalidInput, e),
    })?;
    let flags = libc::O_RDWR | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK;
    // SAFETY: `c_path` is NUL-terminated and outlives the call; no file is created.
    let raw = unsafe { libc::open(c_path.as_ptr(), flags) };
    if raw < 0 {
        let err = io::Error::last_os_error();
        return Err(IpcError::Os {
            call: "open",
            source: io::Error::new(err.kind(), format!("{}: {err}", path.display())),
        });
    }
    // SAFETY: open returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// `fstat` of an open named segment, checked: a regular file of our uid, mode 0600 or
/// stricter. Returns its size.
fn file_size(name: &SegmentName, fd: &OwnedFd) -> Result<usize, IpcError> {
    let mut stat = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `stat` is writable memory of the size of `struct stat`, which fstat fills
    // completely when it returns 0; the descriptor is open.
    if unsafe { libc::fstat(fd.as_raw_fd(), stat.as_mut_ptr()) } != 0 {
        return Err(IpcError::last_os("fstat"));
    }
    // SAFETY: fstat returned 0, so it initialised the whole struct.
    let stat = unsafe { stat.assume_init() };
    if stat.st_mode & libc::S_IFMT != libc::S_IFREG {
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

/// `shm_unlink("/<name>")`.
fn unlink_name(name: &SegmentName) -> io::Result<()> {
    let c_name = CString::new(name.os_id()).map_err(io::Error::other)?;
    // SAFETY: `c_name` is NUL-terminated and outlives the call.
    if unsafe { libc::shm_unlink(c_name.as_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Maps a `shared_memory` error to ours: `ENOSPC` is [`IpcError::ShmTooSmall`] (when
/// `needed` is known), the rest [`IpcError::Os`] with the path in the message.
fn shmem_error(name: &SegmentName, err: ShmemError, needed: u64) -> IpcError {
    let errno = match err {
        ShmemError::MapCreateFailed(e)
        | ShmemError::MapOpenFailed(e)
        | ShmemError::UnknownOsError(e) => i32::try_from(e).ok(),
        _ => None,
    };
    if errno == Some(libc::ENOSPC) && needed > 0 {
        return too_small(needed);
    }
    let path = name.path();
    let source = match errno {
        Some(errno) => {
            let os = io::Error::from_raw_os_error(errno);
            io::Error::new(os.kind(), format!("{}: {os}", path.display()))
        }
        None => io::Error::other(format!("{}: {err}", path.display())),
    };
    IpcError::Os {
        call: "shm_open",
        source,
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
    fn segments_are_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<NamedSegment>();
    }
}
