//! [`PinnedBuf`]: a buffer lent by a node's arena, and its async copies.

use std::mem::{align_of, size_of, ManuallyDrop};
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};

use super::cache::Cached;
use super::{lock, Lease, NodeArena, RuntimeError};
use crate::platform::cuda::{self, CUdeviceptr, CUstream, Event};

/// A pinned host buffer on one NUMA node, lent by the
/// [`Runtime`](crate::runtime::Runtime).
///
/// It derefs to `[u8]` (its contents are whatever the previous user left:
/// not zeroed), offers typed views of plain old data, and async copies to
/// and from device memory. Dropping it gives the memory back to its node's
/// arena; if an async copy issued through it may still be running, the
/// memory is put aside until the copy's event has completed instead (the
/// drop never blocks).
///
/// # Examples
///
/// ```
/// # use numapin::topology::{CudaMode, ProbeOptions, Topology};
/// use numapin::runtime::{Runtime, RuntimeConfig, Target};
///
/// # let topo = Topology::probe(&ProbeOptions::from_process().with_cuda(CudaMode::Off))?;
/// let rt = Runtime::new(topo, RuntimeConfig::default().with_region_bytes(2 << 20))?;
/// let mut buf = rt.alloc(Target::Host, 4096)?;
/// buf[..4].copy_from_slice(b"numa");                 // a [u8]
/// assert_eq!(&buf[..4], b"numa");
/// buf.as_mut_slice_of::<u32>()[1] = 0xC0FFEE;         // or a slice of any Pod type
/// assert_eq!(buf.as_slice_of::<u32>().len(), 1024);
/// assert_eq!(buf[4..8], 0xC0FFEEu32.to_ne_bytes());
/// // Registered with CUDA when a driver is there: copies from it are async.
/// assert_eq!(buf.device_ptr().is_some(), buf.is_registered());
/// drop(buf); // back to its node's arena
/// # Ok::<(), numapin::Error>(())
/// ```
pub struct PinnedBuf {
    ptr: *mut u8,
    len: usize,
    registered: bool,
    lease: Lease,
    // Taken out by Drop (moved into a thread's cache or back to the arena,
    // so the hot path does no reference counting).
    arena: ManuallyDrop<Arc<NodeArena>>,
    events: Mutex<Vec<Event>>,
}

// SAFETY: the buffer owns its block exclusively (the arena hands each block
// to one PinnedBuf); the arena handle is Send + Sync.
unsafe impl Send for PinnedBuf {}
// SAFETY: &PinnedBuf gives only shared (read) access to the bytes; the
// event list is behind a Mutex.
unsafe impl Sync for PinnedBuf {}

impl std::fmt::Debug for PinnedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedBuf")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("node", &self.arena.node())
            .field("registered", &self.registered)
            .finish()
    }
}

impl PinnedBuf {
    pub(super) fn new(
        ptr: *mut u8,
        len: usize,
        registered: bool,
        lease: Lease,
        arena: Arc<NodeArena>,
    ) -> Self {
        PinnedBuf {
            ptr,
            len,
            registered,
            lease,
            arena: ManuallyDrop::new(arena),
            events: Mutex::new(Vec::new()),
        }
    }

    /// The NUMA node the memory is on.
    pub fn node(&self) -> u32 {
        self.arena.node()
    }

    /// Bytes asked for.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes (never: the arena refuses 0).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes set aside for it (the request rounded up to the alignment).
    pub fn capacity(&self) -> usize {
        crate::num::usize_from(self.lease.size)
    }

    /// The first byte (aligned to at least 4 KiB).
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }

    /// The first byte, for writing.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }

    /// Whether the memory is registered with CUDA (false without a driver
    /// or with registration turned off).
    pub fn is_registered(&self) -> bool {
        self.registered
    }

    /// The address a kernel or copy uses for this memory: with unified
    /// addressing (every 64-bit CUDA platform) a registered host pointer is
    /// its own device pointer. `None` when the memory is not registered.
    pub fn device_ptr(&self) -> Option<CUdeviceptr> {
        self.registered.then_some(self.ptr as CUdeviceptr)
    }

    /// The bytes as a slice of `T` (as many whole `T`s as fit): any
    /// [`bytemuck::Pod`] type, such as the numbers or a `#[derive(Pod)]`
    /// struct.
    pub fn as_slice_of<T: bytemuck::Pod>(&self) -> &[T] {
        debug_assert_eq!(self.ptr as usize % align_of::<T>(), 0);
        // SAFETY: the block is at least 4 KiB-aligned (more than any Pod's
        // alignment, checked above), holds len initialised bytes (mapped
        // memory is zero-filled, then only written through these views), T
        // is valid for any bits, and the shared borrow of self keeps the
        // memory alive and unaliased by &mut.
        unsafe {
            std::slice::from_raw_parts(self.ptr as *const T, self.len / size_of::<T>().max(1))
        }
    }

    /// The bytes as a mutable slice of `T` (as many whole `T`s as fit; see
    /// [`as_slice_of`](Self::as_slice_of)).
    pub fn as_mut_slice_of<T: bytemuck::Pod>(&mut self) -> &mut [T] {
        debug_assert_eq!(self.ptr as usize % align_of::<T>(), 0);
        // SAFETY: as in as_slice_of, with the exclusive borrow of self.
        unsafe {
            std::slice::from_raw_parts_mut(self.ptr as *mut T, self.len / size_of::<T>().max(1))
        }
    }

    fn copy_check(&self, what: &'static str, len: usize) -> Result<(), RuntimeError> {
        if len > self.len {
            return Err(RuntimeError::BadRequest {
                node: self.node(),
                bytes: len as u64,
                problem: format!("{what}: the buffer holds only {} bytes", self.len),
            });
        }
        Ok(())
    }

    fn copy_error(&self, what: &'static str) -> impl Fn(cuda::CudaError) -> RuntimeError {
        let node = self.node();
        move |source| RuntimeError::Copy { node, what, source }
    }

    fn record(&self, what: &'static str, stream: CUstream) -> Result<(), RuntimeError> {
        let event = Event::new(false).map_err(self.copy_error(what))?;
        // SAFETY: the caller of the copy vouched for the stream.
        unsafe { event.record(stream) }.map_err(self.copy_error(what))?;
        let mut events = lock(&self.events);
        // Completed events need not be kept.
        events.retain(|e| !e.is_complete().unwrap_or(true));
        events.push(event);
        Ok(())
    }

    /// Queues a copy of the whole buffer to `dst` on `stream` and records
    /// an event after it; the memory is not reused before that event has
    /// completed, even if the buffer is dropped.
    ///
    /// # Safety
    /// `dst` must be device memory of at least [`len`](Self::len) bytes in
    /// the stream's context, that context must be current on this thread,
    /// and the buffer must not be written until the copy has completed
    /// ([`wait_copies`](Self::wait_copies) or a stream synchronisation).
    ///
    /// # Errors
    ///
    /// [`RuntimeError::Copy`] when the copy or its event cannot be queued.
    pub unsafe fn copy_to_device_async(
        &self,
        dst: CUdeviceptr,
        stream: CUstream,
    ) -> Result<(), RuntimeError> {
        // SAFETY: the caller's guarantee for the whole buffer covers its
        // first len bytes.
        unsafe { self.copy_to_device_range_async(dst, self.len, stream) }
    }

    /// As [`copy_to_device_async`](Self::copy_to_device_async), for the
    /// first `len` bytes.
    ///
    /// # Safety
    /// As for `copy_to_device_async`, with `len` bytes at `dst`.
    ///
    /// # Errors
    ///
    /// [`RuntimeError::BadRequest`] for `len` past the buffer,
    /// [`RuntimeError::Copy`] when the copy or its event cannot be queued.
    pub unsafe fn copy_to_device_range_async(
        &self,
        dst: CUdeviceptr,
        len: usize,
        stream: CUstream,
    ) -> Result<(), RuntimeError> {
        const WHAT: &str = "cuMemcpyHtoDAsync";
        self.copy_check(WHAT, len)?;
        // SAFETY: the source is our block of at least len bytes, kept
        // alive past the copy by the event recorded below; the caller
        // vouches for dst and the stream.
        unsafe { cuda::memcpy_htod_async(dst, self.ptr as *const _, len, stream) }
            .map_err(self.copy_error(WHAT))?;
        self.record(WHAT, stream)
    }

    /// Queues a copy of [`len`](Self::len) bytes from `src` into the buffer
    /// on `stream` and records an event after it (see
    /// [`copy_to_device_async`](Self::copy_to_device_async)).
    ///
    /// # Safety
    /// `src` must be device memory of at least `len` bytes in the stream's
    /// context, that context must be current on this thread, and the
    /// buffer must be neither read nor written until the copy has
    /// completed.
    ///
    /// # Errors
    ///
    /// [`RuntimeError::Copy`] when the copy or its event cannot be queued.
    pub unsafe fn copy_from_device_async(
        &mut self,
        src: CUdeviceptr,
        stream: CUstream,
    ) -> Result<(), RuntimeError> {
        const WHAT: &str = "cuMemcpyDtoHAsync";
        // SAFETY: the destination is our block of len bytes, exclusively
        // borrowed and kept alive past the copy by the event; the caller
        // vouches for src and the stream.
        unsafe { cuda::memcpy_dtoh_async(self.ptr as *mut _, src, self.len, stream) }
            .map_err(self.copy_error(WHAT))?;
        self.record(WHAT, stream)
    }

    /// Whether every copy issued through this buffer has completed (never
    /// blocks).
    pub fn copies_done(&self) -> bool {
        let mut events = lock(&self.events);
        events.retain(|e| !e.is_complete().unwrap_or(true));
        events.is_empty()
    }

    /// Blocks until every copy issued through this buffer has completed.
    ///
    /// # Errors
    ///
    /// [`RuntimeError::Copy`] when waiting on a copy's event fails (a sticky
    /// error of the context).
    pub fn wait_copies(&self) -> Result<(), RuntimeError> {
        let mut events = lock(&self.events);
        for e in events.iter() {
            e.synchronize()
                .map_err(self.copy_error("cuEventSynchronize"))?;
        }
        events.clear();
        Ok(())
    }
}

impl Deref for PinnedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice_of::<u8>()
    }
}

impl DerefMut for PinnedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice_of::<u8>()
    }
}

impl Drop for PinnedBuf {
    fn drop(&mut self) {
        let events = std::mem::take(self.events.get_mut().unwrap_or_else(|p| p.into_inner()));
        // SAFETY: drop runs once, and nothing touches the field after this.
        let arena = unsafe { ManuallyDrop::take(&mut self.arena) };
        NodeArena::give_back(
            Cached {
                ptr: self.ptr,
                lease: self.lease,
                registered: self.registered,
                arena,
            },
            events,
        );
    }
}
