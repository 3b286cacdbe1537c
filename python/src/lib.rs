//! `numapin._numapin`: the compiled half of the `numapin` Python package.
//!
//! It imports neither torch nor NumPy. It hands out `PinnedBuffer`s over
//! memory lent by numapin's per-node arenas that speak DLPack, and the
//! pure-Python `numapin/__init__.py` turns them into tensors or arrays with
//! `torch.from_dlpack` / `numpy.from_dlpack`. The memory goes back to the
//! arena when the last tensor, view or array over it is gone (the DLPack
//! deleter drops the last owner; it never needs the GIL).
//!
//! Every call that allocates a region, copies, binds or waits runs with the
//! GIL released (`Python::detach`).
//!
//! One file per topic; this one only registers what they define:
//!
//! | file | what |
//! | --- | --- |
//! | `runtime.rs` | the process's runtime, made on first use |
//! | `config.rs` | `configure()` |
//! | `args.rs` | typed arguments: string options as enums, numbers checked |
//! | `topology.rs` | `topology()`, `bind()` |
//! | `place.rs` | `place()`: the runtime's one placement |
//! | `buffer.rs` | `PinnedBuffer` and its DLPack export (`dlpack.rs`) |
//! | `memory.rs` | the memory a buffer is over, of each kind |
//! | `lent.rs` | where the memory lent to Python lies (for the DataLoader's fork check) |
//! | `dtype.rs` | the element types, `dtypes()` |
//! | `pin.rs` | `empty()`, `pin_address()`, `pin_buffer()` |
//! | `copy.rs` | staged copies to and from a GPU |
//! | `stats.rs` | `stats()`, `trim()` |
//! | `shared.rs` | `SharedBuffer` |
//! | `loader.rs` | `SlotPool`, `SlotLease` (for `numapin.torch`) |
//! | `storage.rs` | checkpoints and file ranges: `Checkpoint`, `read_to_*`, `locate()` |
//! | `doctor.rs` | `doctor()`, `DoctorCheck` |
//! | `cli.rs` | `run_cli()`: the `numapin` command in the wheel |
//! | `errors.rs` | numapin's errors as Python exceptions |

mod args;
mod buffer;
mod cli;
mod config;
mod copy;
mod dlpack;
mod doctor;
mod dtype;
mod errors;
mod lent;
mod loader;
mod memory;
mod pin;
mod place;
mod runtime;
mod save;
mod shared;
mod stats;
mod storage;
mod topology;

use pyo3::prelude::*;

#[pymodule]
fn _numapin(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<buffer::PinnedBuffer>()?;
    m.add_class::<loader::SlotPool>()?;
    m.add_class::<loader::PyLease>()?;
    m.add_class::<shared::SharedBuffer>()?;
    m.add_class::<doctor::DoctorCheck>()?;
    m.add_function(wrap_pyfunction!(pin::empty, m)?)?;
    m.add_function(wrap_pyfunction!(pin::pin_address, m)?)?;
    m.add_function(wrap_pyfunction!(pin::pin_buffer, m)?)?;
    m.add_function(wrap_pyfunction!(copy::copy_to_device, m)?)?;
    m.add_function(wrap_pyfunction!(copy::copy_from_device, m)?)?;
    m.add_function(wrap_pyfunction!(topology::topology, m)?)?;
    m.add_function(wrap_pyfunction!(topology::bind, m)?)?;
    m.add_function(wrap_pyfunction!(doctor::doctor, m)?)?;
    m.add_function(wrap_pyfunction!(config::configure, m)?)?;
    m.add_function(wrap_pyfunction!(stats::stats, m)?)?;
    m.add_function(wrap_pyfunction!(stats::trim, m)?)?;
    m.add_function(wrap_pyfunction!(place::place, m)?)?;
    m.add_function(wrap_pyfunction!(dtype::dtypes, m)?)?;
    m.add_function(wrap_pyfunction!(lent::_lent_at, m)?)?;
    m.add_function(wrap_pyfunction!(cli::run_cli, m)?)?;
    m.add_function(wrap_pyfunction!(
        buffer::_delete_export_on_foreign_thread,
        m
    )?)?;
    m.add_class::<storage::PyCheckpoint>()?;
    m.add_function(wrap_pyfunction!(storage::open_safetensors, m)?)?;
    m.add_function(wrap_pyfunction!(storage::check_io, m)?)?;
    m.add_function(wrap_pyfunction!(storage::read_to_device, m)?)?;
    m.add_function(wrap_pyfunction!(storage::read_to_host, m)?)?;
    m.add_function(wrap_pyfunction!(storage::locate, m)?)?;
    save::register(m)?;
    m.add(
        "DLPACK_VERSION",
        (dlpack::DLPACK_VERSION.major, dlpack::DLPACK_VERSION.minor),
    )?;
    Ok(())
}
