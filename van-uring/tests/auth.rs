//! Cluster authentication over real loopback sockets driven by io_uring (the checks live in
//! `van_core::testkit::auth`, shared with the TCP van).

#![cfg(target_os = "linux")]

van_core::van_auth_tests! {
    make: |auth| {
        van_uring::IoUringVan::new(van_uring::UringOptions {
            auth,
            ..van_uring::UringOptions::default()
        })
        .unwrap_or_else(|e| panic!("cannot create the io_uring van: {e}"))
    },
    refused: |van: &van_uring::IoUringVan| van.refused_connections(),
    tcp_listener: true,
}

// Accepted connections bounded per address and in all (`van_core::testkit::limits`).
van_core::van_connection_limit_tests! {
    make: |auth| {
        van_uring::IoUringVan::new(van_uring::UringOptions {
            auth,
            ..van_uring::UringOptions::default()
        })
        .unwrap_or_else(|e| panic!("cannot create the io_uring van: {e}"))
    },
    refused: |van: &van_uring::IoUringVan| van.refused_connections(),
}
