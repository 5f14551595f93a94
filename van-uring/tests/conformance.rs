//! The van-core conformance suite over real loopback sockets driven by io_uring: with the
//! default options (each ring driven by the test's runtime), with rings on threads of their
//! own, and with two rings, zero-copy sends forced on loopback and small provided buffers (so
//! chunks, large frames and notifications are all exercised).

#![cfg(target_os = "linux")]

fn default_van() -> van_uring::IoUringVan {
    van_uring::IoUringVan::new(van_uring::UringOptions::default())
        .unwrap_or_else(|e| panic!("io_uring van: {e}"))
}

van_core::van_conformance_tests!(|| default_van());

mod dedicated_threads {
    fn van() -> van_uring::IoUringVan {
        van_uring::IoUringVan::new(van_uring::UringOptions {
            dedicated_threads: true,
            ..van_uring::UringOptions::default()
        })
        .unwrap_or_else(|e| panic!("io_uring van: {e}"))
    }

    van_core::van_conformance_tests!(|| van());
}

mod zero_copy_two_threads {
    fn van() -> van_uring::IoUringVan {
        van_uring::IoUringVan::new(van_uring::UringOptions {
            threads: 2,
            zc_threshold: Some(4096),
            zc_loopback: true,
            recv_buffer_bytes: 4096,
            recv_buffers: 16,
            ..van_uring::UringOptions::default()
        })
        .unwrap_or_else(|e| panic!("io_uring van: {e}"))
    }

    van_core::van_conformance_tests!(|| van());
}

mod busy_polling {
    //! SQPOLL (or its logged fallback) and spinning on the completion queue.
    fn van() -> van_uring::IoUringVan {
        van_uring::IoUringVan::new(van_uring::UringOptions {
            busy_polling: true,
            ..van_uring::UringOptions::default()
        })
        .unwrap_or_else(|e| panic!("io_uring van: {e}"))
    }

    van_core::van_conformance_tests!(|| van(), checks: [meta_round_trip, stop_flushes_and_ends]);
}
