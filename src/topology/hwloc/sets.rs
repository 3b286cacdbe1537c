//! hwloc's CPU and node sets as lists, each checked against its limit
//! before it is expanded.

use hwlocality::bitmap::Bitmap;
use hwlocality::cpu::cpuset::CpuSet;
use hwlocality::memory::nodeset::NodeSet;

use crate::cpulist::CpuList;
use crate::topology::limits::{self, MAX_CPUS, MAX_NODES};
use crate::topology::TopologyError as Error;

type Result<T, E = Error> = std::result::Result<T, E>;

/// The members of an hwloc bitmap, refused (before it is expanded) when it
/// is infinite or names a number from `bound` on.
fn members<B: std::borrow::Borrow<Bitmap>>(
    set: Option<impl std::ops::Deref<Target = B>>,
    what: &str,
    bound: u32,
    source: &str,
) -> Result<Vec<u32>> {
    let Some(set) = set else {
        return Ok(Vec::new());
    };
    let b: &Bitmap = (*set).borrow();
    limits::check_bitmap(
        source,
        what,
        b.weight(),
        b.last_set().map(usize::from),
        bound,
    )?;
    Ok(b.iter_set()
        .map(|i| crate::num::u32_saturating(usize::from(i)))
        .collect())
}

/// A CPU set as a list, within [`MAX_CPUS`].
pub(super) fn cpus_of(
    set: Option<impl std::ops::Deref<Target = CpuSet>>,
    source: &str,
) -> Result<CpuList> {
    members(set, "a CPU set", MAX_CPUS, source).map(CpuList::from_iter_unsorted)
}

/// A node set as a list, within [`MAX_NODES`].
pub(super) fn nodes_of(
    set: Option<impl std::ops::Deref<Target = NodeSet>>,
    source: &str,
) -> Result<Vec<u32>> {
    members(set, "a NUMA node set", MAX_NODES, source)
}
