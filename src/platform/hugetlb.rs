//! Huge page pools (hugetlb) and the transparent huge page settings, read
//! from sysfs under a filesystem root (`/` for this machine), so that tests
//! build fake trees for machines with many nodes.
//!
//! What the kernel offers, per page size (`hugepages-2048kB`,
//! `hugepages-1048576kB`):
//!
//! * per node, `sys/devices/system/node/node<N>/hugepages/hugepages-<kB>kB/`
//!   `nr_hugepages` (the node's pool), `free_hugepages` (not faulted in by
//!   anyone; includes pages other mappings have reserved but not touched)
//!   and `surplus_hugepages` (allocated beyond the pool under overcommit);
//! * over the machine, `sys/kernel/mm/hugepages/hugepages-<kB>kB/` the same
//!   plus `resv_hugepages` (reserved by mappings, not faulted in yet) and
//!   `nr_overcommit_hugepages` (how many surplus pages the kernel may
//!   allocate on demand);
//! * `sys/kernel/mm/transparent_hugepage/enabled` and `defrag`.
//!
//! A mapping made with `MAP_HUGETLB` reserves its pages over the whole
//! machine at `mmap` time, not on a node, so what a region bound to one node
//! can count on is at most that node's free pages and at most the machine's
//! free pages that no mapping has reserved ([`Availability::usable`]). Both
//! are snapshots: another process may take the pages a moment later (see
//! the region's populate step for why that cannot end in `SIGBUS`).
//!
//! Every reader returns a typed error naming the file for a missing
//! file, an unreadable one or a value that is not a count; nothing here
//! panics on what it reads.

use std::fmt;
use std::path::{Path, PathBuf};

/// 2 MiB, the x86-64 and aarch64 (4 KiB granule) PMD huge page.
pub const SIZE_2M: u64 = 2 << 20;
/// 1 GiB, the x86-64 and aarch64 (4 KiB granule) PUD huge page.
pub const SIZE_1G: u64 = 1 << 30;

/// The folder of one page size's pool on one node, under `root`.
pub(crate) fn node_dir(root: &Path, node: u32, page_bytes: u64) -> PathBuf {
    root.join(format!(
        "sys/devices/system/node/node{node}/hugepages/hugepages-{}kB",
        page_bytes >> 10
    ))
}

/// The folder of one page size's machine-wide pool, under `root`.
pub(crate) fn global_dir(root: &Path, page_bytes: u64) -> PathBuf {
    root.join(format!(
        "sys/kernel/mm/hugepages/hugepages-{}kB",
        page_bytes >> 10
    ))
}

/// Why a pool file could not be read.
#[derive(Debug)]
#[non_exhaustive]
pub enum PoolError {
    /// The file does not exist: the kernel has no such pool (no hugetlb
    /// support, a page size the CPU lacks, or a node without memory).
    Missing {
        /// The file.
        path: PathBuf,
    },
    /// The file exists but reading it failed.
    Unreadable {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The file does not hold a count.
    NotACount {
        /// The file.
        path: PathBuf,
        /// What it holds (at most 40 characters).
        text: String,
    },
}

impl PoolError {
    /// The file it is about.
    pub fn path(&self) -> &Path {
        match self {
            PoolError::Missing { path }
            | PoolError::Unreadable { path, .. }
            | PoolError::NotACount { path, .. } => path,
        }
    }
}

impl fmt::Display for PoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolError::Missing { path } => write!(f, "{} does not exist", path.display()),
            PoolError::Unreadable { path, source } => {
                write!(f, "cannot read {}: {source}", path.display())
            }
            PoolError::NotACount { path, text } => {
                write!(f, "{} holds {text:?}, not a page count", path.display())
            }
        }
    }
}

impl std::error::Error for PoolError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            PoolError::Unreadable { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Reads a file holding one decimal count.
fn count(path: PathBuf) -> Result<u64, PoolError> {
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(PoolError::Missing { path })
        }
        Err(source) => return Err(PoolError::Unreadable { path, source }),
    };
    let t = text.trim();
    if t.is_empty() || t.len() > 20 || !t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(PoolError::NotACount {
            path,
            text: t.chars().take(40).collect(),
        });
    }
    t.parse().map_err(|_| PoolError::NotACount {
        path,
        text: t.chars().take(40).collect(),
    })
}

/// One node's pool of one page size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct PoolCounts {
    /// Pages in the pool (`nr_hugepages`).
    pub total: u64,
    /// Pages nobody has faulted in (`free_hugepages`).
    pub free: u64,
    /// Pages allocated beyond the pool under overcommit
    /// (`surplus_hugepages`).
    pub surplus: u64,
}

/// The pool of `page_bytes` pages on `node`.
pub(crate) fn node_pool(root: &Path, node: u32, page_bytes: u64) -> Result<PoolCounts, PoolError> {
    let d = node_dir(root, node, page_bytes);
    Ok(PoolCounts {
        total: count(d.join("nr_hugepages"))?,
        free: count(d.join("free_hugepages"))?,
        surplus: count(d.join("surplus_hugepages"))?,
    })
}

/// The machine-wide pool of one page size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub(crate) struct GlobalPool {
    /// Pages in the pools of every node (`nr_hugepages`).
    pub total: u64,
    /// Pages nobody has faulted in (`free_hugepages`).
    pub free: u64,
    /// Of the free pages, those reserved by mappings (`resv_hugepages`).
    pub reserved: u64,
    /// Pages allocated beyond the pool (`surplus_hugepages`).
    pub surplus: u64,
    /// How many surplus pages the kernel may allocate
    /// (`nr_overcommit_hugepages`).
    pub overcommit: u64,
}

/// The machine-wide pool of `page_bytes` pages.
pub(crate) fn global_pool(root: &Path, page_bytes: u64) -> Result<GlobalPool, PoolError> {
    let d = global_dir(root, page_bytes);
    Ok(GlobalPool {
        total: count(d.join("nr_hugepages"))?,
        free: count(d.join("free_hugepages"))?,
        reserved: count(d.join("resv_hugepages"))?,
        surplus: count(d.join("surplus_hugepages"))?,
        overcommit: count(d.join("nr_overcommit_hugepages"))?,
    })
}

/// What a mapping bound to one node may count on, read now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Availability {
    /// The node's pool.
    pub node: PoolCounts,
    /// The machine's pool.
    pub global: GlobalPool,
}

impl Availability {
    /// Pages a new mapping bound to the node can take from the pool: the
    /// node's free pages, at most the machine's free pages no mapping has
    /// reserved.
    pub(crate) fn usable(&self) -> u64 {
        self.node
            .free
            .min(self.global.free.saturating_sub(self.global.reserved))
    }

    /// Surplus pages the kernel may still allocate on demand (overcommit).
    pub(crate) fn overcommit_room(&self) -> u64 {
        self.global.overcommit.saturating_sub(self.global.surplus)
    }
}

/// The node's and the machine's pools of `page_bytes` pages.
pub(crate) fn availability(
    root: &Path,
    node: u32,
    page_bytes: u64,
) -> Result<Availability, PoolError> {
    Ok(Availability {
        node: node_pool(root, node, page_bytes)?,
        global: global_pool(root, page_bytes)?,
    })
}

/// One node's pool of one size, as [`node_pools`] found it.
#[derive(Debug)]
pub(crate) struct NodePool {
    /// The node.
    pub node: u32,
    /// Bytes per page.
    pub page_bytes: u64,
    /// The counts, or why they could not be read.
    pub counts: Result<PoolCounts, PoolError>,
}

/// The numbers `prefix<N>suffix` names in `dir`, sorted (`node3`, with
/// `prefix` `node` and `suffix` empty; `hugepages-2048kB`).
fn numbered(dir: &Path, prefix: &str, suffix: &str) -> std::io::Result<Vec<u64>> {
    let mut out: Vec<u64> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name();
            let n = name.to_str()?.strip_prefix(prefix)?.strip_suffix(suffix)?;
            (!n.is_empty() && n.len() <= 19 && n.bytes().all(|b| b.is_ascii_digit()))
                .then(|| n.parse().ok())
                .flatten()
        })
        .collect();
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// Every node's pool of every page size under `root`, by node then size:
/// the nodes are the `node<N>` folders of `sys/devices/system/node`, the
/// sizes the `hugepages-<kB>kB` folders each node has. A node without a
/// `hugepages` folder (no memory, or a kernel without hugetlb) has no
/// entry; `Err` only when the node folder itself cannot be listed.
pub(crate) fn node_pools(root: &Path) -> std::io::Result<Vec<NodePool>> {
    let nodes_dir = root.join("sys/devices/system/node");
    let mut out = Vec::new();
    for node in numbered(&nodes_dir, "node", "")? {
        let Ok(node) = u32::try_from(node) else {
            continue;
        };
        let dir = nodes_dir.join(format!("node{node}/hugepages"));
        let Ok(sizes) = numbered(&dir, "hugepages-", "kB") else {
            continue;
        };
        for kb in sizes {
            let Some(page_bytes) = kb.checked_mul(1024) else {
                continue;
            };
            out.push(NodePool {
                node,
                page_bytes,
                counts: node_pool(root, node, page_bytes),
            });
        }
    }
    Ok(out)
}

/// The transparent huge page settings: `enabled` and `defrag` as the files
/// hold them (`always [madvise] never`), `None` when unreadable.
pub(crate) fn thp_files(root: &Path) -> (Option<String>, Option<String>) {
    let d = root.join("sys/kernel/mm/transparent_hugepage");
    let read = |f: &str| std::fs::read_to_string(d.join(f)).ok();
    (read("enabled"), read("defrag"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::fake_root as root;

    const N0: &str = "sys/devices/system/node/node0/hugepages/hugepages-2048kB";
    const N1: &str = "sys/devices/system/node/node1/hugepages/hugepages-2048kB";
    const N1G: &str = "sys/devices/system/node/node1/hugepages/hugepages-1048576kB";
    const G: &str = "sys/kernel/mm/hugepages/hugepages-2048kB";

    fn pool_files(dir: &str, total: u64, free: u64, surplus: u64) -> Vec<(String, String)> {
        vec![
            (format!("{dir}/nr_hugepages"), format!("{total}\n")),
            (format!("{dir}/free_hugepages"), format!("{free}\n")),
            (format!("{dir}/surplus_hugepages"), format!("{surplus}\n")),
        ]
    }

    fn tree(files: Vec<(String, String)>) -> tempfile::TempDir {
        let f: Vec<(&str, &str)> = files
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        root(&f)
    }

    fn two_nodes() -> tempfile::TempDir {
        let mut f = pool_files(N0, 0, 0, 0);
        f.extend(pool_files(N1, 64, 60, 2));
        f.extend(pool_files(N1G, 2, 1, 0));
        f.extend(pool_files(G, 64, 60, 2));
        f.push((format!("{G}/resv_hugepages"), "8\n".into()));
        f.push((format!("{G}/nr_overcommit_hugepages"), "4\n".into()));
        // A CPU-only node: no hugepages folder.
        f.push((
            "sys/devices/system/node/node2/cpulist".into(),
            "4-7\n".into(),
        ));
        f.push(("sys/devices/system/node/possible".into(), "0-2\n".into()));
        tree(f)
    }

    #[test]
    fn reads_every_node_and_size() {
        let r = two_nodes();
        let p = node_pools(r.path()).unwrap();
        let got: Vec<(u32, u64, PoolCounts)> = p
            .iter()
            .map(|p| (p.node, p.page_bytes, *p.counts.as_ref().unwrap()))
            .collect();
        let c = |total, free, surplus| PoolCounts {
            total,
            free,
            surplus,
        };
        assert_eq!(
            got,
            [
                (0, SIZE_2M, c(0, 0, 0)),
                (1, SIZE_2M, c(64, 60, 2)),
                (1, SIZE_1G, c(2, 1, 0)),
            ]
        );
    }

    #[test]
    fn usable_pages_are_bounded_by_the_node_and_the_reservations() {
        let r = two_nodes();
        let a = availability(r.path(), 1, SIZE_2M).unwrap();
        assert_eq!(a.global.reserved, 8);
        // 60 free on the node, 60 - 8 unreserved on the machine.
        assert_eq!(a.usable(), 52);
        assert_eq!(a.overcommit_room(), 2);
        let a = availability(r.path(), 0, SIZE_2M).unwrap();
        assert_eq!(a.usable(), 0);
        // No machine-wide 1 GiB folder in this tree.
        let e = availability(r.path(), 1, SIZE_1G).unwrap_err();
        assert!(matches!(e, PoolError::Missing { .. }), "{e}");
        assert!(e.to_string().contains("hugepages-1048576kB"), "{e}");
    }

    #[test]
    fn missing_and_garbage_files_are_errors_naming_the_file() {
        let mut f = pool_files(N0, 4, 4, 0);
        f[1].1 = "lots\n".into();
        f.extend(pool_files(N1, 1, 1, 0));
        f.retain(|(p, _)| !p.ends_with("node1/hugepages/hugepages-2048kB/surplus_hugepages"));
        let r = tree(f);
        let p = node_pools(r.path()).unwrap();
        assert_eq!(p.len(), 2);
        let e = p[0].counts.as_ref().unwrap_err();
        assert!(
            matches!(e, PoolError::NotACount { text, .. } if text == "lots"),
            "{e}"
        );
        assert!(e
            .to_string()
            .contains("node0/hugepages/hugepages-2048kB/free_hugepages"));
        let e = p[1].counts.as_ref().unwrap_err();
        assert!(matches!(e, PoolError::Missing { .. }), "{e}");
        assert!(e.path().ends_with("surplus_hugepages"));
        for bad in ["-1", "", "18446744073709551616", "1e3", "0x10"] {
            let r = root(&[(&format!("{N0}/nr_hugepages"), bad)]);
            let e = count(r.path().join(N0).join("nr_hugepages")).unwrap_err();
            assert!(matches!(e, PoolError::NotACount { .. }), "{bad:?}: {e}");
        }
    }

    #[test]
    fn a_tree_without_nodes_is_an_error_and_odd_names_are_ignored() {
        let r = root(&[(
            "sys/kernel/mm/transparent_hugepage/enabled",
            "[always] madvise never\n",
        )]);
        assert!(node_pools(r.path()).is_err());
        let r = root(&[
            (
                "sys/devices/system/node/nodeX/hugepages/hugepages-2048kB/nr_hugepages",
                "1",
            ),
            (
                "sys/devices/system/node/node0/hugepages/hugepages-kB/nr_hugepages",
                "1",
            ),
            (
                "sys/devices/system/node/node0/hugepages/huge-2048kB/nr_hugepages",
                "1",
            ),
            (
                "sys/devices/system/node/node99999999999/hugepages/hugepages-2048kB/nr_hugepages",
                "1",
            ),
        ]);
        assert!(node_pools(r.path()).unwrap().is_empty());
        let (enabled, defrag) = thp_files(r.path());
        assert_eq!((enabled, defrag), (None, None));
    }

    #[test]
    fn reads_this_machine_without_failing() {
        // Whatever the kernel offers; every file it has must parse.
        if let Ok(pools) = node_pools(Path::new("/")) {
            for p in pools {
                assert!(p.counts.is_ok(), "{:?}", p.counts);
            }
        }
    }
}
