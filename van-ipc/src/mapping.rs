//! [`Mapping`]: a whole file mapped read-write and shared, unmapped when dropped. The one
//! place that calls `mmap` and `munmap`, for memfd segments ([`crate::segment`]) and named
//! `/dev/shm` segments ([`crate::named`]) alike.

use std::io;
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;

use rustix::mm::{MapFlags, ProtFlags};

/// `len` as a file size, when it is one a file can have: more than 0 and at most `off_t`'s
/// maximum (`i64::MAX`).
pub(crate) fn file_len(len: usize) -> Option<u64> {
    let size = u64::try_from(len).ok()?;
    (size > 0 && i64::try_from(size).is_ok()).then_some(size)
}

/// `len` bytes of a file mapped `MAP_SHARED`, `PROT_READ | PROT_WRITE`, at an address the
/// kernel chose; unmapped on drop. The mapping holds its own reference to the file, so the
/// descriptor it was made from may close first.
#[derive(Debug)]
pub(crate) struct Mapping {
    /// Start of the mapping (page-aligned, never null).
    ptr: NonNull<u8>,
    /// Length of the mapping in bytes (> 0).
    len: usize,
}

// SAFETY: a `Mapping` is the address and length of a process-wide `MAP_SHARED` mapping that
// it alone unmaps, in `drop`; neither changes after construction. Nothing in it is tied to
// the creating thread: `munmap` is valid from any thread. It hands out only a raw pointer, so
// moving it creates no aliasing; whoever dereferences the pointer synchronises, as they must
// with the peer process writing the same memory.
unsafe impl Send for Mapping {}
// SAFETY: every `&self` method reads the immutable address and length.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps the first `len` bytes of `fd` (`len > 0`) shared and read-write.
    ///
    /// The caller keeps the file at least `len` bytes long for the life of the mapping, or
    /// accepts `SIGBUS` on the missing pages (a memfd sealed against shrinking; a named file
    /// that only processes of our uid can truncate).
    ///
    /// # Errors
    ///
    /// The `mmap` error; [`io::ErrorKind::InvalidInput`] when `len` is 0;
    /// [`io::ErrorKind::Other`] in the (theoretical) case of a mapping at address zero,
    /// which is unmapped again.
    pub(crate) fn shared(fd: BorrowedFd<'_>, len: usize) -> io::Result<Mapping> {
        Mapping::map(fd, len, ProtFlags::READ | ProtFlags::WRITE)
    }

    /// [`Mapping::shared`], but read-only: a write through it faults. For memory of a peer's
    /// that this process only reads (its arena), so a bug here cannot change it.
    ///
    /// # Errors
    ///
    /// As [`Mapping::shared`].
    pub(crate) fn shared_read_only(fd: BorrowedFd<'_>, len: usize) -> io::Result<Mapping> {
        Mapping::map(fd, len, ProtFlags::READ)
    }

    fn map(fd: BorrowedFd<'_>, len: usize, protection: ProtFlags) -> io::Result<Mapping> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "cannot map 0 bytes",
            ));
        }
        // SAFETY: the address hint is null and `MAP_FIXED` is not set, so the kernel places
        // the mapping where nothing of ours lives: no existing memory is replaced, and no Rust
        // reference can cover the new pages. `fd` is open for the call.
        let addr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                protection,
                MapFlags::SHARED,
                fd,
                0,
            )
        }?;
        match NonNull::new(addr.cast::<u8>()) {
            Some(ptr) => Ok(Mapping { ptr, len }),
            None => {
                // SAFETY: `addr`/`len` are exactly the mapping just created, which nothing
                // has seen; it is unmapped once, here.
                let _ = unsafe { rustix::mm::munmap(addr, len) };
                Err(io::Error::other("mmap returned a null mapping"))
            }
        }
    }

    /// Start of the mapping: page-aligned, valid for [`Mapping::len`] bytes while `self`
    /// lives. Another process may read and write these bytes concurrently: use raw-pointer
    /// copies or atomics, never references to the bytes themselves.
    pub(crate) fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Length of the mapping in bytes (never 0).
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly the mapping created in `shared`, unmapped only here
        // and only once (drop runs once). Nothing borrowed from the mapping outlives it: its
        // owners hand out raw pointers, and references (`NamedSegment::atomic_u32`) that
        // borrow the owner, which cannot drop while they live. Unmapping cannot fail for a
        // range we mapped; if it did, the pages would merely stay mapped.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn file_lengths_are_positive_offsets() {
        assert_eq!(file_len(0), None);
        assert_eq!(file_len(1), Some(1));
        assert_eq!(file_len(i64::MAX as usize), Some(i64::MAX as u64));
        assert_eq!(file_len(i64::MAX as usize + 1), None);
        assert_eq!(file_len(usize::MAX), None);
    }

    #[test]
    fn a_memfd_maps_and_unmaps() {
        let fd =
            rustix::fs::memfd_create("vans-mapping-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&fd, 8192).unwrap();
        assert_eq!(
            Mapping::shared(fd.as_fd(), 0).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        let mapping = Mapping::shared(fd.as_fd(), 8192).unwrap();
        let again = Mapping::shared(fd.as_fd(), 8192).unwrap();
        assert_eq!(mapping.len(), 8192);
        assert_eq!(mapping.ptr().as_ptr() as usize % 4096, 0);
        // SAFETY: both mappings are valid for 8192 bytes; nothing else touches them.
        unsafe {
            mapping.ptr().as_ptr().add(8191).write(7);
            assert_eq!(again.ptr().as_ptr().add(8191).read(), 7);
        }
    }
}
