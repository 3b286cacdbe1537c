//! [`ProcReader`]: one process's files to a [`ProcessSnapshot`].

use std::io;
use std::path::{Path, PathBuf};

use super::attribution::Attribution;
use super::devices::{DeviceFiles, FileKind};
use super::driver::DriverQuery;
use super::identity::{Change, Identity};
use super::publish::{self, Publication};
use super::snapshot::{
    Environment, MemoryUse, OpenGpu, ProcessSnapshot, Threads, Unread, NIC_VARS, RANK_VARS,
};
use super::ProcessError;
use crate::cpulist::CpuList;
use crate::platform::numa_maps::Totals;
use crate::platform::procfs::{self, pid_path};
use crate::topology::Topology;

/// Bounds on what is read of one process; a file past one gives a line in
/// [`ProcessSnapshot::unread`], never an allocation past it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReadLimits {
    /// Descriptors looked at (`/proc/<pid>/fd`).
    pub max_descriptors: usize,
    /// Threads read (`/proc/<pid>/task`).
    pub max_threads: usize,
    /// Lines of `numa_maps` and `maps` (one per mapping; the kernel's
    /// default `vm.max_map_count` is 65,530).
    pub max_map_lines: u64,
    /// Bytes of one line of `numa_maps` or `maps`.
    pub max_line_bytes: usize,
    /// Bytes of `/proc/<pid>/environ`.
    pub max_environ_bytes: usize,
    /// Processes looked at in one pass over `/proc`.
    pub max_processes: usize,
}

impl Default for ReadLimits {
    fn default() -> Self {
        Self {
            max_descriptors: 1 << 20,
            max_threads: 1 << 18,
            max_map_lines: 1 << 22,
            max_line_bytes: 64 << 10,
            max_environ_bytes: 16 << 20,
            max_processes: 1 << 22,
        }
    }
}

with_setters!(ReadLimits {
    with_max_descriptors => max_descriptors: usize,
    with_max_threads => max_threads: usize,
    with_max_map_lines => max_map_lines: u64,
    with_max_line_bytes => max_line_bytes: usize,
    with_max_environ_bytes => max_environ_bytes: usize,
    with_max_processes => max_processes: usize,
});

/// Readings of a process that keeps changing its program or user.
const READS: u32 = 3;

/// Bytes of a command line kept.
const CMDLINE_BYTES: usize = 4 << 10;
/// Bytes of `status`, `comm` and one thread's `stat`.
const SMALL_FILE: usize = 64 << 10;

/// Reads processes under a root: `/proc/<pid>/...` below it (`/` on a live
/// machine; a folder holding a fake or saved `proc/` in tests). Knows which
/// open files are GPUs (see [`crate::procs`]) from the topology and the
/// NVIDIA driver's `proc/driver/nvidia/gpus`, read when it is made; asks
/// the driver's per-GPU process lists (NVML, by default) once per
/// [`scan`](Self::scan) or [`read_pids`](Self::read_pids), while it reads.
#[derive(Debug, Clone)]
pub struct ProcReader {
    pub(super) root: PathBuf,
    pub(super) limits: ReadLimits,
    pub(super) driver: DriverQuery,
    devices: DeviceFiles,
    max_nodes: u32,
}

impl ProcReader {
    /// A reader of this machine's `/proc`, with the GPUs of `topo`.
    pub fn new(topo: &Topology) -> Self {
        Self::with_root(topo, "/")
    }

    /// A reader of `<root>/proc`.
    pub fn with_root(topo: &Topology, root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        Self {
            devices: DeviceFiles::read(topo, &root),
            root,
            limits: ReadLimits::default(),
            driver: DriverQuery::default(),
            max_nodes: crate::topology::limits::MAX_NODES,
        }
    }

    /// The same reader with other limits.
    #[must_use]
    pub fn with_limits(mut self, limits: ReadLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The same reader asking the driver another way: NVML with another
    /// timeout, not at all, or given lists ([`DriverQuery`]).
    #[must_use]
    pub fn with_driver(mut self, driver: DriverQuery) -> Self {
        self.driver = driver;
        self
    }

    /// The root read below.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Why some of the driver's GPU files could not be used (their GPUs'
    /// device files are then GPUs of unknown bus id).
    pub fn notes(&self) -> &[String] {
        &self.devices.notes
    }

    /// Reads process `pid`: everything [`ProcessSnapshot`] holds that this
    /// user may read, the rest listed in [`ProcessSnapshot::unread`]. The
    /// device mappings are read too (`numapin ps --pid`). The driver is not
    /// asked (its GPUs are then by device files:
    /// [`Attribution::default`]); [`read_pids`](Self::read_pids) asks it.
    ///
    /// # Errors
    ///
    /// [`ProcessError::NoSuchProcess`] when there is no such process;
    /// [`ProcessError::Exited`] when it went away while read or is a
    /// zombie; [`ProcessError::Unreadable`] when its `status` cannot be read.
    pub fn read(&self, pid: u32) -> Result<ProcessSnapshot, ProcessError> {
        self.read_with(pid, true, None)
    }

    /// [`ProcReader::read`], reading the mappings only when `maps` is set or
    /// the process has a GPU or the NVIDIA driver open; `first`, the
    /// process's identity when it was first looked at (the scan's look at
    /// its descriptors). A process that `exec`s or changes its user while
    /// read is read again (at most [`READS`] times, then the last reading
    /// says so in [`ProcessSnapshot::unread`]); one whose pid names another
    /// process by the end has exited.
    pub(super) fn read_with(
        &self,
        pid: u32,
        maps: bool,
        first: Option<Identity>,
    ) -> Result<ProcessSnapshot, ProcessError> {
        let mut before = match first {
            Some(i) => i,
            None => self.identity(pid)?,
        };
        let mut attempt = 1;
        loop {
            let mut s = self.read_once(pid, maps)?;
            let after = self.identity(pid).map_err(|_| exited(pid))?;
            match before.change(&after) {
                Change::None => return Ok(s),
                Change::Reused => {
                    return Err(ProcessError::Exited {
                        pid,
                        how: "exited while it was read (its pid now names another process)".into(),
                    })
                }
                Change::Changed(what) if attempt == READS => {
                    s.unread.push(Unread {
                        part: "process".into(),
                        why: format!(
                            "its {what} changed while it was read, {READS} times running: parts may be of its earlier {what}"
                        ),
                        permission: false,
                    });
                    return Ok(s);
                }
                Change::Changed(_) => {
                    before = after;
                    attempt += 1;
                }
            }
        }
    }

    /// One reading of `pid`, from its `status` to its publication.
    fn read_once(&self, pid: u32, maps: bool) -> Result<ProcessSnapshot, ProcessError> {
        let mut s = self.status(pid)?;
        let mut r = PidReader {
            reader: self,
            pid,
            snap: &mut s,
        };
        r.threads()?;
        let stats = r.descriptors()?;
        if maps || r.snap.nvidia_driver || !r.snap.gpus.is_empty() {
            r.mappings()?;
        }
        r.environment()?;
        r.memory()?;
        r.publication(&stats);
        Ok(s)
    }

    /// `pid`'s [`Identity`] now.
    ///
    /// # Errors
    ///
    /// [`ProcessError::NoSuchProcess`] when it is gone.
    pub(super) fn identity(&self, pid: u32) -> Result<Identity, ProcessError> {
        let stat = match procfs::read_capped(&pid_path(&self.root, pid, "stat"), SMALL_FILE) {
            Ok(b) => Some(b),
            Err(e) if procfs::is_gone(&e) && !self.alive(pid) => {
                return Err(ProcessError::NoSuchProcess { pid })
            }
            Err(_) => None,
        };
        let status = procfs::read_capped(&pid_path(&self.root, pid, "status"), SMALL_FILE).ok();
        Ok(Identity::from_files(stat.as_deref(), status.as_deref()))
    }

    pub(super) fn devices(&self) -> &DeviceFiles {
        &self.devices
    }

    pub(super) fn alive(&self, pid: u32) -> bool {
        pid_path(&self.root, pid, "").exists()
    }

    /// The snapshot with what `status`, `comm` and `cmdline` give.
    fn status(&self, pid: u32) -> Result<ProcessSnapshot, ProcessError> {
        let path = pid_path(&self.root, pid, "status");
        let st = match procfs::read_capped(&path, SMALL_FILE) {
            Ok(b) => procfs::parse_status(&b),
            Err(e) if procfs::is_gone(&e) => return Err(ProcessError::NoSuchProcess { pid }),
            Err(e) => return Err(ProcessError::io(&path, e)),
        };
        if st.state == Some('Z') {
            return Err(ProcessError::Exited {
                pid,
                how: "is a zombie (exited, not yet reaped by its parent)".into(),
            });
        }
        let comm = procfs::read_capped(&pid_path(&self.root, pid, "comm"), SMALL_FILE)
            .map(|b| {
                String::from_utf8_lossy(&b)
                    .trim_end_matches('\n')
                    .to_string()
            })
            .ok()
            .or(st.name.clone())
            .unwrap_or_default();
        let cmdline = read_prefix(&pid_path(&self.root, pid, "cmdline"), CMDLINE_BYTES)
            .map(|b| procfs::cmdline_text(&b))
            .unwrap_or_default();
        Ok(ProcessSnapshot {
            pid,
            nspid: st.nspid,
            command: comm,
            cmdline,
            uid: st.uid,
            environment: None,
            gpus: Vec::new(),
            attribution: Attribution::default(),
            nvidia_driver: false,
            allowed_cpus: st.cpus_allowed.as_deref().and_then(cpu_list),
            allowed_nodes: st
                .mems_allowed
                .as_deref()
                .and_then(cpu_list)
                .map(|l| l.iter().collect()),
            threads: Threads::default(),
            memory: None,
            rss_bytes: st.rss,
            locked_bytes: st.locked,
            pinned_bytes: st.pinned,
            numapin: Publication::NotFound,
            unread: Vec::new(),
        })
    }
}

/// A cpulist from a status field, refused when it would list more numbers
/// than a machine has CPUs (checked before building it).
fn cpu_list(text: &str) -> Option<CpuList> {
    let n = CpuList::parse_len(text).ok()?;
    (n <= u64::from(crate::cpulist::MAX_CPUS)).then(|| CpuList::parse(text).ok())?
}

/// The first `cap` bytes of a file.
fn read_prefix(path: &Path, cap: usize) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let mut out = Vec::new();
    std::fs::File::open(path)?
        .take(cap as u64)
        .read_to_end(&mut out)?;
    Ok(out)
}

fn exited(pid: u32) -> ProcessError {
    ProcessError::Exited {
        pid,
        how: "exited while it was read".into(),
    }
}

/// One process being read.
struct PidReader<'a> {
    reader: &'a ProcReader,
    pid: u32,
    snap: &'a mut ProcessSnapshot,
}

impl PidReader<'_> {
    fn path(&self, rest: &str) -> PathBuf {
        pid_path(&self.reader.root, self.pid, rest)
    }

    /// `Ok(Some)` with what was read; `Ok(None)` after noting why a part
    /// could not be read; `Err(Exited)` when the process is gone.
    fn part<T>(
        &mut self,
        part: &str,
        path: &Path,
        r: io::Result<T>,
    ) -> Result<Option<T>, ProcessError> {
        match r {
            Ok(v) => Ok(Some(v)),
            Err(e) if procfs::is_gone(&e) && !self.reader.alive(self.pid) => Err(exited(self.pid)),
            Err(e) => {
                let err = ProcessError::io(path, e);
                self.snap.unread.push(Unread {
                    part: part.into(),
                    why: crate::report::with_causes(&err),
                    permission: err.kind() == crate::ErrorKind::Permission,
                });
                Ok(None)
            }
        }
    }

    /// The CPU each thread last ran on.
    fn threads(&mut self) -> Result<(), ProcessError> {
        let dir = self.path("task");
        let listed = procfs::numeric_entries(&dir, self.reader.limits.max_threads);
        let Some((tids, truncated)) = self.part("threads", &dir, listed)? else {
            return Ok(());
        };
        if truncated {
            self.note_limit("threads", &dir, "threads", self.reader.limits.max_threads);
        }
        for tid in tids {
            let stat = dir.join(tid.to_string()).join("stat");
            // A thread that ended meanwhile is simply not counted.
            let Ok(b) = procfs::read_capped(&stat, SMALL_FILE) else {
                continue;
            };
            if let Some(cpu) = procfs::stat_processor(&b) {
                self.snap.threads.count += 1;
                *self.snap.threads.last_cpu.entry(cpu).or_insert(0) += 1;
            }
        }
        Ok(())
    }

    fn note_limit(&mut self, part: &str, path: &Path, what: &str, limit: usize) {
        self.snap.unread.push(Unread {
            part: part.into(),
            why: format!(
                "{}: more than {limit} {what}: only the first {limit} were read",
                path.display()
            ),
            permission: false,
        });
    }

    /// The GPUs and driver files open; returns the stats memfd links.
    fn descriptors(&mut self) -> Result<Vec<PathBuf>, ProcessError> {
        let dir = self.path("fd");
        let max = self.reader.limits.max_descriptors;
        let listed = procfs::numeric_entries(&dir, max);
        let Some((fds, truncated)) = self.part("descriptors", &dir, listed)? else {
            return Ok(Vec::new());
        };
        if truncated {
            self.note_limit("descriptors", &dir, "descriptors", max);
        }
        let mut stats = Vec::new();
        for fd in fds {
            let link = dir.join(fd.to_string());
            let target = match procfs::link_target(&link) {
                Ok(t) => t,
                Err(e) if procfs::is_gone(&e) => continue,
                Err(e) => {
                    self.part::<()>("descriptors", &link, Err(e))?;
                    break;
                }
            };
            match self.reader.devices.classify(&target) {
                FileKind::Gpu { bus_id, gpu } => self.add_gpu(&target, bus_id, gpu, true),
                FileKind::Driver => self.snap.nvidia_driver = true,
                FileKind::Stats => stats.push(link),
                FileKind::Other => {}
            }
        }
        Ok(stats)
    }

    fn add_gpu(
        &mut self,
        path: &[u8],
        bus_id: Option<String>,
        gpu: Option<crate::GpuIndex>,
        descriptor: bool,
    ) {
        let path = String::from_utf8_lossy(path).into_owned();
        let g = match self.snap.gpus.iter_mut().find(|g| g.path == path) {
            Some(g) => g,
            None => {
                self.snap.gpus.push(OpenGpu {
                    gpu,
                    bus_id,
                    path,
                    descriptor: false,
                    mapped: false,
                });
                self.snap.gpus.last_mut().expect("just pushed")
            }
        };
        if descriptor {
            g.descriptor = true;
        } else {
            g.mapped = true;
        }
    }

    /// GPU device files in the memory map.
    fn mappings(&mut self) -> Result<(), ProcessError> {
        let path = self.path("maps");
        let reader = self.reader;
        let (l, devices) = (&reader.limits, &reader.devices);
        let mut found = Vec::new();
        let r = std::fs::File::open(&path).and_then(|f| {
            procfs::for_each_line(f, l.max_line_bytes, l.max_map_lines, |line| {
                let p = procfs::maps_path(line);
                if p.starts_with(b"/dev/nvidia") || p.starts_with(b"/sys/") {
                    if let FileKind::Gpu { bus_id, gpu } = devices.classify(p) {
                        found.push((p.to_vec(), bus_id, gpu));
                    }
                }
            })
        });
        self.part("mappings", &path, r)?;
        for (p, bus_id, gpu) in found {
            self.add_gpu(&p, bus_id, gpu, false);
        }
        Ok(())
    }

    /// The launcher, CUDA and NIC variables.
    fn environment(&mut self) -> Result<(), ProcessError> {
        let path = self.path("environ");
        let r = procfs::read_capped(&path, self.reader.limits.max_environ_bytes);
        let Some(bytes) = self.part("environment", &path, r)? else {
            return Ok(());
        };
        let cuda = ["CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"];
        let mut env = Environment {
            launcher: procfs::environ_values(&bytes, &RANK_VARS),
            nic: procfs::environ_values(&bytes, &NIC_VARS),
            ..Environment::default()
        };
        for (k, v) in procfs::environ_values(&bytes, &cuda) {
            match k.as_str() {
                "CUDA_VISIBLE_DEVICES" => env.cuda_visible_devices = Some(v),
                _ => env.cuda_device_order = Some(v),
            }
        }
        self.snap.environment = Some(env);
        Ok(())
    }

    /// Bytes per node and the memory policy, line by line.
    fn memory(&mut self) -> Result<(), ProcessError> {
        let path = self.path("numa_maps");
        let reader = self.reader;
        let (l, max_nodes) = (&reader.limits, reader.max_nodes);
        let mut t = Totals::default();
        let r = std::fs::File::open(&path).and_then(|f| {
            procfs::for_each_line(f, l.max_line_bytes, l.max_map_lines, |line| {
                t.add_line(line, max_nodes)
            })
        });
        if self.part("memory", &path, r)?.is_none() {
            return Ok(());
        }
        if t.bad_lines + t.bad_nodes > 0 {
            self.snap.unread.push(Unread {
                part: "memory".into(),
                why: format!(
                    "{}: {} line(s) could not be read and {} count(s) name a node past {max_nodes}: not counted",
                    path.display(),
                    t.bad_lines,
                    t.bad_nodes
                ),
                permission: false,
            });
        }
        self.snap.memory = Some(MemoryUse {
            data: t.data,
            file: t.file,
            policy: t.policy,
            vmas: t.vmas,
        });
        Ok(())
    }

    /// numapin's publication, from the first stats memfd that gives one.
    fn publication(&mut self, links: &[PathBuf]) {
        for link in links {
            let p = publish::read(link, self.pid);
            let read = matches!(p, Publication::Read(_));
            if read || self.snap.numapin == Publication::NotFound {
                self.snap.numapin = p;
            }
            if read {
                return;
            }
        }
    }
}
