//! How a region was made: where its pages were placed ([`PlacedBy`]),
//! what pins them ([`PinnedBy`]), how their placement was checked
//! ([`VerifiedBy`]), which backend made it ([`Backend`]) and what a page
//! off its node means ([`OffNode`]).

use super::huge::PageKind;

/// What a page found off its node at region creation means
/// ([`RuntimeConfig::off_node`](crate::runtime::RuntimeConfig::off_node);
/// `placement` in Python's `configure`). Formerly `Placement`: "place" in
/// numapin is [`Runtime::place`](crate::runtime::Runtime::place)'s answer
/// to "where do threads and memory for this target go"; this setting only
/// says what a page the kernel put elsewhere means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OffNode {
    /// An error: the region is torn down ([`RuntimeError::OffNode`](super::RuntimeError::OffNode)).
    #[default]
    Strict,
    /// Counted in [`NodeStats::pages_off_node`](super::NodeStats::pages_off_node), the region kept.
    Warn,
}

/// How a region's pages were put on its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum PlacedBy {
    /// `mbind(MPOL_BIND)` to the node, then touched.
    Mbind,
    /// `mbind` was refused (a seccomp profile, no NUMA support): touched
    /// first by threads bound to the node's CPUs, so that the default
    /// policy allocated the pages there.
    FirstTouch,
    /// The CUDA driver placed them: `cuMemCreate` with a host NUMA
    /// location ([`Backend::DriverNuma`]).
    DriverNuma,
    /// `cuMemHostAlloc` while the calling thread's memory policy was
    /// `MPOL_BIND` to the node ([`Backend::HostAllocBound`]).
    BindPolicy,
}

/// Where a region's pinned memory comes from (the region *backend*).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Backend {
    /// numapin's own (the default): `mmap`, `mbind(MPOL_BIND)`, populated by
    /// threads on the node's CPUs, `mlock`, `cuMemHostRegister`, placement
    /// checked page by page. Works without a CUDA driver (unregistered).
    #[default]
    Mapped,
    /// The driver allocates pinned memory on the node itself: `cuMemCreate`
    /// with a `CU_MEM_LOCATION_TYPE_HOST_NUMA` location, mapped with
    /// `cuMemMap` and made accessible to the host and every GPU with
    /// `cuMemSetAccess` (CUDA 12.2+ drivers; needs a driver and a GPU).
    DriverNuma,
    /// `cuMemHostAlloc(PORTABLE | DEVICEMAP)` with the thread's memory
    /// policy bound to the node for the call (needs a driver and a GPU, and
    /// `set_mempolicy` allowed).
    HostAllocBound,
}

impl Backend {
    /// `mapped`, `driver_numa`, `host_alloc_bound`: the name in `numapin
    /// bench` parameters and on the command line.
    pub fn as_str(&self) -> &'static str {
        match self {
            Backend::Mapped => "mapped",
            Backend::DriverNuma => "driver_numa",
            Backend::HostAllocBound => "host_alloc_bound",
        }
    }

    /// Every backend, the default first.
    pub const ALL: [Backend; 3] = [
        Backend::Mapped,
        Backend::DriverNuma,
        Backend::HostAllocBound,
    ];
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backend::Mapped => "mmap + mbind + mlock + cuMemHostRegister",
            Backend::DriverNuma => "cuMemCreate on a host NUMA node",
            Backend::HostAllocBound => "cuMemHostAlloc under MPOL_BIND",
        })
    }
}

/// What keeps a region's pages resident.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum PinnedBy {
    /// `mlock`.
    Mlock,
    /// CUDA registration alone: RLIMIT_MEMLOCK was too low for `mlock`,
    /// and `cuMemHostRegister` pins the pages without that limit.
    Registration,
    /// The CUDA driver allocated them pinned (a driver backend).
    Driver,
    /// hugetlb pages, which the kernel never swaps out: not locked (`mlock`
    /// does nothing for them and is not counted in VmLck), so
    /// RLIMIT_MEMLOCK does not apply.
    Hugetlb,
}

/// How a region's placement was checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum VerifiedBy {
    /// `move_pages` with a null node list, page by page.
    MovePages,
    /// `move_pages` was refused: per-node page counts of the region's own
    /// VMAs from `/proc/self/numa_maps` (as exact).
    NumaMaps,
    /// Not checked: the driver's mapping hides its pages from both
    /// `move_pages` and `numa_maps` (a driver backend, which was given the
    /// node explicitly).
    Unverified,
}

impl PlacedBy {
    /// `mbind`, `first_touch`: the name in `numapin bench` parameters.
    pub fn as_str(&self) -> &'static str {
        match self {
            PlacedBy::Mbind => "mbind",
            PlacedBy::FirstTouch => "first_touch",
            PlacedBy::DriverNuma => "driver_numa",
            PlacedBy::BindPolicy => "bind_policy",
        }
    }
}

impl PinnedBy {
    /// `mlock`, `registration`.
    pub fn as_str(&self) -> &'static str {
        match self {
            PinnedBy::Mlock => "mlock",
            PinnedBy::Registration => "registration",
            PinnedBy::Driver => "driver",
            PinnedBy::Hugetlb => "hugetlb",
        }
    }
}

impl VerifiedBy {
    /// `move_pages`, `numa_maps`.
    pub fn as_str(&self) -> &'static str {
        match self {
            VerifiedBy::MovePages => "move_pages",
            VerifiedBy::NumaMaps => "numa_maps",
            VerifiedBy::Unverified => "unverified",
        }
    }
}

/// How one region was placed, pinned and verified, and which pages back
/// it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub struct RegionMethods {
    /// How the pages were put on the node.
    pub placed: PlacedBy,
    /// What keeps the pages resident.
    pub pinned: PinnedBy,
    /// How placement was checked.
    pub verified: VerifiedBy,
    /// The pages ([`RuntimeConfig::huge_pages`](crate::runtime::RuntimeConfig::huge_pages)
    /// asks, the node's pool decides).
    pub pages: PageKind,
}

impl std::fmt::Display for RegionMethods {
    /// `placed by first touch, pinned by CUDA registration, verified
    /// through numa_maps, transparent huge pages`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let placed = match self.placed {
            PlacedBy::Mbind => "bound (mbind MPOL_BIND)",
            PlacedBy::FirstTouch => "placed by first touch",
            PlacedBy::DriverNuma => "placed by the driver (cuMemCreate, host NUMA location)",
            PlacedBy::BindPolicy => "allocated by cuMemHostAlloc under MPOL_BIND",
        };
        let pinned = match self.pinned {
            PinnedBy::Mlock => "locked (mlock)",
            PinnedBy::Registration => "pinned by CUDA registration (no mlock)",
            PinnedBy::Driver => "pinned by the driver",
            PinnedBy::Hugetlb => "hugetlb (never swapped, no mlock)",
        };
        let verified = match self.verified {
            VerifiedBy::MovePages => "verified with move_pages",
            VerifiedBy::NumaMaps => "verified through /proc/self/numa_maps",
            VerifiedBy::Unverified => "not verifiable (the driver's mapping hides its pages)",
        };
        write!(f, "{placed}, {pinned}, {verified}, {}", self.pages.words())
    }
}
