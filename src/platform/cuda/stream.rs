//! Streams and events.

use cudarc::driver::sys;

use super::context::ensure_context;
use super::{check, driver_version, CudaResult};
use cudarc::driver::sys::{CUevent, CUstream};

/// A CUDA stream of the context current when it was created, destroyed on
/// drop.
#[derive(Debug)]
pub struct Stream(CUstream);

// SAFETY: a CUstream handle may be used from any thread (the driver API is
// thread-safe); the wrapper owns it.
unsafe impl Send for Stream {}
// SAFETY: as above; every operation on a stream is thread-safe.
unsafe impl Sync for Stream {}

impl Stream {
    /// A non-blocking stream (`CU_STREAM_NON_BLOCKING`: no implicit
    /// synchronisation with the legacy default stream) in the current
    /// context (see [`set_device`](super::set_device)).
    ///
    /// # Errors
    ///
    /// [`CudaError::NoDriver`](crate::gpu::CudaError::NoDriver) without a usable driver (or with
    /// `NUMAPIN_NO_CUDA` set), [`CudaError::Call`](crate::gpu::CudaError::Call) naming the driver call that
    /// failed, with its `CUresult`.
    pub fn new() -> CudaResult<Stream> {
        driver_version()?;
        ensure_context()?;
        let mut s = std::ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: s is a valid out-pointer; a context is current.
        check("cuStreamCreate", unsafe {
            sys::cuStreamCreate(&mut s, flags)
        })?;
        Ok(Stream(s))
    }

    /// The raw handle.
    pub fn raw(&self) -> CUstream {
        self.0
    }

    /// Waits until all work queued on the stream has finished.
    ///
    /// # Errors
    ///
    /// [`CudaError::NoDriver`](crate::gpu::CudaError::NoDriver) without a usable driver (or with
    /// `NUMAPIN_NO_CUDA` set), [`CudaError::Call`](crate::gpu::CudaError::Call) naming the driver call that
    /// failed, with its `CUresult` (a sticky error of the context shows here).
    pub fn synchronize(&self) -> CudaResult<()> {
        // SAFETY: the handle is valid until drop.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(self.0)
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: the handle is ours; queued work still completes after
        // cuStreamDestroy returns (the driver defers the release).
        unsafe { sys::cuStreamDestroy_v2(self.0) };
    }
}

/// A CUDA event, destroyed on drop.
#[derive(Debug)]
pub struct Event(CUevent);

// SAFETY: a CUevent handle may be queried, synchronised and destroyed from
// any thread; the wrapper owns it.
unsafe impl Send for Event {}
// SAFETY: as above.
unsafe impl Sync for Event {}

impl Event {
    /// An event in the current context. `timing` false creates it with
    /// `CU_EVENT_DISABLE_TIMING`, the cheap kind for ordering.
    ///
    /// # Errors
    ///
    /// [`CudaError::NoDriver`](crate::gpu::CudaError::NoDriver) without a usable driver (or with
    /// `NUMAPIN_NO_CUDA` set), [`CudaError::Call`](crate::gpu::CudaError::Call) naming the driver call that
    /// failed, with its `CUresult`.
    pub fn new(timing: bool) -> CudaResult<Event> {
        driver_version()?;
        ensure_context()?;
        let flags = if timing {
            0
        } else {
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32
        };
        let mut e = std::ptr::null_mut();
        // SAFETY: e is a valid out-pointer; a context is current.
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(&mut e, flags)
        })?;
        Ok(Event(e))
    }

    /// Records the event on `stream` (it completes when the work queued
    /// before it has).
    ///
    /// # Safety
    /// `stream` must be a live stream (or null, the legacy default stream)
    /// of the event's context.
    ///
    /// # Errors
    ///
    /// [`CudaError::NoDriver`](crate::gpu::CudaError::NoDriver) without a usable driver (or with
    /// `NUMAPIN_NO_CUDA` set), [`CudaError::Call`](crate::gpu::CudaError::Call) naming the driver call that
    /// failed, with its `CUresult`.
    pub unsafe fn record(&self, stream: CUstream) -> CudaResult<()> {
        // SAFETY: per the caller's guarantee; the event is ours.
        check("cuEventRecord", unsafe {
            sys::cuEventRecord(self.0, stream)
        })
    }

    /// Whether the work before the event has completed (`cuEventQuery`;
    /// never blocks).
    ///
    /// # Errors
    ///
    /// [`CudaError::NoDriver`](crate::gpu::CudaError::NoDriver) without a usable driver (or with
    /// `NUMAPIN_NO_CUDA` set), [`CudaError::Call`](crate::gpu::CudaError::Call) naming the driver call that
    /// failed, with its `CUresult`. A sticky error of the context shows here.
    pub fn is_complete(&self) -> CudaResult<bool> {
        // SAFETY: the handle is valid until drop.
        let r = unsafe { sys::cuEventQuery(self.0) };
        if r == sys::CUresult::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        check("cuEventQuery", r).map(|()| true)
    }

    /// Blocks until the event has completed.
    ///
    /// # Errors
    ///
    /// [`CudaError::NoDriver`](crate::gpu::CudaError::NoDriver) without a usable driver (or with
    /// `NUMAPIN_NO_CUDA` set), [`CudaError::Call`](crate::gpu::CudaError::Call) naming the driver call that
    /// failed, with its `CUresult` (a sticky error of the context shows here).
    pub fn synchronize(&self) -> CudaResult<()> {
        // SAFETY: the handle is valid until drop.
        check("cuEventSynchronize", unsafe {
            sys::cuEventSynchronize(self.0)
        })
    }

    /// Milliseconds between `start` and this event (both timing events,
    /// both completed).
    ///
    /// # Errors
    ///
    /// [`CudaError::NoDriver`](crate::gpu::CudaError::NoDriver) without a usable driver (or with
    /// `NUMAPIN_NO_CUDA` set), [`CudaError::Call`](crate::gpu::CudaError::Call) naming the driver call that
    /// failed, with its `CUresult`. Events made without timing, or not yet
    /// complete, are `CUDA_ERROR_INVALID_HANDLE` or `CUDA_ERROR_NOT_READY`.
    pub fn elapsed_ms_since(&self, start: &Event) -> CudaResult<f32> {
        let mut ms = 0.0;
        // SAFETY: both handles are valid; ms is an out-pointer.
        check("cuEventElapsedTime", unsafe {
            sys::cuEventElapsedTime(&mut ms, start.0, self.0)
        })?;
        Ok(ms)
    }

    /// The raw handle.
    pub fn raw(&self) -> CUevent {
        self.0
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: the handle is ours; destroying a recorded event that has
        // not completed is allowed (resources are released on completion).
        unsafe { sys::cuEventDestroy_v2(self.0) };
    }
}

/// Queues `cuStreamWaitEvent(stream, event)`: work queued on `stream`
/// afterwards waits on the device until `event` has completed; the host
/// does not wait.
///
/// # Safety
/// `stream` must be a live stream (or null, the legacy default stream) and
/// `event` a live event; both must stay alive until the wait is queued
/// (the call returns after queuing it).
pub(crate) unsafe fn stream_wait_event(stream: CUstream, event: CUevent) -> CudaResult<()> {
    // SAFETY: per the caller's guarantee.
    check("cuStreamWaitEvent", unsafe {
        sys::cuStreamWaitEvent(stream, event, 0)
    })
}
