//! Checkpoints saved from CUDA or CPU tensors, and the pinned buffers a
//! checkpoint stager copies into: the Python face of
//! `numapin::storage::safetensors::save` and of
//! `numapin::Runtime::alloc_with` with `AllocOptions::staging`
//! (`numapin/_save.py` and `numapin/_stager.py` wrap them).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use numapin::storage::safetensors::{self, Dtype, SaveOptions, SaveTensor};
use numapin::storage::write::{Data, WriteOptions, WriteReport};
use numapin::storage::IoMode;
use numapin::{AllocOptions, CudaOrdinal};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyModule};

use crate::args::Choice;
use crate::buffer::{nbytes_of, PinnedBuffer};
use crate::errors::{input_error, to_py};
use crate::memory::{Memory, Owned};
use crate::place::target;
use crate::runtime::rt;
use crate::storage::AUTO;

/// Where each part of a staging buffer starts: a multiple of this.
const PART_ALIGN: usize = 256;

/// One tensor to save: name, safetensors dtype (`"F32"`), shape, CUDA
/// ordinal (`-1` for host memory), address and bytes.
type Entry = (String, String, Vec<usize>, i64, usize, usize);

/// Registers this file's functions in the extension module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(save_safetensors, m)?)?;
    m.add_function(wrap_pyfunction!(staging_buffers, m)?)?;
    Ok(())
}

fn dtype(py: Python<'_>, name: &str, tensor: &str) -> PyResult<Dtype> {
    serde_json::from_value(serde_json::Value::String(name.to_string())).map_err(|_| {
        input_error(
            py,
            format!("tensor {tensor:?}: {name:?} is not a safetensors dtype"),
            "save tensors of the dtypes safetensors has (bool, integers, float8/16/32/64, bfloat16, complex64)",
        )
    })
}

/// The tensors as the library takes them.
///
/// # Safety
/// Each host entry's `address..address + nbytes` must be readable memory
/// the caller keeps alive and unchanged while the views are used.
unsafe fn views<'a>(py: Python<'_>, entries: &'a [Entry]) -> PyResult<Vec<SaveTensor<'a>>> {
    let mut out = Vec::with_capacity(entries.len());
    for (name, dt, shape, gpu, address, nbytes) in entries {
        let data = match (*gpu, *nbytes) {
            (_, 0) => Data::Host(&[]),
            (g, n) if g >= 0 => Data::Device {
                gpu: CudaOrdinal(u32::try_from(g).unwrap_or(u32::MAX)),
                ptr: *address as u64,
                len: n,
            },
            (_, n) => {
                if *address == 0 {
                    return Err(input_error(
                        py,
                        format!("tensor {name:?} has no data"),
                        "pass materialised tensors",
                    ));
                }
                // SAFETY: per this function's contract.
                Data::Host(unsafe { std::slice::from_raw_parts(*address as *const u8, n) })
            }
        };
        out.push(SaveTensor::new(
            name.clone(),
            dtype(py, dt, name)?,
            shape.clone(),
            data,
        ));
    }
    Ok(out)
}

/// A write's report as a dict.
fn report<'py>(py: Python<'py>, r: &WriteReport) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("bytes", r.bytes)?;
    d.set_item("seconds", r.seconds)?;
    d.set_item("gbps", r.gbps())?;
    d.set_item("sync_seconds", r.sync_seconds)?;
    d.set_item("threads", r.threads)?;
    d.set_item("node", r.node)?;
    d.set_item("direct_bytes", r.direct_bytes)?;
    d.set_item("buffered_bytes", r.buffered_bytes)?;
    d.set_item("staging_bytes", r.staging_bytes)?;
    let files: Vec<PathBuf> = r.files.clone();
    d.set_item("files", files)?;
    d.set_item("removed_stale", r.removed_stale)?;
    d.set_item("warnings", r.warnings.clone())?;
    Ok(d)
}

/// Saves `tensors` to `path` (see `numapin.save_safetensors`), the copies
/// from each GPU after the work queued on its stream in `streams`
/// (`(ordinal, raw CUstream)`); returns the report.
#[pyfunction]
#[pyo3(
    signature = (path, tensors, *, metadata=None, max_shard_size=None, prefix="model", gpu=None, node=None, streams=Vec::new(), threads=0, chunk_bytes=8388608, io=AUTO, fsync=true),
    text_signature = "(path, tensors, *, metadata=None, max_shard_size=None, prefix='model', gpu=None, node=None, streams=..., threads=0, chunk_bytes=8388608, io='auto', fsync=True)"
)]
#[allow(clippy::too_many_arguments)]
fn save_safetensors(
    py: Python<'_>,
    path: PathBuf,
    tensors: Vec<Entry>,
    metadata: Option<HashMap<String, String>>,
    max_shard_size: Option<u64>,
    prefix: &str,
    gpu: Option<u32>,
    node: Option<u32>,
    streams: Vec<(u32, usize)>,
    threads: usize,
    chunk_bytes: usize,
    io: Choice<IoMode>,
    fsync: bool,
) -> PyResult<Py<PyDict>> {
    let Choice(io) = io;
    let opts = SaveOptions::default()
        .with_metadata(metadata)
        .with_max_shard_size(max_shard_size)
        .with_prefix(prefix.to_string())
        .with_write(
            WriteOptions::default()
                .with_threads(threads)
                .with_chunk_bytes(chunk_bytes)
                .with_io(io)
                .with_fsync(fsync),
        );
    // SAFETY: the Python wrapper holds every tensor for the call and
    // passes their addresses and sizes.
    let ts = unsafe { views(py, &tensors) }?;
    let rt = rt(py)?;
    let r = py
        .detach(|| {
            let after: Vec<(CudaOrdinal, numapin::gpu::CUstream)> = streams
                .iter()
                .map(|&(g, s)| (CudaOrdinal(g), s as numapin::gpu::CUstream))
                .collect();
            // SAFETY: the wrapper passes torch's current stream of each
            // device (its primary context) and holds the tensors.
            unsafe { safetensors::save_on(&rt, &path, &ts, target(gpu, node), &after, &opts) }
        })
        .map_err(|e| to_py(py, &e.into()))?;
    Ok(report(py, &r)?.unbind())
}

/// One pinned buffer on the node of CUDA device `gpu` (or `node`, or the
/// calling thread's), cut into a `PinnedBuffer` per `(dtype, shape)` of
/// `parts`, each starting at a multiple of 256 bytes: a checkpoint
/// stager's copy, counted in the node's budget, pinning no more than it
/// holds (its region is its own size, rounded up to 2 MiB).
#[pyfunction]
#[pyo3(signature = (parts, *, gpu=None, node=None))]
fn staging_buffers(
    py: Python<'_>,
    parts: Vec<(String, Vec<i64>)>,
    gpu: Option<u32>,
    node: Option<u32>,
) -> PyResult<Vec<PinnedBuffer>> {
    let mut layout = Vec::with_capacity(parts.len());
    let mut total = 0usize;
    for (name, shape) in &parts {
        let dt = crate::dtype::of(py, name)?;
        let n = nbytes_of(py, shape, dt)?;
        layout.push((dt, total, n));
        total = total
            .checked_add(n.div_ceil(PART_ALIGN) * PART_ALIGN)
            .ok_or_else(|| {
                input_error(
                    py,
                    "the parts add up to more than an address space",
                    "stage less",
                )
            })?;
    }
    let rt = rt(py)?;
    // The Runtime's front door: counted in the node's budget, in a region
    // of its own size when one must be made.
    let staging = AllocOptions::default().with_staging(true);
    let buf = py
        .detach(|| rt.alloc_with(target(gpu, node), total.max(1), &staging))
        .map_err(|e| to_py(py, &e.into()))?;
    let buf = Arc::new(Owned::new(buf));
    let mut out = Vec::with_capacity(parts.len());
    for ((_, shape), (dt, offset, len)) in parts.into_iter().zip(layout) {
        let mem = Memory::Part {
            buf: Arc::clone(&buf),
            offset,
            len,
        };
        out.push(PinnedBuffer::checked(py, mem, dt, shape)?);
    }
    Ok(out)
}
