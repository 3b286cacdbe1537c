//! Staged copies between pageable host memory and a GPU
//! (`numapin.copy_to_device` / `copy_from_device`), through pinned memory on
//! the GPU's node ([`numapin::staged`]).

use numapin::CudaOrdinal;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::errors::to_py;
use crate::runtime::rt;

/// Which way a staged copy goes.
#[derive(Clone, Copy)]
enum Way {
    ToDevice,
    FromDevice,
}

/// A staged copy between `nbytes` of host memory at `host` and device
/// memory at `device_ptr` on CUDA device `gpu`, ordered after the work
/// queued on `stream` (a raw `CUstream` of `gpu`'s primary context, 0 for
/// the legacy default stream). Returns when the data has arrived.
fn staged(
    py: Python<'_>,
    way: Way,
    host: usize,
    nbytes: usize,
    device_ptr: u64,
    gpu: u32,
    stream: usize,
) -> PyResult<()> {
    if nbytes == 0 {
        return Ok(());
    }
    if host == 0 {
        return Err(PyValueError::new_err("null host address"));
    }
    let rt = rt(py)?;
    let opts = numapin::staged::StagedOptions::default();
    py.detach(|| {
        let s = stream as numapin::gpu::CUstream;
        match way {
            Way::ToDevice => {
                // SAFETY: the Python wrapper holds the source and the
                // destination tensors for the call; `stream` is torch's
                // stream of that device (its primary context), as the
                // wrapper passes it.
                unsafe {
                    let src = std::slice::from_raw_parts(host as *const u8, nbytes);
                    numapin::staged::copy_to_device_on(
                        &rt,
                        src,
                        device_ptr,
                        CudaOrdinal(gpu),
                        s,
                        &opts,
                    )
                }
            }
            Way::FromDevice => {
                // SAFETY: as above; the destination is a host tensor the
                // wrapper holds and nothing else writes during the call.
                unsafe {
                    let dst = std::slice::from_raw_parts_mut(host as *mut u8, nbytes);
                    numapin::staged::copy_from_device_on(
                        &rt,
                        device_ptr,
                        dst,
                        CudaOrdinal(gpu),
                        s,
                        &opts,
                    )
                }
            }
        }
    })
    .map_err(|e| to_py(py, &e.into()))
}

/// Staged copy of host memory to a device (see `numapin.copy_to_device`).
#[pyfunction]
pub(crate) fn copy_to_device(
    py: Python<'_>,
    host: usize,
    nbytes: usize,
    device_ptr: u64,
    gpu: u32,
    stream: usize,
) -> PyResult<()> {
    staged(py, Way::ToDevice, host, nbytes, device_ptr, gpu, stream)
}

/// Staged copy of device memory to host memory (see
/// `numapin.copy_from_device`).
#[pyfunction]
pub(crate) fn copy_from_device(
    py: Python<'_>,
    device_ptr: u64,
    host: usize,
    nbytes: usize,
    gpu: u32,
    stream: usize,
) -> PyResult<()> {
    staged(py, Way::FromDevice, host, nbytes, device_ptr, gpu, stream)
}
