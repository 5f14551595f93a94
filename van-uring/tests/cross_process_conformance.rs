//! The conformance checks with the peer in another process, over io_uring on 127.0.0.1.

#![cfg(target_os = "linux")]

fn van() -> van_uring::IoUringVan {
    van_uring::IoUringVan::new(van_uring::UringOptions::default())
        .unwrap_or_else(|e| panic!("io_uring van: {e}"))
}

van_core::van_cross_process_conformance_tests!(|| van());
