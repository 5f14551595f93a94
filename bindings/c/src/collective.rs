//! `vans_collective`: all-reduce, broadcast and barrier among the workers, on caller arrays
//! in place ([`CommHandle`]), with elastic generations.

use std::ffi::{c_int, c_void};
use std::time::Duration;

use collective::handle::CommHandle;
use collective::{CollectiveError, Element, ReduceOp};
use node::handle::Call;
use van_core::DataType;

use crate::args;
use crate::error::{guard, Failure, VANS_ERR_COLLECTIVE, VANS_ERR_INVALID_ARGUMENT};
use crate::node::Node;
use crate::{VANS_OP_MAX, VANS_OP_MEAN, VANS_OP_MIN, VANS_OP_SUM};

/// A worker's communicator; opaque to C. Thread-safe (collectives of one communicator run
/// one at a time).
#[derive(Debug)]
pub struct Collective {
    handle: CommHandle,
}

impl From<CollectiveError> for Failure {
    fn from(error: CollectiveError) -> Failure {
        let code = match error {
            CollectiveError::InvalidArgument(_) => VANS_ERR_INVALID_ARGUMENT,
            _ => VANS_ERR_COLLECTIVE,
        };
        Failure {
            code,
            message: error.to_string(),
        }
    }
}

fn reduce_op(op: c_int) -> Result<ReduceOp, Failure> {
    Ok(match op {
        VANS_OP_SUM => ReduceOp::Sum,
        VANS_OP_MEAN => ReduceOp::Mean,
        VANS_OP_MIN => ReduceOp::Min,
        VANS_OP_MAX => ReduceOp::Max,
        other => {
            return Err(Failure::invalid(format!(
                "reduction {other} is not VANS_OP_SUM, VANS_OP_MEAN, VANS_OP_MIN or VANS_OP_MAX"
            )))
        }
    })
}

/// Starts the communicator of worker `node`, blocking until the first generation formed
/// (every worker of the job starts one).
///
/// Ownership: the caller owns `*out` and releases it with `vans_collective_free`.
/// Thread-safety: any thread except a vans I/O thread.
///
/// # Safety
///
/// `node` must be a live node or NULL; `out` valid for writing one pointer.
#[no_mangle]
pub unsafe extern "C" fn vans_collective_start(
    node: *const Node,
    out: *mut *mut Collective,
) -> c_int {
    guard("vans_collective_start", || {
        // SAFETY: live or NULL by the caller's contract.
        let node = unsafe { args::handle(node, "node") }?;
        args::check_out(out, "out")?;
        let handle = CommHandle::start(&node.handle).wait()??;
        // SAFETY: writable by the caller's contract.
        unsafe { args::write_handle(out, "out", Collective { handle }) }
    })
}

/// Releases a communicator; NULL is ignored.
///
/// # Safety
///
/// `comm` must come from `vans_collective_start` and not be used after this call.
#[no_mangle]
pub unsafe extern "C" fn vans_collective_free(comm: *mut Collective) {
    // SAFETY: forwarded contract.
    unsafe { args::free_handle("vans_collective_free", comm) }
}

/// Runs `call` on a copy of the `count` elements of `dtype` at `data` and writes the result
/// back: the caller's memory is only touched during this function.
///
/// # Safety
///
/// A non-null `data` must be valid for reading and writing `count` elements of `dtype`.
unsafe fn in_place(
    comm: &Collective,
    dtype: c_int,
    data: *mut c_void,
    count: usize,
    run: impl Run,
) -> Result<(), Failure> {
    let dtype = crate::data_type(dtype)?;
    // SAFETY: forwarded contract.
    unsafe {
        match dtype {
            DataType::F32 => typed::<f32>(comm, data, count, run),
            DataType::F64 => typed::<f64>(comm, data, count, run),
            DataType::I32 => typed::<i32>(comm, data, count, run),
            DataType::I64 => typed::<i64>(comm, data, count, run),
            other => Err(Failure::invalid(format!(
                "collectives take VANS_F32, VANS_F64, VANS_I32 or VANS_I64, not {other:?}"
            ))),
        }
    }
}

/// A collective on a buffer of any element type.
trait Run {
    fn run<T: Element>(
        &self,
        handle: &CommHandle,
        values: Vec<T>,
    ) -> Call<collective::Result<Vec<T>>>;
}

struct AllReduce(ReduceOp);
impl Run for AllReduce {
    fn run<T: Element>(
        &self,
        handle: &CommHandle,
        values: Vec<T>,
    ) -> Call<collective::Result<Vec<T>>> {
        handle.allreduce(values, self.0).call()
    }
}

struct Broadcast(usize);
impl Run for Broadcast {
    fn run<T: Element>(
        &self,
        handle: &CommHandle,
        values: Vec<T>,
    ) -> Call<collective::Result<Vec<T>>> {
        handle.broadcast(values, self.0).call()
    }
}

/// # Safety
///
/// As [`in_place`].
unsafe fn typed<T: Element>(
    comm: &Collective,
    data: *mut c_void,
    count: usize,
    run: impl Run,
) -> Result<(), Failure> {
    let ptr = data.cast::<T>();
    // SAFETY: readable for `count` elements by the caller's contract (checked non-null and
    // aligned by `slice`).
    let input = unsafe { args::slice(ptr.cast_const(), count, "data") }?.to_vec();
    let output = run.run(&comm.handle, input).wait()??;
    if count > 0 {
        // SAFETY: writable for `count` elements (contract; checked above), and `output` is a
        // distinct allocation of `count` elements.
        unsafe { std::ptr::copy_nonoverlapping(output.as_ptr(), ptr, count) };
    }
    Ok(())
}

/// Reduces the `count` elements of `dtype` (`VANS_F32`, `VANS_F64`, `VANS_I32`, `VANS_I64`)
/// at `data` across the workers with `op` (`VANS_OP_SUM`, `VANS_OP_MEAN`, `VANS_OP_MIN`,
/// `VANS_OP_MAX`), in place; every rank ends with the same values. Blocks until done.
/// `VANS_ERR_COLLECTIVE` when a member died or the membership changed: call
/// `vans_collective_settle`, then redo the step.
///
/// Ownership: `data` is read and written during the call only. Thread-safety: any thread
/// except a vans I/O thread.
///
/// # Safety
///
/// `comm` must be live or NULL; `data` NULL with `count` 0, or valid for reading and
/// writing `count` elements of `dtype`, aligned for it.
#[no_mangle]
pub unsafe extern "C" fn vans_allreduce(
    comm: *const Collective,
    dtype: c_int,
    data: *mut c_void,
    count: usize,
    op: c_int,
) -> c_int {
    guard("vans_allreduce", || {
        // SAFETY: live or NULL by the caller's contract.
        let comm = unsafe { args::handle(comm, "comm") }?;
        let op = reduce_op(op)?;
        // SAFETY: forwarded contract.
        unsafe { in_place(comm, dtype, data, count, AllReduce(op)) }
    })
}

/// Copies rank `root`'s `count` elements of `dtype` at `data` into every other rank's, in
/// place. Same rules as `vans_allreduce`.
///
/// # Safety
///
/// As `vans_allreduce`.
#[no_mangle]
pub unsafe extern "C" fn vans_broadcast(
    comm: *const Collective,
    dtype: c_int,
    data: *mut c_void,
    count: usize,
    root: c_int,
) -> c_int {
    guard("vans_broadcast", || {
        // SAFETY: live or NULL by the caller's contract.
        let comm = unsafe { args::handle(comm, "comm") }?;
        let root = usize::try_from(root)
            .map_err(|_| Failure::invalid(format!("root rank {root} is negative")))?;
        // SAFETY: forwarded contract.
        unsafe { in_place(comm, dtype, data, count, Broadcast(root)) }
    })
}

/// Returns once every rank has called it.
///
/// # Safety
///
/// `comm` must be live or NULL.
#[no_mangle]
pub unsafe extern "C" fn vans_collective_barrier(comm: *const Collective) -> c_int {
    guard("vans_collective_barrier", || {
        // SAFETY: live or NULL by the caller's contract.
        let comm = unsafe { args::handle(comm, "comm") }?;
        comm.handle.barrier().call().wait()??;
        Ok(())
    })
}

/// After a `VANS_ERR_COLLECTIVE`, waits up to `timeout_ms` for the next generation this
/// worker is a member of (returns at once when the current one is intact); then `*rank` and
/// `*size` are this worker's place in it (either may be NULL).
///
/// # Safety
///
/// `comm` must be live or NULL; `rank` and `size` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vans_collective_settle(
    comm: *const Collective,
    timeout_ms: u64,
    rank: *mut c_int,
    size: *mut c_int,
) -> c_int {
    guard("vans_collective_settle", || {
        // SAFETY: live or NULL by the caller's contract.
        let comm = unsafe { args::handle(comm, "comm") }?;
        comm.handle
            .settle(Duration::from_millis(timeout_ms))
            .wait()??;
        // SAFETY: forwarded contract.
        unsafe { write_place(comm, rank, size) }
    })
}

/// This worker's rank and the number of ranks in the current generation (`*rank` is -1 when
/// it is not a member); either pointer may be NULL.
///
/// # Safety
///
/// `comm` must be live or NULL; `rank` and `size` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vans_collective_rank(
    comm: *const Collective,
    rank: *mut c_int,
    size: *mut c_int,
) -> c_int {
    guard("vans_collective_rank", || {
        // SAFETY: live or NULL by the caller's contract.
        let comm = unsafe { args::handle(comm, "comm") }?;
        // SAFETY: forwarded contract.
        unsafe { write_place(comm, rank, size) }
    })
}

/// # Safety
///
/// `rank` and `size` NULL or writable.
unsafe fn write_place(
    comm: &Collective,
    rank: *mut c_int,
    size: *mut c_int,
) -> Result<(), Failure> {
    let generation = comm.handle.generation();
    let me = generation
        .rank_of(comm.handle.node().id())
        .map_or(-1, |r| r as c_int);
    if !rank.is_null() {
        // SAFETY: writable by the caller's contract.
        unsafe { rank.write(me) };
    }
    if !size.is_null() {
        // SAFETY: writable by the caller's contract.
        unsafe { size.write(generation.size() as c_int) };
    }
    Ok(())
}
