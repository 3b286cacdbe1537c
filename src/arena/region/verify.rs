//! Step 6: where the region's pages are (`move_pages`, or `numa_maps` when
//! that is refused), judged by the placement policy.

use std::time::{Duration, Instant};

use super::super::{OffNode, RuntimeError, VerifiedBy};
use super::{
    fail_after, step_failed, verify_threads, PageCounts, Region, RegionOptions, Step, PAGE,
};
use crate::platform::{numa, numa_maps};

impl Region {
    /// Counts where the pages are, timed.
    pub(super) fn timed_count(&self) -> (std::io::Result<PageCounts>, Duration) {
        let started = Instant::now();
        (self.count_pages(), started.elapsed())
    }

    /// Step 6, for every backend: counts where the pages are (unless
    /// `counted` already did, beside registration) and judges it by
    /// `o.off_node`.
    pub(super) fn verify(
        mut self,
        o: &RegionOptions,
        counted: Option<(std::io::Result<PageCounts>, Duration)>,
    ) -> Result<Region, RuntimeError> {
        let region = &mut self;
        let len = region.len;
        let system = step_failed(o.node, len);
        let (counts, took) = counted.unwrap_or_else(|| region.timed_count());
        let counts = counts.map_err(|e| system(Step::Verify, e))?;
        region.times.verify = took;
        if region.driver.is_some() && counts.missing == counts.pages {
            // The driver's mapping shows no page to move_pages or
            // numa_maps: nothing to judge.
            region.methods.verified = VerifiedBy::Unverified;
            region.notes.push(format!(
                "placement not verifiable: {} reports none of the driver's pages",
                counts.by.as_str()
            ));
            if fail_after(o, Step::Verify) {
                return Err(system(
                    Step::Verify,
                    std::io::Error::other("failure injected by a test"),
                ));
            }
            return Ok(self);
        }
        region.methods.verified = counts.by;
        let on = counts.on(o.node);
        let elsewhere = counts.elsewhere(o.node);
        let off: u64 = elsewhere.iter().map(|(_, c)| c).sum();
        region.pages_on_node = on;
        region.pages_off_node = off + counts.missing;
        if fail_after(o, Step::Verify) {
            return Err(system(
                Step::Verify,
                std::io::Error::other("failure injected by a test"),
            ));
        }
        if off + counts.missing > 0 && o.off_node == OffNode::Strict {
            return Err(RuntimeError::OffNode {
                node: o.node,
                size: len as u64,
                pages: counts.pages,
                on_node: on,
                elsewhere,
                missing: counts.missing,
                how: region.how(),
            });
        }
        Ok(self)
    }

    /// Where each 4 KiB page of the region is now: `move_pages` (moving
    /// nothing), or, when that is refused, `/proc/self/numa_maps`.
    ///
    /// # Errors
    ///
    /// As [`Region::count_pages_numa_maps`] when `move_pages` is refused, else
    /// as [`Region::count_pages_move_pages`].
    pub fn count_pages(&self) -> std::io::Result<PageCounts> {
        match self.count_pages_move_pages() {
            Err(e) if numa::is_refusal(&e) => self.count_pages_numa_maps(),
            r => r,
        }
    }

    /// Where each 4 KiB page is, from `move_pages` with a null node list
    /// (one status per page; per hugetlb page for hugetlb pages, counted
    /// as the 4 KiB pages it holds), on one thread, or on
    /// [`VERIFY_THREADS`](super::VERIFY_THREADS) for a region of
    /// [`VERIFY_SPLIT_BYTES`](super::VERIFY_SPLIT_BYTES) or more.
    ///
    /// # Errors
    ///
    /// The system's error from `move_pages` (`EPERM` or `ENOSYS` where a
    /// seccomp profile refuses it).
    pub fn count_pages_move_pages(&self) -> std::io::Result<PageCounts> {
        self.count_pages_move_pages_on(verify_threads(self.len).min(self.threads))
    }

    /// [`Region::count_pages_move_pages`] with the region split between
    /// `threads` threads.
    ///
    /// # Errors
    ///
    /// As [`Region::count_pages_move_pages`].
    pub fn count_pages_move_pages_on(&self, threads: usize) -> std::io::Result<PageCounts> {
        self.count_range_move_pages(self.ptr.as_ptr() as usize, self.len, threads)
    }

    /// [`Region::count_pages_move_pages_on`] of `base..base + len`, a part
    /// of the region starting and ending on a granule boundary.
    pub(super) fn count_range_move_pages(
        &self,
        base: usize,
        len: usize,
        threads: usize,
    ) -> std::io::Result<PageCounts> {
        let granule = self.methods.pages.granule();
        let chunks = len / granule;
        let threads = threads.clamp(1, chunks.max(1));
        let per = chunks.div_ceil(threads) * granule;
        // One address per hugetlb page (it lies on one node), counted as
        // the 4 KiB pages it holds.
        let step = self.methods.pages.hugetlb_bytes().unwrap_or(PAGE);
        let each = (step / PAGE) as u64;
        let count = |from: usize, len: usize| -> std::io::Result<PageCounts> {
            let mut c = PageCounts {
                by: VerifiedBy::MovePages,
                pages: (len / PAGE) as u64,
                nodes: Vec::new(),
                missing: 0,
            };
            // SAFETY: from..from+len lies in the region, whose mapping
            // lives as long as `self`.
            unsafe {
                numa::page_nodes(from as *mut u8, len, step, |batch| {
                    for &s in batch {
                        // A negative entry is an errno: no page there.
                        if let Ok(s) = u32::try_from(s) {
                            c.add(s, each);
                        } else {
                            c.missing += each;
                        }
                    }
                })
            }?;
            Ok(c)
        };
        let parts: Vec<(usize, usize)> = (0..threads)
            .map(|t| (base + t * per, per.min(len.saturating_sub(t * per))))
            .filter(|(_, l)| *l > 0)
            .collect();
        let results: Vec<std::io::Result<PageCounts>> = if parts.len() == 1 {
            vec![count(parts[0].0, parts[0].1)]
        } else {
            std::thread::scope(|s| {
                let hs: Vec<_> = parts
                    .iter()
                    .map(|&(a, l)| s.spawn(move || count(a, l)))
                    .collect();
                hs.into_iter()
                    .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                    .collect()
            })
        };
        let mut total = PageCounts::empty(VerifiedBy::MovePages);
        for r in results {
            total.merge(r?);
        }
        Ok(total)
    }

    /// Per-node page counts of the region's own VMAs from
    /// `/proc/self/numa_maps` (exact: the guard pages, or a hugetlb
    /// mapping's own file, keep its VMAs its own; hugetlb VMAs are counted
    /// in huge pages there, converted to bytes by their page size).
    ///
    /// # Errors
    ///
    /// The system's error reading `/proc/self/numa_maps` and `/proc/self/maps`,
    /// or `InvalidData` when the region's mappings cannot be found in them.
    pub fn count_pages_numa_maps(&self) -> std::io::Result<PageCounts> {
        let start = self.ptr.as_ptr() as u64;
        let p = numa_maps::read_self(start..start + self.len as u64, 5)?;
        let mut c = PageCounts {
            by: VerifiedBy::NumaMaps,
            pages: (self.len / PAGE) as u64,
            nodes: Vec::new(),
            missing: 0,
        };
        // Should the counts ever be bounds, only what is certain counts as
        // on a node and the rest as unknown.
        for (&node, b) in &p.nodes {
            if b.min >= PAGE as u64 {
                c.add(node, b.min / PAGE as u64);
            }
        }
        c.missing = c.pages - c.nodes.iter().map(|(_, n)| n).sum::<u64>().min(c.pages);
        Ok(c)
    }
}
