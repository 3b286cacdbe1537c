//! [`Batch`]: a delivered batch, and [`Batches`], the iterator over them.

use crate::gpu::{CUdeviceptr, CUevent, CUstream};
use crate::platform::cuda;
use crate::runtime::PinnedBuf;

use super::{Loader, LoaderError, RingEntry, MAX_CONSUMER_STREAMS};

/// Iterator over a loader's batches ([`Loader::iter`]).
#[derive(Debug)]
pub struct Batches<'a>(pub(super) &'a Loader);

impl<'a> Iterator for Batches<'a> {
    type Item = Result<Batch<'a>, LoaderError>;
    fn next(&mut self) -> Option<Self::Item> {
        self.0.next_batch()
    }
}

impl<'a> IntoIterator for &'a Loader {
    type Item = Result<Batch<'a>, LoaderError>;
    type IntoIter = Batches<'a>;
    fn into_iter(self) -> Batches<'a> {
        self.iter()
    }
}

pub(super) enum BatchData {
    Host(PinnedBuf),
    Device(usize),
}

/// A delivered batch. Dropping it gives its device buffer (GPU mode) or
/// its pinned slot (host mode) back to the loader.
pub struct Batch<'a> {
    pub(super) loader: &'a Loader,
    pub(super) index: u64,
    pub(super) len: usize,
    pub(super) data: Option<BatchData>,
    pub(super) used_on: Vec<CUstream>,
}

// SAFETY: the raw stream handles in `used_on` are only passed to the
// driver (thread-safe); everything else is Send.
unsafe impl Send for Batch<'_> {}

impl std::fmt::Debug for Batch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("index", &self.index)
            .field("len", &self.len)
            .field("device_ptr", &self.device_ptr())
            .finish_non_exhaustive()
    }
}

impl Batch<'_> {
    /// The batch index (0, 1, ...).
    pub fn index(&self) -> u64 {
        self.index
    }

    /// Bytes the producer wrote.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the producer wrote nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn entry(&self) -> Option<&RingEntry> {
        match self.data.as_ref()? {
            BatchData::Device(i) => Some(&self.loader.shared.gpu.as_ref()?.ring[*i]),
            BatchData::Host(_) => None,
        }
    }

    /// The device buffer holding the batch (GPU mode); valid for
    /// [`len`](Self::len) bytes once [`event`](Self::event) has completed.
    pub fn device_ptr(&self) -> Option<CUdeviceptr> {
        self.entry().map(|e| e.buf.ptr())
    }

    /// The event recorded after the batch's copy (GPU mode), a raw
    /// `CUevent` owned by the loader and valid while the batch is held.
    pub fn event(&self) -> Option<CUevent> {
        self.entry().map(|e| e.copied.raw())
    }

    /// The batch's bytes (host mode).
    pub fn host_bytes(&self) -> Option<&[u8]> {
        match self.data.as_ref()? {
            BatchData::Host(slot) => Some(&slot[..self.len]),
            BatchData::Device(_) => None,
        }
    }

    /// The pinned slot holding the batch (host mode).
    pub fn host_buf(&self) -> Option<&PinnedBuf> {
        match self.data.as_ref()? {
            BatchData::Host(slot) => Some(slot),
            BatchData::Device(_) => None,
        }
    }

    /// Makes work queued on `stream` afterwards wait on the device until
    /// the batch's copy has completed (`cuStreamWaitEvent`; the host does
    /// not wait). When the batch is dropped, an event is recorded on
    /// `stream` and the device buffer is not overwritten before the work
    /// queued on `stream` until then has completed. No-op in host mode.
    ///
    /// # Safety
    /// `stream` must be a stream of the loader's GPU (or null, the legacy
    /// default stream) that stays alive until the batch is dropped.
    ///
    /// # Errors
    ///
    /// [`LoaderError::Cuda`] when `cuStreamWaitEvent` fails,
    /// [`LoaderError::TooManyStreams`] for a stream past the loader's limit of
    /// streams per batch.
    pub unsafe fn wait_on(&mut self, stream: CUstream) -> Result<(), LoaderError> {
        let Some(entry) = self.entry() else {
            return Ok(());
        };
        let index = self.index;
        let gpu = self.loader.gpu_ordinal();
        // SAFETY: the caller vouches for the stream; the event lives in
        // the loader, which outlives the batch.
        unsafe { cuda::stream_wait_event(stream, entry.copied.raw()) }.map_err(|source| {
            LoaderError::Cuda {
                index,
                gpu,
                what: "cuStreamWaitEvent",
                source,
            }
        })?;
        if !self.used_on.contains(&stream) {
            if self.used_on.len() == MAX_CONSUMER_STREAMS {
                return Err(LoaderError::TooManyStreams { index });
            }
            self.used_on.push(stream);
        }
        Ok(())
    }

    /// Blocks the calling thread until the batch's copy has completed (for
    /// CPU-side checks; a GPU consumer uses [`wait_on`](Self::wait_on)).
    /// Returns at once in host mode.
    ///
    /// # Errors
    ///
    /// [`LoaderError::Cuda`] when `cuEventSynchronize` fails (a sticky error of
    /// the context).
    pub fn synchronize(&self) -> Result<(), LoaderError> {
        let Some(entry) = self.entry() else {
            return Ok(());
        };
        entry
            .copied
            .synchronize()
            .map_err(|source| LoaderError::Cuda {
                index: self.index,
                gpu: self.loader.gpu_ordinal(),
                what: "cuEventSynchronize",
                source,
            })
    }
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        let shared = &*self.loader.shared;
        let Some(data) = self.data.take() else {
            return;
        };
        match data {
            BatchData::Host(slot) => {
                let mut st = shared.lock();
                st.held -= 1;
                st.free_slots.push(slot);
                drop(st);
                shared.slot_free.notify_one();
            }
            BatchData::Device(i) => {
                let mut recorded = 0;
                if let (Some(g), false) = (&shared.gpu, self.used_on.is_empty()) {
                    let _ctx = cuda::ContextGuard::push(g.ordinal.0);
                    let entry = &g.ring[i];
                    for &s in &self.used_on {
                        // SAFETY: wait_on's caller vouched that the stream
                        // lives until now and belongs to this GPU, whose
                        // context the event was made in. A failed record
                        // (the stream is gone) leaves nothing to wait for.
                        if unsafe { entry.release[recorded].record(s) }.is_ok() {
                            recorded += 1;
                        }
                    }
                }
                let mut st = shared.lock();
                st.held -= 1;
                st.free_ring.push((i, recorded));
                drop(st);
                shared.engine_wake.notify_one();
            }
        }
    }
}
