//! The van-core conformance suite over van-ipc's named mode: rings in `/dev/shm` files met
//! through an accept queue, liveness by heartbeats (no Unix socket), within this process and
//! with the peer in another process.

#![cfg(target_os = "linux")]

fn named() -> van_ipc::IpcVan {
    van_ipc::IpcVan::new(van_ipc::IpcOptions {
        ring_bytes: 1 << 20,
        named: true,
        ..van_ipc::IpcOptions::default()
    })
}

mod in_process {
    van_core::van_conformance_tests!(super::named);
}

mod cross_process {
    van_core::van_cross_process_conformance_tests!(super::named);
}
