//! The conformance checks with the peer in another process, over shared memory.

#![cfg(target_os = "linux")]

van_core::van_cross_process_conformance_tests!(|| van_ipc::IpcVan::new(van_ipc::IpcOptions {
    ring_bytes: 1 << 20,
    ..van_ipc::IpcOptions::default()
}));
