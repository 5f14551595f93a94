//! `vans._native`: the extension module behind the `vans` Python package.
//!
//! - `node`: `Node`, and the wait every blocking call goes through (without the GIL);
//! - `worker`: `Worker` and `Request` (push, pull, push-pull; requests in flight);
//! - `server`: `Server` (ps-lite's sum, an embedding table with an optimizer, or a handler
//!   in Python), `table_spec`, `table_initial_rows`;
//! - `rendezvous`: `Rendezvous`, `create_key`, `cpu_device`;
//! - `collective`: `Collective` (all-reduce, broadcast, barrier; elastic generations);
//! - `lent`: collectives on memory lent by address (the PyTorch backend);
//! - `launch`: `launch`, a local cluster of processes, `node_role` and `free_port`;
//! - `bench`: `RustBench`, the Rust reference loop of `vans.bench`;
//! - `tf_api`: the functions the TensorFlow ops of `vans.tensorflow` call;
//! - `buffer`: Python memory borrowed without copies (buffer protocol, DLPack);
//! - `errors`: errors as `vans.errors` exceptions;
//! - `logging`: the Rust code's log records, queued for Python's `logging` (`vans._logging`).

use pyo3::prelude::*;
// The C ABI (`vans.h`): linked into this module, whose `vans_*` symbols the TensorFlow server
// plugin of `vans.tensorflow` is linked against.
use vans as _;

mod bench;
mod buffer;
mod collective;
mod errors;
mod launch;
mod lent;
mod logging;
mod node;
mod rendezvous;
mod server;
mod tf_api;
mod worker;

/// The native module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    logging::install();
    m.add_function(wrap_pyfunction!(logging::_next_log_records, m)?)?;
    m.add_function(wrap_pyfunction!(logging::_set_log_level, m)?)?;
    m.add_function(wrap_pyfunction!(logging::_verbose_level, m)?)?;
    m.add_class::<node::Node>()?;
    m.add_class::<worker::Worker>()?;
    m.add_class::<server::Server>()?;
    m.add_class::<worker::Request>()?;
    m.add_class::<rendezvous::Rendezvous>()?;
    m.add_class::<bench::RustBench>()?;
    m.add_class::<collective::Collective>()?;
    m.add_function(wrap_pyfunction!(rendezvous::create_key, m)?)?;
    m.add_function(wrap_pyfunction!(rendezvous::cpu_device, m)?)?;
    m.add_function(wrap_pyfunction!(launch::launch, m)?)?;
    m.add_function(wrap_pyfunction!(launch::free_port, m)?)?;
    m.add_function(wrap_pyfunction!(launch::node_role, m)?)?;
    m.add_function(wrap_pyfunction!(server::table_spec, m)?)?;
    m.add_function(wrap_pyfunction!(server::table_initial_rows, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // The `cmd` of a synchronous round push-pull (`ps::ROUND_CMD`): the built-in sum server
    // answers every worker with the sum of the round's pushes once all of them pushed.
    m.add("ROUND_CMD", ps::ROUND_CMD)?;
    // A table server's two-phase step (`ps::optim`): a push with ACCUMULATE_CMD adds to each
    // row's pending gradient sum; a pull with APPLY_CMD applies the sums, then answers rows.
    m.add("ACCUMULATE_CMD", ps::optim::ACCUMULATE_CMD)?;
    m.add("APPLY_CMD", ps::optim::APPLY_CMD)?;
    Ok(())
}
