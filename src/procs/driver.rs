//! The driver's own lists of the processes on each GPU (NVML), asked once
//! per pass beside the reading of `/proc`, and each process's
//! [`Attribution`] from them.
//!
//! NVML's pids are the host's (the initial PID namespace; the driver knows
//! no other). A process's `NSpid` (in `status`) lists its pid in each
//! namespace from the one of the `/proc` read down to its own, so the
//! host's pid is its first entry exactly when that `/proc` shows the
//! host's namespace (`kthreadd` is pid 2 there: see
//! [`crate::platform::procfs::shows_host_pids`]). Elsewhere (numapin in a
//! container with its own `/proc`) the host's pids cannot be known, NVML is
//! not asked, and every process is judged by its device files.

use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::attribution::{Attribution, ContextKind, GpuContext, GpuSource};
use super::snapshot::ProcessSnapshot;
use crate::gpu::GpuIndex;
use crate::platform::nvml::{self, Failure, List, Pending};

/// How a [`ProcReader`](super::ProcReader) learns which processes use
/// which GPU, besides their device files.
#[derive(Debug, Clone)]
pub struct DriverQuery(Query);

#[derive(Debug, Clone)]
enum Query {
    Nvml(Duration),
    Off,
    Given(DriverLists),
    #[cfg(test)]
    Fake(nvml::Nvml, Duration),
}

impl DriverQuery {
    /// How long a pass waits for NVML by default.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

    /// Ask NVML (`libnvidia-ml.so.1`, loaded at run time), waiting at most
    /// `timeout` from the start of the pass (it is asked while `/proc` is
    /// read). A query that does not return in time is reported and left
    /// on its thread; the next pass does not start another beside it.
    pub fn nvml(timeout: Duration) -> Self {
        Self(Query::Nvml(timeout))
    }

    /// Ask nothing: every process is judged by its device files.
    pub fn off() -> Self {
        Self(Query::Off)
    }

    /// Use these lists as the driver's answer (lists saved earlier, or a
    /// test's), with the same matching of pids as NVML's.
    pub fn given(lists: DriverLists) -> Self {
        Self(Query::Given(lists))
    }

    /// A fake NVML (the platform's query logic over a test's `Api`).
    #[cfg(test)]
    pub(crate) fn fake(api: std::sync::Arc<dyn nvml::Api>, timeout: Duration) -> Self {
        Self(Query::Fake(nvml::Nvml::new(api), timeout))
    }

    /// Starts asking, for a pass over `<root>/proc`.
    pub(super) fn start(&self, root: &Path) -> Asking {
        let started = Instant::now();
        let host_pids = crate::platform::procfs::shows_host_pids(root);
        let (asked, state) = match &self.0 {
            Query::Off => (
                "off",
                State::Done(Err(Why::new(
                    "NVML not asked",
                    "not asked (device files only)",
                ))),
            ),
            Query::Given(_) if !host_pids => ("given", State::Done(Err(other_namespace()))),
            Query::Given(l) => ("given", State::Done(Ok(l.clone()))),
            _ if !host_pids => ("nvml", State::Done(Err(other_namespace()))),
            Query::Nvml(t) => match nvml::live() {
                Ok(n) => ("nvml", State::Waiting(n.start(), *t)),
                Err(f) => ("nvml", State::Done(Err(failure(&f)))),
            },
            #[cfg(test)]
            Query::Fake(n, t) => ("nvml", State::Waiting(n.start(), *t)),
        };
        Asking {
            asked,
            state,
            host_pids,
            started,
        }
    }
}

impl Default for DriverQuery {
    /// [`DriverQuery::nvml`] with [`DriverQuery::DEFAULT_TIMEOUT`].
    fn default() -> Self {
        Self::nvml(Self::DEFAULT_TIMEOUT)
    }
}

/// Why the driver gave no lists: in a few words for each process, and
/// whole (with what to do) for the report.
#[derive(Debug, Clone)]
struct Why {
    short: String,
    long: String,
}

impl Why {
    fn new(short: impl Into<String>, long: impl Into<String>) -> Self {
        Self {
            short: short.into(),
            long: long.into(),
        }
    }
}

fn other_namespace() -> Why {
    Why::new(
        "this /proc's pids are not the host's, which NVML's are",
        "this /proc shows a PID namespace other than the host's (a container's), and NVML's pids are the host's, which cannot be matched from here: run numapin ps on the host, in a container started with --pid=host, or with --root over the host's /proc",
    )
}

fn failure(f: &Failure) -> Why {
    let short = match f {
        Failure::Disabled => "NVML turned off by NUMAPIN_NO_CUDA".to_string(),
        Failure::Load(_) => "NVML is not available".into(),
        Failure::Init(why) => format!("NVML failed: {why}"),
        Failure::TimedOut(t) => format!("NVML gave no answer within {:.1} s", t.as_secs_f64()),
        Failure::Busy => "an earlier NVML query has not returned".into(),
        Failure::Thread(_) => "NVML's query failed".into(),
    };
    let long = match f {
        Failure::Load(why) => format!("NVML is not available: {why}"),
        other => format!("NVML: {other}"),
    };
    Why { short, long }
}

/// The driver's per-GPU process lists.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DriverLists {
    /// The driver's version (`550.54.15`), when known.
    pub driver_version: Option<String>,
    /// Each GPU the driver sees.
    pub gpus: Vec<DriverGpu>,
    /// How the lists were read (an older call used where a newer one is
    /// missing, the longer struct of some drivers).
    pub notes: Vec<String>,
}

/// One GPU's processes, as the driver lists them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DriverGpu {
    /// Its PCI bus id (`0000:1b:00.0`; NVML's `00000000:1B:00.0`, or a
    /// given list's, is normalised by the pass), when it could be read.
    pub bus_id: Option<String>,
    /// The GPU of the topology with that bus id (filled in by the pass).
    pub gpu: Option<GpuIndex>,
    /// Its device file's minor number (`/dev/nvidiaN`; not a CUDA ordinal).
    pub minor: Option<u32>,
    /// The processes with a context on it.
    pub processes: Vec<DriverProcess>,
    /// Why its lists could not be read (its processes are then unknown).
    pub error: Option<String>,
}

/// A process in a GPU's lists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DriverProcess {
    /// Its pid in the host's PID namespace.
    pub pid: u32,
    /// Its memory on the GPU (`None`: the driver could not say).
    pub used_bytes: Option<u64>,
    /// The lists it is in.
    pub kinds: Vec<ContextKind>,
}

/// What the driver said in one pass.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DriverReport {
    /// `nvml`, `given` or `off`.
    pub asked: String,
    /// The lists, when the driver answered.
    pub lists: Option<DriverLists>,
    /// Why there are none: NVML missing, failing, timing out, not asked,
    /// or unable to match this `/proc`'s pids.
    pub unavailable: Option<String>,
    /// Whether the `/proc` read shows the host's PID namespace (NVML's).
    pub host_pids: bool,
    /// Seconds from the start of the pass until the answer (or until the
    /// pass stopped waiting).
    pub elapsed_s: f64,
    /// The pids the driver lists that are not among the processes read
    /// (not readable by this user, or ended meanwhile).
    pub not_read: Vec<u32>,
}

impl Default for DriverReport {
    fn default() -> Self {
        Self {
            asked: "off".into(),
            lists: None,
            unavailable: Some("not asked (device files only)".into()),
            host_pids: false,
            elapsed_s: 0.0,
            not_read: Vec::new(),
        }
    }
}

/// A pass's question to the driver.
#[derive(Debug)]
pub(super) struct Asking {
    asked: &'static str,
    state: State,
    host_pids: bool,
    started: Instant,
}

#[derive(Debug)]
enum State {
    Waiting(Pending, Duration),
    Done(Result<DriverLists, Why>),
}

impl Asking {
    /// Waits for the answer (until the timeout after the start), then
    /// attributes each process. `gpu_of` gives the topology's GPU of a
    /// bus id.
    pub(super) fn finish(
        self,
        gpu_of: &dyn Fn(&str) -> Option<GpuIndex>,
        processes: &mut [ProcessSnapshot],
    ) -> DriverReport {
        let answer = match self.state {
            State::Done(r) => r,
            State::Waiting(p, timeout) => p.wait(timeout).map(lists).map_err(|f| failure(&f)),
        };
        let elapsed_s = self.started.elapsed().as_secs_f64();
        let mut report = DriverReport {
            asked: self.asked.into(),
            lists: None,
            unavailable: None,
            host_pids: self.host_pids,
            elapsed_s,
            not_read: Vec::new(),
        };
        match answer {
            Ok(mut l) => {
                for g in &mut l.gpus {
                    if let Some(b) = &mut g.bus_id {
                        if let Some(n) = crate::platform::pci::normalize_bus_id(b) {
                            *b = n;
                        }
                    }
                    g.gpu = g.bus_id.as_deref().and_then(gpu_of);
                }
                for s in processes.iter_mut() {
                    s.attribution = attribute(&l, s);
                }
                report.not_read = not_read(&l, processes);
                report.lists = Some(l);
            }
            Err(why) => {
                for s in processes.iter_mut() {
                    s.attribution = Attribution::device_files(why.short.clone());
                }
                report.unavailable = Some(why.long);
            }
        }
        report
    }
}

/// The platform's answer as public lists.
fn lists(a: nvml::Answer) -> DriverLists {
    let kind = |l: &List| match l {
        List::Compute => ContextKind::Compute,
        List::Graphics => ContextKind::Graphics,
        List::Mps => ContextKind::Mps,
    };
    DriverLists {
        driver_version: a.driver_version,
        gpus: a
            .gpus
            .into_iter()
            .map(|g| DriverGpu {
                bus_id: g.bus_id,
                gpu: None,
                minor: g.minor,
                processes: g
                    .processes
                    .into_iter()
                    .map(|p| DriverProcess {
                        pid: p.pid,
                        used_bytes: p.used_bytes,
                        kinds: p.lists.iter().map(kind).collect(),
                    })
                    .collect(),
                error: g.error,
            })
            .collect(),
        notes: a.notes,
    }
}

/// `GPU 3 (0000:47:00.0)`, or the bus id alone.
fn gpu_name(g: &DriverGpu) -> String {
    let bus = g.bus_id.as_deref().unwrap_or("bus id unknown");
    match g.gpu {
        Some(i) => format!("GPU {i} ({bus})"),
        None => bus.to_string(),
    }
}

/// A process's attribution by the lists (whose pids are the host's: the
/// process's first `NSpid` entry, its pid in this `/proc`).
pub(super) fn attribute(l: &DriverLists, s: &ProcessSnapshot) -> Attribution {
    let host_pid = s.nspid.first().copied().unwrap_or(s.pid);
    // A GPU whose lists failed and whose device file it has: what NVML
    // says of it is incomplete there.
    let has_file = |g: &DriverGpu| {
        s.gpus.iter().any(|f| {
            (f.bus_id.is_some() && f.bus_id.as_deref() == g.bus_id.as_deref())
                || (g.gpu.is_some() && f.gpu == g.gpu)
        })
    };
    if let Some(g) = l.gpus.iter().find(|g| g.error.is_some() && has_file(g)) {
        return Attribution::device_files(format!(
            "NVML could not list {}'s processes: {}",
            gpu_name(g),
            g.error.as_deref().unwrap_or_default()
        ));
    }
    let contexts: Vec<GpuContext> = l
        .gpus
        .iter()
        .filter_map(|g| {
            let p = g.processes.iter().find(|p| p.pid == host_pid)?;
            Some(GpuContext {
                gpu: g.gpu,
                bus_id: g.bus_id.clone().unwrap_or_default(),
                used_bytes: p.used_bytes,
                kinds: p.kinds.clone(),
            })
        })
        .collect();
    if contexts.is_empty() {
        return Attribution::device_files(
            "NVML lists no context of it on any GPU (none made yet, or its device files were inherited from the process that forked it)",
        );
    }
    Attribution {
        source: GpuSource::Nvml,
        contexts,
        approximate: None,
    }
}

/// The listed pids that are none of the processes read.
fn not_read(l: &DriverLists, processes: &[ProcessSnapshot]) -> Vec<u32> {
    let read: std::collections::BTreeSet<u32> = processes
        .iter()
        .map(|s| s.nspid.first().copied().unwrap_or(s.pid))
        .collect();
    let mut out: Vec<u32> = l
        .gpus
        .iter()
        .flat_map(|g| g.processes.iter().map(|p| p.pid))
        .filter(|p| !read.contains(p))
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}
