//! Cluster authentication and connection limits over real loopback sockets driven by io_uring
//! (the checks live in `van_core::testkit::auth` and `van_core::testkit::limits`, shared with
//! the TCP van).

#![cfg(target_os = "linux")]

fn make(auth: van_core::auth::AuthOptions) -> van_uring::IoUringVan {
    van_uring::IoUringVan::new(van_uring::UringOptions {
        auth,
        ..van_uring::UringOptions::default()
    })
    .unwrap_or_else(|e| panic!("cannot create the io_uring van: {e}"))
}

van_core::van_auth_tests! {
    make: make,
    refused: |van: &van_uring::IoUringVan| van.refused_connections(),
    tcp_listener: true,
}

van_core::van_connection_limit_tests! {
    make: make,
    refused: |van: &van_uring::IoUringVan| van.refused_connections(),
}
