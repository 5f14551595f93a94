//! The conformance checks with the peer in another process, over TCP on 127.0.0.1.

van_core::van_cross_process_conformance_tests!(van_tcp::TcpVan::default);
