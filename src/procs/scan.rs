//! One pass over the process table: the processes that use a GPU (or
//! numapin), and those that could not be looked at.

use serde::Serialize;

use super::devices::FileKind;
use super::driver::DriverReport;
use super::read::ProcReader;
use super::snapshot::ProcessSnapshot;
use super::ProcessError;
use crate::platform::procfs::{self, pid_path};

/// What one pass found.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Scan {
    /// The processes read, by pid.
    pub processes: Vec<ProcessSnapshot>,
    /// Processes whose descriptors this user may not read: whether they
    /// use a GPU is unknown (never guessed).
    pub unreadable: Vec<Unlisted>,
    /// Processes that went away (or turned out zombies) while read.
    pub exited: Vec<Unlisted>,
    /// Processes looked at.
    pub looked_at: usize,
    /// Whether the process table held more than
    /// [`ReadLimits::max_processes`](super::ReadLimits::max_processes).
    pub truncated: bool,
    /// What the driver's per-GPU process lists said (NVML), which gave
    /// each process's [`attribution`](ProcessSnapshot::attribution).
    pub driver: DriverReport,
}

/// A process that is not in [`Scan::processes`], and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unlisted {
    /// The process id.
    pub pid: u32,
    /// Its command name, when it could still be read.
    pub command: Option<String>,
    /// Its real user id, when it could still be read.
    pub uid: Option<u32>,
    /// Why it is not listed.
    pub why: String,
}

impl ProcReader {
    /// Every process with a GPU, the NVIDIA driver or numapin's
    /// publication open (descriptors), read as [`ProcReader::read`] does
    /// (mappings only for those with the driver or a GPU open), each
    /// attributed its GPUs by the driver's process lists where it answers
    /// ([`Scan::driver`]). Processes
    /// whose descriptors this user may not read are listed as such; those
    /// that end meanwhile are skipped, or listed as exited once known to
    /// use a GPU. On the live `/proc`, this process is left out.
    ///
    /// # Errors
    ///
    /// [`ProcessError::Unreadable`] when `<root>/proc` cannot be listed.
    pub fn scan(&self) -> Result<Scan, ProcessError> {
        let asking = self.driver.start(&self.root);
        let dir = self.root.join("proc");
        let (pids, truncated) = procfs::numeric_entries(&dir, self.limits.max_processes)
            .map_err(|e| ProcessError::io(&dir, e))?;
        let me = (self.root == std::path::Path::new("/")).then(std::process::id);
        let mut scan = Scan {
            looked_at: pids.len(),
            truncated,
            ..Scan::default()
        };
        for pid in pids.into_iter().filter(|&p| Some(p) != me) {
            let Ok(first) = self.identity(pid) else {
                continue;
            };
            match self.uses_a_gpu(pid) {
                Ok(true) => self.add(&mut scan, pid, self.read_with(pid, false, Some(first))),
                Ok(false) => {}
                Err(e) if procfs::is_denied(&e) => scan.unreadable.push(self.unlisted(pid, &e)),
                // Gone, or its folder is not a process's: nothing to list.
                Err(_) => {}
            }
        }
        scan.driver = asking.finish(&|b| self.devices().gpu_of(b), &mut scan.processes);
        Ok(scan)
    }

    /// Reads the processes `pids` (duplicates once), in that order, each
    /// attributed its GPUs by the driver's process lists where it answers
    /// ([`Scan::driver`]).
    ///
    /// # Errors
    ///
    /// [`ProcessError::NoSuchProcess`] for the first pid that does not
    /// exist, checked before any is read; [`ProcessError::Unreadable`] when
    /// a process's `status` cannot be read. A process that ends while read
    /// is listed in [`Scan::exited`].
    pub fn read_pids(&self, pids: &[u32]) -> Result<Scan, ProcessError> {
        let mut seen = std::collections::BTreeSet::new();
        let pids: Vec<u32> = pids.iter().copied().filter(|p| seen.insert(*p)).collect();
        if let Some(&pid) = pids.iter().find(|&&p| !self.alive(p)) {
            return Err(ProcessError::NoSuchProcess { pid });
        }
        let asking = self.driver.start(&self.root);
        let mut scan = Scan {
            looked_at: pids.len(),
            ..Scan::default()
        };
        for pid in pids {
            match self.read_with(pid, true, None) {
                Err(ProcessError::NoSuchProcess { pid }) => scan.exited.push(Unlisted {
                    pid,
                    command: None,
                    uid: None,
                    why: "exited before it was read".into(),
                }),
                r => self.add(&mut scan, pid, r),
            }
        }
        scan.driver = asking.finish(&|b| self.devices().gpu_of(b), &mut scan.processes);
        Ok(scan)
    }

    fn add(&self, scan: &mut Scan, pid: u32, r: Result<ProcessSnapshot, ProcessError>) {
        match r {
            Ok(s) => scan.processes.push(s),
            // It ended between the two looks: nothing to list.
            Err(ProcessError::NoSuchProcess { .. }) => {}
            Err(e @ ProcessError::Exited { .. }) => scan.exited.push(Unlisted {
                pid,
                command: None,
                uid: None,
                why: e.to_string(),
            }),
            Err(e) => scan.unreadable.push(Unlisted {
                pid,
                command: None,
                uid: None,
                why: crate::report::with_causes(&e),
            }),
        }
    }

    /// Whether a descriptor of `pid` is a GPU, the driver or the stats memfd.
    fn uses_a_gpu(&self, pid: u32) -> std::io::Result<bool> {
        let dir = pid_path(&self.root, pid, "fd");
        let (fds, _) = procfs::numeric_entries(&dir, self.limits.max_descriptors)?;
        for fd in fds {
            let target = match procfs::link_target(&dir.join(fd.to_string())) {
                Ok(t) => t,
                Err(e) if procfs::is_gone(&e) => continue,
                Err(e) => return Err(e),
            };
            if self.devices().classify(&target) != FileKind::Other {
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn unlisted(&self, pid: u32, e: &std::io::Error) -> Unlisted {
        let status = procfs::read_capped(&pid_path(&self.root, pid, "status"), 64 << 10)
            .map(|b| procfs::parse_status(&b))
            .unwrap_or_default();
        Unlisted {
            pid,
            command: status.name,
            uid: status.uid,
            why: format!("{}: {e}", pid_path(&self.root, pid, "fd").display()),
        }
    }
}
