//! Cold pinning: how long a region of several GiB takes to make from
//! nothing, by each way of making it (`numapin bench --only pinning`, the
//! `pin_cold_*` figures): in one piece or in parts registered while later
//! parts are faulted in, on transparent or hugetlb pages, with the
//! populate and counting threads of each setting; faulting in by touching
//! against `MADV_POPULATE_WRITE` against `MAP_POPULATE`; and
//! `cuMemHostRegister`'s flags. Figures are milliseconds per GiB.

use std::time::Instant;

use super::arena::Stats;
use super::ms_per_gib;
use crate::arena::region::{Region, RegionOptions, StepTimes};
use crate::arena::{Backend, HugePages, RuntimeError};
use crate::platform::{cuda, numa};
use crate::runtime::Runtime;

/// One way of making a region.
#[derive(Debug, Clone, PartialEq)]
pub struct ColdSetting {
    /// Pages: transparent, 2 MiB or 1 GiB hugetlb.
    pub pages: HugePages,
    /// Bytes per registered part (0: one registration after faulting in).
    pub part_bytes: usize,
    /// Populate threads in parts (0: the rule, all but two).
    pub populate_threads: usize,
    /// Counting threads in parts (0: the rule).
    pub verify_threads: usize,
    /// Fault in with `MADV_POPULATE_WRITE` instead of touching.
    pub populate_write: bool,
}

impl ColdSetting {
    /// `thp/parts=256M/threads=14/verify=2/touch`.
    pub fn label(&self) -> String {
        let pages = match self.pages {
            HugePages::Hugetlb2M => "2m",
            HugePages::Hugetlb1G => "1g",
            _ => "thp",
        };
        let parts = if self.part_bytes == 0 {
            "one".to_string()
        } else {
            format!("{}M", self.part_bytes >> 20)
        };
        format!(
            "{pages}/parts={parts}/threads={}/verify={}/{}",
            self.populate_threads,
            self.verify_threads,
            if self.populate_write {
                "populate_write"
            } else {
                "touch"
            }
        )
    }
}

/// The settings compared: one piece (the arena's way until now) against
/// parts of 128 MiB to 1 GiB with several populate thread counts on
/// transparent huge pages, and on hugetlb pages where the node's pools
/// have them (`hugetlb_2m`, `hugetlb_1g`: whether to include them).
pub fn cold_settings(threads: usize, hugetlb_2m: bool, hugetlb_1g: bool) -> Vec<ColdSetting> {
    let s =
        |pages, part_bytes: usize, populate_threads, verify_threads, populate_write| ColdSetting {
            pages,
            part_bytes,
            populate_threads,
            verify_threads,
            populate_write,
        };
    let t = HugePages::Transparent;
    let mut v = vec![s(t, 0, 0, 0, false)];
    let mut counts = vec![
        threads.saturating_sub(2).max(1),
        threads.saturating_sub(4).max(1),
        threads / 2,
        threads,
    ];
    counts.sort_unstable();
    counts.dedup();
    for part in [128usize << 20, 256 << 20, 512 << 20, 1 << 30] {
        for &n in &counts {
            v.push(s(t, part, n, 0, false));
        }
    }
    let best = threads.saturating_sub(2).max(1);
    v.push(s(t, 256 << 20, best, 1, false));
    v.push(s(t, 256 << 20, best, 3, false));
    v.push(s(t, 256 << 20, best, 0, true));
    if hugetlb_2m {
        let h = HugePages::Hugetlb2M;
        v.push(s(h, 0, 0, 0, false));
        for part in [256usize << 20, 512 << 20] {
            v.push(s(h, part, best, 0, false));
        }
    }
    if hugetlb_1g {
        let h = HugePages::Hugetlb1G;
        v.push(s(h, 0, 0, 0, false));
        v.push(s(h, 1 << 30, best, 0, false));
        v.push(s(h, 1 << 30, threads, 0, false));
    }
    v
}

/// What one setting measured (or why it could not be made).
#[derive(Debug, Clone)]
pub struct ColdFigure {
    /// The setting.
    pub setting: ColdSetting,
    /// Wall time of `Region::create`, ms per GiB.
    pub create: Stats,
    /// Each step's time, ms per GiB (in parts they overlap).
    pub steps: Vec<(&'static str, Stats)>,
    /// 4 KiB pages of the last region, and how many were on the node.
    pub pages: (u64, u64),
    /// Bytes of each region.
    pub bytes: usize,
    /// The error of the first failure, when the setting could not be made.
    pub failed: Option<String>,
}

/// Puts the measurement hooks back however the measurement ends.
struct Reset;

impl Drop for Reset {
    fn drop(&mut self) {
        crate::arena::region::set_pipeline_threads(0, 0);
        crate::arena::region::set_populate_write(false);
    }
}

/// The arena's options for a region of `bytes` on `node`, in one piece, on
/// transparent huge pages (each setting changes what it measures).
fn options(rt: &Runtime, node: u32, bytes: usize) -> crate::Result<RegionOptions> {
    Ok(RegionOptions {
        huge_pages: HugePages::Transparent,
        register_part_bytes: 0,
        ..super::pinning::options(rt, node, bytes, Backend::Mapped)?
    })
}

/// Makes and drops a region of `bytes` on `node` with each of `settings`,
/// the settings in turn in each of `reps` rounds (so that a VM's slower
/// first faults do not all land on one setting); one region made first and
/// dropped, untimed. A setting that fails (a hugetlb pool too small) is
/// reported with its error and left out of later rounds.
///
/// # Errors
///
/// [`Error::Runtime`](crate::Error::Runtime) for a node without an arena,
/// or when the untimed first region cannot be made (its step's
/// [`RuntimeError::System`], [`RuntimeError::Memlock`], ...).
pub fn region_create_cold(
    rt: &Runtime,
    node: u32,
    bytes: usize,
    settings: &[ColdSetting],
    reps: usize,
) -> crate::Result<Vec<ColdFigure>> {
    let base = options(rt, node, bytes)?;
    let _reset = Reset;
    drop(Region::create(&base)?);
    let mut create = vec![Vec::new(); settings.len()];
    let mut times: Vec<Vec<StepTimes>> = vec![Vec::new(); settings.len()];
    let mut last = vec![(0u64, 0u64, 0usize); settings.len()];
    let mut failed: Vec<Option<String>> = vec![None; settings.len()];
    for _ in 0..reps.max(1) {
        for (i, s) in settings.iter().enumerate() {
            if failed[i].is_some() {
                continue;
            }
            crate::arena::region::set_pipeline_threads(s.populate_threads, s.verify_threads);
            crate::arena::region::set_populate_write(s.populate_write);
            let o = RegionOptions {
                huge_pages: s.pages,
                register_part_bytes: s.part_bytes,
                size: hugetlb_cap(s.pages, node, bytes),
                ..base.clone()
            };
            let t = Instant::now();
            match Region::create(&o) {
                Ok(r) => {
                    create[i].push(ms_per_gib(t.elapsed(), r.len()));
                    times[i].push(*r.times());
                    last[i] = (
                        (r.len() / crate::arena::region::PAGE) as u64,
                        r.pages_on_node(),
                        r.len(),
                    );
                }
                Err(e) => failed[i] = Some(crate::error::with_causes(&crate::Error::from(e))),
            }
        }
    }
    let names = StepTimes::default().steps().map(|(n, _)| n);
    Ok(settings
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let (pages, on, len) = last[i];
            let steps = names
                .iter()
                .enumerate()
                .filter(|(k, _)| times[i].iter().any(|t| !t.steps()[*k].1.is_zero()))
                .map(|(k, name)| {
                    let v = times[i]
                        .iter()
                        .map(|t| ms_per_gib(t.steps()[k].1, len))
                        .collect();
                    (*name, Stats::of(v))
                })
                .collect();
            ColdFigure {
                setting: s.clone(),
                create: Stats::of(std::mem::take(&mut create[i])),
                steps,
                pages: (pages, on),
                bytes: len,
                failed: failed[i].take(),
            }
        })
        .collect())
}

/// Faulting a region of `bytes` in, alone (no registration): by touching
/// each page and with `MADV_POPULATE_WRITE`, on the arena's populate
/// threads and on one thread, ms per GiB of the populate step; and
/// `MAP_POPULATE` of the same size on one thread under a bind policy for
/// `node` (the kernel faults it in inside `mmap`, before any `madvise`, so
/// with THP in `madvise` mode its pages are 4 KiB).
///
/// # Errors
///
/// [`Error::Runtime`](crate::Error::Runtime): a node without an arena,
/// and [`RuntimeError::System`] naming the step (`mmap`, binding,
/// faulting in) that failed.
pub fn populate_methods(
    rt: &Runtime,
    node: u32,
    bytes: usize,
    reps: usize,
) -> crate::Result<Vec<(String, Stats)>> {
    let mut base = options(rt, node, bytes)?;
    base.register = false;
    let threads = base.populate_threads.max(1);
    let _reset = Reset;
    let ways = [(threads, false), (threads, true), (1, false), (1, true)];
    let mut samples = vec![Vec::new(); ways.len() + 1];
    for _ in 0..reps.max(1) {
        for (i, &(n, write)) in ways.iter().enumerate() {
            crate::arena::region::set_populate_write(write);
            let r = Region::create(&RegionOptions {
                populate_threads: n,
                ..base.clone()
            })?;
            samples[i].push(ms_per_gib(r.times().populate, r.len()));
        }
        samples[ways.len()].push(map_populate_ms_per_gib(node, bytes).map_err(|e| {
            crate::Error::from(RuntimeError::System {
                node,
                size: bytes as u64,
                step: crate::arena::Step::Populate,
                source: e,
            })
        })?);
    }
    let mut out: Vec<(String, Stats)> = ways
        .iter()
        .zip(samples.iter_mut())
        .map(|(&(n, write), v)| {
            let how = if write { "populate_write" } else { "touch" };
            (format!("{how}/threads={n}"), Stats::of(std::mem::take(v)))
        })
        .collect();
    out.push((
        "map_populate/threads=1".into(),
        Stats::of(std::mem::take(&mut samples[ways.len()])),
    ));
    Ok(out)
}

/// `bytes`, or less for hugetlb pages when the node's pool has fewer free
/// pages (a VM may find few free 1 GiB ranges once it runs): what the pool
/// can give, in whole pages, at least one.
fn hugetlb_cap(pages: HugePages, node: u32, bytes: usize) -> usize {
    let page = match pages {
        HugePages::Hugetlb2M => 2usize << 20,
        HugePages::Hugetlb1G => 1 << 30,
        _ => return bytes,
    };
    match crate::platform::hugetlb::availability(std::path::Path::new("/"), node, page as u64) {
        Ok(a) if a.node.free >= 1 => bytes.min(crate::num::usize_from(a.node.free) * page),
        _ => bytes,
    }
}

/// `mmap(MAP_POPULATE)` of `bytes` on a thread of its own whose policy
/// binds it to `node`, ms per GiB (unmapped outside the timing).
fn map_populate_ms_per_gib(node: u32, bytes: usize) -> std::io::Result<f64> {
    std::thread::scope(|s| {
        s.spawn(|| {
            numa::set_mempolicy(numa::Policy::Bind, &[node])?;
            let t = Instant::now();
            let p = numa::map_anonymous_populated(bytes)?;
            let d = t.elapsed();
            // SAFETY: the mapping just made, referenced by nothing else.
            let _ = unsafe { numa::unmap(p, bytes) };
            Ok(ms_per_gib(d, bytes))
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// `cuMemHostRegister` of one faulted-in region of `bytes` on `node` with
/// each flag set, in turn in each of `reps` rounds, ms per GiB (the
/// unregistering is not timed).
///
/// # Errors
///
/// [`Error::Runtime`](crate::Error::Runtime): a node without an arena, the
/// region's errors, and [`RuntimeError::Register`] when
/// `cuMemHostRegister` fails (no driver, a flag the driver refuses).
pub fn register_flags(
    rt: &Runtime,
    node: u32,
    bytes: usize,
    reps: usize,
) -> crate::Result<Vec<(&'static str, Stats)>> {
    let mut o = options(rt, node, bytes)?;
    o.register = false;
    let r = Region::create(&o)?;
    let sets: [(&'static str, u32); 4] = [
        (
            "portable|devicemap",
            cuda::HOST_REGISTER_PORTABLE | cuda::HOST_REGISTER_DEVICEMAP,
        ),
        ("none", 0),
        ("portable", cuda::HOST_REGISTER_PORTABLE),
        ("devicemap", cuda::HOST_REGISTER_DEVICEMAP),
    ];
    let fail = |source| {
        crate::Error::from(RuntimeError::Register {
            node,
            size: r.len() as u64,
            source,
        })
    };
    let mut samples = vec![Vec::new(); sets.len()];
    for _ in 0..reps.max(1) {
        for (i, &(_, flags)) in sets.iter().enumerate() {
            let t = Instant::now();
            // SAFETY: the region stays mapped until it is dropped below,
            // after this registration is undone.
            unsafe { cuda::host_register(r.ptr().cast(), r.len(), flags) }.map_err(fail)?;
            samples[i].push(ms_per_gib(t.elapsed(), r.len()));
            // SAFETY: registered just above; no copy uses it.
            unsafe { cuda::host_unregister(r.ptr().cast()) }.map_err(fail)?;
        }
    }
    Ok(sets
        .iter()
        .zip(samples)
        .map(|(&(name, _), v)| (name, Stats::of(v)))
        .collect())
}
