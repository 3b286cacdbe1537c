//! Which pages back a region: transparent huge pages, hugetlb pages from
//! the kernel's pool (2 MiB or 1 GiB), or 4 KiB pages; and the choice
//! [`HugePages::Auto`] makes for each region (see `docs/arena.md`, Huge
//! pages).
//!
//! hugetlb pages come from a pool the administrator reserved on each node
//! (`nr_hugepages`): they need no allocation or compaction at fault time,
//! are never split, swapped or collapsed, and map a GiB with 512 (2 MiB) or
//! 1 (1 GiB) page table entries. A region that asks for them and finds too
//! few free pages on its node either fails ([`HugePages::Hugetlb2M`],
//! [`HugePages::Hugetlb1G`]) or uses transparent huge pages
//! ([`HugePages::Auto`]).

use std::path::Path;
use std::sync::OnceLock;

use super::{fmt_bytes, RuntimeError};
use crate::num::usize_from;
use crate::platform::hugetlb::{self, PoolError, SIZE_1G, SIZE_2M};
use crate::platform::numa;

/// Regions are multiples of this, and aligned to it (the x86-64 and
/// aarch64-with-4K-pages huge page size).
pub const HUGE_PAGE: usize = 2 << 20;
/// The base page size placement is checked at.
pub const PAGE: usize = 4096;

/// Whether transparent huge pages may back an `madvise(MADV_HUGEPAGE)`
/// range (mode `always` or `madvise`).
pub fn thp_enabled() -> bool {
    static MODE: OnceLock<bool> = OnceLock::new();
    *MODE.get_or_init(|| {
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .map(|s| s.contains("[always]") || s.contains("[madvise]"))
            .unwrap_or(false)
    })
}

/// Which pages regions ask for
/// ([`RuntimeConfig::huge_pages`](crate::runtime::RuntimeConfig::huge_pages)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum HugePages {
    /// hugetlb pages when the node's pool has enough free pages for the
    /// whole region at the moment it is made (2 MiB pages; 1 GiB pages when
    /// the 2 MiB pool is short and the region's size is a multiple of
    /// 1 GiB), otherwise
    /// transparent huge pages (as [`HugePages::Transparent`]). On a
    /// machine without a reserved pool, that is always transparent huge
    /// pages. Also transparent huge pages on a kernel without
    /// `MADV_POPULATE_WRITE` (before Linux 5.14), where hugetlb pages could
    /// not be faulted in without the risk of `SIGBUS`.
    #[default]
    Auto,
    /// Transparent huge pages: `madvise(MADV_HUGEPAGE)` when the kernel's
    /// THP mode is `always` or `madvise`, 4 KiB pages when it is `never`.
    Transparent,
    /// 2 MiB hugetlb pages from the node's pool; region sizes are multiples
    /// of 2 MiB. A node whose pool lacks the pages is an error
    /// ([`RuntimeError::HugePages`]).
    Hugetlb2M,
    /// 1 GiB hugetlb pages from the node's pool; region sizes (and so the
    /// configured region size) are rounded up to 1 GiB. A node whose pool
    /// lacks the pages is an error ([`RuntimeError::HugePages`]).
    Hugetlb1G,
    /// 4 KiB pages only (`madvise(MADV_NOHUGEPAGE)`, even with THP in
    /// `always` mode).
    None,
}

impl HugePages {
    /// `auto`, `thp`, `2m`, `1g`, `none`: the names [`str::parse`] takes.
    pub fn as_str(&self) -> &'static str {
        match self {
            HugePages::Auto => "auto",
            HugePages::Transparent => "thp",
            HugePages::Hugetlb2M => "2m",
            HugePages::Hugetlb1G => "1g",
            HugePages::None => "none",
        }
    }

    /// Every choice, in the order of the docs.
    pub const ALL: [HugePages; 5] = [
        HugePages::Auto,
        HugePages::Transparent,
        HugePages::Hugetlb2M,
        HugePages::Hugetlb1G,
        HugePages::None,
    ];

    /// What region sizes are multiples of: 1 GiB for
    /// [`HugePages::Hugetlb1G`], 2 MiB otherwise.
    pub fn granule(&self) -> usize {
        match self {
            HugePages::Hugetlb1G => usize_from(SIZE_1G),
            _ => HUGE_PAGE,
        }
    }
}

impl std::fmt::Display for HugePages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is not a [`HugePages`] choice.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{text}` is not a huge page choice: use auto, thp, 2m, 1g or none")]
pub struct ParseHugePagesError {
    /// The text given.
    pub text: String,
}

impl std::str::FromStr for HugePages {
    type Err = ParseHugePagesError;

    /// `auto`, `thp` (or `transparent`), `2m`, `1g`, `none`; any case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s.trim().to_ascii_lowercase().as_str() {
            "auto" => HugePages::Auto,
            "thp" | "transparent" => HugePages::Transparent,
            "2m" => HugePages::Hugetlb2M,
            "1g" => HugePages::Hugetlb1G,
            "none" => HugePages::None,
            _ => {
                return Err(ParseHugePagesError {
                    text: s.chars().take(40).collect(),
                })
            }
        })
    }
}

/// The pages that back one region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[non_exhaustive]
pub enum PageKind {
    /// 4 KiB pages (THP mode `never`, or [`HugePages::None`]).
    #[serde(rename = "base")]
    Base,
    /// Transparent huge pages asked for with `MADV_HUGEPAGE` (the kernel
    /// gives 2 MiB pages where it can and 4 KiB pages elsewhere).
    #[serde(rename = "thp")]
    Transparent,
    /// 2 MiB hugetlb pages from the node's pool.
    #[serde(rename = "hugetlb_2m")]
    Hugetlb2M,
    /// 1 GiB hugetlb pages from the node's pool.
    #[serde(rename = "hugetlb_1g")]
    Hugetlb1G,
    /// The CUDA driver's own (a driver backend,
    /// [`Backend::DriverNuma`](super::Backend::DriverNuma) or
    /// [`Backend::HostAllocBound`](super::Backend::HostAllocBound)).
    #[serde(rename = "driver")]
    Driver,
}

impl PageKind {
    /// `base`, `thp`, `hugetlb_2m`, `hugetlb_1g`, `driver`: the name in
    /// `numapin bench` parameters and in JSON.
    pub fn as_str(&self) -> &'static str {
        match self {
            PageKind::Base => "base",
            PageKind::Transparent => "thp",
            PageKind::Hugetlb2M => "hugetlb_2m",
            PageKind::Hugetlb1G => "hugetlb_1g",
            PageKind::Driver => "driver",
        }
    }

    /// Bytes per hugetlb page, `None` for the other kinds.
    pub fn hugetlb_bytes(&self) -> Option<usize> {
        match self {
            PageKind::Hugetlb2M => Some(usize_from(SIZE_2M)),
            PageKind::Hugetlb1G => Some(usize_from(SIZE_1G)),
            PageKind::Base | PageKind::Transparent | PageKind::Driver => None,
        }
    }

    /// What the region's size is a multiple of (and aligned to).
    pub fn granule(&self) -> usize {
        self.hugetlb_bytes().unwrap_or(HUGE_PAGE)
    }

    /// In words: `4 KiB pages`, `transparent huge pages`, `2 MiB hugetlb
    /// pages`, `1 GiB hugetlb pages`.
    pub fn words(&self) -> &'static str {
        match self {
            PageKind::Base => "4 KiB pages",
            PageKind::Transparent => "transparent huge pages",
            PageKind::Hugetlb2M => "2 MiB hugetlb pages",
            PageKind::Hugetlb1G => "1 GiB hugetlb pages",
            PageKind::Driver => "the driver's pages",
        }
    }
}

/// The pages a region gets, and why when it is not what was asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Choice {
    /// The kind.
    pub(crate) kind: PageKind,
    /// Why Auto did not take a pool that exists, or how an explicit
    /// choice will be faulted in on an old kernel (for the region's notes).
    pub(crate) note: Option<String>,
}

/// The kind THP gives: transparent huge pages, or 4 KiB pages when the THP
/// mode is `never`.
fn transparent() -> PageKind {
    if thp_enabled() {
        PageKind::Transparent
    } else {
        PageKind::Base
    }
}

/// A pool file error as the `io::Error` an [`RuntimeError`] keeps.
fn io_error(e: PoolError) -> std::io::Error {
    let kind = match &e {
        PoolError::Missing { .. } => std::io::ErrorKind::NotFound,
        PoolError::Unreadable { source, .. } => source.kind(),
        PoolError::NotACount { .. } => std::io::ErrorKind::InvalidData,
    };
    std::io::Error::new(kind, e)
}

/// Decides the pages of a region of `size` bytes on `node` for `want`,
/// reading the pools under `root` (`/` on this machine). An explicit
/// hugetlb choice whose pool cannot supply the region is an error; Auto
/// never is.
pub(crate) fn choose(
    want: HugePages,
    node: u32,
    size: usize,
    root: &Path,
) -> Result<Choice, RuntimeError> {
    let plain = |kind| Choice { kind, note: None };
    match want {
        HugePages::Transparent => Ok(plain(transparent())),
        HugePages::None => Ok(plain(PageKind::Base)),
        HugePages::Hugetlb2M => explicit(PageKind::Hugetlb2M, node, size, root),
        HugePages::Hugetlb1G => explicit(PageKind::Hugetlb1G, node, size, root),
        HugePages::Auto => Ok(auto(node, size, root)),
    }
}

fn explicit(kind: PageKind, node: u32, size: usize, root: &Path) -> Result<Choice, RuntimeError> {
    let page = kind.granule();
    let len = size.div_ceil(page).max(1) * page;
    let needed = (len / page) as u64;
    let err = |problem: String, usable, pool, source| RuntimeError::HugePages {
        node,
        size: len as u64,
        page_bytes: page as u64,
        needed,
        usable,
        pool,
        problem,
        source,
    };
    let a = hugetlb::availability(root, node, page as u64).map_err(|e| {
        let problem = match &e {
            PoolError::Missing { .. } => format!(
                "this kernel offers no {} hugetlb pages on node {node}",
                fmt_bytes(page as u64)
            ),
            _ => format!("the node's {} pool cannot be read", fmt_bytes(page as u64)),
        };
        err(problem, None, None, Some(io_error(e)))
    })?;
    if a.usable() + a.overcommit_room() < needed {
        return Err(err(
            pool_words(&a, node, page as u64, needed),
            Some(a.usable()),
            Some(a.node.total),
            None,
        ));
    }
    let note = (!numa::populate_write_supported()).then(|| {
        "this kernel has no MADV_POPULATE_WRITE (Linux 5.14): hugetlb pages touched after checking the node's pool, a process taking them in between would end this one with SIGBUS".to_string()
    });
    Ok(Choice { kind, note })
}

/// `node 1's 2 MiB pool has 3 pages free that no mapping reserved (64 in
/// the pool), 128 needed`.
fn pool_words(a: &hugetlb::Availability, node: u32, page: u64, needed: u64) -> String {
    let mut s = format!(
        "node {node}'s {} pool has {} free page(s) that no mapping reserved ({} in the pool, {} free), {needed} needed",
        fmt_bytes(page),
        a.usable(),
        a.node.total,
        a.node.free,
    );
    if a.overcommit_room() > 0 {
        s.push_str(&format!(
            ", and overcommit allows {} more",
            a.overcommit_room()
        ));
    }
    s
}

fn auto(node: u32, size: usize, root: &Path) -> Choice {
    let fallback = transparent();
    let mut short = Vec::new();
    // The size any region has (a multiple of 2 MiB).
    let len = size.div_ceil(HUGE_PAGE).max(1) * HUGE_PAGE;
    // 2 MiB pages first: the kernel zeroes each hugetlb page in one thread,
    // so a region of few 1 GiB pages populates with few threads (a 1 GiB
    // region on 16 cores of an H200 VM: 177 ms with one 1 GiB page, 22 ms
    // with 512 pages of 2 MiB); 1 GiB pages when the 2 MiB pool is short.
    for kind in [PageKind::Hugetlb2M, PageKind::Hugetlb1G] {
        let page = kind.granule();
        // 1 GiB pages only where they add nothing to the region's size.
        if len % page != 0 {
            continue;
        }
        let needed = (len / page) as u64;
        match hugetlb::availability(root, node, page as u64) {
            Ok(a) if a.usable() >= needed => {
                if numa::populate_write_supported() {
                    return Choice { kind, note: None };
                }
                short.push(format!(
                    "node {node}'s {} pool has the pages but this kernel has no MADV_POPULATE_WRITE (Linux 5.14) to fault them in without risking SIGBUS",
                    fmt_bytes(page as u64)
                ));
            }
            // A pool that exists but is short is worth a note; no pool is
            // the usual case and is not.
            Ok(a) if a.node.total > 0 || a.node.surplus > 0 => {
                short.push(pool_words(&a, node, page as u64, needed));
            }
            Ok(_) | Err(PoolError::Missing { .. }) => {}
            Err(e) => short.push(e.to_string()),
        }
    }
    Choice {
        kind: fallback,
        note: (!short.is_empty()).then(|| {
            format!(
                "huge pages auto: {}: {} instead",
                short.join("; "),
                fallback.words()
            )
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::fake_root;

    fn pools(node_free: &[(u32, u64, u64)], global_free: u64, resv: u64) -> tempfile::TempDir {
        let mut files: Vec<(String, String)> = Vec::new();
        let mut total_2m = 0;
        for &(node, page_kb, free) in node_free {
            let d = format!("sys/devices/system/node/node{node}/hugepages/hugepages-{page_kb}kB");
            files.push((format!("{d}/nr_hugepages"), format!("{}\n", free + 1)));
            files.push((format!("{d}/free_hugepages"), format!("{free}\n")));
            files.push((format!("{d}/surplus_hugepages"), "0\n".into()));
            if page_kb == 2048 {
                total_2m += free + 1;
            }
        }
        for (page_kb, total, free) in [(2048, total_2m, global_free), (1048576, 8, global_free)] {
            let d = format!("sys/kernel/mm/hugepages/hugepages-{page_kb}kB");
            files.push((format!("{d}/nr_hugepages"), format!("{total}\n")));
            files.push((format!("{d}/free_hugepages"), format!("{free}\n")));
            files.push((format!("{d}/resv_hugepages"), format!("{resv}\n")));
            files.push((format!("{d}/surplus_hugepages"), "0\n".into()));
            files.push((format!("{d}/nr_overcommit_hugepages"), "0\n".into()));
        }
        let f: Vec<(&str, &str)> = files
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        fake_root(&f)
    }

    const MIB: usize = 1 << 20;

    #[test]
    fn names_round_trip() {
        for h in HugePages::ALL {
            assert_eq!(h.as_str().parse::<HugePages>(), Ok(h));
        }
        assert_eq!("THP".parse::<HugePages>(), Ok(HugePages::Transparent));
        assert_eq!(" 1G ".parse::<HugePages>(), Ok(HugePages::Hugetlb1G));
        let e = "4k".parse::<HugePages>().unwrap_err();
        assert!(e.to_string().contains("auto, thp, 2m, 1g or none"), "{e}");
        assert_eq!(HugePages::default(), HugePages::Auto);
        assert_eq!(HugePages::Hugetlb1G.granule(), 1 << 30);
        assert_eq!(HugePages::Hugetlb2M.granule(), 2 * MIB);
    }

    #[test]
    fn explicit_choices_take_the_pool_or_fail_naming_it() {
        // Node 1 has 60 free 2 MiB pages (8 reserved machine-wide).
        let r = pools(&[(0, 2048, 0), (1, 2048, 60), (1, 1048576, 2)], 60, 8);
        let c = choose(HugePages::Hugetlb2M, 1, 100 * MIB, r.path()).unwrap();
        assert_eq!(c.kind, PageKind::Hugetlb2M);
        let e = choose(HugePages::Hugetlb2M, 1, 120 * MIB, r.path()).unwrap_err();
        assert!(
            matches!(
                e,
                RuntimeError::HugePages {
                    needed: 60,
                    usable: Some(52),
                    ..
                }
            ),
            "{e}"
        );
        let msg = e.to_string();
        assert!(
            msg.contains("node 1's 2 MiB pool has 52 free page(s)"),
            "{msg}"
        );
        assert_eq!(e.kind(), crate::report::ErrorKind::Budget);
        let fix = e.fix().unwrap();
        assert!(
            fix.contains("`echo 69 > /sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages` (the pool's new size: 61 now, 8 more)"),
            "{fix}"
        );
        let e = choose(HugePages::Hugetlb2M, 0, 2 * MIB, r.path()).unwrap_err();
        assert!(
            matches!(
                e,
                RuntimeError::HugePages {
                    usable: Some(0),
                    ..
                }
            ),
            "{e}"
        );
        // No 1 GiB folder for node 0: the kernel offers none there.
        let e = choose(HugePages::Hugetlb1G, 0, 1 << 30, r.path()).unwrap_err();
        assert!(
            e.to_string()
                .contains("offers no 1 GiB hugetlb pages on node 0"),
            "{e}"
        );
        assert!(std::error::Error::source(&e).is_some());
        // 1 GiB pages round the region up: 100 MiB needs one.
        let c = choose(HugePages::Hugetlb1G, 1, 100 * MIB, r.path()).unwrap();
        assert_eq!(c.kind, PageKind::Hugetlb1G);
    }

    #[test]
    fn auto_takes_hugetlb_when_the_pool_suffices_else_thp() {
        if !numa::populate_write_supported() {
            eprintln!("skipped: this kernel has no MADV_POPULATE_WRITE, Auto never takes hugetlb");
            return;
        }
        let r = pools(&[(0, 2048, 0), (1, 2048, 60), (1, 1048576, 2)], 60, 0);
        let c = choose(HugePages::Auto, 1, 100 * MIB, r.path()).unwrap();
        assert_eq!(
            c,
            Choice {
                kind: PageKind::Hugetlb2M,
                note: None
            }
        );
        // 2 MiB pages first, even for a multiple of 1 GiB.
        let c = choose(HugePages::Auto, 1, 1 << 30, r.path());
        assert_eq!(
            c.unwrap().kind,
            PageKind::Hugetlb1G,
            "60 pages of 2 MiB are short"
        );
        let c = choose(HugePages::Auto, 1, 64 * MIB, r.path()).unwrap();
        assert_eq!(c.kind, PageKind::Hugetlb2M);
        // The 2 MiB pool short, a multiple of 1 GiB takes 1 GiB pages.
        let c = choose(HugePages::Auto, 1, 2 << 30, r.path()).unwrap();
        assert_eq!(c.kind, PageKind::Hugetlb1G);
        // Short of both: THP, and a note naming the pools.
        let c = choose(HugePages::Auto, 1, 4 << 30, r.path()).unwrap();
        assert_eq!(c.kind, transparent());
        let note = c.note.unwrap();
        assert!(
            note.starts_with("huge pages auto: node 1's 2 MiB pool has 60 free page(s)"),
            "{note}"
        );
        assert!(note.contains("node 1's 1 GiB pool"), "{note}");
        // Node 0's pool exists (1 page, none free): a note; node 2 has no
        // pool at all: no note.
        let c = choose(HugePages::Auto, 0, 2 * MIB, r.path()).unwrap();
        assert!(c.note.is_some());
        let c = choose(HugePages::Auto, 2, 2 * MIB, r.path()).unwrap();
        assert_eq!(
            c,
            Choice {
                kind: transparent(),
                note: None
            }
        );
        // Sizes are rounded to 2 MiB first, as for any region: 3 MiB is two
        // pages, 1 byte one.
        let kind = |size| choose(HugePages::Auto, 1, size, r.path()).unwrap().kind;
        assert_eq!(kind(3 * MIB), PageKind::Hugetlb2M);
        assert_eq!(kind(1), PageKind::Hugetlb2M);
        let c = choose(HugePages::Auto, 1, 120 * MIB + 1, r.path()).unwrap();
        assert!(c.note.unwrap().contains("61 needed"));
    }

    #[test]
    fn garbage_in_the_pool_files_is_an_error_or_a_fallback_never_a_panic() {
        let r = fake_root(&[
            (
                "sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages",
                "x",
            ),
            (
                "sys/devices/system/node/node0/hugepages/hugepages-2048kB/free_hugepages",
                "\u{0}\u{ff}",
            ),
            (
                "sys/devices/system/node/node0/hugepages/hugepages-2048kB/surplus_hugepages",
                "0",
            ),
        ]);
        let e = choose(HugePages::Hugetlb2M, 0, 2 * MIB, r.path()).unwrap_err();
        assert!(e.to_string().contains("pool cannot be read"), "{e}");
        let c = choose(HugePages::Auto, 0, 2 * MIB, r.path()).unwrap();
        assert_eq!(c.kind, transparent());
        let note = c.note.unwrap();
        assert!(note.contains("nr_hugepages holds \"x\""), "{note}");
        assert_eq!(
            choose(HugePages::None, 0, 2 * MIB, r.path()).unwrap().kind,
            PageKind::Base
        );
    }
}
