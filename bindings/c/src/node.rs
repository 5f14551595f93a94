//! `vans_node`: a node of the cluster with its own I/O threads ([`NodeHandle`]): start from
//! the environment or a `vans_config`, role/rank/size queries, barrier, finalize and stop.

use std::ffi::c_int;

use node::handle::NodeHandle;
use van_core::Role;

use crate::args;
use crate::config::Config;
use crate::error::{guard, Outcome};
use crate::{VANS_ROLE_SCHEDULER, VANS_ROLE_SERVER, VANS_ROLE_WORKER};

/// A node of the cluster; opaque to C. Thread-safe.
#[derive(Debug)]
pub struct Node {
    pub(crate) handle: NodeHandle,
}

/// Starts `node` and stores it in `out`: joined the cluster, or failed.
fn start(out: *mut *mut Node, node: ps::Result<NodeHandle>) -> Outcome {
    // SAFETY: writable by the caller's contract.
    unsafe { args::write_handle(out, "out", Node { handle: node? }) }
}

/// Joins the cluster described by the environment (`DMLC_ROLE`, `DMLC_NUM_SERVER`,
/// `DMLC_NUM_WORKER`, `DMLC_PS_ROOT_URI`, `DMLC_PS_ROOT_PORT`, ... or `TF_CONFIG`; see the
/// book's Configuration chapter), blocking until the node table has arrived or the bootstrap
/// deadline (`VANS_BOOTSTRAP_TIMEOUT_SECS`, 120 s by default) passed. On success `*out` is the
/// node.
///
/// Ownership: the caller owns `*out` and releases it with `vans_node_free` (after
/// `vans_node_finalize` or `vans_node_stop`). Thread-safety: any thread except a vans I/O
/// thread (not from a callback).
///
/// # Safety
///
/// `out` must be valid for writing one pointer.
#[no_mangle]
pub unsafe extern "C" fn vans_node_start_env(out: *mut *mut Node) -> c_int {
    guard("vans_node_start_env", || {
        args::check_out(out, "out")?;
        start(out, NodeHandle::from_env())
    })
}

/// Joins the cluster described by `config` (see `vans_config_set`), blocking like
/// `vans_node_start_env`. The environment is not read.
///
/// Ownership: `config` stays the caller's (it may be freed right after); the caller owns
/// `*out` and releases it with `vans_node_free`. Thread-safety: as `vans_node_start_env`.
///
/// # Safety
///
/// `config` must be a live configuration or NULL; `out` valid for writing one pointer.
#[no_mangle]
pub unsafe extern "C" fn vans_node_start(config: *const Config, out: *mut *mut Node) -> c_int {
    guard("vans_node_start", || {
        // SAFETY: live or NULL by the caller's contract.
        let config = unsafe { args::handle(config, "config") }?.parse()?;
        args::check_out(out, "out")?;
        start(out, NodeHandle::start(config))
    })
}

/// Runs `query` on the node behind `node` and writes its answer to `out`.
///
/// # Safety
///
/// `node` must be a live node or NULL; `out` valid for writing one `T` or NULL.
unsafe fn query<T>(
    node: *const Node,
    out: *mut T,
    query: impl FnOnce(&NodeHandle) -> T,
) -> Outcome {
    // SAFETY: live or NULL by the caller's contract.
    let node = unsafe { args::handle(node, "node") }?;
    // SAFETY: writable by the caller's contract (NULL is refused).
    unsafe { args::write_out(out, "out", query(&node.handle)) }
}

/// Writes this node's role to `*out`: `VANS_ROLE_SCHEDULER`, `VANS_ROLE_SERVER` or
/// `VANS_ROLE_WORKER`. Thread-safety: any thread.
///
/// # Safety
///
/// `node` must be a live node or NULL; `out` valid for writing one `int` or NULL.
#[no_mangle]
pub unsafe extern "C" fn vans_node_role(node: *const Node, out: *mut c_int) -> c_int {
    // SAFETY: forwarded contract.
    guard("vans_node_role", || unsafe {
        query(node, out, |node| match node.role() {
            Role::Scheduler => VANS_ROLE_SCHEDULER,
            Role::Server => VANS_ROLE_SERVER,
            Role::Worker => VANS_ROLE_WORKER,
        })
    })
}

/// Writes this node's id to `*out` (ps-lite numbering: scheduler 1, servers 8, 10, ...,
/// workers 9, 11, ...). Thread-safety: any thread.
///
/// # Safety
///
/// `node` must be a live node or NULL; `out` valid for writing one `int` or NULL.
#[no_mangle]
pub unsafe extern "C" fn vans_node_id(node: *const Node, out: *mut c_int) -> c_int {
    // SAFETY: forwarded contract.
    guard("vans_node_id", || unsafe {
        query(node, out, NodeHandle::id)
    })
}

/// Writes this node's rank within its role (from 0) to `*out`. Thread-safety: any thread.
///
/// # Safety
///
/// `node` must be a live node or NULL; `out` valid for writing one `uint32_t` or NULL.
#[no_mangle]
pub unsafe extern "C" fn vans_node_rank(node: *const Node, out: *mut u32) -> c_int {
    // SAFETY: forwarded contract.
    guard("vans_node_rank", || unsafe {
        query(node, out, NodeHandle::rank)
    })
}

/// Writes the number of servers in the cluster to `*out`. Thread-safety: any thread.
///
/// # Safety
///
/// `node` must be a live node or NULL; `out` valid for writing one `uint32_t` or NULL.
#[no_mangle]
pub unsafe extern "C" fn vans_node_num_servers(node: *const Node, out: *mut u32) -> c_int {
    // SAFETY: forwarded contract.
    guard("vans_node_num_servers", || unsafe {
        query(node, out, NodeHandle::num_servers)
    })
}

/// Writes the number of workers in the cluster to `*out`. Thread-safety: any thread.
///
/// # Safety
///
/// `node` must be a live node or NULL; `out` valid for writing one `uint32_t` or NULL.
#[no_mangle]
pub unsafe extern "C" fn vans_node_num_workers(node: *const Node, out: *mut u32) -> c_int {
    // SAFETY: forwarded contract.
    guard("vans_node_num_workers", || unsafe {
        query(node, out, NodeHandle::num_workers)
    })
}

/// Blocks until every node of `group` (`VANS_SCHEDULER`, `VANS_SERVER_GROUP`,
/// `VANS_WORKER_GROUP` or their bitwise or, e.g. `VANS_ALL_GROUPS`) has called
/// `vans_node_barrier` with the same group. Fails with `VANS_ERR_BARRIER_FAILED` when members
/// died, `VANS_ERR_NODE_FAILED` when the scheduler is lost (it died, or this node is cut
/// off from it), `VANS_ERR_STOPPED` when the node stopped.
///
/// Thread-safety: any thread except a vans I/O thread (not from a callback).
///
/// # Safety
///
/// `node` must be a live node or NULL.
#[no_mangle]
pub unsafe extern "C" fn vans_node_barrier(node: *const Node, group: c_int) -> c_int {
    guard("vans_node_barrier", || {
        // SAFETY: live or NULL by the caller's contract.
        let node = unsafe { args::handle(node, "node") }?;
        Ok(node.handle.barrier(group).wait()?)
    })
}

/// Leaves the cluster in order (ps-lite's `Finalize`): a barrier of every node, then stop.
/// Every node must call it; it blocks until all have. The handle must still be released with
/// `vans_node_free`.
///
/// Thread-safety: any thread except a vans I/O thread.
///
/// # Safety
///
/// `node` must be a live node or NULL.
#[no_mangle]
pub unsafe extern "C" fn vans_node_finalize(node: *const Node) -> c_int {
    guard("vans_node_finalize", || {
        // SAFETY: live or NULL by the caller's contract.
        let node = unsafe { args::handle(node, "node") }?;
        Ok(node.handle.finalize().wait()?)
    })
}

/// Stops the node without a barrier (after a failure): pending requests, barriers and
/// receives fail with `VANS_ERR_STOPPED`. The handle must still be released with
/// `vans_node_free`.
///
/// Thread-safety: any thread except a vans I/O thread.
///
/// # Safety
///
/// `node` must be a live node or NULL.
#[no_mangle]
pub unsafe extern "C" fn vans_node_stop(node: *const Node) -> c_int {
    guard("vans_node_stop", || {
        // SAFETY: live or NULL by the caller's contract.
        let node = unsafe { args::handle(node, "node") }?;
        Ok(node.handle.stop().wait()?)
    })
}

/// Releases a node handle; NULL is ignored. Workers, servers and rendezvous made from it keep
/// the node running until they are released too; when the last goes without
/// `vans_node_finalize` or `vans_node_stop`, the node stops (waiting up to 2 s for its
/// connections to close).
///
/// # Safety
///
/// `node` must come from `vans_node_start*` and not be used after this call (nor during it
/// by another thread).
#[no_mangle]
pub unsafe extern "C" fn vans_node_free(node: *mut Node) {
    // SAFETY: forwarded contract.
    unsafe { args::free_handle("vans_node_free", node) }
}
