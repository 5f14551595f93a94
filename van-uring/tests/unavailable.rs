//! When io_uring is unavailable, creating the van fails with an error that says so and names
//! the fallback setting. Forced for real: a seccomp filter on the calling thread (inherited
//! by the I/O threads it starts) makes `io_uring_setup` fail as a container runtime's filter
//! or an old kernel would.

#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use van_core::{VanError, VanKind};
use van_uring::{IoUringVan, UringOptions};

/// `io_uring_setup`: the same number on every architecture Linux added it to (425).
const SYS_IO_URING_SETUP: u32 = 425;

/// Makes `io_uring_setup` fail with `errno` on this thread and threads it starts.
fn refuse_io_uring_setup(errno: u32) {
    let stmt = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let filter = [
        // A = seccomp_data.nr
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0),
        libc::sock_filter {
            code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
            jt: 0,
            jf: 1,
            k: SYS_IO_URING_SETUP,
        },
        stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ERRNO | errno),
        stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW),
    ];
    let program = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr() as *mut libc::sock_filter,
    };
    rustix::thread::set_no_new_privs(true).unwrap();
    // rustix's `set_secure_computing_mode` cannot pass a filter program, so this prctl stays.
    // SAFETY: prctl with these options reads only `program`, which points at `filter`; both
    // live across the call. The filter binds this thread (no TSYNC), which the test owns.
    unsafe {
        assert_eq!(
            libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER as libc::c_ulong,
                &program as *const libc::sock_fprog,
            ),
            0,
            "cannot install a seccomp filter: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Creates a van on a fresh thread where `io_uring_setup` fails with `errno`.
fn new_van_refused(errno: u32) -> String {
    std::thread::spawn(move || {
        refuse_io_uring_setup(errno);
        match IoUringVan::new(UringOptions::default()) {
            Ok(_) => panic!("the van started although io_uring_setup is refused"),
            Err(e) => VanError::from(e).to_string(),
        }
    })
    .join()
    .unwrap()
}

#[test]
fn seccomp_refusing_io_uring_is_a_clear_error_naming_the_fallback() {
    let text = new_van_refused(libc::EPERM as u32);
    for words in [
        "uring van cannot serve this",
        "io_uring is unavailable",
        "io_uring_setup failed",
        "Operation not permitted",
        "seccomp",
        "VANS_STREAM_VAN=tcp",
    ] {
        assert!(text.contains(words), "`{words}` missing from: {text}");
    }
}

#[test]
fn a_kernel_without_io_uring_is_a_clear_error_naming_the_fallback() {
    let text = new_van_refused(libc::ENOSYS as u32);
    for words in [
        "io_uring is unavailable",
        "no io_uring",
        "VANS_STREAM_VAN=tcp",
    ] {
        assert!(text.contains(words), "`{words}` missing from: {text}");
    }
}

#[test]
fn other_threads_still_get_a_working_van() {
    // The filters above bind only their own threads.
    let _refused = new_van_refused(libc::EPERM as u32);
    let van = IoUringVan::new(UringOptions::default()).unwrap();
    assert_eq!(van_core::Van::kind(&van), VanKind::Uring);
}

#[test]
fn the_simulated_switch_takes_the_same_path() {
    let e = IoUringVan::new(UringOptions {
        simulate_unavailable: true,
        ..UringOptions::default()
    })
    .unwrap_err();
    let text = VanError::from(e).to_string();
    assert!(
        text.contains("io_uring is unavailable") && text.contains("VANS_STREAM_VAN=tcp"),
        "{text}"
    );
}
