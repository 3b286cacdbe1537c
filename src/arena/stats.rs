//! What an arena holds and how it was made: [`NodeStats`].

use super::{
    lock, NodeArena, PageKind, PinnedBy, PlacedBy, RegionMethods, Registration, VerifiedBy,
};

/// One node's counters, as [`crate::runtime::Runtime::stats`] reports them.
/// Deserializing fills counters a writer did not send with zero (another
/// version's stats, read by `numapin ps`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct NodeStats {
    /// The node.
    pub node: u32,
    /// Regions held.
    pub regions: u64,
    /// Bytes in regions (mapped for the arena).
    pub bytes_reserved: u64,
    /// Bytes locked (mlock); regions pinned by CUDA registration alone and
    /// hugetlb regions are not counted here (see
    /// `regions_registration_pinned`, `regions_hugetlb_2m`).
    pub bytes_locked: u64,
    /// Bytes registered with CUDA.
    pub bytes_registered: u64,
    /// Bytes in buffers handed out (rounded to the alignment), including
    /// buffers dropped with a copy still in flight; not blocks in threads'
    /// caches.
    pub bytes_in_use: u64,
    /// Bytes of freed blocks kept in threads' caches for reuse (not in
    /// use, not free for other sizes until given back).
    pub bytes_cached: u64,
    /// Blocks kept in threads' caches.
    pub blocks_cached: u64,
    /// Highest bytes taken from the regions (in use plus cached) seen.
    pub bytes_peak: u64,
    /// The budget of pinned bytes.
    pub budget: u64,
    /// Allocations served.
    pub allocations: u64,
    /// Of those, allocations served from a thread's cache.
    pub cache_hits: u64,
    /// Buffers taken back.
    pub frees: u64,
    /// Allocations refused.
    pub failures: u64,
    /// Buffers dropped with a copy in flight, not yet taken back.
    pub deferred: u64,
    /// 4 KiB pages of the current regions found on the node (a hugetlb
    /// page counts as the 4 KiB pages it holds: 512 for 2 MiB).
    pub pages_on_node: u64,
    /// 4 KiB pages of the current regions found elsewhere or not present
    /// (only with [`OffNode::Warn`](super::OffNode::Warn)).
    pub pages_off_node: u64,
    /// `"registered"`, `"skipped: <why>"`, or `"none"` before any region.
    pub registration: String,
    /// Of the current regions, those bound with `mbind(MPOL_BIND)`.
    pub regions_bound: u64,
    /// Of the current regions, those placed by first touch (`mbind` was
    /// refused).
    pub regions_first_touch: u64,
    /// Of the current regions, those locked with `mlock`.
    pub regions_mlocked: u64,
    /// Of the current regions, those pinned by CUDA registration alone
    /// (RLIMIT_MEMLOCK too low for `mlock`).
    pub regions_registration_pinned: u64,
    /// Of the current regions, those whose placement `move_pages` checked.
    pub regions_verified_move_pages: u64,
    /// Of the current regions, those whose placement was checked through
    /// `/proc/self/numa_maps` (`move_pages` was refused).
    pub regions_verified_numa_maps: u64,
    /// Bytes of emptied regions of 64 MiB or more that the release thread
    /// is still tearing down (they count against the budget until gone).
    pub bytes_releasing: u64,
    /// Shared regions on the node (`numapin::shared`: memory other
    /// processes map too), counted apart from `regions`.
    pub shared_regions: u64,
    /// Their bytes (in the budget beside `bytes_reserved`).
    pub bytes_shared: u64,
    /// Of the current regions, those a driver backend allocated
    /// ([`Backend::DriverNuma`](super::Backend::DriverNuma),
    /// [`Backend::HostAllocBound`](super::Backend::HostAllocBound)).
    pub regions_driver: u64,
    /// Of the current regions, those whose placement could not be checked
    /// (a driver backend's mapping hides its pages).
    pub regions_unverified: u64,
    /// Of the current regions, those backed by 2 MiB hugetlb pages.
    pub regions_hugetlb_2m: u64,
    /// Of the current regions, those backed by 1 GiB hugetlb pages.
    pub regions_hugetlb_1g: u64,
    /// Of the current regions, those given transparent huge pages
    /// (`MADV_HUGEPAGE`).
    pub regions_thp: u64,
    /// Of the current regions, those of 4 KiB pages (THP mode `never`, or
    /// [`HugePages::None`](super::HugePages::None)).
    pub regions_base_pages: u64,
    /// The machine budget on the node: what every numapin process of this
    /// user may pin there together (`docs/arena.md`, Machine budget); 0
    /// when it is off.
    pub machine_budget: u64,
    /// Bytes numapin processes of this user pin on the node, this one's
    /// included, as the state file said when these figures were taken.
    pub machine_used: u64,
    /// Of those, this process's (all its runtimes, and the shared regions
    /// it made).
    pub machine_share: u64,
    /// Why `machine_used` could not be read (it is then this process's
    /// share alone); empty when it was, or when the machine budget is off.
    pub machine_note: String,
    /// Why methods other than the usual ones were used, for the latest
    /// region (`mbind refused (EPERM): placed by first touch from CPUs
    /// 0-3`); empty before any region or when none was needed.
    pub method_notes: Vec<String>,
}

impl NodeStats {
    /// The methods and pages every current region shares; `None` when the
    /// regions differ in one of them, before any region, or when a driver
    /// backend made some (its two placements are counted together).
    pub fn shared_methods(&self) -> Option<RegionMethods> {
        fn only<T: Copy>(pairs: &[(u64, T)]) -> Option<T> {
            let mut used = pairs.iter().filter(|(n, _)| *n > 0);
            let first = used.next()?;
            used.next().is_none().then_some(first.1)
        }
        if self.regions_driver > 0 {
            return None;
        }
        Some(RegionMethods {
            placed: only(&[
                (self.regions_bound, PlacedBy::Mbind),
                (self.regions_first_touch, PlacedBy::FirstTouch),
            ])?,
            pinned: only(&[
                (self.regions_mlocked, PinnedBy::Mlock),
                (self.regions_registration_pinned, PinnedBy::Registration),
                (
                    self.regions_hugetlb_2m + self.regions_hugetlb_1g,
                    PinnedBy::Hugetlb,
                ),
            ])?,
            verified: only(&[
                (self.regions_verified_move_pages, VerifiedBy::MovePages),
                (self.regions_verified_numa_maps, VerifiedBy::NumaMaps),
                (self.regions_unverified, VerifiedBy::Unverified),
            ])?,
            pages: only(&[
                (self.regions_base_pages, PageKind::Base),
                (self.regions_thp, PageKind::Transparent),
                (self.regions_hugetlb_2m, PageKind::Hugetlb2M),
                (self.regions_hugetlb_1g, PageKind::Hugetlb1G),
            ])?,
        })
    }

    /// How the current regions were placed, pinned and verified, and their
    /// pages, in words: `placed by first touch, pinned by CUDA registration
    /// (no mlock), verified through /proc/self/numa_maps, transparent huge
    /// pages`, or with counts when regions differ; `no region` before any.
    pub fn methods(&self) -> String {
        if self.regions == 0 {
            return "no region".into();
        }
        let part = |pairs: &[(u64, &str)]| -> String {
            let used: Vec<_> = pairs.iter().filter(|(n, _)| *n > 0).collect();
            match used.as_slice() {
                [(_, one)] => one.to_string(),
                _ => used
                    .iter()
                    .map(|(n, w)| format!("{n} {w}"))
                    .collect::<Vec<_>>()
                    .join(" + "),
            }
        };
        format!(
            "{}, {}, {}, {}",
            part(&[
                (self.regions_bound, "bound (mbind MPOL_BIND)"),
                (self.regions_first_touch, "placed by first touch"),
                (self.regions_driver, "placed by the CUDA driver"),
            ]),
            part(&[
                (self.regions_mlocked, "locked (mlock)"),
                (
                    self.regions_registration_pinned,
                    "pinned by CUDA registration (no mlock)"
                ),
                (self.regions_driver, "pinned by the driver"),
                (
                    self.regions_hugetlb_2m + self.regions_hugetlb_1g,
                    "hugetlb (never swapped, no mlock)"
                ),
            ]),
            part(&[
                (self.regions_verified_move_pages, "verified with move_pages"),
                (
                    self.regions_verified_numa_maps,
                    "verified through /proc/self/numa_maps"
                ),
                (self.regions_unverified, "not verifiable"),
            ]),
            part(&[
                (self.regions_thp, PageKind::Transparent.words()),
                (self.regions_hugetlb_2m, PageKind::Hugetlb2M.words()),
                (self.regions_hugetlb_1g, PageKind::Hugetlb1G.words()),
                (self.regions_base_pages, PageKind::Base.words()),
                (self.regions_driver, PageKind::Driver.words()),
            ]),
        )
    }
}

impl NodeArena {
    /// The node's counters.
    pub(crate) fn stats(&self) -> NodeStats {
        // Every shelf locked, then the state: one consistent snapshot (a
        // block moves between a shelf and the bookkeeping only under both
        // locks).
        let shelves = self.live_shelves();
        let guards: Vec<_> = shelves.iter().map(|s| lock(&s.state)).collect();
        let (mut hits, mut frees, mut blocks, mut cached) = (0, 0, 0, 0);
        for g in &guards {
            hits += g.hits;
            frees += g.frees;
            blocks += g.blocks() as u64;
            cached += g.bytes();
        }
        let st = lock(&self.state);
        drop(guards);
        let regions = st.slots.iter().flatten();
        let mut s = NodeStats {
            node: self.node,
            bytes_reserved: st.tlsf.region_bytes(),
            bytes_in_use: st.tlsf.used_bytes() - cached,
            bytes_cached: cached,
            blocks_cached: blocks,
            bytes_peak: st.counters.peak,
            budget: self.cfg.budget,
            allocations: st.counters.allocations + hits,
            cache_hits: st.counters.cache_hits + hits,
            frees: st.counters.frees + frees,
            failures: st.counters.failures,
            deferred: st.deferred.len() as u64,
            registration: match &st.registration {
                None => "none".into(),
                Some(Registration::Registered) => "registered".into(),
                Some(Registration::Skipped(why)) => format!("skipped: {why}"),
            },
            method_notes: st.notes.clone(),
            bytes_releasing: self.releasing.bytes(),
            shared_regions: st.shared.len() as u64,
            bytes_shared: st.shared.iter().map(|(_, b)| b).sum(),
            ..NodeStats::default()
        };
        for slot in regions {
            let r = &slot.region;
            s.regions += 1;
            let m = r.methods();
            match m.placed {
                PlacedBy::Mbind => s.regions_bound += 1,
                PlacedBy::FirstTouch => s.regions_first_touch += 1,
                PlacedBy::DriverNuma | PlacedBy::BindPolicy => s.regions_driver += 1,
            }
            match m.pinned {
                PinnedBy::Mlock => {
                    s.regions_mlocked += 1;
                    s.bytes_locked += r.len() as u64;
                }
                PinnedBy::Registration => s.regions_registration_pinned += 1,
                PinnedBy::Driver | PinnedBy::Hugetlb => {}
            }
            match m.pages {
                PageKind::Base => s.regions_base_pages += 1,
                PageKind::Transparent => s.regions_thp += 1,
                PageKind::Hugetlb2M => s.regions_hugetlb_2m += 1,
                PageKind::Hugetlb1G => s.regions_hugetlb_1g += 1,
                PageKind::Driver => {}
            }
            match m.verified {
                VerifiedBy::MovePages => s.regions_verified_move_pages += 1,
                VerifiedBy::NumaMaps => s.regions_verified_numa_maps += 1,
                VerifiedBy::Unverified => s.regions_unverified += 1,
            }
            if r.registered() {
                s.bytes_registered += r.len() as u64;
            }
            s.pages_on_node += r.pages_on_node();
            s.pages_off_node += r.pages_off_node();
        }
        // The state file is read with no lock of the arena's held.
        drop(st);
        self.machine_stats(&mut s);
        s
    }
}
