//! The limits every topology input is held to, checked before anything is
//! allocated for what the input claims.
//!
//! A description is text that may come from anyone; the memory and time
//! numapin spends on it must follow what the input is, not what it claims.
//! Every reader (hwloc XML, numapin JSON, NCCL XML, captured roots, the live
//! probe) checks these bounds; `docs/topology-json.md` ("Limits") lists them.

use super::TopologyError as Error;

pub use crate::cpulist::MAX_CPUS;
pub use crate::platform::numa::MAX_NODES;

/// Most GPUs (and chosen accelerators) in one description. The largest
/// single hosts have a few dozen; the bound keeps the GPU-by-GPU views
/// (the locality matrix, ordinal lookups) small.
pub const MAX_GPUS: usize = 1024;

/// Most NICs and storage devices (together) in one description. Real
/// hosts have a few dozen, a few hundred with SR-IOV virtual functions;
/// the bound keeps the device-by-GPU relations (and the JSON that lists
/// them) small.
pub const MAX_IO_DEVICES: usize = 4096;

/// Most nodes of a PCI tree: host bridges, bridges, switches and devices
/// (one PCI domain has at most 65,536 functions).
pub const MAX_PCI_NODES: usize = 65_536;

/// Deepest PCI tree: bridges and switches between a host bridge and a
/// device (real machines have a few; each relation walks the two paths).
pub const MAX_PCI_DEPTH: usize = 64;

/// Most objects in an hwloc XML file: 32 per CPU at the CPU limit (a
/// machine of 8,192 CPUs with its cores, caches, packages, nodes and the
/// largest PCI tree has about 200,000). hwloc's work grows faster than
/// the file, so the count is checked as the file is read.
pub const MAX_XML_OBJECTS: usize = 32 * MAX_CPUS as usize;

/// Most pairs of objects side by side (directly inside the same object)
/// in an hwloc XML file, counted over the whole file: hwloc places each
/// object after those already beside it, so its time grows with this
/// number (65,536 PCI devices under one bridge keep it busy for 20 s).
/// 8,192 CPUs side by side make 33,550,336 pairs; real machines far fewer.
pub const MAX_XML_SIBLING_PAIRS: u64 = 1 << 26;

/// Deepest nesting of elements in an hwloc XML file (hwloc reads it
/// recursively: the bound keeps the stack it needs small). A real export
/// nests about 12 deep on the CPU side and [`MAX_PCI_DEPTH`] bridges
/// below a host bridge at most.
pub const MAX_XML_DEPTH: usize = 128;

/// Most ranks a plan is made for: one per CPU at most.
pub const MAX_RANKS: usize = MAX_CPUS as usize;

/// Largest file (or standard input) read as a description. Real hwloc XML
/// exports and captures of the largest machines are a few MiB.
pub const MAX_INPUT_BYTES: u64 = 64 << 20;

/// Most CPU numbers all the CPU lists of one JSON file may name together:
/// every CPU once in each of the packages, nodes, cores, caches and allowed
/// CPUs, and once in each GPU's local CPUs (what a real machine of
/// [`MAX_CPUS`] CPUs and [`MAX_GPUS`] GPUs needs). A 100 KB file that
/// claims millions is refused before they are built.
pub const MAX_LISTED_CPUS: u64 = MAX_CPUS as u64 * (MAX_GPUS as u64 + 8);

/// Most bytes a captured root may unpack to, counted as they are written.
pub const MAX_CAPTURE_BYTES: u64 = 512 << 20;

/// Largest single file in a captured root (sysfs files are a page;
/// `/proc/cpuinfo` of an 8,192-CPU machine is about 12 MiB).
pub const MAX_CAPTURE_FILE_BYTES: u64 = 16 << 20;

/// Most entries (files, folders, links) in a captured root: 32 per CPU at
/// the CPU limit. Captures of large real machines hold a few tens of
/// thousands.
pub const MAX_CAPTURE_ENTRIES: usize = 32 * MAX_CPUS as usize;

/// The error for an input over a limit: names the input, the limit and
/// what to do.
pub(crate) fn over(source: &str, problem: String) -> Error {
    Error::input(
        source,
        problem,
        "give the description of a real machine: numapin handles at most 8192 CPUs, 1024 NUMA nodes, 1024 GPUs, 4096 NICs and storage devices and inputs of 64 MiB (docs/topology-json.md, \"Limits\")",
    )
}

/// Checks an hwloc bitmap (CPU or node set) before it is expanded: `weight`
/// is `None` for an infinite set, `last` its highest member.
pub(crate) fn check_bitmap(
    source: &str,
    what: &str,
    weight: Option<usize>,
    last: Option<usize>,
    bound: u32,
) -> Result<(), Error> {
    match (weight, last) {
        (None, _) => Err(over(
            source,
            format!("{what} is infinite (every number from some point on)"),
        )),
        (Some(_), Some(l)) if l >= bound as usize => Err(over(
            source,
            format!(
                "{what} names number {l}, beyond the limit of {bound} (0-{})",
                bound - 1
            ),
        )),
        _ => Ok(()),
    }
}

/// Checks a count of things against its limit.
pub(crate) fn check_count(source: &str, what: &str, n: usize, max: usize) -> Result<(), Error> {
    if n > max {
        return Err(over(
            source,
            format!("it lists {n} {what}, more than the limit of {max}"),
        ));
    }
    Ok(())
}

/// Checks a NUMA node number.
pub(crate) fn check_node(source: &str, what: &str, node: u32) -> Result<(), Error> {
    if node >= MAX_NODES {
        return Err(over(
            source,
            format!(
                "{what} names NUMA node {node}, beyond the limit of {MAX_NODES} nodes (0-{})",
                MAX_NODES - 1
            ),
        ));
    }
    Ok(())
}

/// The lists of a JSON description, each refused at the first item over
/// its limit, before that item is built: a file of 60 MB that lists a
/// million GPUs never becomes a million GPUs in memory.
pub(crate) mod listed {
    use std::marker::PhantomData;

    use serde::de::{Deserialize, Deserializer, Error as _, IgnoredAny, SeqAccess, Visitor};

    use super::{MAX_CPUS, MAX_GPUS, MAX_IO_DEVICES, MAX_NODES};

    /// A list of at most `max` items (`what` names them in the error).
    fn at_most<'de, D, T>(d: D, max: usize, what: &'static str) -> Result<Vec<T>, D::Error>
    where
        D: Deserializer<'de>,
        T: Deserialize<'de>,
    {
        struct Bounded<T> {
            max: usize,
            what: &'static str,
            item: PhantomData<T>,
        }
        impl<'de, T: Deserialize<'de>> Visitor<'de> for Bounded<T> {
            type Value = Vec<T>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "a list of at most {} {}", self.max, self.what)
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
                let mut out = Vec::new();
                while out.len() < self.max {
                    match seq.next_element()? {
                        Some(item) => out.push(item),
                        None => return Ok(out),
                    }
                }
                // One more is read but not built.
                match seq.next_element::<IgnoredAny>()? {
                    None => Ok(out),
                    Some(_) => Err(A::Error::custom(format!(
                        "it lists {} or more {}, more than the limit of {}",
                        self.max + 1,
                        self.what,
                        self.max
                    ))),
                }
            }
        }
        d.deserialize_seq(Bounded {
            max,
            what,
            item: PhantomData,
        })
    }

    macro_rules! lists {
        ($($name:ident: $max:expr, $what:literal;)*) => {$(
            #[doc = concat!("A list of at most [`", stringify!($max), "`] ", $what, ".")]
            pub(crate) fn $name<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
            where
                D: Deserializer<'de>,
                T: Deserialize<'de>,
            {
                at_most(d, $max as usize, $what)
            }
        )*};
    }

    lists! {
        packages: MAX_CPUS, "packages";
        cores: MAX_CPUS, "cores";
        caches: MAX_CPUS, "caches";
        nodes: MAX_NODES, "NUMA nodes";
        distances: MAX_NODES, "distances";
        gpus: MAX_GPUS, "GPUs";
        ordinals: MAX_GPUS, "CUDA ordinals";
        relations: MAX_GPUS, "relations to GPUs";
        io_devices: MAX_IO_DEVICES, "NICs and storage devices";
    }
}
