//! Pinned memory several processes map: one engine with the arena's.
//!
//! * [`SharedRegion`]: pinned memory on a node, made by the arena's steps
//!   (bound, faulted in on the node's CPUs, locked, registered with CUDA,
//!   its placement checked) in a memfd, counted once in the maker's budget
//!   and [`NodeStats::bytes_shared`](crate::runtime::NodeStats::bytes_shared),
//!   that other processes of the job map by name ([`AttachedRegion`]:
//!   attaching costs a mapping and a registration, no memory). For example
//!   a KV-cache offload tier shared by the ranks of one machine.
//! * [`SlotPool`]: fixed-size slots in shared pinned memory that worker
//!   processes fill and the main process copies to a GPU (the Python
//!   DataLoader's pool), each growth a shared region of its own.
//!
//! Where the memory goes is [`Runtime::place`](crate::runtime::Runtime::place)'s
//! answer for the [`Target`](crate::runtime::Target) given. Nothing outlives
//! the processes: a memfd's pages go when the last process mapping them
//! exits, crashes included.
//!
//! ```
//! use std::time::Duration;
//! use numapin::runtime::{Runtime, RuntimeConfig, Target};
//! use numapin::shared::{AttachedRegion, SharedRegion};
//! use numapin::topology::{CudaMode, ProbeOptions, Topology};
//!
//! let topo = Topology::probe(&ProbeOptions::from_process().with_cuda(CudaMode::Off))?;
//! let rt = Runtime::new(topo, RuntimeConfig::default())?;
//! // Rank 0 makes it near its GPU (Target::Gpu(CudaOrdinal(0))), here on
//! // this thread's node...
//! let name = format!("kv-tier-{}", std::process::id());
//! let mut kv = SharedRegion::create(&rt, Target::Host, 1 << 20, &name)?;
//! kv.as_mut_slice()[0] = 1;
//! // ...and the other ranks of the machine attach to it by name (here, in
//! // the same process), waiting up to 30 s for it to be made.
//! let mut other = AttachedRegion::attach(&name, Duration::from_secs(30))?;
//! assert_eq!((other.as_slice()[0], other.node(), other.len()), (1, kv.node(), 1 << 20));
//! other.as_mut_slice()[1] = 2;
//! assert_eq!(kv.as_slice()[1], 2, "one memory");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod error;
mod pool;
mod region;

pub use error::SharedError;
pub use pool::{SlotLease, SlotPool, MAX_SLOTS, SLOT_GRANULE};
pub use region::{AttachedRegion, SharedRegion};
