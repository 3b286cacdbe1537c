//! Shared regions: a window of a shared file (a memfd other processes map)
//! made by the arena's steps and charged to its node ([`crate::shared`]
//! builds on them).

use std::sync::Arc;

use super::{alloc, lock, publish, region, NodeArena, Region, RuntimeError};

impl NodeArena {
    /// A region of `bytes` (rounded up to 2 MiB) over `file` (a shared
    /// file's window: another process may map the same pages), made by the
    /// same steps as every region (bound to the node, faulted in on its
    /// CPUs, locked, registered with CUDA, its placement checked) and
    /// charged to the node's budget, the memory cgroup's and
    /// [`NodeStats::bytes_shared`] until the part is dropped. The file must
    /// hold `file.offset` plus the rounded size. Registered with CUDA when
    /// `register` and the runtime's configuration both ask for it.
    ///
    /// # Errors
    ///
    /// As an allocation that makes a region: [`RuntimeError::BudgetExceeded`]
    /// (or [`RuntimeError::CgroupBudget`]), [`RuntimeError::Memlock`] and any
    /// error of [`Region::create`].
    pub(crate) fn shared_region(
        self: &Arc<Self>,
        file: region::SharedFile,
        bytes: usize,
        register: bool,
    ) -> Result<SharedPart, RuntimeError> {
        let size = alloc::round_up(bytes.max(1) as u64, region::HUGE_PAGE as u64);
        let _grow = lock(&self.slow.grow);
        self.releasing.wait();
        let reserved = lock(&self.state).reserved();
        let mut admitted = self.admit(bytes as u64, (size, size), reserved)?;
        let mut options = self.region_options(&admitted, Some(file));
        options.register &= register;
        let created = Region::create(&options);
        let mut region = self.charged(created, admitted.size)?;
        // Charged to the machine budget here, by the process that makes
        // it, once: processes that attach to it are not charged.
        region.charge_machine(admitted.machine.take());
        let mut st = lock(&self.state);
        st.last_shared += 1;
        let id = st.last_shared;
        st.shared.push((id, region.len() as u64));
        drop(st);
        publish::changed();
        Ok(SharedPart {
            region: Some(region),
            arena: self.clone(),
            id,
        })
    }
}

/// A region over a shared file's window, charged to its node until dropped
/// ([`NodeArena::shared_region`]). Dropping it unregisters, unlocks and
/// unmaps this process's mapping; the file's pages live on while another
/// process maps them.
#[derive(Debug)]
pub(crate) struct SharedPart {
    region: Option<Region>,
    arena: Arc<NodeArena>,
    id: u64,
}

impl SharedPart {
    /// The region.
    pub(crate) fn region(&self) -> &Region {
        self.region
            .as_ref()
            .expect("a part holds its region until dropped")
    }
}

impl Drop for SharedPart {
    fn drop(&mut self) {
        drop(self.region.take());
        lock(&self.arena.state)
            .shared
            .retain(|(id, _)| *id != self.id);
        self.arena.notify_waiters();
        publish::changed();
    }
}
