//! Pinned buffers made for Python: `empty` (uninitialised) and `pin`
//! (a pinned copy of a tensor's or array's bytes, made by threads on the
//! target's node), each on the node of a GPU, of a NUMA node or of the
//! calling thread.

use numapin::runtime::{Runtime, Target};
use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::buffer::{nbytes_of, PinnedBuffer};
use crate::dtype::DType;
use crate::errors::to_py;
use crate::memory::{Memory, Owned};
use crate::place;
use crate::runtime::rt;

/// Lends `len` bytes (exact; at least one byte is taken from the arena) on
/// `target`'s node. Called with the GIL released.
fn lend(rt: &Runtime, len: usize, target: Target) -> Result<Memory, numapin::Error> {
    let buf = rt.alloc(target, len.max(1))?;
    Ok(Memory::Pinned {
        buf: Owned::new(buf),
        len,
    })
}

/// An uninitialised C-contiguous buffer of `shape` and `dtype` (a torch or
/// NumPy dtype name) in pinned memory on the node of CUDA device `gpu`, or
/// on `node`, or on the calling thread's node.
#[pyfunction]
#[pyo3(signature = (shape, dtype, *, gpu=None, node=None))]
pub(crate) fn empty(
    py: Python<'_>,
    shape: Vec<i64>,
    dtype: DType,
    gpu: Option<u32>,
    node: Option<u32>,
) -> PyResult<PinnedBuffer> {
    let len = nbytes_of(py, &shape, dtype)?;
    let rt = rt(py)?;
    let mem = py
        .detach(|| lend(&rt, len, place::target(gpu, node)))
        .map_err(|e| to_py(py, &e))?;
    Ok(PinnedBuffer::new(mem, dtype, shape))
}

/// A pinned copy of `nbytes` at host `address` (a CPU tensor's or array's
/// data, kept alive by the caller) on the node of `gpu` / `node` / the
/// calling thread, copied by threads on that node with the GIL released.
#[pyfunction]
#[pyo3(signature = (address, nbytes, shape, dtype, *, gpu=None, node=None))]
pub(crate) fn pin_address(
    py: Python<'_>,
    address: usize,
    nbytes: usize,
    shape: Vec<i64>,
    dtype: DType,
    gpu: Option<u32>,
    node: Option<u32>,
) -> PyResult<PinnedBuffer> {
    if nbytes_of(py, &shape, dtype)? != nbytes {
        return Err(PyValueError::new_err(format!(
            "{nbytes} bytes do not make a {shape:?} {} tensor",
            dtype.name
        )));
    }
    if nbytes > 0 && address == 0 {
        return Err(PyValueError::new_err("null source address"));
    }
    let rt = rt(py)?;
    let target = place::target(gpu, node);
    let mem = py
        .detach(|| {
            let src: &[u8] = if nbytes == 0 {
                &[]
            } else {
                // SAFETY: the caller (numapin's Python wrapper) holds the
                // source tensor or array, whose `nbytes` bytes at `address`
                // stay live and unchanged for this call.
                unsafe { std::slice::from_raw_parts(address as *const u8, nbytes) }
            };
            let buf = numapin::staged::pinned_copy(&rt, src, target)?;
            Ok::<_, numapin::Error>(Memory::Pinned {
                buf: Owned::new(buf),
                len: nbytes,
            })
        })
        .map_err(|e| to_py(py, &e))?;
    Ok(PinnedBuffer::new(mem, dtype, shape))
}

/// A pinned copy of a C-contiguous buffer-protocol object (a NumPy array,
/// `bytes`, a `memoryview`), viewed as `shape`/`dtype`.
#[pyfunction]
#[pyo3(signature = (src, shape, dtype, *, gpu=None, node=None))]
pub(crate) fn pin_buffer(
    py: Python<'_>,
    src: &Bound<'_, PyAny>,
    shape: Vec<i64>,
    dtype: DType,
    gpu: Option<u32>,
    node: Option<u32>,
) -> PyResult<PinnedBuffer> {
    let view = PyUntypedBuffer::get(src)?;
    if !view.is_c_contiguous() {
        return Err(PyValueError::new_err("the source must be C-contiguous"));
    }
    let r = pin_address(
        py,
        view.buf_ptr() as usize,
        view.len_bytes(),
        shape,
        dtype,
        gpu,
        node,
    );
    view.release(py);
    r
}
