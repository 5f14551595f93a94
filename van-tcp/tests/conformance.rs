//! The van-core conformance suite over real loopback TCP sockets.

van_core::van_conformance_tests!(van_tcp::TcpVan::default);
