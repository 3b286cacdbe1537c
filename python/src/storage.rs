//! Checkpoints and file ranges to a GPU or to pinned CPU tensors: the
//! Python face of `numapin::storage` (`numapin/_storage.py` wraps it).

use std::path::PathBuf;

use numapin::storage::safetensors::{Checkpoint, Dtype, Shard, TensorEntry};
use numapin::storage::{self, DeviceRange, IoMode, ReadOptions, ReadReport, Source};
use numapin::CudaOrdinal;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::args::{Choice, Choices, Names};
use crate::buffer::PinnedBuffer;
use crate::dtype;
use crate::errors::{input_error, to_py};
use crate::memory::{Memory, Owned};
use crate::place::target;
use crate::runtime::rt;

impl Choices for IoMode {
    const ARG: &'static str = "io";
    const WHAT: &'static str = "an I/O mode";
    const NAMES: Names<Self> = &[
        (
            "auto",
            IoMode::Auto,
            "the page cache for what it holds, O_DIRECT for the rest",
        ),
        ("buffered", IoMode::Buffered, ""),
        ("direct", IoMode::Direct, ""),
    ];
}

/// The torch/NumPy dtype name of a safetensors dtype, `None` for the
/// 6-bit formats (`F6_*`), which torch has no type for (safetensors' own
/// torch loader refuses them too). `F4` is torch's `float4_e2m1fn_x2`, two
/// elements to a byte.
fn dtype_name(d: Dtype) -> Option<&'static str> {
    Some(match d {
        Dtype::BOOL => "bool",
        Dtype::U8 => "uint8",
        Dtype::I8 => "int8",
        Dtype::F4 => "float4_e2m1fn_x2",
        Dtype::F8_E5M2 => "float8_e5m2",
        Dtype::F8_E4M3 => "float8_e4m3fn",
        Dtype::F8_E8M0 => "float8_e8m0fnu",
        Dtype::F8_E4M3FNUZ => "float8_e4m3fnuz",
        Dtype::F8_E5M2FNUZ => "float8_e5m2fnuz",
        Dtype::I16 => "int16",
        Dtype::U16 => "uint16",
        Dtype::F16 => "float16",
        Dtype::BF16 => "bfloat16",
        Dtype::I32 => "int32",
        Dtype::U32 => "uint32",
        Dtype::F32 => "float32",
        Dtype::C64 => "complex64",
        Dtype::F64 => "float64",
        Dtype::I64 => "int64",
        Dtype::U64 => "uint64",
        _ => return None,
    })
}

/// The torch dtype name and shape of tensor `t` (for `F4`, the last
/// dimension halved, as safetensors' torch loader makes it), or why torch
/// cannot hold it.
fn torch_view(t: &TensorEntry) -> Result<(&'static str, Vec<usize>), String> {
    let name = dtype_name(t.dtype).ok_or_else(|| {
        format!(
            "has dtype {}, which torch has no type for (safetensors' torch loader refuses it too)",
            t.dtype
        )
    })?;
    if t.dtype != Dtype::F4 {
        return Ok((name, t.shape.clone()));
    }
    match t.shape.split_last() {
        Some((&last, rest)) if last % 2 == 0 => {
            let mut shape = rest.to_vec();
            shape.push(last / 2);
            Ok((name, shape))
        }
        _ => Err(format!(
            "has dtype F4 and shape {:?}: torch holds F4 as float4_e2m1fn_x2, two elements to a byte, which needs an even last dimension",
            t.shape
        )),
    }
}

/// The default `io`: a Python signature shows it as `io='auto'`.
pub(crate) const AUTO: Choice<IoMode> = Choice(IoMode::Auto);

fn options(
    threads: usize,
    chunk_bytes: usize,
    readers: usize,
    Choice(io): Choice<IoMode>,
) -> ReadOptions {
    ReadOptions::default()
        .with_threads(threads)
        .with_chunk_bytes(chunk_bytes)
        .with_readers(readers)
        .with_io(io)
}

/// A read's report as a dict.
fn report<'py>(py: Python<'py>, r: &ReadReport) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("bytes", r.bytes)?;
    d.set_item("seconds", r.seconds)?;
    d.set_item("gbps", r.gbps())?;
    d.set_item("threads", r.threads)?;
    d.set_item("node", r.node)?;
    d.set_item("cached_bytes", r.cached_bytes)?;
    d.set_item("direct_bytes", r.direct_bytes)?;
    d.set_item("buffered_bytes", r.buffered_bytes)?;
    d.set_item("staging_bytes", r.staging_bytes)?;
    d.set_item("chunk_bytes", r.chunk_bytes)?;
    d.set_item("warnings", r.warnings.clone())?;
    Ok(d)
}

/// A safetensors checkpoint (a file, or an index and its shards), opened
/// and checked.
#[pyclass(frozen, module = "numapin._numapin", name = "Checkpoint")]
pub(crate) struct PyCheckpoint {
    ck: Checkpoint,
}

/// Checks `io` as the readers take it (a `TypeError` or an `InputError`
/// naming the accepted modes), so that a caller checks it before opening
/// a file.
#[pyfunction]
pub(crate) fn check_io(io: Choice<IoMode>) {
    let _ = io;
}

/// Opens a `.safetensors` file or a `*.index.json` and its shards.
#[pyfunction]
pub(crate) fn open_safetensors(py: Python<'_>, path: PathBuf) -> PyResult<PyCheckpoint> {
    let ck = py
        .detach(|| Checkpoint::open(&path))
        .map_err(|e| to_py(py, &e.into()))?;
    Ok(PyCheckpoint { ck })
}

#[pymethods]
impl PyCheckpoint {
    /// Every tensor, sorted by name: `(name, dtype, shape, nbytes,
    /// safetensors dtype)`; `dtype` and `shape` are torch's (`F4`:
    /// `float4_e2m1fn_x2`, the last dimension halved), `dtype` `None`
    /// (and `shape` the file's) for a tensor torch cannot hold.
    #[allow(clippy::type_complexity)]
    fn tensors(&self) -> Vec<(String, Option<&'static str>, Vec<usize>, usize, String)> {
        self.ck
            .tensors()
            .iter()
            .map(|t| {
                let (dtype, shape) = match torch_view(t) {
                    Ok((d, s)) => (Some(d), s),
                    Err(_) => (None, t.shape.clone()),
                };
                (t.name.clone(), dtype, shape, t.len, t.dtype.to_string())
            })
            .collect()
    }

    /// Raises `InputError` naming the file and the tensor for the first
    /// tensor at `selection` that torch cannot hold (or an index out of
    /// range).
    fn check_loadable(&self, py: Python<'_>, selection: Vec<usize>) -> PyResult<()> {
        for i in selection {
            self.entry(py, i)?;
        }
        Ok(())
    }

    /// The files read (one, or the index's shards in name order).
    fn files(&self) -> Vec<PathBuf> {
        self.ck
            .files()
            .iter()
            .map(|s| s.path().to_path_buf())
            .collect()
    }

    /// Where each file lives (its drive and NUMA node), as sentences.
    fn locations(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        let rt = rt(py)?;
        Ok(py.detach(|| {
            self.ck
                .files()
                .iter()
                .map(|s| {
                    let loc = storage::locate(s.path(), rt.topology());
                    match loc {
                        Ok(l) => format!("{}: {}", s.path().display(), l.describe()),
                        Err(e) => e.to_string(),
                    }
                })
                .collect()
        }))
    }

    /// Indexes (into `tensors()`) of the tensors called `names` (all when
    /// `None`), and of them rank `rank`'s share of `world`, in file order.
    #[pyo3(signature = (names=None, rank=None, world=None))]
    fn select(
        &self,
        py: Python<'_>,
        names: Option<Vec<String>>,
        rank: Option<usize>,
        world: Option<usize>,
    ) -> PyResult<Vec<usize>> {
        let shard = match (rank, world) {
            (None, None) => None,
            (Some(r), Some(w)) => Some(Shard::new(r, w).map_err(|e| to_py(py, &e.into()))?),
            _ => {
                return Err(input_error(
                    py,
                    "a shard needs both a rank and a world size",
                    "pass shard=(rank, world_size), or shard=\"local\"",
                ))
            }
        };
        let refs: Option<Vec<&str>> = names
            .as_ref()
            .map(|v| v.iter().map(String::as_str).collect());
        self.ck
            .select(refs.as_deref(), shard)
            .map_err(|e| to_py(py, &e.into()))
    }

    /// The names each of `world` ranks loads (see `select`).
    #[pyo3(signature = (world, names=None))]
    fn shards(
        &self,
        py: Python<'_>,
        world: usize,
        names: Option<Vec<String>>,
    ) -> PyResult<Vec<Vec<String>>> {
        if world == 0 {
            return Err(input_error(
                py,
                "world size 0",
                "pass a world size of at least 1",
            ));
        }
        let refs: Option<Vec<&str>> = names
            .as_ref()
            .map(|v| v.iter().map(String::as_str).collect());
        let s = self
            .ck
            .shards(refs.as_deref(), world)
            .map_err(|e| to_py(py, &e.into()))?;
        Ok(s.into_iter()
            .map(|r| {
                r.into_iter()
                    .map(|i| self.ck.tensors()[i].name.clone())
                    .collect()
            })
            .collect())
    }

    /// Loads the tensors at `selection` into pinned memory (the node of
    /// CUDA device `gpu`, or `node`, or the calling thread's): one
    /// `PinnedBuffer` each, in the order of `selection`.
    #[pyo3(
        signature = (selection, *, gpu=None, node=None, threads=0, chunk_bytes=0, readers=1, io=AUTO),
        text_signature = "($self, selection, *, gpu=None, node=None, threads=0, chunk_bytes=0, readers=1, io='auto')"
    )]
    #[allow(clippy::too_many_arguments)]
    fn load_to_host(
        &self,
        py: Python<'_>,
        selection: Vec<usize>,
        gpu: Option<u32>,
        node: Option<u32>,
        threads: usize,
        chunk_bytes: usize,
        readers: usize,
        io: Choice<IoMode>,
    ) -> PyResult<(Vec<PinnedBuffer>, Py<PyDict>)> {
        let opts = options(threads, chunk_bytes, readers, io);
        let mut views = Vec::with_capacity(selection.len());
        for &i in &selection {
            let (name, shape) = self.entry(py, i)?;
            // F4 is handed out as bytes; the wrapper views it as torch's
            // float4_e2m1fn_x2 (one byte each, as NumPy has no such type).
            let name = if name == "float4_e2m1fn_x2" {
                "uint8"
            } else {
                name
            };
            // The header's checks hold each dimension to the file's size.
            let shape = shape
                .iter()
                .map(|&d| i64::try_from(d))
                .collect::<Result<Vec<i64>, _>>()
                .map_err(|_| {
                    input_error(
                        py,
                        format!("tensor {i} has a dimension past 2^63"),
                        "pass a checkpoint whose shapes fit its file",
                    )
                })?;
            views.push((dtype::of(py, name)?, shape));
        }
        let rt = rt(py)?;
        let loaded = py
            .detach(|| {
                self.ck
                    .load_to_host(&rt, target(gpu, node), &selection, &opts)
            })
            .map_err(|e| to_py(py, &e.into()))?;
        let rep = report(py, &loaded.report)?.unbind();
        let mut out = Vec::with_capacity(loaded.tensors.len());
        for (h, (dtype, shape)) in loaded.tensors.into_iter().zip(views) {
            let mem = Memory::PinnedAt {
                buf: Owned::new(h.buf),
                offset: h.offset,
                len: h.len,
            };
            out.push(PinnedBuffer::checked(py, mem, dtype, shape)?);
        }
        Ok((out, rep))
    }

    /// Loads the tensors at `selection` into device memory on CUDA device
    /// `gpu`, after the work queued on `stream` (a raw `CUstream` of that
    /// device, 0 for the legacy default stream); returns when they are
    /// there. `make(k)` makes the destination of `selection[k]` (a tensor
    /// the caller keeps) and returns its device address; it is called once
    /// for each `k` while the reads run, so that making them overlaps
    /// reading: a turn of at most 16 files at a time, in the order of
    /// `selection` within a turn (so not always in order of `k`). An
    /// exception from `make` stops the read and is raised.
    #[pyo3(
        signature = (selection, make, gpu, stream, *, threads=0, chunk_bytes=0, readers=1, io=AUTO),
        text_signature = "($self, selection, make, gpu, stream, *, threads=0, chunk_bytes=0, readers=1, io='auto')"
    )]
    #[allow(clippy::too_many_arguments)]
    fn load_to_device(
        &self,
        py: Python<'_>,
        selection: Vec<usize>,
        make: Py<PyAny>,
        gpu: u32,
        stream: usize,
        threads: usize,
        chunk_bytes: usize,
        readers: usize,
        io: Choice<IoMode>,
    ) -> PyResult<Py<PyDict>> {
        let opts = options(threads, chunk_bytes, readers, io);
        for &i in &selection {
            self.entry(py, i)?;
        }
        let rt = rt(py)?;
        let gpu = CudaOrdinal(gpu);
        let made = |k: usize| {
            Python::attach(|py| make.call1(py, (k,))?.extract::<u64>(py)).map_err(LoadError::Make)
        };
        let r = py.detach(|| {
            self.ck
                .load_to_device_as_made(&selection, &opts, |sources, ranges, at| {
                    // SAFETY: the Python wrapper passes torch's current
                    // stream of that device (its primary context) and
                    // keeps each tensor `make` makes for the call.
                    unsafe {
                        storage::read_ranges_to_device_as_made(
                            &rt,
                            sources,
                            ranges,
                            gpu,
                            stream as numapin::gpu::CUstream,
                            &opts,
                            |i| made(at[i]),
                        )
                    }
                })
        });
        match r {
            Ok(r) => Ok(report(py, &r)?.unbind()),
            Err(LoadError::Make(e)) => Err(e),
            Err(LoadError::Read(e)) => Err(to_py(py, &e.into())),
        }
    }
}

/// Why a load to a GPU stopped: the read, or the caller's `make`.
enum LoadError {
    Read(storage::StorageError),
    Make(PyErr),
}

impl From<storage::StorageError> for LoadError {
    fn from(e: storage::StorageError) -> Self {
        LoadError::Read(e)
    }
}

impl PyCheckpoint {
    /// Tensor `i`'s torch dtype name and shape, or an `InputError` naming
    /// its file and itself.
    fn entry(&self, py: Python<'_>, i: usize) -> PyResult<(&'static str, Vec<usize>)> {
        let t = self.ck.tensors().get(i).ok_or_else(|| {
            input_error(
                py,
                format!("tensor index {i} is out of range"),
                "pass indexes from select()",
            )
        })?;
        torch_view(t).map_err(|why| {
            let file = self.ck.file_of(i).unwrap_or(self.ck.path());
            input_error(
                py,
                format!("{}: tensor {:?} {why}", file.display(), t.name),
                "load the other tensors (names=[...] without it)",
            )
        })
    }
}

/// Reads `nbytes` of the file at `path` from `offset` into device memory
/// at `device_ptr` on CUDA device `gpu`, after the work queued on
/// `stream`; returns the report.
#[pyfunction]
#[pyo3(
    signature = (path, offset, nbytes, device_ptr, gpu, stream, *, threads=0, chunk_bytes=0, io=AUTO),
    text_signature = "(path, offset, nbytes, device_ptr, gpu, stream, *, threads=0, chunk_bytes=0, io='auto')"
)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn read_to_device(
    py: Python<'_>,
    path: PathBuf,
    offset: u64,
    nbytes: usize,
    device_ptr: u64,
    gpu: u32,
    stream: usize,
    threads: usize,
    chunk_bytes: usize,
    io: Choice<IoMode>,
) -> PyResult<Py<PyDict>> {
    let opts = options(threads, chunk_bytes, 1, io);
    let rt = rt(py)?;
    let r = py
        .detach(|| {
            let src = Source::open(&path)?;
            let range = DeviceRange {
                source: 0,
                offset,
                len: nbytes,
                dst: device_ptr,
            };
            // SAFETY: as in load_to_device: torch's stream of that device,
            // the destination held by the wrapper.
            unsafe {
                storage::read_ranges_to_device_on(
                    &rt,
                    std::slice::from_ref(&src),
                    &[range],
                    CudaOrdinal(gpu),
                    stream as numapin::gpu::CUstream,
                    &opts,
                )
            }
        })
        .map_err(|e| to_py(py, &e.into()))?;
    Ok(report(py, &r)?.unbind())
}

/// Reads `nbytes` of the file at `path` from `offset` into host memory at
/// `address` (a CPU tensor the wrapper holds), by threads on the node of
/// `gpu` / `node` / the calling thread; returns the report.
#[pyfunction]
#[pyo3(
    signature = (path, offset, nbytes, address, *, gpu=None, node=None, threads=0, chunk_bytes=0, io=AUTO),
    text_signature = "(path, offset, nbytes, address, *, gpu=None, node=None, threads=0, chunk_bytes=0, io='auto')"
)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn read_to_host(
    py: Python<'_>,
    path: PathBuf,
    offset: u64,
    nbytes: usize,
    address: usize,
    gpu: Option<u32>,
    node: Option<u32>,
    threads: usize,
    chunk_bytes: usize,
    io: Choice<IoMode>,
) -> PyResult<Py<PyDict>> {
    let opts = options(threads, chunk_bytes, 1, io);
    if nbytes > 0 && address == 0 {
        return Err(input_error(
            py,
            "null destination address",
            "pass a CPU tensor",
        ));
    }
    let rt = rt(py)?;
    let r = py
        .detach(|| {
            let src = Source::open(&path)?;
            let dst: &mut [u8] = if nbytes == 0 {
                &mut []
            } else {
                // SAFETY: the wrapper holds the destination tensor, whose
                // `nbytes` bytes at `address` nothing else touches during
                // the call.
                unsafe { std::slice::from_raw_parts_mut(address as *mut u8, nbytes) }
            };
            storage::read_to_host(&rt, &src, offset, dst, target(gpu, node), &opts)
        })
        .map_err(|e| to_py(py, &e.into()))?;
    Ok(report(py, &r)?.unbind())
}

/// Where the file at `path` lives: `(description, drives)`, each drive a
/// dict (name, pci_bus_id, numa_node, package, kind).
#[pyfunction]
pub(crate) fn locate<'py>(
    py: Python<'py>,
    path: PathBuf,
) -> PyResult<(String, Vec<Bound<'py, PyDict>>)> {
    let rt = rt(py)?;
    let loc = py
        .detach(|| storage::locate(&path, rt.topology()))
        .map_err(|e| to_py(py, &e.into()))?;
    let mut drives = Vec::new();
    for d in &loc.drives {
        let x = PyDict::new(py);
        x.set_item("name", &d.name)?;
        x.set_item("pci_bus_id", &d.pci_bus_id)?;
        x.set_item("numa_node", d.numa_node)?;
        x.set_item("package", d.package)?;
        x.set_item("kind", d.kind.map(|k| k.as_str()))?;
        drives.push(x);
    }
    Ok((loc.describe(), drives))
}
