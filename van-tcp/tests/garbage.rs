//! Peers that write garbage to a real socket get their connection closed with a typed error,
//! while the van keeps serving its healthy peers (the checks live in
//! `van_core::testkit::garbage`, shared with the io_uring van).

van_core::stream_van_garbage_tests! {
    make: |limits| van_tcp::TcpVan::new(van_tcp::TcpOptions {
        limits,
        ..van_tcp::TcpOptions::default()
    }),
    kind: van_core::VanKind::Tcp,
    connected: |van: &van_tcp::TcpVan| van.connected_peers(),
}
