//! The van-core conformance suite over van-ipc: real memfd rings, real Unix sockets, real
//! reader and writer threads (both vans in this process; `two_processes.rs` crosses processes).

#![cfg(target_os = "linux")]

van_core::van_conformance_tests!(|| van_ipc::IpcVan::new(van_ipc::IpcOptions {
    // Small rings: 64 MiB messages fragment into many records and wrap many times.
    ring_bytes: 1 << 20,
    ..van_ipc::IpcOptions::default()
}));
