//! Cluster authentication over real loopback sockets (the checks live in
//! `van_core::testkit::auth`, shared with the io_uring van).

van_core::van_auth_tests! {
    make: |auth| van_tcp::TcpVan::new(van_tcp::TcpOptions {
        auth,
        ..van_tcp::TcpOptions::default()
    }),
    refused: |van: &van_tcp::TcpVan| van.refused_connections(),
    tcp_listener: true,
}

// Accepted connections bounded per address and in all (`van_core::testkit::limits`).
van_core::van_connection_limit_tests! {
    make: |auth| van_tcp::TcpVan::new(van_tcp::TcpOptions {
        auth,
        ..van_tcp::TcpOptions::default()
    }),
    refused: |van: &van_tcp::TcpVan| van.refused_connections(),
}
