//! Each NUMA node's hugetlb pools (total, free and surplus pages of each
//! size) and the transparent huge page mode: what arena regions get under
//! the default `HugePages::Auto` (hugetlb pages when the node's pool has
//! enough free for a region, else transparent huge pages).

use std::path::{Path, PathBuf};

use serde::ser::{Serialize, SerializeStruct, Serializer};

use super::kernel::Thp;
use crate::platform::hugetlb::{self, PoolCounts, PoolError};

/// One node's pool of one page size.
#[derive(Debug)]
#[non_exhaustive]
pub struct PoolRow {
    /// The node.
    pub node: u32,
    /// Bytes per page.
    pub page_bytes: u64,
    /// The pool's counts, or why its files could not be read (the file
    /// and the problem).
    pub counts: Result<PoolCounts, PoolError>,
}

impl PoolRow {
    /// Pages in the pool (`nr_hugepages`), `None` when unreadable.
    pub fn total(&self) -> Option<u64> {
        self.counts.as_ref().ok().map(|c| c.total)
    }

    /// Pages nobody has faulted in (`free_hugepages`), `None` when
    /// unreadable.
    pub fn free(&self) -> Option<u64> {
        self.counts.as_ref().ok().map(|c| c.free)
    }

    /// Pages beyond the pool under overcommit (`surplus_hugepages`), `None`
    /// when unreadable.
    pub fn surplus(&self) -> Option<u64> {
        self.counts.as_ref().ok().map(|c| c.surplus)
    }
}

/// Serialized flat, as `numapin doctor --json` prints it: `node`,
/// `page_bytes`, `total`, `free`, `surplus` (`null` when unreadable) and
/// `error` (the problem, or `null`).
impl Serialize for PoolRow {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("PoolRow", 6)?;
        st.serialize_field("node", &self.node)?;
        st.serialize_field("page_bytes", &self.page_bytes)?;
        st.serialize_field("total", &self.total())?;
        st.serialize_field("free", &self.free())?;
        st.serialize_field("surplus", &self.surplus())?;
        st.serialize_field("error", &self.counts.as_ref().err().map(|e| e.to_string()))?;
        st.end()
    }
}

/// The node folders could not be listed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
#[error("cannot list {}: {source}", path.display())]
pub struct HugePagesError {
    /// The folder (`sys/devices/system/node` under the root).
    pub path: PathBuf,
    /// The system's error.
    #[source]
    pub source: std::io::Error,
}

/// The huge page settings of this machine: the THP mode and every node's
/// hugetlb pools.
#[derive(Debug)]
#[non_exhaustive]
pub struct HugePages {
    /// The THP mode (`always`, `madvise`, `never`), `None` when unreadable.
    pub thp_enabled: Option<String>,
    /// The THP defrag mode, `None` when unreadable.
    pub thp_defrag: Option<String>,
    /// Whether the kernel has `MADV_POPULATE_WRITE` (Linux 5.14), without
    /// which `HugePages::Auto` never takes hugetlb pages.
    pub madv_populate_write: bool,
    /// Every node's pool of every size, by node then size.
    pub pools: Vec<PoolRow>,
    /// Why the nodes could not be listed (`pools` is then empty).
    pub error: Option<HugePagesError>,
}

/// Serialized as `numapin doctor --json` prints it: `thp_enabled`,
/// `thp_defrag`, `madv_populate_write`, `pools` and `error` (the problem's
/// text, or `null`).
impl Serialize for HugePages {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("HugePages", 5)?;
        st.serialize_field("thp_enabled", &self.thp_enabled)?;
        st.serialize_field("thp_defrag", &self.thp_defrag)?;
        st.serialize_field("madv_populate_write", &self.madv_populate_write)?;
        st.serialize_field("pools", &self.pools)?;
        st.serialize_field("error", &self.error.as_ref().map(|e| e.to_string()))?;
        st.end()
    }
}

impl HugePages {
    /// Reads every node's pools under `root` (`/` for this machine); `thp`
    /// gives the THP mode; `madv_populate_write` says whether the kernel
    /// has `MADV_POPULATE_WRITE`.
    pub fn read_under(root: &Path, thp: &Thp, madv_populate_write: bool) -> Self {
        let word = |m: Option<&str>| m.map(str::to_string);
        let nodes = root.join("sys/devices/system/node");
        let (pools, error) = match hugetlb::node_pools(root) {
            Ok(p) => (
                p.into_iter()
                    .map(|p| PoolRow {
                        node: p.node,
                        page_bytes: p.page_bytes,
                        counts: p.counts,
                    })
                    .collect(),
                None,
            ),
            Err(source) => (
                Vec::new(),
                Some(HugePagesError {
                    path: nodes,
                    source,
                }),
            ),
        };
        HugePages {
            thp_enabled: word(thp.enabled_mode()),
            thp_defrag: word(thp.defrag_mode()),
            madv_populate_write,
            pools,
            error,
        }
    }

    /// The row of `node`'s pool of `page_bytes` pages.
    pub fn row(&self, node: u32, page_bytes: u64) -> Option<&PoolRow> {
        self.pools
            .iter()
            .find(|r| r.node == node && r.page_bytes == page_bytes)
    }
}
