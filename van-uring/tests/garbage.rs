//! Peers that write garbage to a real socket get their connection closed with a typed error,
//! while the io_uring van keeps serving its healthy peers (the checks live in
//! `van_core::testkit::garbage`, shared with the TCP van).

#![cfg(target_os = "linux")]

van_core::stream_van_garbage_tests! {
    make: |limits| {
        van_uring::IoUringVan::new(van_uring::UringOptions {
            limits,
            ..van_uring::UringOptions::default()
        })
        .unwrap_or_else(|e| panic!("cannot create the io_uring van: {e}"))
    },
    kind: van_core::VanKind::Uring,
    connected: |van: &van_uring::IoUringVan| van.connected_peers(),
}
