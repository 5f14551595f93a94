//! Cluster authentication of the shared-memory handshake (abstract-socket mode), over real
//! Unix sockets: the same secret connects and delivers both ways; another secret, or none, is
//! refused before any ring or descriptor is taken, and counted (the checks live in
//! `van_core::testkit::auth`, shared with every van).

#![cfg(target_os = "linux")]

van_core::van_auth_tests! {
    make: |auth| van_ipc::IpcVan::new(van_ipc::IpcOptions {
        auth,
        ..van_ipc::IpcOptions::default()
    }),
    refused: |van: &van_ipc::IpcVan| van.refused_connections(),
    tcp_listener: false,
}
