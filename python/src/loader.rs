//! `SlotPool` and `SlotLease`: the Python face of [`crate::slots`], used by
//! `numapin.torch.DataLoader` (see `numapin/torch.py`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use numapin::CpuList;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::to_py;
use crate::memory::Memory;
use crate::slots::{Shm, SlotLease, MAX_SLOTS};
use crate::{dtype_of, rt, PinnedBuffer};

fn io_err(e: std::io::Error) -> PyErr {
    pyo3::exceptions::PyOSError::new_err(e.to_string())
}

/// A pool of batch slots in shared memory (one memfd), made by the main
/// process and attached by the DataLoader's workers.
#[pyclass(frozen, module = "numapin._numapin", name = "SlotPool")]
pub(crate) struct SlotPool {
    shm: Arc<Shm>,
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
    fn new(shm: Shm) -> SlotPool {
        SlotPool {
            shm: Arc::new(shm),
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
            self.shm.wake();
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

/// The node slots go on and the CPUs that fault them in: the runtime's
/// placement of CUDA device `gpu`, or of `node`, or of the calling thread.
fn where_to_place(py: Python<'_>, gpu: Option<u32>, node: Option<u32>) -> PyResult<(u32, CpuList)> {
    let rt = rt(py)?;
    py.detach(|| rt.place(crate::place::target(gpu, node)))
        .map(|s| (s.node, s.cpus))
        .map_err(|e| to_py(py, &numapin::Error::from(e)))
}

/// Registers `len` bytes at `p` (a part of the pool's mapping) with CUDA
/// when asked and a driver is there; whether it did.
fn register_part(p: *mut u8, len: usize, register: bool) -> bool {
    if !register || !numapin::internals::cuda::available() {
        return false;
    }
    let flags = numapin::internals::cuda::HOST_REGISTER_PORTABLE
        | numapin::internals::cuda::HOST_REGISTER_DEVICEMAP;
    // SAFETY: the range is part of the pool's mapping, which stays mapped
    // until the pool's Drop unregisters every part first.
    unsafe { numapin::internals::cuda::host_register(p.cast(), len, flags) }.is_ok()
}

/// Provisions `shm` with `nslots` slots of `slot_bytes` (rounded up to
/// 2 MiB), the first `first` of them made now: on `node`, faulted in on
/// `cpus`, registered with CUDA when asked and a driver is there.
fn provision(
    shm: &Shm,
    (nslots, first): (usize, usize),
    slot_bytes: usize,
    node: u32,
    cpus: &CpuList,
    register: bool,
) -> std::io::Result<()> {
    let slot_bytes = slot_bytes
        .max(1)
        .checked_next_multiple_of(2 << 20)
        .ok_or_else(|| {
            std::io::Error::other(format!("a slot of {slot_bytes} bytes is too large"))
        })?;
    shm.provision(
        nslots,
        slot_bytes,
        first,
        |p, len| {
            place(p, len, node, cpus);
            Ok(())
        },
        |p, len| register_part(p, len, register),
    )
}

/// The main process's hold on one filled slot: views made through it keep
/// it, and the slot goes back to the pool when the lease and every view are
/// gone.
#[pyclass(frozen, module = "numapin._numapin", name = "SlotLease")]
pub(crate) struct PyLease {
    lease: Arc<SlotLease>,
}

fn check_range(shm: &Shm, offset: usize, nbytes: usize) -> PyResult<()> {
    let (_, slot_bytes) = shm.geometry();
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

/// Binds `len` bytes at `p` to `node` where the system allows it, then
/// faults every page in from threads bound to `cpus` (so that, allowed or
/// not, first touch puts them on the node).
fn place(p: *mut u8, len: usize, node: u32, cpus: &CpuList) {
    // SAFETY: the range is the pool's own fresh mapping. A refusal (a
    // seccomp profile, a cpuset) leaves placement to the first touch below.
    let _ = unsafe { numapin::internals::numa::mbind_node(p, len, node) };
    let threads = cpus.len().clamp(1, 8);
    let per = len.div_ceil(threads).next_multiple_of(4096);
    let base = p as usize;
    std::thread::scope(|s| {
        for t in 0..threads {
            let from = base + t * per;
            let to = (from + per).min(base + len);
            if from >= to {
                break;
            }
            s.spawn(move || {
                let _ = numapin::affinity::bind_current_thread(cpus);
                let mut a = from;
                while a < to {
                    // SAFETY: `a` is inside the fresh shared mapping, which
                    // no one else uses yet; each thread writes its own part.
                    unsafe { std::ptr::write_volatile(a as *mut u8, 0) };
                    a += 4096;
                }
            });
        }
    });
}

#[pymethods]
impl SlotPool {
    /// A new, empty pool (main process).
    #[staticmethod]
    fn create() -> PyResult<SlotPool> {
        Ok(SlotPool::new(Shm::create().map_err(io_err)?))
    }

    /// The pool at `path` (a worker process).
    #[staticmethod]
    fn attach(py: Python<'_>, path: &str) -> PyResult<SlotPool> {
        let shm = py.detach(|| Shm::attach(path)).map_err(io_err)?;
        Ok(SlotPool::new(shm))
    }

    /// The path workers attach by.
    #[getter]
    fn path(&self) -> String {
        self.shm.path()
    }

    /// Whether the slots are provisioned.
    #[getter]
    fn ready(&self) -> bool {
        self.shm.ready()
    }

    /// Slots in the pool (made so far: it may grow up to `max_slots`).
    #[getter]
    fn nslots(&self) -> usize {
        self.shm.usable()
    }

    /// Slots the pool may grow to.
    #[getter]
    fn max_slots(&self) -> usize {
        self.shm.geometry().0
    }

    /// Bytes per slot.
    #[getter]
    fn slot_bytes(&self) -> usize {
        self.shm.geometry().1
    }

    /// Whether the slots are registered with CUDA in this process.
    #[getter]
    fn registered(&self) -> bool {
        self.shm.registered()
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
        let (node, cpus) = where_to_place(py, gpu, node)?;
        let shm = self.shm.clone();
        py.detach(move || provision(&shm, (nslots, nslots), slot_bytes, node, &cpus, register))
            .map_err(io_err)
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
        if w.is_some() || self.shm.ready() {
            return Ok(());
        }
        let (node, cpus) = where_to_place(py, gpu, node)?;
        let stop = Arc::new(AtomicBool::new(false));
        let (shm, flag, error) = (self.shm.clone(), stop.clone(), self.error.clone());
        let handle = std::thread::Builder::new()
            .name("numapin-slot-pool".into())
            .spawn(move || {
                let Some(bytes) = shm.wait_request(&flag) else {
                    return;
                };
                let bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
                if let Err(e) = provision(&shm, (nslots, first), bytes, node, &cpus, register) {
                    *error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
                    shm.fail();
                    return;
                }
                // Then grow when workers find no slot free, up to nslots.
                while shm.wait_grow(&flag) {
                    let grown = shm.grow(
                        grow_by,
                        |p, len| {
                            place(p, len, node, &cpus);
                            Ok(())
                        },
                        |p, len| register_part(p, len, register),
                    );
                    match grown {
                        Ok(usable) => shm.grown(usable < nslots),
                        Err(e) => {
                            *error.lock().unwrap_or_else(|p| p.into_inner()) =
                                Some(format!("growing the slot pool: {e}"));
                            shm.grown(false);
                            return;
                        }
                    }
                }
            })
            .map_err(io_err)?;
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
        self.shm.request(nbytes);
    }

    /// Waits up to `timeout` seconds (the GIL released) for the pool to be
    /// provisioned; whether it is. Returns at once when the pool is closed
    /// or its provisioning failed.
    fn wait_ready(&self, py: Python<'_>, timeout: f64) -> bool {
        let t = Duration::from_secs_f64(timeout.clamp(0.0, 3600.0));
        let shm = self.shm.clone();
        py.detach(move || shm.wait_ready(t))
    }

    /// Takes a free slot, waiting up to `timeout` seconds (the GIL
    /// released); `None` if none came free, or the pool is not ready.
    fn acquire(&self, py: Python<'_>, timeout: f64) -> Option<u32> {
        let t = Duration::from_secs_f64(timeout.clamp(0.0, 3600.0));
        let shm = self.shm.clone();
        py.detach(move || shm.acquire(t))
    }

    /// Gives a slot back.
    fn release(&self, slot: u32) {
        self.shm.release(slot);
    }

    /// A `dtype`/`shape` view of `nbytes` at `offset` in `slot`, for the
    /// worker that fills it (the pool stays mapped while it lives).
    fn view(
        &self,
        py: Python<'_>,
        slot: u32,
        offset: usize,
        nbytes: usize,
        dtype: &str,
        shape: Vec<i64>,
    ) -> PyResult<PinnedBuffer> {
        check_range(&self.shm, offset, nbytes)?;
        let dtype = dtype_of(py, dtype)?;
        let base = self.shm.slot_ptr(slot).map_err(io_err)?;
        let mem = Memory::Mapped {
            _shm: self.shm.clone(),
            ptr: base.wrapping_add(offset),
            len: nbytes,
        };
        PinnedBuffer::checked(py, mem, dtype, shape)
    }

    /// Takes over giving `slot` back: it returns to the pool when the lease
    /// and every view made through it are gone.
    fn lease(&self, slot: u32) -> PyResult<PyLease> {
        let (n, _) = self.shm.geometry();
        if slot as usize >= n {
            return Err(PyValueError::new_err(format!("slot {slot} of {n}")));
        }
        Ok(PyLease {
            lease: Arc::new(SlotLease::new(self.shm.clone(), slot)),
        })
    }

    /// Frees every slot no lease holds; returns the slots still leased.
    fn reset(&self) -> usize {
        self.shm.reset()
    }

    /// Starts a generation of slots (before an epoch starts); returns it.
    fn begin_generation(&self) -> u32 {
        self.shm.begin_generation()
    }

    /// Frees the slots taken before `generation` that no lease holds;
    /// returns how many came back.
    fn reclaim_before(&self, generation: u32) -> usize {
        self.shm.reclaim_before(generation)
    }

    /// `{"nslots" (made so far), "max_slots", "slot_bytes", "free",
    /// "leased", "registered"}`.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        let (n, b) = self.shm.geometry();
        d.set_item("nslots", self.shm.usable())?;
        d.set_item("max_slots", n)?;
        d.set_item("slot_bytes", b)?;
        d.set_item("free", self.shm.free_slots())?;
        d.set_item("leased", self.shm.leased_slots())?;
        d.set_item("registered", self.shm.registered())?;
        Ok(d)
    }

    /// Closes the pool: workers waiting for a slot give up at once; the
    /// provisioning thread, if any, is stopped.
    fn close(&self, py: Python<'_>) {
        self.shm.close();
        py.detach(|| self.stop_watcher());
    }
}

#[pymethods]
impl PyLease {
    /// The slot.
    #[getter]
    fn slot(&self) -> u32 {
        self.lease.slot
    }

    /// A `dtype`/`shape` view of `nbytes` at `offset` in the slot, holding
    /// the lease.
    fn view(
        &self,
        py: Python<'_>,
        offset: usize,
        nbytes: usize,
        dtype: &str,
        shape: Vec<i64>,
    ) -> PyResult<PinnedBuffer> {
        let shm = &self.lease.shm;
        check_range(shm, offset, nbytes)?;
        let dtype = dtype_of(py, dtype)?;
        let base = shm.slot_ptr(self.lease.slot).map_err(io_err)?;
        let mem = Memory::Slot {
            lease: self.lease.clone(),
            ptr: base.wrapping_add(offset),
            len: nbytes,
        };
        PinnedBuffer::checked(py, mem, dtype, shape)
    }
}
