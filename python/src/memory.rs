//! [`Memory`]: what a `PinnedBuffer` and its DLPack exports share, of
//! every kind numapin lends Python: the arena's buffers, shared regions
//! ([`Held`]), loader slots, and plain heap bytes.

use std::ops::Deref;
use std::sync::Arc;

use numapin::shared::{AttachedRegion, SharedRegion, SlotLease, SlotPool};
use numapin::PinnedBuf;

use crate::lent;

/// A value holding memory of the process that made it: the arena's buffers
/// and shared memory, which are `MADV_DONTFORK`. Dropped in a forked child
/// (whose inherited tensor, array or `SharedBuffer` goes), it is forgotten:
/// the pages are not mapped there, the arena copy is not the child's own,
/// and only the parent gives them back, unmaps or unregisters them.
#[derive(Debug)]
pub(crate) struct Here<T> {
    /// Always `Some` until dropped.
    inner: Option<T>,
    pid: u32,
}

impl<T> Here<T> {
    pub(crate) fn new(inner: T) -> Self {
        Here {
            inner: Some(inner),
            pid: std::process::id(),
        }
    }

    /// Whether this process made it (false in a forked child).
    pub(crate) fn here(&self) -> bool {
        self.pid == std::process::id()
    }
}

impl<T> Deref for Here<T> {
    type Target = T;

    fn deref(&self) -> &T {
        self.inner.as_ref().expect("held until dropped")
    }
}

impl<T> Drop for Here<T> {
    fn drop(&mut self) {
        if !self.here() {
            // A forked child's copy: forgotten, not dropped (see above).
            std::mem::forget(self.inner.take());
        }
    }
}

/// An arena buffer of this process (see [`Here`]).
pub(crate) type Owned = Here<PinnedBuf>;

/// This process's hold on shared memory: the maker's region, or another
/// process's attached.
#[derive(Debug)]
pub(crate) enum Held {
    /// Made here (counted in this process's budget).
    Made(Box<SharedRegion>),
    /// Made by another process, mapped here.
    Attached(AttachedRegion),
}

impl Held {
    pub(crate) fn ptr(&self) -> *mut u8 {
        match self {
            Held::Made(r) => r.as_ptr(),
            Held::Attached(a) => a.as_ptr(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            Held::Made(r) => r.len(),
            Held::Attached(a) => a.len(),
        }
    }

    pub(crate) fn node(&self) -> u32 {
        match self {
            Held::Made(r) => r.node(),
            Held::Attached(a) => a.node(),
        }
    }

    pub(crate) fn registered(&self) -> bool {
        match self {
            Held::Made(r) => r.registered(),
            Held::Attached(a) => a.registered(),
        }
    }
}

/// Host memory a tensor or array is built over: a buffer lent by numapin's
/// arena (given back to it when the last owner drops it, on whatever thread
/// that is, without the GIL), or a plain heap block (tests, and the
/// `copy=True` path without a runtime).
#[derive(Debug)]
pub(crate) enum Memory {
    /// From the arena: pinned, on one NUMA node, registered when CUDA is.
    Pinned {
        /// The buffer (at least one byte: the arena lends no empty ones).
        buf: Owned,
        /// Bytes the tensor uses (`0` for an empty tensor).
        len: usize,
    },
    /// From the arena, the tensor starting `offset` bytes in (a tensor
    /// read from a file lies where the file's byte lies modulo a page).
    PinnedAt {
        /// The buffer (at least `offset + len` bytes, at least one).
        buf: Owned,
        /// Where the tensor starts in it.
        offset: usize,
        /// Bytes the tensor uses.
        len: usize,
    },
    /// Part of an arena buffer several tensors share (a checkpoint
    /// stager's: one buffer, one tensor per part, each with a storage of
    /// its own size).
    Part {
        /// The buffer (given back when its last part goes).
        buf: Arc<Owned>,
        /// Where the part starts in it.
        offset: usize,
        /// Bytes the tensor uses.
        len: usize,
    },
    /// Ordinary heap memory.
    Heap(Box<[u8]>),
    /// Part of a loader slot this process is responsible for giving back.
    Slot {
        /// The lease (the slot is freed when the last one goes).
        lease: Arc<SlotLease>,
        /// The first byte.
        ptr: *mut u8,
        /// Bytes.
        len: usize,
    },
    /// Part of shared pinned memory (`numapin.SharedBuffer`).
    Shared {
        /// Keeps it mapped.
        held: Arc<Here<Held>>,
        /// The first byte.
        ptr: *mut u8,
        /// Bytes.
        len: usize,
    },
    /// Part of a loader slot a worker writes into (another process frees it).
    Mapped {
        /// Keeps the pool mapped (held, never read).
        _pool: Arc<SlotPool>,
        /// The first byte.
        ptr: *mut u8,
        /// Bytes.
        len: usize,
    },
}

impl Drop for Memory {
    fn drop(&mut self) {
        // Noted by `PinnedBuffer::new` under this address (inside its Arc).
        if self.lent_as().is_some() {
            lent::forget(std::ptr::from_ref(self) as usize);
        }
    }
}

// SAFETY: the raw pointers in the slot variants are addresses into the
// pool's shared mapping, which the Arc they sit beside keeps mapped;
// `PinnedBuf` and boxed bytes are Send.
unsafe impl Send for Memory {}
// SAFETY: as above; the memory is only read and written through tensors.
unsafe impl Sync for Memory {}

impl Memory {
    /// `len` zeroed heap bytes.
    pub(crate) fn heap(len: usize) -> Self {
        Memory::Heap(vec![0u8; len].into_boxed_slice())
    }

    /// The first byte.
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        match self {
            // The arena's memory is handed out as raw bytes; writes go
            // through tensors (never through a Rust reference).
            Memory::Pinned { buf, .. } => buf.as_ptr().cast_mut(),
            Memory::PinnedAt { buf, offset, .. } => buf.as_ptr().wrapping_add(*offset).cast_mut(),
            Memory::Part { buf, offset, .. } => buf.as_ptr().wrapping_add(*offset).cast_mut(),
            Memory::Heap(b) => b.as_ptr().cast_mut(),
            Memory::Slot { ptr, .. } | Memory::Mapped { ptr, .. } | Memory::Shared { ptr, .. } => {
                *ptr
            }
        }
    }

    /// Bytes the tensor uses.
    pub(crate) fn len(&self) -> usize {
        match self {
            Memory::Pinned { len, .. }
            | Memory::PinnedAt { len, .. }
            | Memory::Part { len, .. } => *len,
            Memory::Heap(b) => b.len(),
            Memory::Slot { len, .. } | Memory::Mapped { len, .. } | Memory::Shared { len, .. } => {
                *len
            }
        }
    }

    /// Whether the memory is mapped in this process: false for arena and
    /// shared memory in a forked child of the process that made it.
    pub(crate) fn mapped_here(&self) -> bool {
        match self {
            Memory::Pinned { buf, .. } | Memory::PinnedAt { buf, .. } => buf.here(),
            Memory::Part { buf, .. } => buf.here(),
            Memory::Shared { held, .. } => held.here(),
            _ => true,
        }
    }

    /// The NUMA node of arena memory.
    pub(crate) fn node(&self) -> Option<u32> {
        match self {
            Memory::Pinned { buf, .. } | Memory::PinnedAt { buf, .. } => Some(buf.node()),
            Memory::Part { buf, .. } => Some(buf.node()),
            Memory::Shared { held, .. } => Some(held.node()),
            Memory::Slot { lease, .. } => lease.pool().node(),
            _ => None,
        }
    }

    /// What made memory that a forked child does not have (the arena's and
    /// shared memory, `MADV_DONTFORK`), as the DataLoader's refusal names
    /// it; `None` for memory a child has (heap bytes, a worker's view of
    /// another process's pool, which the worker maps itself).
    pub(crate) fn lent_as(&self) -> Option<&'static str> {
        match self {
            Memory::Pinned { .. } => Some("numapin.empty() or numapin.pin()"),
            Memory::PinnedAt { .. } => Some("numapin.load_safetensors(device=None)"),
            Memory::Part { .. } => Some("numapin.torch.CheckpointStager (its staged copy)"),
            Memory::Slot { .. } => {
                Some("numapin.torch.DataLoader(device=None) (a pinned CPU batch)")
            }
            Memory::Shared { .. } => Some("a numapin.SharedBuffer"),
            Memory::Heap(_) | Memory::Mapped { .. } => None,
        }
    }

    /// Whether the memory is registered with CUDA (pinned for DMA).
    pub(crate) fn registered(&self) -> bool {
        match self {
            Memory::Pinned { buf, .. } | Memory::PinnedAt { buf, .. } => buf.is_registered(),
            Memory::Part { buf, .. } => buf.is_registered(),
            Memory::Slot { lease, .. } => lease.pool().registered(),
            Memory::Shared { held, .. } => held.registered(),
            _ => false,
        }
    }
}
