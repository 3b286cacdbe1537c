//! NVML (`libnvidia-ml.so.1`), loaded at run time: the driver's own list
//! of the processes on each GPU, with the memory each holds there. This is
//! what tells which GPUs a process works on; its device files cannot (the
//! CUDA driver opens and maps every GPU's `/dev/nvidiaN`).
//!
//! numapin builds and runs without NVML: the library is looked up the
//! first time it is asked for ([`live`]), and a machine without it gets
//! [`Failure::Load`]. `NUMAPIN_NO_CUDA=1` turns it off as it turns CUDA
//! off; `NUMAPIN_NVML_LIBRARY` names another file (tests use a fake one).
//!
//! The traps of the process lists, each handled here:
//! * `nvmlDeviceGet*RunningProcesses_v3` is missing from older drivers:
//!   `_v2` is used then, and the unversioned call (`v1`, a shorter struct)
//!   where `_v2` is missing too.
//! * Drivers 535.43 to 535.86 wrote a longer struct (32 bytes, with
//!   `usedGpuCcProtectedMemory`) from `_v3` under the same name: the buffer
//!   always has room for 32-byte entries, and those drivers' entries are
//!   read as such.
//! * The list can grow between the call that counts and the call that
//!   fills: it is asked again, a few times, with room to spare.
//! * NVML can block (a driver call waits while another process pins
//!   memory): [`Nvml::start`] runs the query on a helper thread and
//!   [`Pending::wait`] gives up at a deadline. A query that never returns
//!   keeps its thread, and the next [`Nvml::start`] answers
//!   [`Failure::Busy`] at once instead of starting another.
//! * NVML's pids are the host's (the initial PID namespace): matching them
//!   with the processes of a `/proc` is the caller's business
//!   ([`crate::procs`]).
//!
//! Everything the library is asked goes through [`Api`], so tests put a
//! fake in its place; [`library`] is the real one and the only `unsafe`.

pub(crate) mod library;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::{Duration, Instant};

/// An NVML device handle (an opaque pointer, kept as an address so that a
/// handle can cross to the query's thread).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Device(pub(crate) usize);

/// Why a call gave nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    /// NVML returned this code (`nvmlReturn_t`).
    Code(u32),
    /// The library lacks this entry point.
    Missing,
}

/// `NVML_ERROR_NOT_SUPPORTED`.
pub(crate) const NOT_SUPPORTED: u32 = 3;
/// `NVML_ERROR_INSUFFICIENT_SIZE`: the buffer was too small; the count
/// says how many entries there are.
pub(crate) const INSUFFICIENT_SIZE: u32 = 7;

/// Which process list of a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum List {
    /// Processes with a compute (CUDA) context.
    Compute,
    /// Processes with a graphics context.
    Graphics,
    /// Clients of the MPS server.
    Mps,
}

impl List {
    /// The three lists, in the order asked.
    pub(crate) const ALL: [List; 3] = [List::Compute, List::Graphics, List::Mps];

    /// The call's name without its version suffix.
    pub(crate) fn call(self) -> &'static str {
        match self {
            List::Compute => "nvmlDeviceGetComputeRunningProcesses",
            List::Graphics => "nvmlDeviceGetGraphicsRunningProcesses",
            List::Mps => "nvmlDeviceGetMPSComputeRunningProcesses",
        }
    }
}

/// Which version of a list call: `_v3`, `_v2`, or the unversioned one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Version {
    /// `_v3` (`nvmlProcessInfo_t`: 24 bytes, 32 on drivers 535.43-535.86).
    V3,
    /// `_v2` (`nvmlProcessInfo_v2_t`: 24 bytes).
    V2,
    /// The unversioned call (`nvmlProcessInfo_v1_t`: 16 bytes).
    V1,
}

impl Version {
    /// Newest first: the order they are tried in.
    pub(crate) const ALL: [Version; 3] = [Version::V3, Version::V2, Version::V1];

    fn suffix(self) -> &'static str {
        match self {
            Version::V3 => "_v3",
            Version::V2 => "_v2",
            Version::V1 => "",
        }
    }
}

/// Bytes of the largest process entry any driver writes: the buffer given
/// to a list call has this much room per entry it is said to hold.
pub(crate) const MAX_ENTRY: usize = 32;

/// Entries asked for at most per list of one GPU (a bound on the buffer:
/// 512 KiB).
pub(crate) const MAX_PROCESSES: u32 = 16_384;

/// GPUs asked at most: as many as a topology holds (1,024, its limit).
pub(crate) const MAX_GPUS: u32 = 1024;

/// `NVML_VALUE_NOT_AVAILABLE` in `usedGpuMemory`: the memory is not known
/// (another user's process without the rights, some virtual GPUs).
const NOT_AVAILABLE: u64 = u64::MAX;

/// The NVML calls numapin makes, one method each (the real library:
/// [`library::Library`]; tests: fakes).
pub(crate) trait Api: Send + Sync {
    /// `nvmlInit_v2`.
    fn init(&self) -> Result<(), Status>;
    /// `nvmlShutdown`.
    fn shutdown(&self);
    /// `nvmlSystemGetDriverVersion` (`550.54.15`).
    fn driver_version(&self) -> Result<String, Status>;
    /// `nvmlDeviceGetCount_v2`.
    fn count(&self) -> Result<u32, Status>;
    /// `nvmlDeviceGetHandleByIndex_v2`.
    fn device(&self, index: u32) -> Result<Device, Status>;
    /// The PCI bus id (`nvmlDeviceGetPciInfo_v3`, else `_v2`), as NVML
    /// prints it (`00000000:1B:00.0`).
    fn bus_id(&self, d: Device) -> Result<String, Status>;
    /// `nvmlDeviceGetMinorNumber`: N of `/dev/nvidiaN`.
    fn minor(&self, d: Device) -> Result<u32, Status>;
    /// One call of a process list. With `buf`, `count` becomes the entries
    /// it has room for (`buf.len() * 8 / MAX_ENTRY`) before the call;
    /// without, 0 (a call that only counts). After the call, `count` is
    /// what NVML set: the entries written, or needed.
    fn processes(
        &self,
        d: Device,
        list: List,
        version: Version,
        count: &mut u32,
        buf: Option<&mut [u64]>,
    ) -> Result<(), Status>;
    /// `nvmlErrorString` of a code, when the library has it.
    fn error_string(&self, code: u32) -> Option<String>;
}

/// One process in a GPU's lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Proc {
    /// Its pid in the host's PID namespace.
    pub pid: u32,
    /// Its memory on the GPU (`None`: NVML could not say).
    pub used_bytes: Option<u64>,
    /// The lists it is in.
    pub lists: Vec<List>,
}

/// One GPU's processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Gpu {
    /// NVML's index.
    pub index: u32,
    /// Its PCI bus id as NVML prints it (`None` when it could not be read).
    pub bus_id: Option<String>,
    /// Its device file's minor number (`/dev/nvidiaN`).
    pub minor: Option<u32>,
    /// Its processes, by pid.
    pub processes: Vec<Proc>,
    /// Why (some of) its lists could not be read.
    pub error: Option<String>,
}

/// What one query found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Answer {
    /// The driver's version, when NVML gives it.
    pub driver_version: Option<String>,
    /// Every GPU NVML sees.
    pub gpus: Vec<Gpu>,
    /// How the lists were read (a call missing, an older one used).
    pub notes: Vec<String>,
}

/// Why a query gave no lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Failure {
    /// `NUMAPIN_NO_CUDA` is set.
    Disabled,
    /// The library could not be loaded, or lacks a call numapin needs.
    Load(String),
    /// `nvmlInit_v2` or `nvmlDeviceGetCount_v2` failed.
    Init(String),
    /// No answer within the timeout; the query's thread is left to finish.
    TimedOut(Duration),
    /// An earlier query has still not returned (its thread waits in NVML):
    /// none is started beside it.
    Busy,
    /// The query's thread could not start, or ended without an answer.
    Thread(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Disabled => write!(f, "turned off by NUMAPIN_NO_CUDA"),
            Failure::Load(why) => write!(f, "{why}"),
            Failure::Init(why) => write!(f, "{why}"),
            Failure::TimedOut(t) => write!(
                f,
                "no answer within {:.1} s (NVML can block while another process pins memory or a GPU resets)",
                t.as_secs_f64()
            ),
            Failure::Busy => write!(
                f,
                "an earlier NVML query of this process has not returned yet (it waits in the driver)"
            ),
            Failure::Thread(why) => write!(f, "the query's thread failed: {why}"),
        }
    }
}

/// `NVML_ERROR_...` for the codes a query can meet.
fn code_name(code: u32) -> &'static str {
    match code {
        1 => "NVML_ERROR_UNINITIALIZED",
        2 => "NVML_ERROR_INVALID_ARGUMENT",
        3 => "NVML_ERROR_NOT_SUPPORTED",
        4 => "NVML_ERROR_NO_PERMISSION",
        6 => "NVML_ERROR_NOT_FOUND",
        7 => "NVML_ERROR_INSUFFICIENT_SIZE",
        9 => "NVML_ERROR_DRIVER_NOT_LOADED",
        10 => "NVML_ERROR_TIMEOUT",
        12 => "NVML_ERROR_LIBRARY_NOT_FOUND",
        13 => "NVML_ERROR_FUNCTION_NOT_FOUND",
        15 => "NVML_ERROR_GPU_IS_LOST",
        17 => "NVML_ERROR_OPERATING_SYSTEM",
        18 => "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
        20 => "NVML_ERROR_MEMORY",
        _ => "NVML error",
    }
}

/// `call failed: NVML_ERROR_NO_PERMISSION (Insufficient Permissions)`.
fn failed(api: &dyn Api, call: &str, s: Status) -> String {
    match s {
        Status::Missing => format!("{call} is missing from the library"),
        Status::Code(c) => {
            let name = code_name(c);
            let name = if name == "NVML error" {
                format!("NVML error {c}")
            } else {
                name.to_string()
            };
            match api.error_string(c) {
                Some(d) if !d.is_empty() => format!("{call} failed: {name} ({d})"),
                _ => format!("{call} failed: {name}"),
            }
        }
    }
}

/// Bytes per entry that a driver's `_v3` writes: 32 on 535.43 up to (not
/// including) 535.98, which wrote the `usedGpuCcProtectedMemory` struct
/// under the old name; 24 elsewhere.
pub(crate) fn v3_stride(driver_version: Option<&str>) -> usize {
    let mut parts = driver_version
        .unwrap_or("")
        .split('.')
        .map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(535), Some(minor)) if (43..98).contains(&minor) => 32,
        _ => 24,
    }
}

/// Reads every GPU's lists: NVML initialised, asked, shut down.
pub(crate) fn read_all(api: &dyn Api) -> Result<Answer, Failure> {
    api.init()
        .map_err(|s| Failure::Init(failed(api, "nvmlInit_v2", s)))?;
    let r = read_initialised(api);
    api.shutdown();
    r
}

fn read_initialised(api: &dyn Api) -> Result<Answer, Failure> {
    let driver_version = api.driver_version().ok();
    let count = api
        .count()
        .map_err(|s| Failure::Init(failed(api, "nvmlDeviceGetCount_v2", s)))?;
    let mut lists = Lists {
        api,
        v3_stride: v3_stride(driver_version.as_deref()),
        chosen: Vec::new(),
        notes: Vec::new(),
    };
    let max = MAX_GPUS;
    if count > max {
        lists.notes.push(format!(
            "NVML counts {count} GPUs: only the first {max} were asked"
        ));
    }
    let gpus = (0..count.min(max)).map(|i| lists.gpu(i)).collect();
    Ok(Answer {
        driver_version,
        gpus,
        notes: lists.notes,
    })
}

/// The list calls of one query: which version each list uses (the first
/// that the library has), and the notes about them.
struct Lists<'a> {
    api: &'a dyn Api,
    v3_stride: usize,
    /// The version found for each list.
    chosen: Vec<(List, Option<Version>)>,
    notes: Vec<String>,
}

impl Lists<'_> {
    fn gpu(&mut self, index: u32) -> Gpu {
        let api = self.api;
        let mut gpu = Gpu {
            index,
            bus_id: None,
            minor: None,
            processes: Vec::new(),
            error: None,
        };
        let d = match api.device(index) {
            Ok(d) => d,
            Err(s) => {
                gpu.error = Some(failed(api, "nvmlDeviceGetHandleByIndex_v2", s));
                return gpu;
            }
        };
        match api.bus_id(d) {
            Ok(b) => gpu.bus_id = Some(b),
            Err(s) => gpu.error = Some(failed(api, "nvmlDeviceGetPciInfo", s)),
        }
        gpu.minor = api.minor(d).ok();
        let mut errors = Vec::new();
        for list in List::ALL {
            match self.list(d, list) {
                Ok(procs) => merge(&mut gpu.processes, procs, list),
                Err(e) => errors.push(e),
            }
        }
        if !errors.is_empty() {
            errors.extend(gpu.error.take());
            gpu.error = Some(errors.join("; "));
        }
        gpu.processes.sort_by_key(|p| p.pid);
        gpu
    }

    /// One list of one GPU, with the first version the library has. A
    /// graphics or MPS list the GPU does not support is empty.
    fn list(&mut self, d: Device, list: List) -> Result<Vec<Proc>, String> {
        let known = self.chosen.iter().find(|(l, _)| *l == list).map(|c| c.1);
        let versions: Vec<Version> = match known {
            Some(Some(v)) => vec![v],
            Some(None) => return self.none_of(list),
            None => Version::ALL.to_vec(),
        };
        for v in versions {
            let stride = match v {
                Version::V3 => self.v3_stride,
                Version::V2 => 24,
                Version::V1 => 16,
            };
            match list_once(self.api, d, list, v, stride) {
                Err(Status::Missing) => continue,
                r => {
                    self.choose(list, Some(v));
                    return match r {
                        Ok(p) => Ok(p),
                        Err(Status::Code(NOT_SUPPORTED)) if list != List::Compute => Ok(Vec::new()),
                        Err(s) => Err(failed(
                            self.api,
                            &format!("{}{}", list.call(), v.suffix()),
                            s,
                        )),
                    };
                }
            }
        }
        self.choose(list, None);
        self.none_of(list)
    }

    fn none_of(&self, list: List) -> Result<Vec<Proc>, String> {
        match list {
            // Old drivers have no MPS list: nothing to read there.
            List::Mps => Ok(Vec::new()),
            _ => Err(format!(
                "{0}_v3, {0}_v2 and {0} are all missing from the library",
                list.call()
            )),
        }
    }

    fn choose(&mut self, list: List, v: Option<Version>) {
        if self.chosen.iter().any(|(l, _)| *l == list) {
            return;
        }
        self.chosen.push((list, v));
        if let Some(v) = v.filter(|&v| v != Version::V3) {
            self.notes.push(format!(
                "{0}_v3 is missing from this driver's NVML: {0}{1} was used",
                list.call(),
                v.suffix()
            ));
        } else if v == Some(Version::V3) && self.v3_stride == 32 && list == List::Compute {
            self.notes.push(
                "this driver (535.43-535.86) writes _v3's longer process struct: read as such"
                    .into(),
            );
        }
    }
}

/// Adds `procs` of `list` to a GPU's processes (a process in two lists,
/// compute and graphics, is one process; its memory is the larger figure).
fn merge(into: &mut Vec<Proc>, procs: Vec<Proc>, list: List) {
    for p in procs {
        match into.iter_mut().find(|q| q.pid == p.pid) {
            Some(q) => {
                q.used_bytes = match (q.used_bytes, p.used_bytes) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    (a, b) => a.or(b),
                };
                if !q.lists.contains(&list) {
                    q.lists.push(list);
                }
            }
            None => into.push(p),
        }
    }
}

/// One list of one GPU with one version: counted, then filled (asked again
/// while it grows, up to 4 times).
fn list_once(
    api: &dyn Api,
    d: Device,
    list: List,
    v: Version,
    stride: usize,
) -> Result<Vec<Proc>, Status> {
    let mut count = 0u32;
    match api.processes(d, list, v, &mut count, None) {
        Ok(()) if count == 0 => return Ok(Vec::new()),
        Ok(()) | Err(Status::Code(INSUFFICIENT_SIZE)) => {}
        Err(s) => return Err(s),
    }
    for _ in 0..4 {
        let room = count.saturating_add(8).min(MAX_PROCESSES);
        let mut buf = vec![0u64; room as usize * MAX_ENTRY / 8];
        let mut n = 0u32;
        match api.processes(d, list, v, &mut n, Some(&mut buf)) {
            Ok(()) => return Ok(parse(&buf, n.min(room), stride, list)),
            Err(Status::Code(INSUFFICIENT_SIZE)) if room < MAX_PROCESSES => count = n.max(room),
            Err(s) => return Err(s),
        }
    }
    Err(Status::Code(INSUFFICIENT_SIZE))
}

/// `n` entries of `stride` bytes: the pid (4 bytes at 0) and the memory
/// (8 bytes at 8) of each, in the machine's byte order.
fn parse(buf: &[u64], n: u32, stride: usize, list: List) -> Vec<Proc> {
    let bytes: &[u8] = bytemuck::cast_slice(buf);
    bytes
        .chunks_exact(stride)
        .take(n as usize)
        .map(|e| {
            let pid = u32::from_ne_bytes([e[0], e[1], e[2], e[3]]);
            let mut m = [0u8; 8];
            m.copy_from_slice(&e[8..16]);
            let used = u64::from_ne_bytes(m);
            Proc {
                pid,
                used_bytes: (used != NOT_AVAILABLE).then_some(used),
                lists: vec![list],
            }
        })
        .collect()
}

/// NVML with one query at a time: the library (or a fake) and whether a
/// query's thread is still out.
#[derive(Clone)]
pub(crate) struct Nvml {
    api: Arc<dyn Api>,
    busy: Arc<AtomicBool>,
}

impl std::fmt::Debug for Nvml {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nvml")
            .field("busy", &self.busy.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// A query under way (or one that could not start).
#[derive(Debug)]
pub(crate) struct Pending {
    rx: Result<mpsc::Receiver<Result<Answer, Failure>>, Failure>,
    started: Instant,
}

impl Nvml {
    /// NVML through `api`.
    pub(crate) fn new(api: Arc<dyn Api>) -> Self {
        Self {
            api,
            busy: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Starts a query on a helper thread, unless an earlier one has still
    /// not returned ([`Failure::Busy`] then, at once).
    pub(crate) fn start(&self) -> Pending {
        let started = Instant::now();
        if self.busy.swap(true, Ordering::AcqRel) {
            return Pending {
                rx: Err(Failure::Busy),
                started,
            };
        }
        let (tx, rx) = mpsc::sync_channel(1);
        let (api, busy) = (Arc::clone(&self.api), Arc::clone(&self.busy));
        let spawned = std::thread::Builder::new()
            .name("numapin-nvml".into())
            .spawn(move || {
                let r = crate::platform::panic_guard::catch(|| read_all(api.as_ref()))
                    .unwrap_or_else(|p| Err(Failure::Thread(format!("NVML panicked: {p}"))));
                busy.store(false, Ordering::Release);
                // The caller may have stopped waiting: nobody to tell then.
                let _ = tx.send(r);
            });
        match spawned {
            Ok(_) => Pending {
                rx: Ok(rx),
                started,
            },
            Err(e) => {
                self.busy.store(false, Ordering::Release);
                Pending {
                    rx: Err(Failure::Thread(e.to_string())),
                    started,
                }
            }
        }
    }
}

impl Pending {
    /// The answer, waiting until `timeout` after the query started.
    pub(crate) fn wait(self, timeout: Duration) -> Result<Answer, Failure> {
        let rx = self.rx?;
        let left = timeout.saturating_sub(self.started.elapsed());
        match rx.recv_timeout(left) {
            Ok(r) => r,
            Err(mpsc::RecvTimeoutError::Timeout) => Err(Failure::TimedOut(timeout)),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                Err(Failure::Thread("it ended without an answer".into()))
            }
        }
    }
}

/// The environment variable naming the NVML library to load instead of
/// `libnvidia-ml.so.1`.
pub(crate) const LIBRARY_ENV: &str = "NUMAPIN_NVML_LIBRARY";

/// This machine's NVML, loaded the first time (`NUMAPIN_NVML_LIBRARY`, else
/// `libnvidia-ml.so.1` from the loader's path).
pub(crate) fn live() -> Result<Nvml, Failure> {
    if std::env::var_os("NUMAPIN_NO_CUDA").is_some_and(|v| v != "0" && !v.is_empty()) {
        return Err(Failure::Disabled);
    }
    static LIVE: OnceLock<Result<Nvml, String>> = OnceLock::new();
    LIVE.get_or_init(|| {
        let name = std::env::var_os(LIBRARY_ENV)
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| library::DEFAULT_NAME.into());
        library::Library::load(&name).map(|l| Nvml::new(Arc::new(l)))
    })
    .clone()
    .map_err(Failure::Load)
}

#[cfg(test)]
pub(crate) mod fake;
#[cfg(test)]
mod tests;
