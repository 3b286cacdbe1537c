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

mod cli;
mod dlpack;
mod doctor;
mod dtype;
mod errors;
mod loader;
mod memory;
mod place;
mod shared;
mod storage;

use std::sync::{Arc, Mutex};

use numapin::affinity::{self, MemPolicy, Mode, PlanOptions, RankChoice};
use numapin::runtime::{
    Backend, CacheLimits, HugePages, MachineBudget, ParseMachineBudgetError, Placement, Runtime,
    RuntimeConfig,
};
use numapin::topology::ProbeOptions;
use numapin::{CudaOrdinal, Target, Topology};
use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyCapsule, PyDict, PyTuple};

use crate::dlpack::{TensorDesc, FLAG_IS_COPIED, KDL_CPU};
use crate::dtype::DType;
use crate::errors::{input_error, to_py};
use crate::memory::Memory;

/// The process's runtime (made on first use) and the configuration it will
/// be made with.
struct Global {
    config: RuntimeConfig,
    runtime: Option<Arc<Runtime>>,
    /// The process that made `runtime`: a forked child makes its own (the
    /// parent's regions are not mapped in the child).
    pid: u32,
}

impl Global {
    /// The runtime, if this process made it. One a forked child inherited
    /// is forgotten, never dropped: its regions are the parent's, not
    /// mapped here, and only the parent unmaps and unregisters them.
    fn own_runtime(&mut self) -> Option<Arc<Runtime>> {
        if self.runtime.is_some() && self.pid != std::process::id() {
            std::mem::forget(self.runtime.take());
        }
        self.runtime.clone()
    }
}

static GLOBAL: Mutex<Option<Global>> = Mutex::new(None);

fn lock_global() -> std::sync::MutexGuard<'static, Option<Global>> {
    GLOBAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// The runtime, made now (topology probe with the CUDA driver when present)
/// if this is the first use. Called with the GIL released.
fn runtime() -> Result<Arc<Runtime>, numapin::Error> {
    let mut g = lock_global();
    let global = g.get_or_insert_with(|| Global {
        config: RuntimeConfig::default(),
        runtime: None,
        pid: std::process::id(),
    });
    if let Some(rt) = global.own_runtime() {
        return Ok(rt);
    }
    let topo = Topology::probe(&ProbeOptions::from_process())?;
    let rt = Arc::new(Runtime::new(topo, global.config.clone())?);
    global.runtime = Some(rt.clone());
    global.pid = std::process::id();
    Ok(rt)
}

pub(crate) fn rt(py: Python<'_>) -> PyResult<Arc<Runtime>> {
    py.detach(runtime).map_err(|e| to_py(py, &e))
}

/// A numapin-owned host buffer viewed as a tensor of `dtype` and `shape`.
/// The memory lives until this object and every tensor or array exported
/// from it (and their views) are gone.
#[pyclass(frozen, module = "numapin._numapin", name = "PinnedBuffer")]
pub(crate) struct PinnedBuffer {
    mem: Arc<Memory>,
    dtype: DType,
    shape: Vec<i64>,
    /// In elements (DLPack convention).
    strides: Vec<i64>,
}

fn contiguous_strides(shape: &[i64]) -> Vec<i64> {
    let mut strides = vec![0i64; shape.len()];
    let mut step = 1i64;
    for (s, &n) in strides.iter_mut().zip(shape).rev() {
        *s = step;
        step = step.saturating_mul(n.max(1));
    }
    strides
}

pub(crate) fn nbytes_of(py: Python<'_>, shape: &[i64], dtype: DType) -> PyResult<usize> {
    let mut n = dtype.itemsize();
    for &d in shape {
        let d = usize::try_from(d).map_err(|_| {
            input_error(
                py,
                format!("shape {shape:?}: dimension {d} is negative"),
                "give sizes of zero or more",
            )
        })?;
        n = n.checked_mul(d).ok_or_else(|| {
            input_error(
                py,
                format!(
                    "shape {shape:?} of {} holds more bytes than an address space",
                    dtype.name
                ),
                "ask for a smaller tensor",
            )
        })?;
    }
    Ok(n)
}

/// The dtype called `name`, or an `InputError` listing the ones there are.
pub(crate) fn dtype_of(py: Python<'_>, name: &str) -> PyResult<DType> {
    dtype::by_name(name).ok_or_else(|| {
        input_error(
            py,
            format!("dtype {name:?} is not one numapin hands out"),
            format!("use one of {}", dtype::names().join(", ")),
        )
    })
}

/// Lends `len` bytes (exact; at least one byte is taken from the arena) on
/// `target`'s node. Called with the GIL released.
fn lend(rt: &Runtime, len: usize, target: Target) -> Result<Memory, numapin::Error> {
    let buf = rt.alloc_on_node(place::node_of(rt, target)?, len.max(1))?;
    Ok(Memory::Pinned {
        buf: memory::Owned::new(buf),
        len,
    })
}

impl PinnedBuffer {
    /// A view of `mem` as `shape` of `dtype`, whose bytes must be exactly
    /// `mem`'s length.
    pub(crate) fn checked(
        py: Python<'_>,
        mem: Memory,
        dtype: DType,
        shape: Vec<i64>,
    ) -> PyResult<Self> {
        if nbytes_of(py, &shape, dtype)? != mem.len() {
            return Err(PyValueError::new_err(format!(
                "{} bytes do not make a {shape:?} {} tensor",
                mem.len(),
                dtype.name
            )));
        }
        Ok(Self::new(mem, dtype, shape))
    }

    fn new(mem: Memory, dtype: DType, shape: Vec<i64>) -> Self {
        let strides = contiguous_strides(&shape);
        PinnedBuffer {
            mem: Arc::new(mem),
            dtype,
            shape,
            strides,
        }
    }
}

#[pymethods]
impl PinnedBuffer {
    /// Bytes of the tensor.
    #[getter]
    fn nbytes(&self) -> usize {
        self.mem.len()
    }

    /// The shape.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.shape)
    }

    /// Strides in elements.
    #[getter]
    fn strides<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.strides)
    }

    /// The dtype's name (`float32`, `bfloat16`, ...).
    #[getter]
    fn dtype(&self) -> &'static str {
        self.dtype.name
    }

    /// Host address of the first byte.
    #[getter]
    fn address(&self) -> usize {
        self.mem.as_ptr() as usize
    }

    /// The NUMA node the memory is on (`None` for plain heap memory).
    #[getter]
    fn node(&self) -> Option<u32> {
        self.mem.node()
    }

    /// Whether the memory is registered with CUDA (page-locked for DMA).
    #[getter]
    fn registered(&self) -> bool {
        self.mem.registered()
    }

    /// How many Rust owners the memory has: this object plus one per live
    /// export (a consumed or unconsumed DLPack capsule). For tests.
    #[getter]
    fn _owners(&self) -> usize {
        Arc::strong_count(&self.mem)
    }

    fn __repr__(&self) -> String {
        format!(
            "PinnedBuffer(shape={:?}, dtype={}, nbytes={}, node={:?}, registered={})",
            self.shape,
            self.dtype.name,
            self.mem.len(),
            self.mem.node(),
            self.mem.registered(),
        )
    }

    /// DLPack producer (array API 2023.12 signature). Returns a
    /// `dltensor_versioned` capsule when the consumer passes
    /// `max_version >= (1, 0)`, else a legacy `dltensor` capsule.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        if !self.mem.mapped_here() {
            return Err(errors::forked(py, "this pinned buffer"));
        }
        if let Some(s) = stream {
            // For CPU data the only meaningful stream is "none given".
            if !s.is_none() && s.extract::<i64>().ok() != Some(-1) {
                return Err(PyBufferError::new_err("stream must be None for CPU memory"));
            }
        }
        if let Some(dev) = dl_device {
            if dev != (KDL_CPU, 0) {
                return Err(PyBufferError::new_err(format!(
                    "cannot export host memory to DLPack device {dev:?} without a copy"
                )));
            }
        }
        let versioned = max_version.is_some_and(|(major, _)| major >= 1);
        let (owner, flags) = if copy == Some(true) {
            let fresh = Arc::new(Memory::heap(self.mem.len()));
            let (src, dst, len) = (
                self.mem.as_ptr() as usize,
                fresh.as_ptr() as usize,
                self.mem.len(),
            );
            py.detach(|| {
                // SAFETY: both buffers are `len` bytes, live (owned by `self`
                // and `fresh` for the whole call) and distinct allocations.
                unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, len) }
            });
            (fresh, FLAG_IS_COPIED)
        } else {
            (Arc::clone(&self.mem), 0)
        };
        let desc = TensorDesc {
            owner: &owner,
            byte_offset: 0,
            dtype: self.dtype.dl(),
            shape: &self.shape,
            strides: &self.strides,
        };
        dlpack::to_capsule(py, &desc, versioned, flags)
    }

    fn __dlpack_device__(&self) -> (i32, i32) {
        (KDL_CPU, 0)
    }

    /// A copy of the bytes, read from the Rust side (GIL released). For
    /// tests.
    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        if !self.mem.mapped_here() {
            return Err(errors::forked(py, "this pinned buffer"));
        }
        let (ptr, len) = (self.mem.as_ptr() as usize, self.mem.len());
        let v = py.detach(|| {
            // SAFETY: `ptr..ptr+len` is the live memory owned by `self`,
            // which outlives this call; it is only read for the copy.
            unsafe { std::slice::from_raw_parts(ptr as *const u8, len) }.to_vec()
        });
        Ok(PyBytes::new(py, &v))
    }
}

/// An uninitialised C-contiguous buffer of `shape` and `dtype` (a torch or
/// NumPy dtype name) in pinned memory on the node of CUDA device `gpu`, or
/// on `node`, or on the calling thread's node.
#[pyfunction]
#[pyo3(signature = (shape, dtype, *, gpu=None, node=None))]
fn empty(
    py: Python<'_>,
    shape: Vec<i64>,
    dtype: &str,
    gpu: Option<u32>,
    node: Option<u32>,
) -> PyResult<PinnedBuffer> {
    let dtype = dtype_of(py, dtype)?;
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
fn pin_address(
    py: Python<'_>,
    address: usize,
    nbytes: usize,
    shape: Vec<i64>,
    dtype: &str,
    gpu: Option<u32>,
    node: Option<u32>,
) -> PyResult<PinnedBuffer> {
    let dtype = dtype_of(py, dtype)?;
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
            let buf = numapin::staged::pin(&rt, src, target)?;
            Ok::<_, numapin::Error>(Memory::Pinned {
                buf: memory::Owned::new(buf),
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
fn pin_buffer(
    py: Python<'_>,
    src: &Bound<'_, PyAny>,
    shape: Vec<i64>,
    dtype: &str,
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
fn copy_to_device(
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
fn copy_from_device(
    py: Python<'_>,
    device_ptr: u64,
    host: usize,
    nbytes: usize,
    gpu: u32,
    stream: usize,
) -> PyResult<()> {
    staged(py, Way::FromDevice, host, nbytes, device_ptr, gpu, stream)
}

/// The topology of this machine, or of a saved machine at `input`: its
/// JSON (the documented schema) and the `numapin topo` text.
#[pyfunction]
#[pyo3(signature = (input=None))]
fn topology(py: Python<'_>, input: Option<std::path::PathBuf>) -> PyResult<(String, String)> {
    py.detach(|| {
        let opts = ProbeOptions::from_process();
        let t = match &input {
            Some(p) => Topology::load(p, &opts)?,
            None => Topology::probe(&opts)?,
        };
        Ok::<_, numapin::Error>((t.to_json(), t.to_text()))
    })
    .map_err(|e| to_py(py, &e))
}

/// Binds the calling process near its GPU (see `numapin.bind`); returns
/// the plan's JSON and how the GPU was chosen.
#[pyfunction]
#[pyo3(signature = (local_rank=None, *, gpu=None, node=None, mode="node", memory="bind", input=None))]
#[allow(clippy::too_many_arguments)]
fn bind(
    py: Python<'_>,
    local_rank: Option<u32>,
    gpu: Option<u32>,
    node: Option<u32>,
    mode: &str,
    memory: &str,
    input: Option<std::path::PathBuf>,
) -> PyResult<(String, String)> {
    let mode: Mode = mode.parse().map_err(|problem: String| {
        input_error(
            py,
            format!("mode: {problem}"),
            "use node, socket, exclusive, cache or core",
        )
    })?;
    let memory = match memory {
        "bind" => Some(MemPolicy::Bind),
        "preferred" => Some(MemPolicy::Preferred),
        "none" => None,
        other => {
            return Err(input_error(
                py,
                format!("memory={other:?} is not a memory policy numapin sets"),
                "use \"bind\" (only the GPU's node), \"preferred\" (that node first) or \"none\" (CPUs only)",
            ))
        }
    };
    py.detach(|| {
        let opts = ProbeOptions::from_process();
        let topo = match &input {
            Some(p) => Topology::load(p, &opts)?,
            None => Topology::probe(&opts)?,
        };
        let (mut plan, why) = match node {
            Some(n) => (
                affinity::plan_node(&topo, n)?,
                format!("NUMA node {n} (chosen)"),
            ),
            None => {
                let choice = RankChoice::default()
                    .with_local_rank(local_rank)
                    .with_gpu(gpu.map(CudaOrdinal));
                affinity::rank_plan(&topo, choice, mode, &PlanOptions::default())?
            }
        };
        // A saved machine is described, not bound.
        if input.is_none() {
            match memory {
                Some(policy) => {
                    // Refused by a seccomp profile: the CPUs are bound, and
                    // the plan says memory follows first touch.
                    if let affinity::Binding::CpusOnly { reason } =
                        affinity::bind_current_process(&plan, policy)?
                    {
                        plan.warnings.push(reason);
                    }
                }
                None => affinity::bind_current_process_cpus(&plan)?,
            }
        }
        let json = serde_json::to_string(&plan).expect("a plan always serializes");
        Ok::<_, numapin::Error>((json, why))
    })
    .map_err(|e| to_py(py, &e))
}

/// Stores the configuration `apply` makes of the current one, if it is in
/// range and no runtime was made yet: `Err(None)` when one was, the range
/// error otherwise (the configuration before stays). No Python runs while
/// GLOBAL is held: a thread waiting for it may hold the GIL.
fn store_config(
    apply: impl FnOnce(RuntimeConfig) -> RuntimeConfig,
) -> Result<(), Option<numapin::Error>> {
    let mut g = lock_global();
    let global = g.get_or_insert_with(|| Global {
        config: RuntimeConfig::default(),
        runtime: None,
        pid: std::process::id(),
    });
    if global.own_runtime().is_some() {
        return Err(None);
    }
    let c = apply(global.config.clone());
    c.check().map_err(|e| Some(e.into()))?;
    global.config = c;
    Ok(())
}

/// `configure`'s `machine_budget` (its text forms) and `budget_wait`
/// (seconds), checked.
fn machine_and_wait(
    py: Python<'_>,
    machine_budget: Option<&str>,
    budget_wait: Option<f64>,
) -> PyResult<(Option<MachineBudget>, Option<std::time::Duration>)> {
    let machine_budget = match machine_budget.map(str::parse::<MachineBudget>) {
        None => None,
        Some(Ok(m)) => Some(m),
        Some(Err(e)) => {
            return Err(input_error(
                py,
                format!("machine_budget={:?}: {}", e.text, e.problem),
                ParseMachineBudgetError::FIX,
            ))
        }
    };
    let budget_wait = match budget_wait {
        None => None,
        Some(w) if w.is_finite() && (0.0..=86_400.0 * 365.0).contains(&w) => {
            Some(std::time::Duration::from_secs_f64(w))
        }
        Some(w) => {
            return Err(input_error(
                py,
                format!("budget_wait={w} is not a number of seconds from 0 to a year"),
                "pass the seconds to wait for pinned memory when over budget (e.g. 30.0), or None to fail at once",
            ))
        }
    };
    Ok((machine_budget, budget_wait))
}

/// Sets the configuration of the runtime numapin makes on first use.
#[pyfunction]
#[pyo3(signature = (*, budget_bytes=None, budget_fraction=None, region_bytes=None, register=None, placement=None, thread_cache_blocks=None, thread_cache_bytes=None, populate_threads=None, backend=None, huge_pages=None, register_in_parts=None, machine_budget=None, budget_wait=None))]
#[allow(clippy::too_many_arguments)]
fn configure(
    py: Python<'_>,
    budget_bytes: Option<u64>,
    budget_fraction: Option<f64>,
    region_bytes: Option<usize>,
    register: Option<bool>,
    placement: Option<&str>,
    thread_cache_blocks: Option<usize>,
    thread_cache_bytes: Option<u64>,
    populate_threads: Option<usize>,
    backend: Option<&str>,
    huge_pages: Option<&str>,
    register_in_parts: Option<bool>,
    machine_budget: Option<&str>,
    budget_wait: Option<f64>,
) -> PyResult<()> {
    let (machine_budget, budget_wait) = machine_and_wait(py, machine_budget, budget_wait)?;
    let backend = match backend {
        None => None,
        Some(name) => match Backend::ALL.into_iter().find(|b| b.as_str() == name) {
            Some(b) => Some(b),
            None => {
                return Err(input_error(
                    py,
                    format!("backend={name:?} is not a region backend"),
                    "use \"mapped\" (the default: mmap + mbind + mlock + cuMemHostRegister), \"driver_numa\" (cuMemCreate on the node) or \"host_alloc_bound\" (cuMemHostAlloc under MPOL_BIND)",
                ))
            }
        },
    };
    let huge_pages = match huge_pages.map(str::parse::<HugePages>) {
        None => None,
        Some(Ok(h)) => Some(h),
        Some(Err(e)) => {
            return Err(input_error(
                py,
                format!("huge_pages={:?}: {e}", e.text),
                "use \"auto\" (hugetlb pages when the node's pool has enough, else transparent huge pages; the default), \"thp\", \"2m\" or \"1g\" (hugetlb pages from the node's pool, an error when it is short), or \"none\" (4 KiB pages)",
            ))
        }
    };
    let placement =
        match placement {
            None => None,
            Some("strict") => Some(Placement::Strict),
            Some("warn") => Some(Placement::Warn),
            Some(other) => return Err(input_error(
                py,
                format!("placement={other:?} is not a placement rule"),
                "use \"strict\" (a page off its node is an error) or \"warn\" (counted in stats)",
            )),
        };
    let apply = |mut c: RuntimeConfig| {
        if let Some(b) = budget_bytes {
            c = c.with_budget_bytes(Some(b));
        }
        if let Some(f) = budget_fraction {
            c = c.with_budget_fraction(f);
        }
        if let Some(r) = region_bytes {
            c = c.with_region_bytes(r);
        }
        if let Some(r) = register {
            c = c.with_register(r);
        }
        if let Some(p) = placement {
            c = c.with_placement(p);
        }
        if let Some(t) = populate_threads {
            c = c.with_populate_threads(t);
        }
        if let Some(b) = backend {
            c = c.with_backend(b);
        }
        if let Some(h) = huge_pages {
            c = c.with_huge_pages(h);
        }
        if let Some(p) = register_in_parts {
            c = c.with_register_in_parts(p);
        }
        if let Some(m) = machine_budget {
            c = c.with_machine_budget(Some(m));
        }
        if let Some(w) = budget_wait {
            c = c.with_budget_wait(Some(w));
        }
        if thread_cache_blocks.is_some() || thread_cache_bytes.is_some() {
            let d = c.thread_cache;
            c = c.with_thread_cache(CacheLimits {
                max_blocks: thread_cache_blocks.unwrap_or(d.max_blocks),
                max_bytes: thread_cache_bytes.unwrap_or(d.max_bytes),
                max_block_bytes: d.max_block_bytes,
            });
        }
        c
    };
    let outcome = store_config(apply);
    match outcome {
        Ok(()) => Ok(()),
        Err(Some(e)) => Err(to_py(py, &e)),
        Err(None) => Err(input_error(
            py,
            "numapin.configure() after numapin already made its runtime (an empty(), pin(), stats() or copy call came first)",
            "call numapin.configure() once, before any other numapin call that allocates",
        )),
    }
}

/// Per-node counters of the runtime (made now if it was not yet), as a
/// list of dicts.
#[pyfunction]
fn stats<'py>(py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
    let rt = rt(py)?;
    let stats = py.detach(|| rt.stats());
    let json = py.import("json")?;
    stats
        .iter()
        .map(|s| {
            let text =
                serde_json::to_string(s).map_err(|e| PyValueError::new_err(e.to_string()))?;
            json.call_method1("loads", (text,))?
                .cast_into::<PyDict>()
                .map_err(Into::into)
        })
        .collect()
}

/// Gives every empty region back to the system; returns the bytes still
/// reserved.
#[pyfunction]
fn trim(py: Python<'_>) -> PyResult<u64> {
    let rt = rt(py)?;
    Ok(py.detach(|| rt.trim()))
}

/// Names of the dtypes numapin hands out.
#[pyfunction]
fn dtypes() -> Vec<&'static str> {
    dtype::names()
}

/// Test hook: exports `buf` as a consumer would take it, then runs the
/// DLPack deleter on a fresh OS thread that is not attached to Python, while
/// this thread keeps the GIL. Returns the owner count after the join. If the
/// deleter needed the GIL this would deadlock.
#[pyfunction]
fn _delete_export_on_foreign_thread(buf: &PinnedBuffer) -> usize {
    let desc = TensorDesc {
        owner: &buf.mem,
        byte_offset: 0,
        dtype: buf.dtype.dl(),
        shape: &buf.shape,
        strides: &buf.strides,
    };
    let m = dlpack::export_versioned(&desc, 0).as_ptr() as usize;
    let joined = std::thread::spawn(move || {
        let m = m as *mut dlpack::DLManagedTensorVersioned;
        // SAFETY: `m` is a fresh export nobody else holds; its deleter is
        // called exactly once, here.
        if let Some(del) = unsafe { (*m).deleter } {
            // SAFETY: as above.
            unsafe { del(m) };
        }
    })
    .join();
    debug_assert!(joined.is_ok());
    Arc::strong_count(&buf.mem)
}

#[pymodule]
fn _numapin(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PinnedBuffer>()?;
    m.add_class::<loader::SlotPool>()?;
    m.add_class::<loader::PyLease>()?;
    m.add_class::<shared::SharedBuffer>()?;
    m.add_class::<doctor::DoctorCheck>()?;
    m.add_function(wrap_pyfunction!(empty, m)?)?;
    m.add_function(wrap_pyfunction!(pin_address, m)?)?;
    m.add_function(wrap_pyfunction!(pin_buffer, m)?)?;
    m.add_function(wrap_pyfunction!(copy_to_device, m)?)?;
    m.add_function(wrap_pyfunction!(copy_from_device, m)?)?;
    m.add_function(wrap_pyfunction!(topology, m)?)?;
    m.add_function(wrap_pyfunction!(bind, m)?)?;
    m.add_function(wrap_pyfunction!(doctor::doctor, m)?)?;
    m.add_function(wrap_pyfunction!(configure, m)?)?;
    m.add_function(wrap_pyfunction!(stats, m)?)?;
    m.add_function(wrap_pyfunction!(trim, m)?)?;
    m.add_function(wrap_pyfunction!(place::place, m)?)?;
    m.add_function(wrap_pyfunction!(dtypes, m)?)?;
    m.add_function(wrap_pyfunction!(cli::run_cli, m)?)?;
    m.add_function(wrap_pyfunction!(_delete_export_on_foreign_thread, m)?)?;
    m.add_class::<storage::PyCheckpoint>()?;
    m.add_function(wrap_pyfunction!(storage::open_safetensors, m)?)?;
    m.add_function(wrap_pyfunction!(storage::read_to_device, m)?)?;
    m.add_function(wrap_pyfunction!(storage::read_to_host, m)?)?;
    m.add_function(wrap_pyfunction!(storage::locate, m)?)?;
    m.add(
        "DLPACK_VERSION",
        (dlpack::DLPACK_VERSION.major, dlpack::DLPACK_VERSION.minor),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strides_are_c_order() {
        assert_eq!(contiguous_strides(&[2, 3, 4]), vec![12, 4, 1]);
        assert_eq!(contiguous_strides(&[]), Vec::<i64>::new());
        assert_eq!(contiguous_strides(&[0, 3]), vec![3, 1]);
    }
}
