//! A fake NVML for tests: GPUs with compute and graphics lists, calls the
//! "library" lacks, the longer `_v3` struct, lists that grow, failing
//! calls, a gate that blocks list calls (a driver that hangs).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use super::{Api, Device, List, Status, Version, INSUFFICIENT_SIZE, MAX_ENTRY};

/// `(pid, bytes)` of a fake list.
pub(crate) type Procs = Vec<(u32, u64)>;

/// A fake NVML: GPUs with their compute and graphics lists.
pub(crate) struct Fake {
    pub(crate) version: &'static str,
    /// `(bus id, compute [(pid, bytes)], graphics [(pid, bytes)])`.
    pub(crate) gpus: Vec<(String, Procs, Procs)>,
    /// Calls the "library" lacks.
    pub(crate) missing: Vec<(List, Version)>,
    /// Bytes per entry this "driver" writes from `_v3`.
    pub(crate) v3_stride: usize,
    /// Processes that start at each list call, for `grow_calls` calls.
    pub(crate) grow_by: AtomicU32,
    pub(crate) grow_calls: AtomicU32,
    /// Processes started so far (by `grow_by`).
    pub(crate) extra: AtomicU32,
    /// List calls made (also those waiting at the gate).
    pub(crate) calls: AtomicU32,
    /// `(GPU index, list, code)` a list call returns.
    pub(crate) fail: Option<(u32, List, u32)>,
    pub(crate) init_fails: Option<u32>,
    /// Calls of init minus calls of shutdown.
    pub(crate) open: AtomicU32,
    /// While set, list calls wait for it to clear.
    pub(crate) gate: Option<Arc<(Mutex<bool>, Condvar)>>,
}

impl Fake {
    pub(crate) fn new(gpus: Vec<(String, Procs, Procs)>) -> Self {
        Self {
            version: "550.54.15",
            gpus,
            missing: Vec::new(),
            v3_stride: 24,
            grow_by: AtomicU32::new(0),
            grow_calls: AtomicU32::new(0),
            extra: AtomicU32::new(0),
            calls: AtomicU32::new(0),
            fail: None,
            init_fails: None,
            open: AtomicU32::new(0),
            gate: None,
        }
    }

    fn stride(&self, v: Version) -> usize {
        match v {
            Version::V3 => self.v3_stride,
            Version::V2 => 24,
            Version::V1 => 16,
        }
    }
}

impl Api for Fake {
    fn init(&self) -> Result<(), Status> {
        if let Some(c) = self.init_fails {
            return Err(Status::Code(c));
        }
        self.open.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn shutdown(&self) {
        self.open.fetch_sub(1, Ordering::SeqCst);
    }

    fn driver_version(&self) -> Result<String, Status> {
        Ok(self.version.into())
    }

    fn count(&self) -> Result<u32, Status> {
        Ok(u32::try_from(self.gpus.len()).unwrap())
    }

    fn device(&self, index: u32) -> Result<Device, Status> {
        Ok(Device(index as usize + 1))
    }

    fn bus_id(&self, d: Device) -> Result<String, Status> {
        Ok(self.gpus[d.0 - 1].0.clone())
    }

    fn minor(&self, d: Device) -> Result<u32, Status> {
        Ok(u32::try_from(d.0).unwrap() + 9)
    }

    fn processes(
        &self,
        d: Device,
        list: List,
        version: Version,
        count: &mut u32,
        buf: Option<&mut [u64]>,
    ) -> Result<(), Status> {
        if self.missing.contains(&(list, version)) {
            return Err(Status::Missing);
        }
        self.calls.fetch_add(1, Ordering::SeqCst);
        if let Some(g) = &self.gate {
            let mut closed = g.0.lock().unwrap();
            while *closed {
                closed = g.1.wait(closed).unwrap();
            }
        }
        let index = u32::try_from(d.0).unwrap() - 1;
        if let Some((i, l, code)) = self.fail {
            if (i, l) == (index, list) {
                return Err(Status::Code(code));
            }
        }
        let (_, compute, graphics) = &self.gpus[index as usize];
        let mut procs = match list {
            List::Compute => compute.clone(),
            List::Graphics => graphics.clone(),
            List::Mps => Vec::new(),
        };
        if self.grow_calls.load(Ordering::SeqCst) > 0 {
            self.grow_calls.fetch_sub(1, Ordering::SeqCst);
            let g = self.grow_by.load(Ordering::SeqCst);
            self.extra.fetch_add(g, Ordering::SeqCst);
        }
        let extra = self.extra.load(Ordering::SeqCst);
        procs.extend((0..extra).map(|k| (90_000 + k, 1)));
        *count = u32::try_from(procs.len()).unwrap();
        let Some(buf) = buf.filter(|b| b.len() * 8 / MAX_ENTRY >= procs.len()) else {
            return if procs.is_empty() {
                Ok(())
            } else {
                Err(Status::Code(INSUFFICIENT_SIZE))
            };
        };
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(buf);
        let stride = self.stride(version);
        for (e, (pid, mem)) in bytes.chunks_exact_mut(stride).zip(&procs) {
            e[..4].copy_from_slice(&pid.to_ne_bytes());
            e[8..16].copy_from_slice(&mem.to_ne_bytes());
            // gpuInstanceId, computeInstanceId: "none" as NVML writes it.
            if stride >= 24 {
                e[16..24].fill(0xff);
            }
        }
        Ok(())
    }

    fn error_string(&self, code: u32) -> Option<String> {
        (code == 4).then(|| "Insufficient Permissions".into())
    }
}
