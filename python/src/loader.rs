//! `SlotPool` and `SlotLease`: the Python face of the library's
//! [`numapin::shared::SlotPool`], used by `numapin.torch.DataLoader` (see
//! `numapin/_loader_pool.py`). The pool's memory is the arena's (placed by
//! `Runtime::place`, counted in the node's budget and `numapin.stats()`);
//! this file only adds the provisioning thread and Python views.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use numapin::shared::{SharedError, SlotLease, SlotPool as Pool, MAX_SLOTS};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::buffer::PinnedBuffer;
use crate::dtype::DType;
use crate::errors::to_py;
use crate::memory::Memory;
use crate::place;
use crate::runtime::rt;

fn shared_err(py: Python<'_>, e: SharedError) -> PyErr {
    to_py(py, &numapin::Error::from(e))
}

/// A pool of batch slots in shared memory (one memfd), made by the main
/// process and attached by the DataLoader's workers.
#[pyclass(frozen, module = "numapin._numapin", name = "SlotPool")]
pub(crate) struct SlotPool {
    pool: Arc<Pool>,
    /// The provisioning thread of `provision_on_request` and its stop flag
    /// (main process).
    watcher: Mutex<Option<Watcher>>,
    /// Why that thread failed to provision the pool.
    error: Arc<Mutex<Option<String>>>,
}

/// The provisioning thread of `provision_on_request`.
struct Watcher {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<()>,
    /// The process that started it (a forked worker inherits this object,
    /// not the thread).
    pid: u32,
}

impl SlotPool {
    fn new(pool: Pool) -> SlotPool {
        SlotPool {
            pool: Arc::new(pool),
            watcher: Mutex::new(None),
            error: Arc::new(Mutex::new(None)),
        }
    }

    /// Stops the provisioning thread (it finishes a provisioning under
    /// way) and waits for it.
    fn stop_watcher(&self) {
        let w = self
            .watcher
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(w) = w {
            if w.pid != std::process::id() {
                // A forked copy: the thread is not in this process.
                std::mem::forget(w.handle);
                return;
            }
            w.stop.store(true, Ordering::Release);
            self.pool.wake();
            let _ = w.handle.join();
        }
    }
}

impl Drop for SlotPool {
    fn drop(&mut self) {
        self.stop_watcher();
    }
}

fn check_nslots(nslots: usize) -> PyResult<()> {
    if nslots == 0 || nslots > MAX_SLOTS {
        return Err(PyValueError::new_err(format!(
            "{nslots} slots: a pool holds 1 to {MAX_SLOTS}"
        )));
    }
    Ok(())
}

/// The provisioning thread's work: waits for a worker's request, makes the
/// pool, then grows it by `grow_by` when workers find no slot free. A
/// failure is kept in `error` and ends the waiting of the workers.
fn provision_when_asked(
    pool: &Pool,
    rt: &numapin::Runtime,
    target: numapin::Target,
    (nslots, first, grow_by): (usize, usize, usize),
    register: bool,
    (stop, error): (&AtomicBool, &Mutex<Option<String>>),
) {
    let keep = |e: SharedError| {
        *error.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(numapin::error::with_causes(&numapin::Error::from(e)));
    };
    let Some(bytes) = pool.wait_request(stop) else {
        return;
    };
    let bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
    if let Err(e) = pool.provision(rt, target, (nslots, bytes), first, register) {
        keep(e);
        pool.fail();
        return;
    }
    while pool.wait_grow(stop) {
        match pool.grow(grow_by) {
            Ok(usable) => pool.grown(usable < nslots),
            Err(e) => {
                keep(e);
                pool.grown(false);
                return;
            }
        }
    }
}

/// The main process's hold on one filled slot: views made through it keep
/// it, and the slot goes back to the pool when the lease and every view are
/// gone.
#[pyclass(frozen, module = "numapin._numapin", name = "SlotLease")]
pub(crate) struct PyLease {
    lease: Arc<SlotLease>,
}

fn check_range(pool: &Pool, offset: usize, nbytes: usize) -> PyResult<()> {
    let (_, slot_bytes) = pool.geometry();
    if offset
        .checked_add(nbytes)
        .is_none_or(|end| end > slot_bytes)
    {
        return Err(PyValueError::new_err(format!(
            "{nbytes} bytes at offset {offset} run past the {slot_bytes}-byte slot"
        )));
    }
    Ok(())
}

#[pymethods]
impl SlotPool {
    /// A new, empty pool (main process).
    #[staticmethod]
    fn create(py: Python<'_>) -> PyResult<SlotPool> {
        Ok(SlotPool::new(
            Pool::create().map_err(|e| shared_err(py, e))?,
        ))
    }

    /// The pool at `path` (a worker process).
    #[staticmethod]
    fn attach(py: Python<'_>, path: &str) -> PyResult<SlotPool> {
        let pool = py
            .detach(|| Pool::attach(std::path::Path::new(path)))
            .map_err(|e| shared_err(py, e))?;
        Ok(SlotPool::new(pool))
    }

    /// The path workers attach by.
    #[getter]
    fn path(&self) -> String {
        self.pool.path().display().to_string()
    }

    /// Whether the slots are provisioned.
    #[getter]
    fn ready(&self) -> bool {
        self.pool.ready()
    }

    /// Slots in the pool (made so far: it may grow up to `max_slots`).
    #[getter]
    fn nslots(&self) -> usize {
        self.pool.usable()
    }

    /// Slots the pool may grow to.
    #[getter]
    fn max_slots(&self) -> usize {
        self.pool.geometry().0
    }

    /// Bytes per slot.
    #[getter]
    fn slot_bytes(&self) -> usize {
        self.pool.geometry().1
    }

    /// Whether the slots are registered with CUDA in this process.
    #[getter]
    fn registered(&self) -> bool {
        self.pool.registered()
    }

    /// Makes `nslots` slots of `slot_bytes` on the node of CUDA device
    /// `gpu` (or `node`, or the calling thread's node), faulted in by
    /// threads on its CPUs and, with `register`, registered with CUDA.
    #[pyo3(signature = (nslots, slot_bytes, *, gpu=None, node=None, register=true))]
    fn provision(
        &self,
        py: Python<'_>,
        nslots: usize,
        slot_bytes: usize,
        gpu: Option<u32>,
        node: Option<u32>,
        register: bool,
    ) -> PyResult<()> {
        check_nslots(nslots)?;
        let rt = rt(py)?;
        let target = place::target(gpu, node);
        let pool = self.pool.clone();
        py.detach(move || pool.provision(&rt, target, (nslots, slot_bytes), nslots, register))
            .map_err(|e| shared_err(py, e))
    }

    /// Provisions a pool of up to `nslots` slots as soon as a worker asks
    /// for them ([`request`](Self::request)), sized by its request, on a
    /// thread of this (the main) process, so that workers wait for the
    /// pool instead of sending their first batches down torch's path while
    /// the main process waits for the first of them. `first` slots are made
    /// then, and `grow_by` more each time a worker finds none free, up to
    /// `nslots` (each growth faulted in and registered as a part of its
    /// own, so that no slot spans two). Returns at once; a failure is kept
    /// for [`provision_error`](Self::provision_error) and makes the waiting
    /// workers go on without the pool (or without more slots).
    #[pyo3(signature = (nslots, *, first=None, grow_by=None, gpu=None, node=None, register=true))]
    #[allow(clippy::too_many_arguments)]
    fn provision_on_request(
        &self,
        py: Python<'_>,
        nslots: usize,
        first: Option<usize>,
        grow_by: Option<usize>,
        gpu: Option<u32>,
        node: Option<u32>,
        register: bool,
    ) -> PyResult<()> {
        check_nslots(nslots)?;
        let first = first.unwrap_or(nslots).clamp(1, nslots);
        let grow_by = grow_by.unwrap_or(nslots).max(1);
        let mut w = self.watcher.lock().unwrap_or_else(|e| e.into_inner());
        if w.is_some() || self.pool.ready() {
            return Ok(());
        }
        let rt = rt(py)?;
        let target = place::target(gpu, node);
        // An unknown GPU or node is the caller's error now, not the
        // thread's later.
        rt.place(target)
            .map_err(|e| to_py(py, &numapin::Error::from(e)))?;
        let stop = Arc::new(AtomicBool::new(false));
        let (pool, flag, error) = (self.pool.clone(), stop.clone(), self.error.clone());
        let handle = std::thread::Builder::new()
            .name("numapin-slot-pool".into())
            .spawn(move || {
                let sizes = (nslots, first, grow_by);
                provision_when_asked(&pool, &rt, target, sizes, register, (&flag, &error));
            })
            .map_err(|e| {
                shared_err(
                    py,
                    SharedError::System {
                        what: "starting the slot pool's thread".into(),
                        source: e,
                    },
                )
            })?;
        *w = Some(Watcher {
            stop,
            handle,
            pid: std::process::id(),
        });
        Ok(())
    }

    /// Why provisioning on request failed, if it did.
    fn provision_error(&self) -> Option<String> {
        self.error.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Asks for slots of at least `nbytes` (a worker that found the pool
    /// not provisioned yet; the first request wins).
    fn request(&self, nbytes: u64) {
        self.pool.request(nbytes);
    }

    /// Waits up to `timeout` seconds (the GIL released) for the pool to be
    /// provisioned; whether it is. Returns at once when the pool is closed
    /// or its provisioning failed.
    fn wait_ready(&self, py: Python<'_>, timeout: f64) -> bool {
        let t = Duration::from_secs_f64(timeout.clamp(0.0, 3600.0));
        let pool = self.pool.clone();
        py.detach(move || pool.wait_ready(t))
    }

    /// Takes a free slot, waiting up to `timeout` seconds (the GIL
    /// released); `None` if none came free, or the pool is not ready.
    fn acquire(&self, py: Python<'_>, timeout: f64) -> Option<u32> {
        let t = Duration::from_secs_f64(timeout.clamp(0.0, 3600.0));
        let pool = self.pool.clone();
        py.detach(move || pool.acquire(t))
    }

    /// Gives a slot back.
    fn release(&self, slot: u32) {
        self.pool.release(slot);
    }

    /// A `dtype`/`shape` view of `nbytes` at `offset` in `slot`, for the
    /// worker that fills it (the pool stays mapped while it lives).
    fn view(
        &self,
        py: Python<'_>,
        slot: u32,
        offset: usize,
        nbytes: usize,
        dtype: DType,
        shape: Vec<i64>,
    ) -> PyResult<PinnedBuffer> {
        check_range(&self.pool, offset, nbytes)?;
        let base = self.pool.slot_ptr(slot).map_err(|e| shared_err(py, e))?;
        let mem = Memory::Mapped {
            _pool: self.pool.clone(),
            ptr: base.wrapping_add(offset),
            len: nbytes,
        };
        PinnedBuffer::checked(py, mem, dtype, shape)
    }

    /// Copies the `lengths[i]` bytes at `addresses[i]` (CPU tensors' data,
    /// kept alive by the caller, numapin's own DataLoader) one after
    /// another into `slot`, which this process holds, from `offset` on,
    /// each followed by padding to a multiple of `align` bytes, with
    /// streaming stores, a source of 4 MiB or more on threads bound to
    /// `cpus` (the GIL released). Returns the offset after the last one.
    #[pyo3(signature = (slot, offset, addresses, lengths, align, cpus))]
    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        py: Python<'_>,
        slot: u32,
        offset: usize,
        addresses: Vec<usize>,
        lengths: Vec<usize>,
        align: usize,
        cpus: Vec<u32>,
    ) -> PyResult<usize> {
        if addresses.len() != lengths.len() || !align.is_power_of_two() {
            return Err(PyValueError::new_err(
                "write: one length per address, and a power-of-two alignment",
            ));
        }
        if addresses
            .iter()
            .zip(&lengths)
            .any(|(&a, &l)| l > 0 && a == 0)
        {
            return Err(PyValueError::new_err("write: null source address"));
        }
        let cpus: numapin::CpuList = cpus.into_iter().collect();
        let pool = self.pool.clone();
        py.detach(move || {
            let srcs: Vec<&[u8]> = addresses
                .iter()
                .zip(&lengths)
                .map(|(&a, &l)| {
                    if l == 0 {
                        &[][..]
                    } else {
                        // SAFETY: the caller (numapin.torch's collate) holds
                        // each source tensor, whose `l` bytes at `a` stay
                        // live and unchanged for this call, and none of
                        // them lies in a slot.
                        unsafe { std::slice::from_raw_parts(a as *const u8, l) }
                    }
                })
                .collect();
            let pad = |i: usize| lengths[i].next_multiple_of(align) - lengths[i];
            pool.write(slot, offset, &srcs, pad, &cpus)
        })
        .map_err(|e| shared_err(py, e))
    }

    /// Takes over giving `slot` back: it returns to the pool when the lease
    /// and every view made through it are gone.
    fn lease(&self, slot: u32) -> PyResult<PyLease> {
        let lease = SlotLease::new(self.pool.clone(), slot)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(PyLease {
            lease: Arc::new(lease),
        })
    }

    /// Frees every slot no lease holds; returns the slots still leased.
    fn reset(&self) -> usize {
        self.pool.reset()
    }

    /// Starts a generation of slots (before an epoch starts); returns it.
    fn begin_generation(&self) -> u32 {
        self.pool.begin_generation()
    }

    /// Frees the slots taken before `generation` that no lease holds;
    /// returns how many came back.
    fn reclaim_before(&self, generation: u32) -> usize {
        self.pool.reclaim_before(generation)
    }

    /// `{"nslots" (made so far), "max_slots", "slot_bytes", "free",
    /// "leased", "registered"}`.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        let (n, b) = self.pool.geometry();
        d.set_item("nslots", self.pool.usable())?;
        d.set_item("max_slots", n)?;
        d.set_item("slot_bytes", b)?;
        d.set_item("free", self.pool.free_slots())?;
        d.set_item("leased", self.pool.leased_slots())?;
        d.set_item("registered", self.pool.registered())?;
        Ok(d)
    }

    /// Closes the pool: workers waiting for a slot give up at once; the
    /// provisioning thread, if any, is stopped.
    fn close(&self, py: Python<'_>) {
        self.pool.close();
        py.detach(|| self.stop_watcher());
    }
}

#[pymethods]
impl PyLease {
    /// The slot.
    #[getter]
    fn slot(&self) -> u32 {
        self.lease.slot()
    }

    /// A `dtype`/`shape` view of `nbytes` at `offset` in the slot, holding
    /// the lease.
    fn view(
        &self,
        py: Python<'_>,
        offset: usize,
        nbytes: usize,
        dtype: DType,
        shape: Vec<i64>,
    ) -> PyResult<PinnedBuffer> {
        let pool = self.lease.pool();
        check_range(pool, offset, nbytes)?;
        let base = pool
            .slot_ptr(self.lease.slot())
            .map_err(|e| shared_err(py, e))?;
        let mem = Memory::Slot {
            lease: self.lease.clone(),
            ptr: base.wrapping_add(offset),
            len: nbytes,
        };
        PinnedBuffer::checked(py, mem, dtype, shape)
    }
}
