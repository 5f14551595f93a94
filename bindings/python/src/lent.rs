//! Collectives on memory lent by address, for framework adapters (`vans.torch`): the caller
//! passes a tensor's `(data_ptr, nbytes)`, an object that keeps the memory alive, and a
//! callback; the collective runs in that memory (no copy in or out) on the node's runtime,
//! and the callback runs on a vans I/O thread, with the GIL, once it is done. No thread
//! waits per operation.
//!
//! These entry points take raw addresses, so they are private (`Collective._start`): the
//! adapter checks that the tensor is a contiguous CPU tensor of the dtype it names and keeps
//! it alive (the `keep` object) and unwritten until the callback has run.

use collective::handle::{Buffer, CommHandle, Numbered};
use collective::{bf16, f16, Element, ReduceOp};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

use crate::errors::collective_to_py as to_py;

/// `count` elements of `T` at an address the caller lends until the operation completes.
pub(crate) struct Lent<T> {
    ptr: *mut T,
    len: usize,
}

// SAFETY: the memory is lent for the operation's lifetime by a caller that does not touch
// it meanwhile (the contract of `Collective._start`), so the one thread running the
// operation may use it.
unsafe impl<T: Send> Send for Lent<T> {}

impl<T: Element> Lent<T> {
    /// The memory `(address, nbytes)` as elements of `T`: the address must be aligned for
    /// `T` and the byte count a whole number of elements.
    fn new(memory: (usize, usize), what: &str) -> PyResult<Lent<T>> {
        let (address, nbytes) = memory;
        let size = std::mem::size_of::<T>();
        if nbytes % size != 0 {
            return Err(PyValueError::new_err(format!(
                "{what}: {nbytes} bytes are not a whole number of {}-byte {} elements",
                size,
                T::NAME
            )));
        }
        if nbytes == 0 {
            return Ok(Lent {
                ptr: std::ptr::NonNull::<T>::dangling().as_ptr(),
                len: 0,
            });
        }
        if address == 0 || address % std::mem::align_of::<T>() != 0 {
            return Err(PyValueError::new_err(format!(
                "{what}: address {address:#x} is not aligned for {} elements",
                T::NAME
            )));
        }
        Ok(Lent {
            ptr: address as *mut T,
            len: nbytes / size,
        })
    }
}

impl<T: Element> Buffer<T> for Lent<T> {
    fn elements(&self) -> &[T] {
        // SAFETY: `ptr` is non-null, aligned and valid for `len` elements (checked in `new`,
        // dangling only when `len` is 0) for as long as the operation holds `self` (the
        // caller's contract).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    fn elements_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `elements`; the caller does not touch the memory while it is lent,
        // and `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

/// What `_start` is asked to run.
pub(crate) struct Request<'a> {
    pub(crate) kind: &'a str,
    pub(crate) first: (usize, usize),
    pub(crate) second: Option<(usize, usize)>,
    pub(crate) op: ReduceOp,
    pub(crate) peer: usize,
    pub(crate) tag: i32,
    pub(crate) counts: Option<(Vec<usize>, Vec<usize>)>,
}

/// Runs `request` on elements of `T`; `done(error)` runs once it is done.
fn run<T: Element>(
    comm: &CommHandle,
    request: Request<'_>,
    keep: Py<PyAny>,
    done: Py<PyAny>,
) -> PyResult<()> {
    let first = Lent::<T>::new(request.first, "tensor")?;
    let second = || -> PyResult<Lent<T>> {
        match request.second {
            Some(memory) => Lent::new(memory, "output"),
            None => Err(PyValueError::new_err(format!(
                "{} needs an output",
                request.kind
            ))),
        }
    };
    match request.kind {
        "allreduce" => complete(comm.allreduce(first, request.op), keep, done),
        "broadcast" => complete(comm.broadcast(first, request.peer), keep, done),
        "all_gather" => complete(comm.all_gather(first, second()?), keep, done),
        "reduce_scatter" => complete(
            comm.reduce_scatter(first, second()?, request.op),
            keep,
            done,
        ),
        "all_to_all" => {
            let (send, recv) = request.counts.unwrap_or_default();
            complete(comm.all_to_all(first, send, second()?, recv), keep, done)
        }
        "send" => complete(comm.send(first, request.peer, request.tag), keep, done),
        "recv" => complete(comm.recv(first, request.peer, request.tag), keep, done),
        other => {
            return Err(PyValueError::new_err(format!(
                "unknown collective {other:?}"
            )))
        }
    }
    Ok(())
}

/// Starts `request` on elements named by `dtype` (a torch/numpy dtype name); `done(error)`
/// runs once it is done, after `keep` is let go.
pub(crate) fn start(
    comm: &CommHandle,
    dtype: &str,
    request: Request<'_>,
    keep: Py<PyAny>,
    done: Py<PyAny>,
) -> PyResult<()> {
    match dtype {
        "float32" => run::<f32>(comm, request, keep, done),
        "float64" => run::<f64>(comm, request, keep, done),
        "int32" => run::<i32>(comm, request, keep, done),
        "int64" => run::<i64>(comm, request, keep, done),
        "uint8" => run::<u8>(comm, request, keep, done),
        "bfloat16" => run::<bf16>(comm, request, keep, done),
        "float16" => run::<f16>(comm, request, keep, done),
        other => Err(PyTypeError::new_err(format!(
            "vans collectives take float32, float64, bfloat16, float16, int32, int64 or uint8 \
             tensors, not {other}"
        ))),
    }
}

/// Calls `done(error)` (`None` on success) on completion of `call`, with the GIL, after the
/// lent buffers and `keep` are let go.
pub(crate) fn complete<B: Send + 'static>(
    collective: Numbered<B>,
    keep: Py<PyAny>,
    done: Py<PyAny>,
) {
    collective.on_complete(move |result| {
        // The operation is over: its view of the lent memory goes first.
        let result = result.map(drop);
        Python::attach(|py| {
            crate::buffer::release_pending(py);
            let error = result.err().map(to_py);
            drop(keep);
            let called = match error {
                None => done.call1(py, (py.None(),)),
                Some(e) => done.call1(py, (e.into_value(py),)),
            };
            if let Err(e) = called {
                e.write_unraisable(py, None);
            }
        })
    });
}
