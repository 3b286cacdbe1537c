//! The CUDA driver API, loaded at run time.
//!
//! numapin builds and runs on machines without CUDA: the driver library
//! (`libcuda.so`) is looked up the first time it is needed, and every entry
//! point here returns [`CudaError::NoDriver`] when it is absent. Only the
//! driver API is used (through `cudarc`'s raw bindings), never the runtime.
//!
//! This is one of numapin's small `unsafe` modules: every block says why it
//! holds. Set `NUMAPIN_NO_CUDA=1` to make numapin behave as if no driver were
//! installed (tests use it to exercise that path on GPU machines).

use std::ffi::{c_void, CStr};
use std::sync::OnceLock;

use cudarc::driver::sys;

pub use sys::{CUcontext, CUdevice, CUdeviceptr, CUevent, CUstream};

/// A CUDA failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CudaError {
    /// The driver library is not installed or could not be initialised.
    #[error("no CUDA driver: {0}")]
    NoDriver(String),
    /// A driver call failed.
    #[error("{call} failed: {name} ({description})")]
    Call {
        /// The driver function.
        call: &'static str,
        /// The error's name, e.g. `CUDA_ERROR_OUT_OF_MEMORY`.
        name: String,
        /// The driver's description of it.
        description: String,
        /// The raw code.
        code: u32,
    },
}

impl CudaError {
    /// The CUDA error name (`CUDA_ERROR_...`), or `NO_DRIVER`.
    pub fn name(&self) -> &str {
        match self {
            CudaError::NoDriver(_) => "NO_DRIVER",
            CudaError::Call { name, .. } => name,
        }
    }
}

/// Result of a driver call.
pub type CudaResult<T> = Result<T, CudaError>;

fn check(call: &'static str, r: sys::CUresult) -> CudaResult<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut name_ptr: *const std::ffi::c_char = std::ptr::null();
    let mut desc_ptr: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: the driver is loaded (we only get a CUresult from it); both
    // functions write a pointer to a static string or leave ours null.
    unsafe {
        sys::cuGetErrorName(r, &mut name_ptr);
        sys::cuGetErrorString(r, &mut desc_ptr);
    }
    let text = |p: *const std::ffi::c_char| {
        if p.is_null() {
            None
        } else {
            // SAFETY: non-null pointers from the driver point to static,
            // NUL-terminated strings.
            Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        }
    };
    Err(CudaError::Call {
        call,
        name: text(name_ptr).unwrap_or_else(|| format!("CUDA error {}", r as u32)),
        description: text(desc_ptr).unwrap_or_default(),
        code: r as u32,
    })
}

static DRIVER: OnceLock<Result<u32, String>> = OnceLock::new();

/// Loads and initialises the driver once; returns its version (`12080` for
/// 12.8) or why it is unavailable.
pub fn driver_version() -> CudaResult<u32> {
    DRIVER
        .get_or_init(|| {
            if std::env::var_os("NUMAPIN_NO_CUDA").is_some_and(|v| v != "0" && !v.is_empty()) {
                return Err("disabled by NUMAPIN_NO_CUDA".into());
            }
            // SAFETY: is_culib_present only tries dlopen on candidate names.
            if !unsafe { sys::is_culib_present() } {
                return Err("libcuda.so was not found (install the NVIDIA driver, or add its folder to LD_LIBRARY_PATH)".into());
            }
            // cudarc panics when a symbol is missing from an old driver:
            // turn that into an error instead.
            let init = std::panic::catch_unwind(|| {
                // SAFETY: cuInit takes flags 0 and has no other precondition.
                let r = unsafe { sys::cuInit(0) };
                check("cuInit", r)?;
                let mut v = 0;
                // SAFETY: v is a valid out-pointer.
                check("cuDriverGetVersion", unsafe { sys::cuDriverGetVersion(&mut v) })?;
                Ok::<u32, CudaError>(v as u32)
            });
            match init {
                Ok(Ok(v)) => Ok(v),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err("the CUDA driver library lacks a required entry point (driver too old)".into()),
            }
        })
        .clone()
        .map_err(CudaError::NoDriver)
}

/// The installed driver's version without initialising it (works when
/// `cuInit` fails for want of a visible device).
fn installed_driver_version() -> Option<u32> {
    if std::env::var_os("NUMAPIN_NO_CUDA").is_some_and(|v| v != "0" && !v.is_empty()) {
        return None;
    }
    // SAFETY: is_culib_present only tries dlopen on candidate names.
    if !unsafe { sys::is_culib_present() } {
        return None;
    }
    crate::panic_guard::catch(|| {
        let mut v = 0;
        // SAFETY: v is a valid out-pointer; cuDriverGetVersion needs no cuInit.
        let r = unsafe { sys::cuDriverGetVersion(&mut v) };
        (r == sys::CUresult::CUDA_SUCCESS).then_some(v as u32)
    })
    .ok()
    .flatten()
}

/// Whether the driver is present and initialised.
pub fn available() -> bool {
    driver_version().is_ok()
}

/// One device as the driver enumerates it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaDevice {
    /// The CUDA ordinal in this process.
    pub ordinal: u32,
    /// PCI bus id, normalised (`0000:07:00.0`).
    pub pci_bus_id: String,
    /// Product name.
    pub name: String,
    /// UUID, `GPU-...` (or `MIG-...` for a MIG instance).
    pub uuid: String,
}

/// What the driver says about the devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Enumeration {
    /// The driver answered.
    Devices {
        /// The driver version.
        driver_version: u32,
        /// The devices, by ordinal.
        devices: Vec<CudaDevice>,
    },
    /// No driver, or it failed.
    Unavailable(String),
}

/// Lists the devices this process sees (after `CUDA_VISIBLE_DEVICES`).
pub fn enumerate() -> Enumeration {
    let version = match driver_version() {
        Ok(v) => v,
        // cuInit says "no device" when CUDA_VISIBLE_DEVICES hides them all:
        // the driver is there and sees nothing.
        Err(e) if e.to_string().contains("CUDA_ERROR_NO_DEVICE") => {
            return match installed_driver_version() {
                Some(v) => Enumeration::Devices {
                    driver_version: v,
                    devices: Vec::new(),
                },
                None => Enumeration::Unavailable(e.to_string()),
            }
        }
        Err(e) => return Enumeration::Unavailable(e.to_string()),
    };
    match list_devices() {
        Ok(devices) => Enumeration::Devices {
            driver_version: version,
            devices,
        },
        // With no visible device (CUDA_VISIBLE_DEVICES="" and the like)
        // cuInit still succeeded; cuDeviceGetCount then says 0.
        Err(e) => Enumeration::Unavailable(e.to_string()),
    }
}

fn list_devices() -> CudaResult<Vec<CudaDevice>> {
    let mut count = 0;
    // SAFETY: count is a valid out-pointer; the driver is initialised.
    check("cuDeviceGetCount", unsafe {
        sys::cuDeviceGetCount(&mut count)
    })?;
    let mut out = Vec::new();
    for ordinal in 0..count.max(0) {
        let dev = device(ordinal as u32)?;
        let mut bus = [0 as std::ffi::c_char; 64];
        // SAFETY: the buffer is 64 bytes and we pass its length.
        check("cuDeviceGetPCIBusId", unsafe {
            sys::cuDeviceGetPCIBusId(bus.as_mut_ptr(), bus.len() as i32, dev)
        })?;
        // SAFETY: the driver NUL-terminates within the given length.
        let bus = unsafe { CStr::from_ptr(bus.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let mut name = [0 as std::ffi::c_char; 256];
        // SAFETY: as above.
        check("cuDeviceGetName", unsafe {
            sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, dev)
        })?;
        // SAFETY: as above.
        let name = unsafe { CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let mut uuid = sys::CUuuid { bytes: [0; 16] };
        // SAFETY: uuid is a valid out-pointer.
        check("cuDeviceGetUuid", unsafe {
            sys::cuDeviceGetUuid_v2(&mut uuid, dev)
        })?;
        out.push(CudaDevice {
            ordinal: ordinal as u32,
            pci_bus_id: crate::topology::normalize_bus_id(&bus).unwrap_or(bus),
            name,
            uuid: format_uuid(&uuid.bytes),
        });
    }
    Ok(out)
}

/// Formats a UUID as `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn format_uuid(b: &[std::ffi::c_char; 16]) -> String {
    let h: Vec<String> = b.iter().map(|x| format!("{:02x}", *x as u8)).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}

/// The driver handle of ordinal `ordinal`.
pub fn device(ordinal: u32) -> CudaResult<CUdevice> {
    driver_version()?;
    let mut dev = 0;
    // SAFETY: dev is a valid out-pointer; the driver is initialised.
    check("cuDeviceGet", unsafe {
        sys::cuDeviceGet(&mut dev, ordinal as i32)
    })?;
    Ok(dev)
}

/// Makes ordinal `ordinal`'s primary context current on this thread
/// (retaining it once per process; primary contexts live until exit).
pub fn set_device(ordinal: u32) -> CudaResult<CUcontext> {
    let ctx = primary_context(ordinal)?;
    // SAFETY: ctx is a retained primary context, valid for the process.
    check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx) })?;
    Ok(ctx)
}

/// Ordinal `ordinal`'s primary context, retained once per process (primary
/// contexts live until exit); does not make it current.
pub fn primary_context(ordinal: u32) -> CudaResult<CUcontext> {
    static CTXS: OnceLock<std::sync::Mutex<Vec<(u32, usize)>>> = OnceLock::new();
    let ctxs = CTXS.get_or_init(Default::default);
    let mut g = ctxs.lock().unwrap_or_else(|p| p.into_inner());
    let ctx = match g.iter().find(|(o, _)| *o == ordinal) {
        Some((_, c)) => *c as CUcontext,
        None => {
            let dev = device(ordinal)?;
            let mut ctx = std::ptr::null_mut();
            // SAFETY: ctx is a valid out-pointer; dev is a valid device.
            check("cuDevicePrimaryCtxRetain", unsafe {
                sys::cuDevicePrimaryCtxRetain(&mut ctx, dev)
            })?;
            g.push((ordinal, ctx as usize));
            ctx
        }
    };
    Ok(ctx)
}

/// Makes a context current on this thread until dropped, then restores the
/// one that was current before (`cuCtxPushCurrent` / `cuCtxPopCurrent`):
/// for work on a GPU from a thread that is not numapin's own, without
/// changing which context the caller had current.
///
/// Not `Send`: it must be dropped on the thread that made it.
#[derive(Debug)]
pub struct ContextGuard(std::marker::PhantomData<*const ()>);

impl ContextGuard {
    /// Pushes ordinal `ordinal`'s primary context.
    pub fn push(ordinal: u32) -> CudaResult<ContextGuard> {
        Self::push_context(primary_context(ordinal)?)
    }

    fn push_context(ctx: CUcontext) -> CudaResult<ContextGuard> {
        // SAFETY: ctx is a retained primary context, valid for the process.
        check("cuCtxPushCurrent", unsafe { sys::cuCtxPushCurrent_v2(ctx) })?;
        Ok(ContextGuard(std::marker::PhantomData))
    }
}

impl Drop for ContextGuard {
    fn drop(&mut self) {
        let mut old = std::ptr::null_mut();
        // SAFETY: pops the context this guard pushed: the guard is not
        // Send, so this runs on the thread that pushed it, and guards on
        // one thread are dropped in reverse order of creation (scopes).
        unsafe { sys::cuCtxPopCurrent_v2(&mut old) };
    }
}

/// Makes some context current (ordinal 0's primary context) when none is,
/// for calls such as `cuMemHostRegister` that need one.
pub fn ensure_context() -> CudaResult<()> {
    let mut cur = std::ptr::null_mut();
    // SAFETY: cur is a valid out-pointer.
    check("cuCtxGetCurrent", unsafe { sys::cuCtxGetCurrent(&mut cur) })?;
    if cur.is_null() {
        set_device(0)?;
    }
    Ok(())
}

/// `CU_MEMHOSTREGISTER_PORTABLE`: pinned for every context.
pub const HOST_REGISTER_PORTABLE: u32 = sys::CU_MEMHOSTREGISTER_PORTABLE;

/// Registers (page-locks for DMA) host memory with `cuMemHostRegister`.
///
/// # Safety
/// `ptr..ptr+len` must be a mapped host range that stays mapped until
/// [`host_unregister`] is called on `ptr`.
pub unsafe fn host_register(ptr: *mut c_void, len: usize, flags: u32) -> CudaResult<()> {
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
pub unsafe fn host_unregister(ptr: *mut c_void) -> CudaResult<()> {
    driver_version()?;
    ensure_context()?;
    // SAFETY: per the caller's guarantee.
    check("cuMemHostUnregister", unsafe {
        sys::cuMemHostUnregister(ptr)
    })
}

/// The flags the driver holds for a pinned host pointer (`cuMemHostGetFlags`).
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
    /// context (see [`set_device`]).
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
    pub unsafe fn record(&self, stream: CUstream) -> CudaResult<()> {
        // SAFETY: per the caller's guarantee; the event is ours.
        check("cuEventRecord", unsafe {
            sys::cuEventRecord(self.0, stream)
        })
    }

    /// Whether the work before the event has completed (`cuEventQuery`;
    /// never blocks).
    pub fn is_complete(&self) -> CudaResult<bool> {
        // SAFETY: the handle is valid until drop.
        let r = unsafe { sys::cuEventQuery(self.0) };
        if r == sys::CUresult::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        check("cuEventQuery", r).map(|()| true)
    }

    /// Blocks until the event has completed.
    pub fn synchronize(&self) -> CudaResult<()> {
        // SAFETY: the handle is valid until drop.
        check("cuEventSynchronize", unsafe {
            sys::cuEventSynchronize(self.0)
        })
    }

    /// Milliseconds between `start` and this event (both timing events,
    /// both completed).
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

/// Device memory from `cuMemAlloc`, freed on drop.
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
        unsafe { sys::cuMemFree_v2(self.ptr) };
        drop(guard);
    }
}

/// Pinned host memory from `cuMemAllocHost`, freed with `cuMemFreeHost` on
/// drop (the baseline numapin's arenas are measured against).
#[derive(Debug)]
pub struct HostAlloc {
    ptr: *mut c_void,
    len: usize,
}

// SAFETY: the wrapper owns the allocation; the pointer is an address.
unsafe impl Send for HostAlloc {}
// SAFETY: &HostAlloc only exposes the address.
unsafe impl Sync for HostAlloc {}

impl HostAlloc {
    /// Allocates `len` bytes of pinned host memory in the current context.
    pub fn new(len: usize) -> CudaResult<HostAlloc> {
        driver_version()?;
        ensure_context()?;
        let mut ptr = std::ptr::null_mut();
        // SAFETY: ptr is a valid out-pointer; a context is current.
        check("cuMemAllocHost", unsafe {
            sys::cuMemAllocHost_v2(&mut ptr, len.max(1))
        })?;
        Ok(HostAlloc { ptr, len })
    }

    /// The first byte.
    pub fn ptr(&self) -> *mut c_void {
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

impl Drop for HostAlloc {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemAllocHost and not freed before.
        unsafe { sys::cuMemFreeHost(self.ptr) };
    }
}

/// Queues a host-to-device copy of `len` bytes on `stream`.
///
/// # Safety
/// `src..src+len` must stay mapped and unchanged, and `dst..dst+len` be
/// device memory of the stream's context, until the copy completes (record
/// an [`Event`] after it and wait for it). For the copy to be asynchronous
/// the host range must be pinned (registered or `cuMemAllocHost`).
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

/// Queues `cuStreamWaitEvent(stream, event)`: work queued on `stream`
/// afterwards waits on the device until `event` has completed; the host
/// does not wait.
///
/// # Safety
/// `stream` must be a live stream (or null, the legacy default stream) and
/// `event` a live event; both must stay alive until the wait is queued
/// (the call returns after queuing it).
pub unsafe fn stream_wait_event(stream: CUstream, event: CUevent) -> CudaResult<()> {
    // SAFETY: per the caller's guarantee.
    check("cuStreamWaitEvent", unsafe {
        sys::cuStreamWaitEvent(stream, event, 0)
    })
}

/// Copies `len` bytes from host to device synchronously (`cuMemcpyHtoD`;
/// from pageable memory the driver stages it through its own buffers).
///
/// # Safety
/// `src..src+len` must be readable host memory and `dst..dst+len` device
/// memory of the current context.
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
pub unsafe fn memcpy_dtoh(dst: *mut c_void, src: CUdeviceptr, len: usize) -> CudaResult<()> {
    driver_version()?;
    // SAFETY: per the caller's guarantee.
    check("cuMemcpyDtoH", unsafe {
        sys::cuMemcpyDtoH_v2(dst, src, len)
    })
}

impl DeviceBuffer {
    /// Sets every byte to `value` (`cuMemsetD8`, synchronous).
    pub fn memset(&self, value: u8) -> CudaResult<()> {
        let _g = ContextGuard::push_context(self.ctx)?;
        // SAFETY: the range is this allocation.
        check("cuMemsetD8", unsafe {
            sys::cuMemsetD8_v2(self.ptr, value, self.len)
        })
    }

    /// Copies the first `dst.len()` bytes back to the host (synchronous).
    pub fn read(&self, dst: &mut [u8]) -> CudaResult<()> {
        assert!(dst.len() <= self.len, "read past the device buffer");
        let _g = ContextGuard::push_context(self.ctx)?;
        // SAFETY: dst is exclusively borrowed host memory of that length;
        // the source is inside this allocation.
        unsafe { memcpy_dtoh(dst.as_mut_ptr().cast(), self.ptr, dst.len()) }
    }

    /// Copies `src` to the start of the buffer (synchronous).
    pub fn write(&self, src: &[u8]) -> CudaResult<()> {
        assert!(src.len() <= self.len, "write past the device buffer");
        let _g = ContextGuard::push_context(self.ctx)?;
        // SAFETY: src is readable host memory of that length; the
        // destination is inside this allocation.
        unsafe { memcpy_htod(self.ptr, src.as_ptr().cast(), src.len()) }
    }
}

/// A device attribute of ordinal `ordinal` (`cuDeviceGetAttribute`).
pub fn device_attribute(ordinal: u32, attr: sys::CUdevice_attribute) -> CudaResult<i32> {
    let dev = device(ordinal)?;
    let mut v = 0;
    // SAFETY: v is a valid out-pointer; dev is a valid device.
    check("cuDeviceGetAttribute", unsafe {
        sys::cuDeviceGetAttribute(&mut v, attr, dev)
    })?;
    Ok(v)
}

/// The number of streaming multiprocessors of ordinal `ordinal`.
pub fn multiprocessor_count(ordinal: u32) -> CudaResult<u32> {
    device_attribute(
        ordinal,
        sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
    )
    .map(|v| v.max(1) as u32)
}

/// Where a device pointer lies, from `cuPointerGetAttribute`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceRange {
    /// The CUDA ordinal of the device the memory is on.
    pub ordinal: u32,
    /// First byte of the allocation holding the pointer.
    pub start: CUdeviceptr,
    /// Bytes of that allocation.
    pub size: usize,
}

/// The device allocation holding `ptr`, or an error when `ptr` is not
/// device memory (host memory, managed memory, an unknown address).
pub fn device_range(ptr: CUdeviceptr) -> CudaResult<DeviceRange> {
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
        ordinal: ordinal.max(0) as u32,
        start,
        size,
    })
}

/// A module loaded from PTX text (`cuModuleLoadData`, JIT-compiled by the
/// driver for the current device), unloaded on drop.
#[derive(Debug)]
pub struct Module {
    raw: sys::CUmodule,
    ctx: CUcontext,
}

// SAFETY: a module handle may be used from any thread of the process; the
// wrapper owns it.
unsafe impl Send for Module {}
// SAFETY: looking up functions and launching them are thread-safe.
unsafe impl Sync for Module {}

impl Module {
    /// Loads `ptx` into ordinal `ordinal`'s primary context.
    pub fn load_ptx(ordinal: u32, ptx: &str) -> CudaResult<Module> {
        let ctx = primary_context(ordinal)?;
        let _g = ContextGuard::push_context(ctx)?;
        let text = std::ffi::CString::new(ptx).map_err(|_| CudaError::Call {
            call: "cuModuleLoadData",
            name: "CUDA_ERROR_INVALID_PTX".into(),
            description: "the PTX text holds a NUL byte".into(),
            code: 0,
        })?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: text is NUL-terminated PTX, alive for the call; raw is a
        // valid out-pointer; the context is current.
        check("cuModuleLoadData", unsafe {
            sys::cuModuleLoadData(&mut raw, text.as_ptr().cast())
        })?;
        Ok(Module { raw, ctx })
    }

    /// The kernel named `name` (its `.entry` name).
    pub fn function(&self, name: &str) -> CudaResult<Function> {
        let c = std::ffi::CString::new(name).map_err(|_| CudaError::Call {
            call: "cuModuleGetFunction",
            name: "CUDA_ERROR_NOT_FOUND".into(),
            description: "a kernel name holds a NUL byte".into(),
            code: 0,
        })?;
        let mut f = std::ptr::null_mut();
        // SAFETY: the module is loaded; c is NUL-terminated; f is a valid
        // out-pointer.
        check("cuModuleGetFunction", unsafe {
            sys::cuModuleGetFunction(&mut f, self.raw, c.as_ptr())
        })?;
        Ok(Function(f))
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        let guard = ContextGuard::push_context(self.ctx);
        // SAFETY: the module is ours; functions taken from it are only
        // used while it lives (Function borrows nothing, so callers keep
        // the module alive: see Function).
        unsafe { sys::cuModuleUnload(self.raw) };
        drop(guard);
    }
}

/// A kernel of a [`Module`]; valid while the module is loaded.
#[derive(Debug, Clone, Copy)]
pub struct Function(sys::CUfunction);

// SAFETY: a function handle is an address usable from any thread.
unsafe impl Send for Function {}
// SAFETY: as above.
unsafe impl Sync for Function {}

impl Function {
    /// Queues the kernel on `stream` with `grid` x `block` threads (one
    /// dimension) and the given parameters (`cuLaunchKernel`).
    ///
    /// # Safety
    /// The module must still be loaded, `stream` must be a live stream of
    /// the module's context, and `params` must point to one value of the
    /// type and size of each kernel parameter, in order; whatever memory
    /// the kernel touches through them must stay valid until it completes.
    pub unsafe fn launch(
        &self,
        grid: u32,
        block: u32,
        stream: CUstream,
        params: &mut [*mut c_void],
    ) -> CudaResult<()> {
        // SAFETY: per the caller's guarantee; params outlives the call
        // (the driver copies the values when the launch is queued).
        check("cuLaunchKernel", unsafe {
            sys::cuLaunchKernel(
                self.0,
                grid.max(1),
                1,
                1,
                block.max(1),
                1,
                1,
                0,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }
}
