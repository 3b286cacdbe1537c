//! The worker threads: each takes a free slot, then the next batch index,
//! and runs the producer into the slot.

use std::sync::atomic::Ordering;

use crate::cpulist::CpuList;
use crate::gpu::CudaOrdinal;
use crate::platform::cuda;

use super::{LoaderError, Produced, Result, Shared};

/// Binds the calling (new) thread to `cpus` and, for the copy engine, makes
/// the GPU's context current; returns the thread id.
pub(super) fn start_thread(cpus: &CpuList, ordinal: Option<CudaOrdinal>) -> Result<i32> {
    crate::affinity::bind_current_thread(cpus)?;
    if let Some(o) = ordinal {
        cuda::set_device(o.0).map_err(|e| {
            LoaderError::cuda_setup(o, "making its context current on the copy thread", e)
        })?;
    }
    Ok(nix::unistd::gettid().as_raw())
}

/// Counts a worker out when it ends, however it ends.
struct WorkerExit<'a>(&'a Shared);

impl Drop for WorkerExit<'_> {
    fn drop(&mut self) {
        self.0.lock().workers_running -= 1;
        self.0.engine_wake.notify_one();
    }
}

pub(super) fn run_worker(shared: &Shared, started: bool) {
    let _exit = WorkerExit(shared);
    if !started {
        return;
    }
    let total = shared.cfg.total_batches;
    loop {
        let mut slot = {
            let mut st = shared.lock();
            loop {
                if st.stop || st.failed {
                    return;
                }
                if let Some(s) = st.free_slots.pop() {
                    break s;
                }
                st.producer_waits += 1;
                st.workers_blocked += 1;
                st = shared.slot_free.wait(st).unwrap_or_else(|p| p.into_inner());
                st.workers_blocked -= 1;
            }
        };
        // The slot is taken before the index, so every index taken has a
        // slot: the batch the consumer waits for is never starved of one.
        let index = shared.next_index.fetch_add(1, Ordering::SeqCst);
        if total.is_some_and(|t| index >= t) {
            shared.lock().free_slots.push(slot);
            shared.slot_free.notify_one();
            return;
        }
        let capacity = slot.len();
        let result =
            crate::platform::panic_guard::catch(|| (shared.producer)(index, &mut slot[..]));
        let (item, back) = match result {
            Ok(Ok(len)) if len <= capacity => (Produced::Data { slot, len }, None),
            Ok(Ok(returned)) => (
                Produced::Failed(LoaderError::TooLong {
                    index,
                    returned,
                    capacity,
                }),
                Some(slot),
            ),
            Ok(Err(source)) => (
                Produced::Failed(LoaderError::Producer { index, source }),
                Some(slot),
            ),
            Err(message) => (
                Produced::Failed(LoaderError::Panicked { index, message }),
                Some(slot),
            ),
        };
        let failed = matches!(item, Produced::Failed(_));
        let mut st = shared.lock();
        st.produced += 1;
        st.ready.insert(index, item);
        if let Some(slot) = back {
            st.free_slots.push(slot);
        }
        if failed {
            st.failed = true;
        }
        drop(st);
        shared.engine_wake.notify_one();
        if failed {
            shared.slot_free.notify_all();
            return;
        }
    }
}
