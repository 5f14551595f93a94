//! Cluster authentication and connection limits over real loopback sockets (the checks live
//! in `van_core::testkit::auth` and `van_core::testkit::limits`, shared with the io_uring
//! van).

fn make(auth: van_core::auth::AuthOptions) -> van_tcp::TcpVan {
    van_tcp::TcpVan::new(van_tcp::TcpOptions {
        auth,
        ..van_tcp::TcpOptions::default()
    })
}

van_core::van_auth_tests! {
    make: make,
    refused: |van: &van_tcp::TcpVan| van.refused_connections(),
    tcp_listener: true,
}

van_core::van_connection_limit_tests! {
    make: make,
    refused: |van: &van_tcp::TcpVan| van.refused_connections(),
}
