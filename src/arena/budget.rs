//! What may be pinned: the node's budget, the memory cgroup's budget over
//! every node ([`CgroupCap`]) and the memlock limit, decided for each new
//! region before anything is mapped.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{
    fmt_bytes, huge, Admitted, Backend, HugePages, MachineCharge, NodeArena, Region, RuntimeError,
};

/// The cap on pinned bytes over every node of a runtime under the
/// process's memory cgroup limit: the share of that limit that may be
/// pinned (pinned pages are charged to the cgroup whatever their node, and
/// above `memory.max` the OOM killer ends the process). Formerly
/// `SharedBudget`: "shared" in numapin means memory other processes map
/// ([`crate::shared`]).
#[derive(Debug)]
pub(crate) struct CgroupCap {
    limit: u64,
    used: AtomicU64,
    source: String,
}

impl CgroupCap {
    /// A budget of `limit` bytes; `source` says where it comes from (for
    /// messages: `half of memory.max = 2 GiB (sys/fs/cgroup/memory.max)`).
    pub(crate) fn new(limit: u64, source: String) -> CgroupCap {
        CgroupCap {
            limit,
            used: AtomicU64::new(0),
            source,
        }
    }

    /// The limit in bytes.
    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes charged now.
    pub(crate) fn used(&self) -> u64 {
        self.used.load(Ordering::SeqCst)
    }

    /// Charges `bytes` if they fit; whether they did.
    pub(super) fn try_reserve(&self, bytes: u64) -> bool {
        self.used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |u| {
                u.checked_add(bytes).filter(|&n| n <= self.limit)
            })
            .is_ok()
    }

    /// The error for `requested` bytes on `node` that do not fit.
    pub(super) fn exceeded(&self, node: u32, requested: u64) -> RuntimeError {
        RuntimeError::CgroupBudget {
            node,
            requested,
            in_use: self.used(),
            limit: self.limit,
            cgroup: self.source.clone(),
        }
    }

    /// Gives back `bytes` charged before.
    pub(super) fn release(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::SeqCst);
    }
}

impl NodeArena {
    /// Decides whether a region of `size` bytes (or, short of room, the
    /// `fitted` size that would still serve a request of `bytes`) may be
    /// made with `reserved` bytes held on the node already: the node's
    /// budget (after giving back empty regions), the memlock limit (too
    /// low: registration pins the region, or, without CUDA, an error) and
    /// the memory cgroup's budget over all nodes, which it reserves (the
    /// region's charge, or [`NodeArena::charged`], gives it back).
    pub(super) fn admit(
        &self,
        bytes: u64,
        (size, fitted): (u64, u64),
        reserved: u64,
    ) -> Result<Admitted, RuntimeError> {
        let mut size = size;
        let mut reserved = reserved;
        if reserved + size > self.cfg.budget {
            // Empty regions held for reuse make room first.
            reserved = self.trim();
            if reserved + size > self.cfg.budget && reserved + fitted <= self.cfg.budget {
                size = fitted;
            }
            if reserved + size > self.cfg.budget {
                // A budget the memory cgroup set says so, with its fix.
                if let Some(cap) = self
                    .cfg
                    .cgroup_cap
                    .as_ref()
                    .filter(|s| s.limit() == self.cfg.budget)
                {
                    return Err(cap.exceeded(self.node, bytes));
                }
                return Err(RuntimeError::BudgetExceeded {
                    node: self.node,
                    requested: bytes,
                    in_use: reserved,
                    limit: self.cfg.budget,
                });
            }
        }
        let (size, pin_by_registration) = self.memlock_room(size, fitted)?;
        // The machine budget (every process of the user), then the cgroup's;
        // a size the cgroup cuts to `fitted` gives the rest of the
        // machine's reservation back.
        let mut machine = self.reserve_machine(bytes, size, fitted)?;
        let size = machine.as_ref().map_or(size, MachineCharge::bytes);
        let size = self.reserve_cgroup(bytes, size, fitted)?;
        if let Some(m) = &mut machine {
            m.shrink_to(size);
        }
        Ok(Admitted {
            size,
            pin_by_registration,
            machine,
        })
    }

    /// The memlock limit's say on a region of `size` bytes (or `fitted`):
    /// the size to make, and why registration pins it when the limit is too
    /// low and CUDA will register it. Driver backends' memory is pinned by
    /// the driver, outside RLIMIT_MEMLOCK (as registration is); hugetlb
    /// pages are not locked (never swapped): the limit does not apply.
    pub(super) fn memlock_room(
        &self,
        size: u64,
        fitted: u64,
    ) -> Result<(u64, Option<String>), RuntimeError> {
        if !self.cfg.memlock_applies
            || self.cfg.backend != Backend::Mapped
            || self.will_use_hugetlb(size)
        {
            return Ok((size, None));
        }
        let soft = crate::platform::sys::memlock_limit().map_or(0, |(s, _)| s);
        let locked = crate::platform::sys::locked_bytes();
        let room = soft.saturating_sub(locked);
        let size = if size > room && fitted <= room {
            fitted
        } else {
            size
        };
        if size <= room {
            return Ok((size, None));
        }
        // Without CUDA registration nothing else would pin the pages: then
        // the limit is an error, as before.
        if !(self.cfg.register && crate::platform::cuda::driver_version().is_ok()) {
            return Err(RuntimeError::lock_failed(self.node, size, None));
        }
        Ok((
            size,
            Some(format!(
                "RLIMIT_MEMLOCK is {} with {} locked, too low for {}",
                fmt_bytes(soft),
                fmt_bytes(locked),
                fmt_bytes(size)
            )),
        ))
    }

    /// Reserves `size` bytes (or `fitted`) of the memory cgroup's budget
    /// over all nodes, if there is one; the size reserved.
    pub(super) fn reserve_cgroup(
        &self,
        bytes: u64,
        size: u64,
        fitted: u64,
    ) -> Result<u64, RuntimeError> {
        let Some(cap) = &self.cfg.cgroup_cap else {
            return Ok(size);
        };
        if cap.try_reserve(size) {
            return Ok(size);
        }
        // Empty regions of this node make room (other nodes keep theirs
        // until their own trim).
        self.trim();
        if size > fitted && cap.try_reserve(fitted) {
            Ok(fitted)
        } else if cap.try_reserve(size) {
            Ok(size)
        } else {
            Err(cap.exceeded(self.node, bytes))
        }
    }

    /// The region `created` (of `size` bytes reserved by [`admit`](Self::admit)),
    /// charged to the cgroup's budget until dropped; on failure the
    /// reservation is given back.
    pub(super) fn charged(
        &self,
        created: Result<Region, RuntimeError>,
        size: u64,
    ) -> Result<Region, RuntimeError> {
        match created {
            Ok(mut region) => {
                if let Some(cap) = &self.cfg.cgroup_cap {
                    region.charge(cap.clone(), size);
                }
                Ok(region)
            }
            Err(e) => {
                if let Some(cap) = &self.cfg.cgroup_cap {
                    cap.release(size);
                }
                Err(e)
            }
        }
    }

    /// Whether a region of `size` bytes made now would be of hugetlb pages
    /// (a preview of the choice region creation makes; an explicit hugetlb
    /// choice always is, or fails).
    pub(super) fn will_use_hugetlb(&self, size: u64) -> bool {
        match self.cfg.huge_pages {
            HugePages::Hugetlb2M | HugePages::Hugetlb1G => true,
            HugePages::Auto => {
                let root = self
                    .cfg
                    .pool_root
                    .as_deref()
                    .unwrap_or(std::path::Path::new("/"));
                huge::choose(
                    HugePages::Auto,
                    self.node,
                    crate::num::usize_from(size),
                    root,
                )
                .is_ok_and(|c| c.kind.hugetlb_bytes().is_some())
            }
            HugePages::Transparent | HugePages::None => false,
        }
    }
}
