//! The CUDA driver API, loaded at run time.
//!
//! numapin builds and runs on machines without CUDA: the driver library
//! (`libcuda.so`) is looked up the first time it is needed, and every entry
//! point here returns [`CudaError::NoDriver`] when it is absent. Only the
//! driver API is used (through `cudarc`'s raw bindings), never the runtime.
//!
//! Three layers, as in cudarc: the raw bindings (`cudarc::driver::sys`),
//! [`check`] turning a `CUresult` into a [`CudaError`] that keeps the code,
//! and the owning types of the submodules by driver API area: devices and
//! contexts ([`context`]), memory ([`memory`]), host memory the driver
//! places on a NUMA node ([`host_numa`]), streams and events ([`stream`]),
//! kernels ([`module`]).
//!
//! This is one of numapin's small `unsafe` modules: every block says why it
//! holds. Set `NUMAPIN_NO_CUDA=1` to make numapin behave as if no driver were
//! installed (tests use it to exercise that path on GPU machines).

pub(crate) mod context;
pub(crate) mod host_numa;
pub(crate) mod memory;
#[cfg(feature = "measure")]
pub(crate) mod module;
pub(crate) mod stream;

use std::ffi::CStr;
use std::sync::OnceLock;

use cudarc::driver::sys;

pub(crate) use context::device;
#[cfg(feature = "measure")]
pub(crate) use context::{device_attribute, multiprocessor_count};
pub use context::{ensure_context, set_device, ContextGuard};
pub(crate) use memory::{device_range, host_register, host_unregister, HostAlloc};
pub use memory::{
    failed_frees, host_device_pointer, host_get_flags, memcpy_dtoh, memcpy_dtoh_async, memcpy_htod,
    memcpy_htod_async, DeviceBuffer, FailedFrees, HOST_REGISTER_DEVICEMAP, HOST_REGISTER_PORTABLE,
};
#[cfg(feature = "measure")]
pub(crate) use module::{Function, Module};
pub(crate) use stream::stream_wait_event;
pub use stream::{Event, Stream};
pub(crate) use sys::{CUdeviceptr, CUstream};

/// Why the CUDA driver cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NoDriver {
    /// `NUMAPIN_NO_CUDA` is set.
    #[error("disabled by NUMAPIN_NO_CUDA")]
    Disabled,
    /// `libcuda.so` could not be loaded.
    #[error("libcuda.so was not found (install the NVIDIA driver, or add its folder to LD_LIBRARY_PATH)")]
    NotInstalled,
    /// The library lacks an entry point numapin calls.
    #[error("the CUDA driver library lacks a required entry point (driver too old)")]
    TooOld,
    /// `cuInit` (or the version query after it) failed.
    #[error("{0}")]
    Init(Box<CudaError>),
}

/// A CUDA failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// The driver library is not installed or could not be initialised.
    #[error("no CUDA driver: {0}")]
    NoDriver(NoDriver),
    /// A driver call failed.
    #[error("{call} failed: {name} ({description})")]
    Call {
        /// The driver function.
        call: &'static str,
        /// The error's name, e.g. `CUDA_ERROR_OUT_OF_MEMORY`.
        name: String,
        /// The driver's description of it.
        description: String,
        /// The raw `CUresult` code.
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

    /// The `CUresult` code of the failed call (also when `cuInit` failed),
    /// `None` when the driver is missing or was turned off.
    pub fn code(&self) -> Option<u32> {
        match self {
            CudaError::Call { code, .. } => Some(*code),
            CudaError::NoDriver(NoDriver::Init(e)) => e.code(),
            CudaError::NoDriver(_) => None,
        }
    }

    /// Whether the driver is there but this process sees no device
    /// (`CUDA_ERROR_NO_DEVICE`, as when `CUDA_VISIBLE_DEVICES` hides them all).
    pub fn is_no_device(&self) -> bool {
        self.code() == Some(sys::cudaError_enum::CUDA_ERROR_NO_DEVICE as u32)
    }

    /// Whether the error only means that no usable driver is installed.
    pub fn is_no_driver(&self) -> bool {
        matches!(self, CudaError::NoDriver(_))
    }
}

/// Result of a driver call.
pub type CudaResult<T> = Result<T, CudaError>;

/// Turns a `CUresult` into a [`CudaError`] naming `call`.
pub(crate) fn check(call: &'static str, r: sys::CUresult) -> CudaResult<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    Err(call_error(call, r))
}

/// The [`CudaError`] of `call` failing with `r` (not `CUDA_SUCCESS`).
pub(crate) fn call_error(call: &'static str, r: sys::CUresult) -> CudaError {
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
    CudaError::Call {
        call,
        name: text(name_ptr).unwrap_or_else(|| format!("CUDA error {}", r as u32)),
        description: text(desc_ptr).unwrap_or_default(),
        code: r as u32,
    }
}

static DRIVER: OnceLock<Result<u32, NoDriver>> = OnceLock::new();

/// Loads and initialises the driver once; returns its version (`12080` for
/// 12.8) or why it is unavailable.
///
/// # Errors
///
/// [`CudaError::NoDriver`] when the driver cannot be loaded or initialised (or
/// `NUMAPIN_NO_CUDA` is set).
pub fn driver_version() -> CudaResult<u32> {
    DRIVER
        .get_or_init(|| {
            if std::env::var_os("NUMAPIN_NO_CUDA").is_some_and(|v| v != "0" && !v.is_empty()) {
                return Err(NoDriver::Disabled);
            }
            // SAFETY: is_culib_present only tries dlopen on candidate names.
            if !unsafe { sys::is_culib_present() } {
                return Err(NoDriver::NotInstalled);
            }
            // cudarc panics when a symbol is missing from an old driver:
            // turn that into an error instead.
            let init = std::panic::catch_unwind(|| {
                // SAFETY: cuInit takes flags 0 and has no other precondition.
                let r = unsafe { sys::cuInit(0) };
                check("cuInit", r)?;
                let mut v = 0;
                // SAFETY: v is a valid out-pointer.
                check("cuDriverGetVersion", unsafe {
                    sys::cuDriverGetVersion(&mut v)
                })?;
                // A version is positive; a negative one reads as 0 (unknown).
                Ok::<u32, CudaError>(u32::try_from(v).unwrap_or(0))
            });
            match init {
                Ok(Ok(v)) => Ok(v),
                Ok(Err(e)) => Err(NoDriver::Init(Box::new(e))),
                Err(_) => Err(NoDriver::TooOld),
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
    crate::platform::panic_guard::catch(|| {
        let mut v = 0;
        // SAFETY: v is a valid out-pointer; cuDriverGetVersion needs no cuInit.
        let r = unsafe { sys::cuDriverGetVersion(&mut v) };
        (r == sys::CUresult::CUDA_SUCCESS).then(|| u32::try_from(v).unwrap_or(0))
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
pub(crate) struct CudaDevice {
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
pub(crate) enum Enumeration {
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
pub(crate) fn enumerate() -> Enumeration {
    let version = match driver_version() {
        Ok(v) => v,
        // cuInit says "no device" when CUDA_VISIBLE_DEVICES hides them all:
        // the driver is there and sees nothing.
        Err(e) if e.is_no_device() => {
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

/// How many devices this process sees (`cuDeviceGetCount`).
///
/// # Errors
///
/// [`CudaError::NoDriver`] without a usable driver (or with `NUMAPIN_NO_CUDA`
/// set), [`CudaError::Call`] naming the driver call that failed, with its
/// `CUresult`.
pub fn device_count() -> CudaResult<u32> {
    driver_version()?;
    let mut count = 0;
    // SAFETY: count is a valid out-pointer; the driver is initialised.
    check("cuDeviceGetCount", unsafe {
        sys::cuDeviceGetCount(&mut count)
    })?;
    // A count is never negative; one that were would mean no device.
    Ok(u32::try_from(count).unwrap_or(0))
}

fn list_devices() -> CudaResult<Vec<CudaDevice>> {
    let count = device_count()?;
    let mut out = Vec::new();
    for ordinal in 0..count {
        let dev = device(ordinal)?;
        let mut bus = [0 as std::ffi::c_char; 64];
        // SAFETY: the buffer is 64 bytes and we pass its length.
        check("cuDeviceGetPCIBusId", unsafe {
            sys::cuDeviceGetPCIBusId(bus.as_mut_ptr(), 64, dev)
        })?;
        // SAFETY: the driver NUL-terminates within the given length.
        let bus = unsafe { CStr::from_ptr(bus.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let mut name = [0 as std::ffi::c_char; 256];
        // SAFETY: as above.
        check("cuDeviceGetName", unsafe {
            sys::cuDeviceGetName(name.as_mut_ptr(), 256, dev)
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
            ordinal,
            pci_bus_id: crate::platform::pci::normalize_bus_id(&bus).unwrap_or(bus),
            name,
            uuid: format_uuid(&uuid.bytes),
        });
    }
    Ok(out)
}

/// Formats a UUID as `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub(crate) fn format_uuid(b: &[std::ffi::c_char; 16]) -> String {
    let h: Vec<String> = b
        .iter()
        .map(|x| format!("{:02x}", crate::num::c_byte(*x)))
        .collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}
