//! Memory: registering host memory, driver-pinned and device allocations,
//! copies between them, and where a device pointer lies.

use std::ffi::c_void;

use cudarc::driver::sys;

use super::context::{ensure_context, CUcontext, ContextGuard};
use super::{check, driver_version, CudaError, CudaResult};
use cudarc::driver::sys::{CUdeviceptr, CUstream};

/// `CU_MEMHOSTREGISTER_PORTABLE`: pinned for every context.
pub const HOST_REGISTER_PORTABLE: u32 = sys::CU_MEMHOSTREGISTER_PORTABLE;

/// Registers (page-locks for DMA) host memory with `cuMemHostRegister`.
///
/// # Safety
/// `ptr..ptr+len` must be a mapped host range that stays mapped until
/// [`host_unregister`] is called on `ptr`.
pub(crate) unsafe fn host_register(ptr: *mut c_void, len: usize, flags: u32) -> CudaResult<()> {
    driver_version()?;
    ensure_context()?;
    // SAFETY: the caller guarantees the range is mapped.
    check("cuMemHostRegister", unsafe {
        sys::cuMemHostRegister_v2(ptr, len, flags)
    })
}

/// Unregisters memory registered with [`host_register`].
///
/// # Safety
/// `ptr` must be the start of a range registered with [`host_register`], and
/// no copy may still be reading or writing it.
pub(crate) unsafe fn host_unregister(ptr: *mut c_void) -> CudaResult<()> {
    driver_version()?;
    ensure_context()?;
    // SAFETY: per the caller's guarantee.
    check("cuMemHostUnregister", unsafe {
        sys::cuMemHostUnregister(ptr)
    })
}

/// The flags the driver holds for a pinned host pointer (`cuMemHostGetFlags`).
///
/// # Errors
///
/// [`CudaError::NoDriver`] without a usable driver (or with `NUMAPIN_NO_CUDA`
/// set), [`CudaError::Call`] naming the driver call that failed, with its
/// `CUresult`. Memory the driver did not pin is `CUDA_ERROR_INVALID_VALUE`.
pub fn host_get_flags(ptr: *const c_void) -> CudaResult<u32> {
    driver_version()?;
    ensure_context()?;
    let mut flags = 0;
    // SAFETY: the driver only looks the pointer up; flags is an out-pointer.
    check("cuMemHostGetFlags", unsafe {
        sys::cuMemHostGetFlags(&mut flags, ptr as *mut c_void)
    })?;
    Ok(flags)
}

/// `CU_MEMHOSTREGISTER_DEVICEMAP`: the range is mapped into the device
/// address space (implied with unified addressing; asked for explicitly).
pub const HOST_REGISTER_DEVICEMAP: u32 = sys::CU_MEMHOSTREGISTER_DEVICEMAP;

/// The device pointer of registered or `cuMemAllocHost` memory
/// (`cuMemHostGetDevicePointer`; equal to the host pointer with unified
/// addressing).
///
/// # Errors
///
/// [`CudaError::NoDriver`] without a usable driver (or with `NUMAPIN_NO_CUDA`
/// set), [`CudaError::Call`] naming the driver call that failed, with its
/// `CUresult`. Memory the driver did not pin is `CUDA_ERROR_INVALID_VALUE`.
pub fn host_device_pointer(ptr: *const c_void) -> CudaResult<CUdeviceptr> {
    driver_version()?;
    ensure_context()?;
    let mut d = 0;
    // SAFETY: the driver only looks the pointer up; d is an out-pointer.
    check("cuMemHostGetDevicePointer", unsafe {
        sys::cuMemHostGetDevicePointer_v2(&mut d, ptr as *mut c_void, 0)
    })?;
    Ok(d)
}

/// Device memory from `cuMemAlloc`, freed on drop (a failed free is
/// counted in [`failed_frees`]).
#[derive(Debug)]
pub struct DeviceBuffer {
    ptr: CUdeviceptr,
    len: usize,
    ctx: CUcontext,
}

// SAFETY: a device pointer is an address valid in every thread; the
// wrapper owns the allocation.
unsafe impl Send for DeviceBuffer {}
// SAFETY: &DeviceBuffer only exposes the address.
unsafe impl Sync for DeviceBuffer {}

impl DeviceBuffer {
    /// Allocates `len` bytes on the current context's device.
    ///
    /// # Errors
    ///
    /// [`CudaError::NoDriver`] without a usable driver (or with
    /// `NUMAPIN_NO_CUDA` set), [`CudaError::Call`] naming the driver call that
    /// failed, with its `CUresult`. `CUDA_ERROR_OUT_OF_MEMORY` when the device
    /// is full.
    pub fn new(len: usize) -> CudaResult<DeviceBuffer> {
        driver_version()?;
        ensure_context()?;
        let mut ptr = 0;
        // SAFETY: ptr is a valid out-pointer; a context is current.
        check("cuMemAlloc", unsafe {
            sys::cuMemAlloc_v2(&mut ptr, len.max(1))
        })?;
        let mut ctx = std::ptr::null_mut();
        // SAFETY: ctx is a valid out-pointer; a context is current.
        check("cuCtxGetCurrent", unsafe { sys::cuCtxGetCurrent(&mut ctx) })?;
        Ok(DeviceBuffer { ptr, len, ctx })
    }

    /// The device address.
    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// Bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // Free in the context it was allocated in, whatever the dropping
        // thread has current.
        let guard = ContextGuard::push_context(self.ctx);
        // SAFETY: allocated by cuMemAlloc; cuMemFree synchronises with work
        // still using it.
        record_free(check("cuMemFree", unsafe { sys::cuMemFree_v2(self.ptr) }));
        drop(guard);
    }
}

/// Pinned host memory from `cuMemAllocHost`, freed with `cuMemFreeHost`:
/// the driver's own pinned memory, with no NUMA placement and counted in
/// no budget. Crate-private: the baseline the measurements compare the
/// arenas with, and the memory of [`Backend::HostAllocBound`] regions
/// (allocated under a bind policy); users get pinned memory from a
/// `Runtime`.
///
/// [`Backend::HostAllocBound`]: crate::runtime::Backend::HostAllocBound
#[derive(Debug)]
pub(crate) struct HostAlloc {
    ptr: *mut c_void,
    len: usize,
}

// SAFETY: the wrapper owns the allocation; the pointer is an address.
unsafe impl Send for HostAlloc {}
// SAFETY: &HostAlloc only exposes the address.
unsafe impl Sync for HostAlloc {}

impl HostAlloc {
    /// Allocates `len` bytes of pinned host memory in the current context.
    #[cfg(feature = "measure")]
    pub(crate) fn new(len: usize) -> CudaResult<HostAlloc> {
        driver_version()?;
        ensure_context()?;
        let mut ptr = std::ptr::null_mut();
        // SAFETY: ptr is a valid out-pointer; a context is current.
        check("cuMemAllocHost", unsafe {
            sys::cuMemAllocHost_v2(&mut ptr, len.max(1))
        })?;
        Ok(HostAlloc { ptr, len })
    }

    /// Allocates with `cuMemHostAlloc` and `flags` (`CU_MEMHOSTALLOC_*`).
    pub(crate) fn with_flags(len: usize, flags: u32) -> CudaResult<HostAlloc> {
        driver_version()?;
        ensure_context()?;
        let mut ptr = std::ptr::null_mut();
        // SAFETY: ptr is a valid out-pointer; a context is current.
        check("cuMemHostAlloc", unsafe {
            sys::cuMemHostAlloc(&mut ptr, len.max(1), flags)
        })?;
        Ok(HostAlloc { ptr, len })
    }

    /// The first byte.
    pub(crate) fn ptr(&self) -> *mut c_void {
        self.ptr
    }

    /// Bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Frees the memory now, returning `cuMemFreeHost`'s result (dropping
    /// it frees too, and records a failure in [`failed_frees`]).
    #[cfg(feature = "measure")]
    pub(crate) fn free(self) -> CudaResult<()> {
        let r = self.free_now();
        std::mem::forget(self);
        r
    }

    fn free_now(&self) -> CudaResult<()> {
        // SAFETY: allocated by cuMemAllocHost/cuMemHostAlloc; `free` and
        // `drop` each run once per value and never both.
        check("cuMemFreeHost", unsafe { sys::cuMemFreeHost(self.ptr) })
    }
}

impl Drop for HostAlloc {
    fn drop(&mut self) {
        record_free(self.free_now());
    }
}

/// Driver frees that failed where nothing could return the error (a
/// `Drop`): how many since the process started, and the last one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FailedFrees {
    /// Failed frees (`cuMemFree`, `cuMemFreeHost`).
    pub count: u64,
    /// The last failure.
    pub last: Option<CudaError>,
}

static FAILED_FREES: std::sync::Mutex<FailedFrees> = std::sync::Mutex::new(FailedFrees {
    count: 0,
    last: None,
});

/// Records the result of a free made in a `Drop`.
pub(crate) fn record_free(r: CudaResult<()>) {
    if let Err(e) = r {
        let mut f = FAILED_FREES.lock().unwrap_or_else(|p| p.into_inner());
        f.count += 1;
        f.last = Some(e);
    }
}

/// The driver frees that failed when a [`DeviceBuffer`] (or numapin's own
/// driver memory) was dropped: a drop cannot return an error, so each
/// failure is counted here instead of being lost. A failed free usually
/// means the context was already torn down or a sticky error killed it.
pub fn failed_frees() -> FailedFrees {
    FAILED_FREES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
}

/// Queues a host-to-device copy of `len` bytes on `stream`.
///
/// # Safety
/// `src..src+len` must stay mapped and unchanged, and `dst..dst+len` be
/// device memory of the stream's context, until the copy completes (record
/// an [`Event`](super::stream::Event) after it and wait for it). For the copy to be asynchronous
/// the host range must be pinned (registered or `cuMemAllocHost`).
///
/// # Errors
///
/// [`CudaError::NoDriver`] without a usable driver (or with `NUMAPIN_NO_CUDA`
/// set), [`CudaError::Call`] naming the driver call that failed, with its
/// `CUresult`.
pub unsafe fn memcpy_htod_async(
    dst: CUdeviceptr,
    src: *const c_void,
    len: usize,
    stream: CUstream,
) -> CudaResult<()> {
    driver_version()?;
    // SAFETY: per the caller's guarantee.
    check("cuMemcpyHtoDAsync", unsafe {
        sys::cuMemcpyHtoDAsync_v2(dst, src, len, stream)
    })
}

/// Queues a device-to-host copy of `len` bytes on `stream`.
///
/// # Safety
/// `dst..dst+len` must stay mapped and be neither read nor written by the
/// host, and `src..src+len` be device memory of the stream's context, until
/// the copy completes.
///
/// # Errors
///
/// [`CudaError::NoDriver`] without a usable driver (or with `NUMAPIN_NO_CUDA`
/// set), [`CudaError::Call`] naming the driver call that failed, with its
/// `CUresult`.
pub unsafe fn memcpy_dtoh_async(
    dst: *mut c_void,
    src: CUdeviceptr,
    len: usize,
    stream: CUstream,
) -> CudaResult<()> {
    driver_version()?;
    // SAFETY: per the caller's guarantee.
    check("cuMemcpyDtoHAsync", unsafe {
        sys::cuMemcpyDtoHAsync_v2(dst, src, len, stream)
    })
}

/// Copies `len` bytes from host to device synchronously (`cuMemcpyHtoD`;
/// from pageable memory the driver stages it through its own buffers).
///
/// # Safety
/// `src..src+len` must be readable host memory and `dst..dst+len` device
/// memory of the current context.
///
/// # Errors
///
/// [`CudaError::NoDriver`] without a usable driver (or with `NUMAPIN_NO_CUDA`
/// set), [`CudaError::Call`] naming the driver call that failed, with its
/// `CUresult`.
pub unsafe fn memcpy_htod(dst: CUdeviceptr, src: *const c_void, len: usize) -> CudaResult<()> {
    driver_version()?;
    // SAFETY: per the caller's guarantee.
    check("cuMemcpyHtoD", unsafe {
        sys::cuMemcpyHtoD_v2(dst, src, len)
    })
}

/// Copies `len` bytes from device to host synchronously (`cuMemcpyDtoH`).
///
/// # Safety
/// `dst..dst+len` must be writable host memory not otherwise accessed
/// during the call, and `src..src+len` device memory of the current
/// context.
///
/// # Errors
///
/// [`CudaError::NoDriver`] without a usable driver (or with `NUMAPIN_NO_CUDA`
/// set), [`CudaError::Call`] naming the driver call that failed, with its
/// `CUresult`.
pub unsafe fn memcpy_dtoh(dst: *mut c_void, src: CUdeviceptr, len: usize) -> CudaResult<()> {
    driver_version()?;
    // SAFETY: per the caller's guarantee.
    check("cuMemcpyDtoH", unsafe {
        sys::cuMemcpyDtoH_v2(dst, src, len)
    })
}

impl DeviceBuffer {
    /// Sets every byte to `value` (`cuMemsetD8`, synchronous).
    ///
    /// # Errors
    ///
    /// [`CudaError::NoDriver`] without a usable driver (or with
    /// `NUMAPIN_NO_CUDA` set), [`CudaError::Call`] naming the driver call that
    /// failed, with its `CUresult`.
    pub fn memset(&self, value: u8) -> CudaResult<()> {
        let _g = ContextGuard::push_context(self.ctx)?;
        // SAFETY: the range is this allocation.
        check("cuMemsetD8", unsafe {
            sys::cuMemsetD8_v2(self.ptr, value, self.len)
        })
    }

    /// Copies the first `dst.len()` bytes back to the host (synchronous).
    ///
    /// # Errors
    ///
    /// [`CudaError::NoDriver`] without a usable driver (or with
    /// `NUMAPIN_NO_CUDA` set), [`CudaError::Call`] naming the driver call that
    /// failed, with its `CUresult`. `dst` longer than the buffer is
    /// `CUDA_ERROR_INVALID_VALUE`.
    pub fn read(&self, dst: &mut [u8]) -> CudaResult<()> {
        assert!(dst.len() <= self.len, "read past the device buffer");
        let _g = ContextGuard::push_context(self.ctx)?;
        // SAFETY: dst is exclusively borrowed host memory of that length;
        // the source is inside this allocation.
        unsafe { memcpy_dtoh(dst.as_mut_ptr().cast(), self.ptr, dst.len()) }
    }

    /// Copies `src` to the start of the buffer (synchronous).
    ///
    /// # Errors
    ///
    /// [`CudaError::NoDriver`] without a usable driver (or with
    /// `NUMAPIN_NO_CUDA` set), [`CudaError::Call`] naming the driver call that
    /// failed, with its `CUresult`. `src` longer than the buffer is
    /// `CUDA_ERROR_INVALID_VALUE`.
    pub fn write(&self, src: &[u8]) -> CudaResult<()> {
        assert!(src.len() <= self.len, "write past the device buffer");
        let _g = ContextGuard::push_context(self.ctx)?;
        // SAFETY: src is readable host memory of that length; the
        // destination is inside this allocation.
        unsafe { memcpy_htod(self.ptr, src.as_ptr().cast(), src.len()) }
    }
}

/// Where a device pointer lies, from `cuPointerGetAttribute`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DeviceRange {
    /// The CUDA ordinal of the device the memory is on.
    pub ordinal: u32,
    /// First byte of the allocation holding the pointer.
    pub start: CUdeviceptr,
    /// Bytes of that allocation.
    pub size: usize,
}

/// The device allocation holding `ptr`, or an error when `ptr` is not
/// device memory (host memory, managed memory, an unknown address).
pub(crate) fn device_range(ptr: CUdeviceptr) -> CudaResult<DeviceRange> {
    driver_version()?;
    ensure_context()?;
    use sys::CUpointer_attribute as A;
    let mut mem_type: u32 = 0;
    // SAFETY: the attribute is a 32-bit CUmemorytype; the out-pointer is
    // valid. The driver only looks the address up.
    check("cuPointerGetAttribute", unsafe {
        sys::cuPointerGetAttribute(
            (&mut mem_type as *mut u32).cast(),
            A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            ptr,
        )
    })?;
    if mem_type != sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 {
        return Err(CudaError::Call {
            call: "cuPointerGetAttribute",
            name: "NOT_DEVICE_MEMORY".into(),
            description: format!("{ptr:#x} is not device memory (memory type {mem_type})"),
            code: 0,
        });
    }
    let mut ordinal: i32 = 0;
    let mut start: CUdeviceptr = 0;
    let mut size: usize = 0;
    // SAFETY: each out-pointer has the attribute's documented type (int,
    // CUdeviceptr, size_t).
    unsafe {
        check(
            "cuPointerGetAttribute",
            sys::cuPointerGetAttribute(
                (&mut ordinal as *mut i32).cast(),
                A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                ptr,
            ),
        )?;
        check(
            "cuPointerGetAttribute",
            sys::cuPointerGetAttribute(
                (&mut start as *mut CUdeviceptr).cast(),
                A::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                ptr,
            ),
        )?;
        check(
            "cuPointerGetAttribute",
            sys::cuPointerGetAttribute(
                (&mut size as *mut usize).cast(),
                A::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                ptr,
            ),
        )?;
    }
    Ok(DeviceRange {
        // Device memory has a device's ordinal (never negative).
        ordinal: u32::try_from(ordinal).unwrap_or(0),
        start,
        size,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_free_that_fails_in_a_drop_is_counted_not_lost() {
        let before = failed_frees().count;
        record_free(Ok(()));
        let e = CudaError::Call {
            call: "cuMemFreeHost",
            name: "CUDA_ERROR_INVALID_VALUE".into(),
            description: "invalid argument".into(),
            code: 1,
        };
        record_free(Err(e.clone()));
        let after = failed_frees();
        // Other tests may record failures of their own meanwhile.
        assert!(after.count > before, "{after:?}");
        assert!(after.last.is_some());
    }
}
