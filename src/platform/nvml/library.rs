//! The real NVML: `libnvidia-ml.so.1` opened with `dlopen` (through
//! `libloading`) and the few entry points numapin calls, declared by hand
//! from `nvml.h`. The library stays loaded for the life of the process
//! (it is kept in a `static`), so the function pointers taken from it stay
//! valid, on any thread, also in a query thread that never returns.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, OsString};
use std::ptr;

use super::{Api, Device, List, Status, Version, MAX_ENTRY};

/// The name looked up on the loader's path: the driver installs the `.1`
/// name (the unversioned `.so` comes with development packages only).
pub(crate) const DEFAULT_NAME: &str = "libnvidia-ml.so.1";

type Ret = c_int;
type Handle = *mut c_void;
type NoArgFn = unsafe extern "C" fn() -> Ret;
type ErrorStringFn = unsafe extern "C" fn(Ret) -> *const c_char;
type VersionFn = unsafe extern "C" fn(*mut c_char, c_uint) -> Ret;
type CountFn = unsafe extern "C" fn(*mut c_uint) -> Ret;
type HandleFn = unsafe extern "C" fn(c_uint, *mut Handle) -> Ret;
type PciFn = unsafe extern "C" fn(Handle, *mut PciInfo) -> Ret;
type MinorFn = unsafe extern "C" fn(Handle, *mut c_uint) -> Ret;
type ProcessesFn = unsafe extern "C" fn(Handle, *mut c_uint, *mut c_void) -> Ret;

/// `nvmlPciInfo_t` (the same for `_v2` and `_v3`).
#[repr(C)]
struct PciInfo {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_sub_system_id: c_uint,
    bus_id: [c_char; 32],
}

/// The loaded library and its entry points (those it lacks are `None`).
pub(crate) struct Library {
    init: NoArgFn,
    shutdown: NoArgFn,
    count: CountFn,
    handle: HandleFn,
    pci: PciFn,
    error_string: Option<ErrorStringFn>,
    version: Option<VersionFn>,
    minor: Option<MinorFn>,
    /// By [`List`], then by [`Version`].
    processes: [[Option<ProcessesFn>; 3]; 3],
    /// Kept last: dropped after the pointers above (never, in practice:
    /// the library lives in a `static`).
    _lib: libloading::Library,
}

impl Library {
    /// Opens `name` (a file name looked up on the loader's path, or a
    /// path) and finds its entry points.
    pub(crate) fn load(name: &std::ffi::OsStr) -> Result<Self, String> {
        let shown = name.to_string_lossy().into_owned();
        let path: String = OsString::from(name)
            .into_string()
            .map_err(|_| format!("{shown}: not a UTF-8 file name"))?;
        // SAFETY: loading runs the library's initialisers; NVML's (or a
        // test's fake) have no preconditions on the loading process.
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| {
            // libloading's message is "dlopen failed"; dlerror's is its source.
            let why = std::error::Error::source(&e).map_or(e.to_string(), |s| s.to_string());
            format!("{shown} could not be loaded ({why}): install the NVIDIA driver, or add its folder to LD_LIBRARY_PATH")
        })?;
        let missing =
            |what: &str| format!("{shown} lacks {what} (an NVIDIA driver older than 418?)");
        // SAFETY: each symbol is declared with its type in nvml.h: the
        // function pointer types above match those declarations.
        unsafe {
            let pci = get::<PciFn>(&lib, "nvmlDeviceGetPciInfo_v3")
                .or_else(|| get(&lib, "nvmlDeviceGetPciInfo_v2"))
                .ok_or_else(|| missing("nvmlDeviceGetPciInfo_v3/_v2"))?;
            Ok(Self {
                init: get(&lib, "nvmlInit_v2").ok_or_else(|| missing("nvmlInit_v2"))?,
                shutdown: get(&lib, "nvmlShutdown").ok_or_else(|| missing("nvmlShutdown"))?,
                count: get(&lib, "nvmlDeviceGetCount_v2")
                    .ok_or_else(|| missing("nvmlDeviceGetCount_v2"))?,
                handle: get(&lib, "nvmlDeviceGetHandleByIndex_v2")
                    .ok_or_else(|| missing("nvmlDeviceGetHandleByIndex_v2"))?,
                pci,
                error_string: get(&lib, "nvmlErrorString"),
                version: get(&lib, "nvmlSystemGetDriverVersion"),
                minor: get(&lib, "nvmlDeviceGetMinorNumber"),
                processes: List::ALL.map(|l| {
                    Version::ALL.map(|v| {
                        let suffix = match v {
                            Version::V3 => "_v3",
                            Version::V2 => "_v2",
                            Version::V1 => "",
                        };
                        get(&lib, &format!("{}{suffix}", l.call()))
                    })
                }),
                _lib: lib,
            })
        }
    }
}

/// The entry point `name` of `lib`, as a `T`.
///
/// # Safety
///
/// `T` must be the function pointer type the library declares `name` with.
unsafe fn get<T: Copy>(lib: &libloading::Library, name: &str) -> Option<T> {
    // SAFETY: the caller gives the declared type; the pointer is copied
    // out of the Symbol and stays valid while `lib` is loaded, which the
    // Library holding both ensures.
    unsafe { lib.get::<T>(name).ok().map(|s| *s) }
}

fn status(r: Ret) -> Result<(), Status> {
    if r == 0 {
        Ok(())
    } else {
        Err(Status::Code(crate::num::u32_bits(r)))
    }
}

/// A NUL-terminated string in a buffer the library filled.
fn c_text(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| crate::num::c_byte(c))
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

// SAFETY: NVML is thread-safe (its documentation: all calls may be made
// from several threads); the struct holds only function pointers and the
// library's handle.
unsafe impl Send for Library {}
// SAFETY: as above.
unsafe impl Sync for Library {}

impl Api for Library {
    fn init(&self) -> Result<(), Status> {
        // SAFETY: nvmlInit_v2 takes nothing; it may be called repeatedly
        // (NVML counts the calls, nvmlShutdown undoes one).
        status(unsafe { (self.init)() })
    }

    fn shutdown(&self) {
        // SAFETY: called once per successful init.
        let _ = unsafe { (self.shutdown)() };
    }

    fn driver_version(&self) -> Result<String, Status> {
        let f = self.version.ok_or(Status::Missing)?;
        let mut buf = [0 as c_char; 96];
        // SAFETY: the buffer is 96 bytes and its length is passed; NVML
        // writes a NUL-terminated string within it.
        status(unsafe { f(buf.as_mut_ptr(), 96) })?;
        Ok(c_text(&buf))
    }

    fn count(&self) -> Result<u32, Status> {
        let mut n: c_uint = 0;
        // SAFETY: n is a valid out-pointer.
        status(unsafe { (self.count)(&mut n) })?;
        Ok(n)
    }

    fn device(&self, index: u32) -> Result<Device, Status> {
        let mut h: Handle = ptr::null_mut();
        // SAFETY: h is a valid out-pointer.
        status(unsafe { (self.handle)(index, &mut h) })?;
        Ok(Device(h as usize))
    }

    fn bus_id(&self, d: Device) -> Result<String, Status> {
        let mut info = PciInfo {
            bus_id_legacy: [0; 16],
            domain: 0,
            bus: 0,
            device: 0,
            pci_device_id: 0,
            pci_sub_system_id: 0,
            bus_id: [0; 32],
        };
        // SAFETY: the handle came from nvmlDeviceGetHandleByIndex_v2 in
        // this query; info is a valid nvmlPciInfo_t to fill.
        status(unsafe { (self.pci)(d.0 as Handle, &mut info) })?;
        Ok(c_text(&info.bus_id))
    }

    fn minor(&self, d: Device) -> Result<u32, Status> {
        let f = self.minor.ok_or(Status::Missing)?;
        let mut n: c_uint = 0;
        // SAFETY: a handle of this query and a valid out-pointer.
        status(unsafe { f(d.0 as Handle, &mut n) })?;
        Ok(n)
    }

    fn processes(
        &self,
        d: Device,
        list: List,
        version: Version,
        count: &mut u32,
        buf: Option<&mut [u64]>,
    ) -> Result<(), Status> {
        let f = self.processes[list as usize][version as usize].ok_or(Status::Missing)?;
        let infos: *mut c_void = match buf {
            Some(b) => {
                *count = u32::try_from(b.len() * 8 / MAX_ENTRY).unwrap_or(u32::MAX);
                b.as_mut_ptr().cast()
            }
            None => {
                *count = 0;
                ptr::null_mut()
            }
        };
        // SAFETY: a handle of this query; `count` is a valid pointer;
        // `infos` is null with a count of 0 (NVML then only counts), or a
        // buffer of `count * MAX_ENTRY` bytes: room for `count` entries of
        // the largest struct any driver writes (32 bytes), so NVML never
        // writes past it whichever struct it uses.
        status(unsafe { f(d.0 as Handle, count, infos) })
    }

    fn error_string(&self, code: u32) -> Option<String> {
        let f = self.error_string?;
        // SAFETY: nvmlErrorString takes any code and returns a pointer to
        // a static NUL-terminated string (or null).
        let p = unsafe { f(crate::num::i32_bits(code)) };
        if p.is_null() {
            return None;
        }
        // SAFETY: non-null, static and NUL-terminated, as documented.
        Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }
}
