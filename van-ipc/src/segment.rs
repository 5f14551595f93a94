//! Shared-memory segments: anonymous, sealed `memfd` files mapped `MAP_SHARED`.
//!
//! A memfd has no name in any file system, so there is nothing to guess, nothing another
//! user can open, and nothing left behind: the memory is freed when the last descriptor and
//! the last mapping are gone, crash included. It travels to the peer over a Unix socket
//! (`SCM_RIGHTS`). The creator seals it against shrinking and growing before passing it, and
//! the receiver refuses one that is not sealed against shrinking, because a peer that could
//! truncate the file under our mapping could make us fault (`SIGBUS`) at will.
//!
//! A `Segment` can also be a page-aligned window of a named `/dev/shm` segment
//! ([`Segment::from_named`]), for the named mode of [`crate::named`] where no Unix socket can
//! carry a memfd; rings work on either kind the same way.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Arc;

use rustix::fs::{FallocateFlags, FileType, MemfdFlags, Mode, SealFlags};
use rustix::io::Errno;

use crate::error::IpcError;
use crate::mapping::{file_len, Mapping};
use crate::named::NamedSegment;

/// Every segment's name starts with this (it shows in `/proc/<pid>/fd` and `/proc/<pid>/maps`);
/// named segments share it, which is why it is defined in [`crate::named`].
pub use crate::named::NAME_PREFIX;

/// Longest memfd name the kernel accepts (`NAME_MAX` minus the `memfd:` it prepends).
const MAX_NAME_BYTES: usize = 249;

/// Alignment of a window's offset in [`Segment::from_named`] (the smallest page size).
pub const WINDOW_ALIGN: usize = 4096;

/// Seals the creator applies: the size is fixed for good.
const CREATOR_SEALS: SealFlags = SealFlags::SHRINK
    .union(SealFlags::GROW)
    .union(SealFlags::SEAL);

/// A sealed memfd mapped read-write and shared, or a window of a named segment.
///
/// The mapping stays valid, and the same size, for the life of the value; the memory is
/// released when the last process holding the descriptor or a mapping lets go. Access the
/// bytes only through [`Segment::as_ptr`] with raw-pointer copies or atomics: another
/// process may write them at any time, so no `&[u8]`/`&mut [u8]` may ever cover them.
#[derive(Debug)]
pub struct Segment {
    /// Start of the mapping (page-aligned).
    ptr: NonNull<u8>,
    /// Length of the mapping in bytes (> 0).
    len: usize,
    /// What owns the memory behind `ptr`.
    backing: Backing,
}

/// Who owns a [`Segment`]'s mapping.
#[derive(Debug)]
enum Backing {
    /// Our own mapping of this memfd: unmapped when the segment drops, then the memfd closes.
    Memfd {
        /// The mapping `Segment::ptr` points into, held to be unmapped when it drops.
        _mapping: Mapping,
        /// The memfd, to pass to a peer.
        fd: OwnedFd,
    },
    /// A window of a named segment, which keeps its own mapping alive (and unmaps it when
    /// the last window and handle are gone).
    Named(Arc<NamedSegment>),
}

// SAFETY: `Segment` owns a descriptor and a `Mapping` (both `Send + Sync`) that live exactly
// as long as it does and that no method mutates (the address and length are fixed after
// construction), or, for a named window, an `Arc` of a `NamedSegment` (itself `Send + Sync`)
// that keeps the mapping alive at least as long. It hands out only a raw pointer, never a reference to the bytes, so
// sharing or moving it between threads creates no aliasing on its own: whoever dereferences
// the pointer must synchronise, exactly as they must with the peer process that writes the
// same memory.
unsafe impl Send for Segment {}
// SAFETY: see `Send` above: every `&self` method only reads immutable fields.
unsafe impl Sync for Segment {}

impl Segment {
    /// Creates a segment of `len` bytes: `memfd_create("vans-<name>")` (close-on-exec,
    /// sealable, non-executable where the kernel knows that), mode 0600, sized and backed
    /// with memory up front (so exhausting memory is an error here rather than a `SIGBUS`
    /// later), sealed against shrinking, growing and further sealing, then mapped.
    ///
    /// `name` is for humans (it shows in `/proc/<pid>/fd`); NUL bytes are replaced and an
    /// over-long name is cut.
    ///
    /// # Errors
    ///
    /// [`IpcError::Os`] naming the call that failed; `len == 0` or a length the OS cannot
    /// represent fails as `memfd_create` with [`io::ErrorKind::InvalidInput`].
    pub fn create(name: &str, len: usize) -> Result<Segment, IpcError> {
        let Some(size) = file_len(len) else {
            return Err(IpcError::Os {
                call: "memfd_create",
                source: io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("cannot create a shared-memory segment of {len} bytes"),
                ),
            });
        };
        let fd = memfd_create(name)?;
        rustix::fs::fchmod(&fd, Mode::RUSR | Mode::WUSR).map_err(|e| IpcError::os("fchmod", e))?;
        rustix::fs::ftruncate(&fd, size).map_err(|e| IpcError::os("ftruncate", e))?;
        if let Err(errno) = rustix::fs::fallocate(&fd, FallocateFlags::empty(), 0, size) {
            // A kernel without shmem fallocate just leaves the pages to be allocated on use.
            if errno != Errno::OPNOTSUPP {
                let err = io::Error::from(errno);
                return Err(IpcError::Os {
                    call: "fallocate",
                    source: io::Error::new(
                        err.kind(),
                        format!(
                            "reserving {len} bytes of shared memory: {err}; free memory, raise \
                             the memory limit of this process's cgroup, or use smaller rings"
                        ),
                    ),
                });
            }
        }
        rustix::fs::fcntl_add_seals(&fd, CREATOR_SEALS)
            .map_err(|e| IpcError::os("fcntl(F_ADD_SEALS)", e))?;
        map(fd, len)
    }

    /// Maps a segment received from a peer. The descriptor must be a memfd sealed against
    /// shrinking and not sealed against writing; its current size is the mapping's length.
    ///
    /// # Errors
    ///
    /// [`IpcError::BadSegment`] when the descriptor is not a sealable memfd, lacks
    /// `F_SEAL_SHRINK`, is write-sealed, is not a regular file or is empty;
    /// [`IpcError::Os`] when `fstat` or `mmap` fails.
    pub fn open(fd: OwnedFd) -> Result<Segment, IpcError> {
        Segment::open_as(fd, true)
    }

    /// [`Segment::open`], mapped read-only: for a peer's arena, which this side only reads.
    /// Writing through [`Segment::as_ptr`] faults, so nothing here can change the peer's memory;
    /// a write-sealed memfd is accepted.
    ///
    /// # Errors
    ///
    /// As [`Segment::open`], except that write seals are allowed.
    pub fn open_read_only(fd: OwnedFd) -> Result<Segment, IpcError> {
        Segment::open_as(fd, false)
    }

    fn open_as(fd: OwnedFd, writable: bool) -> Result<Segment, IpcError> {
        // Seals first: once F_SEAL_SHRINK is present it can never be removed, so the size read
        // afterwards can only grow, which cannot hurt a mapping of the smaller size.
        let seals = match rustix::fs::fcntl_get_seals(&fd) {
            Ok(seals) => seals,
            Err(errno) => {
                return Err(IpcError::bad_segment(format!(
                    "the descriptor is not a sealable memfd ({})",
                    io::Error::from(errno)
                )))
            }
        };
        if !seals.contains(SealFlags::SHRINK) {
            return Err(IpcError::bad_segment(
                "the memfd is not sealed against shrinking (F_SEAL_SHRINK); the peer could \
                 truncate it under our mapping",
            ));
        }
        if writable && seals.intersects(SealFlags::WRITE | SealFlags::FUTURE_WRITE) {
            return Err(IpcError::bad_segment(
                "the memfd is sealed against writing; a ring needs both sides to write",
            ));
        }
        let stat = rustix::fs::fstat(&fd).map_err(|e| IpcError::os("fstat", e))?;
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
            return Err(IpcError::bad_segment(
                "the descriptor is not a regular file",
            ));
        }
        let len = match usize::try_from(stat.st_size) {
            Ok(len) if len > 0 => len,
            _ => {
                return Err(IpcError::bad_segment(format!(
                    "the memfd has size {}",
                    stat.st_size
                )))
            }
        };
        match writable {
            true => map(fd, len),
            false => map_read_only(fd, len),
        }
    }

    /// A window of `len` bytes at `offset` of a named segment (see [`crate::named`]), for
    /// rings in the named mode. The window keeps the named segment mapped. `offset` must be
    /// a multiple of [`WINDOW_ALIGN`] (so ring headers keep their alignment) and the window
    /// must lie inside the segment.
    ///
    /// # Errors
    ///
    /// [`IpcError::BadSegment`] when the window is empty, misaligned or out of bounds.
    pub fn from_named(
        named: Arc<NamedSegment>,
        offset: usize,
        len: usize,
    ) -> Result<Segment, IpcError> {
        let end = offset.checked_add(len);
        if len == 0 || offset % WINDOW_ALIGN != 0 || end.is_none_or(|end| end > named.len()) {
            return Err(IpcError::bad_segment(format!(
                "window of {len} bytes at offset {offset} does not fit the {}-byte named \
                 segment {} at a multiple of {WINDOW_ALIGN}",
                named.len(),
                named.name()
            )));
        }
        // `wrapping_add` keeps this safe to compute; the bounds check above puts it in range.
        let ptr = named.as_ptr().wrapping_add(offset);
        let Some(ptr) = NonNull::new(ptr) else {
            return Err(IpcError::bad_segment(
                "named segment mapped at address zero",
            ));
        };
        Ok(Segment {
            ptr,
            len,
            backing: Backing::Named(named),
        })
    }

    /// The descriptor of the file behind the segment: the memfd, to pass to a peer with
    /// `SCM_RIGHTS`. For a window of a named segment it is the whole named file, which a
    /// peer's [`Segment::open`] refuses (it cannot be sealed); peers open those by name.
    pub fn fd(&self) -> BorrowedFd<'_> {
        match &self.backing {
            Backing::Memfd { fd, .. } => fd.as_fd(),
            Backing::Named(named) => named.fd(),
        }
    }

    /// Length of the mapping in bytes (never 0).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always `false`: a segment has at least one byte. Present for API symmetry with `len`.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Start of the mapping: page-aligned, valid for [`Segment::len`] bytes while `self`
    /// lives. Another process may read and write these bytes concurrently: use raw-pointer
    /// copies or atomics, never references to the bytes themselves.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

/// `memfd_create("vans-<name>")`, asking for `MFD_NOEXEC_SEAL` and retrying without it on
/// kernels that predate it (6.3).
fn memfd_create(name: &str) -> Result<OwnedFd, IpcError> {
    let mut full = String::with_capacity(NAME_PREFIX.len() + name.len());
    full.push_str(NAME_PREFIX);
    for c in name.chars() {
        let c = if c == '\0' { '_' } else { c };
        if full.len() + c.len_utf8() > MAX_NAME_BYTES {
            break;
        }
        full.push(c);
    }
    let base = MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING;
    let fd = match rustix::fs::memfd_create(full.as_str(), base | MemfdFlags::NOEXEC_SEAL) {
        Err(Errno::INVAL) => rustix::fs::memfd_create(full.as_str(), base),
        result => result,
    };
    fd.map_err(|e| IpcError::os("memfd_create", e))
}

/// Maps `len` bytes of `fd` shared and read-write. `fd` is a memfd sealed against shrinking
/// and at least `len` bytes long, so the mapping can never lose its pages.
fn map(fd: OwnedFd, len: usize) -> Result<Segment, IpcError> {
    let mapping = Mapping::shared(fd.as_fd(), len);
    segment(fd, len, mapping)
}

/// [`map`], read-only.
fn map_read_only(fd: OwnedFd, len: usize) -> Result<Segment, IpcError> {
    let mapping = Mapping::shared_read_only(fd.as_fd(), len);
    segment(fd, len, mapping)
}

fn segment(fd: OwnedFd, len: usize, mapping: io::Result<Mapping>) -> Result<Segment, IpcError> {
    let mapping = mapping.map_err(|source| IpcError::Os {
        call: "mmap",
        source,
    })?;
    Ok(Segment {
        ptr: mapping.ptr(),
        len,
        backing: Backing::Memfd {
            _mapping: mapping,
            fd,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_seals_and_shares_memory_with_open() {
        let seg = Segment::create("unit", 8192).unwrap();
        assert_eq!(seg.len(), 8192);
        assert!(!seg.is_empty());
        let seals = rustix::fs::fcntl_get_seals(seg.fd()).unwrap();
        assert!(seals.contains(CREATOR_SEALS), "{seals:?}");

        let dup = seg.fd().try_clone_to_owned().unwrap();
        let other = Segment::open(dup).unwrap();
        assert_eq!(other.len(), 8192);
        assert_ne!(other.as_ptr(), seg.as_ptr());
        // SAFETY: both pointers are valid for 8192 bytes; nothing else touches them.
        unsafe {
            seg.as_ptr().add(100).write(0xAB);
            assert_eq!(other.as_ptr().add(100).read(), 0xAB);
        }
    }

    #[test]
    fn zero_length_is_rejected() {
        assert!(matches!(
            Segment::create("zero", 0),
            Err(IpcError::Os {
                call: "memfd_create",
                ..
            })
        ));
    }

    #[test]
    fn odd_names_are_accepted() {
        let long = "x".repeat(1000);
        assert!(Segment::create(&long, 4096).is_ok());
        assert!(Segment::create("a\0b", 4096).is_ok());
    }

    /// The permissions `/proc/self/maps` shows for the mapping that starts at `ptr`.
    fn permissions(ptr: *const u8) -> String {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let start = format!("{:x}-", ptr as usize);
        let line = maps.lines().find(|l| l.starts_with(&start)).unwrap();
        line.split_whitespace().nth(1).unwrap().to_owned()
    }

    #[test]
    fn a_read_only_open_maps_the_peers_memory_without_write_access() {
        let seg = Segment::create("unit-ro", 8192).unwrap();
        // SAFETY: 8192 bytes mapped read-write, no other user.
        unsafe { seg.as_ptr().add(100).write(42) };
        let dup = seg.fd().try_clone_to_owned().unwrap();
        let read_only = Segment::open_read_only(dup).unwrap();
        assert_eq!(read_only.len(), 8192);
        // SAFETY: in bounds; read only.
        assert_eq!(unsafe { read_only.as_ptr().add(100).read() }, 42);
        assert_eq!(permissions(read_only.as_ptr()), "r--s");
        assert_eq!(permissions(seg.as_ptr()), "rw-s");
        let dup = seg.fd().try_clone_to_owned().unwrap();
        let writable = Segment::open(dup).unwrap();
        assert_eq!(permissions(writable.as_ptr()), "rw-s");
    }

    #[test]
    fn open_rejects_a_pipe() {
        let (read, _write) = rustix::pipe::pipe().unwrap();
        assert!(matches!(
            Segment::open(read),
            Err(IpcError::BadSegment { .. })
        ));
    }
}
