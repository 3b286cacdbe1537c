//! `numapin.configure()`: the configuration of the runtime made on first
//! use. Each keyword is a type that checks what it is given as it is
//! extracted ([`crate::args`]); the configuration they make is checked as a
//! whole by [`RuntimeConfig::check`], the library's one checker, before it
//! is stored.

use std::time::Duration;

use numapin::runtime::{
    Backend, HugePages, MachineBudget, OffNode, ParseMachineBudgetError, RuntimeConfig,
};
use pyo3::prelude::*;
use pyo3::types::{PyFloat, PyString};

use crate::args::{self, Choice, Choices, Names};
use crate::errors::{input_error, to_py};
use crate::runtime::{store_config, NotStored};

impl Choices for OffNode {
    const ARG: &'static str = "placement";
    const WHAT: &'static str = "a placement rule";
    const NAMES: Names<Self> = &[
        ("strict", OffNode::Strict, "a page off its node is an error"),
        ("warn", OffNode::Warn, "counted in stats"),
    ];
}

impl Choices for Backend {
    const ARG: &'static str = "backend";
    const WHAT: &'static str = "a region backend";
    const NAMES: Names<Self> = &[
        (
            "mapped",
            Backend::Mapped,
            "the default: mmap + mbind + mlock + cuMemHostRegister",
        ),
        (
            "driver_numa",
            Backend::DriverNuma,
            "cuMemCreate on the node",
        ),
        (
            "host_alloc_bound",
            Backend::HostAllocBound,
            "cuMemHostAlloc under MPOL_BIND",
        ),
    ];
}

impl Choices for HugePages {
    const ARG: &'static str = "huge_pages";
    const WHAT: &'static str = "a huge page choice";
    const NAMES: Names<Self> = &[
        ("auto", HugePages::Auto, "hugetlb pages when the node's pool has enough, else transparent huge pages; the default"),
        ("thp", HugePages::Transparent, "transparent huge pages"),
        ("2m", HugePages::Hugetlb2M, "2 MiB hugetlb pages from the node's pool, an error when it is short"),
        ("1g", HugePages::Hugetlb1G, "1 GiB hugetlb pages, likewise"),
        ("none", HugePages::None, "4 KiB pages"),
    ];

    /// The library's spellings (`transparent`, any case).
    fn parse(name: &str) -> Option<Self> {
        name.parse().ok()
    }
}

/// A keyword of `configure` that is a number or a bool: a type of its own,
/// read by `args::$read` (with the bound or fix after the name).
macro_rules! keyword {
    ($(#[$doc:meta])* $ty:ident($inner:ty) = $arg:literal, $read:ident($how:expr)) => {
        $(#[$doc])*
        pub(crate) struct $ty($inner);

        impl<'py> FromPyObject<'_, 'py> for $ty {
            type Error = PyErr;

            fn extract(obj: Borrowed<'_, 'py, PyAny>) -> PyResult<Self> {
                args::$read(&obj, $arg, $how).map($ty)
            }
        }
    };
}

const BOOL: &str = "pass True or False (or None for the default)";

keyword!(
    /// Pinned bytes allowed per node.
    BudgetBytes(u64) = "budget_bytes", int(u64::MAX)
);
keyword!(
    /// Pinned bytes allowed per node, as a fraction of its memory.
    BudgetFraction(f64) = "budget_fraction", number("pass a fraction such as 0.5")
);
keyword!(
    /// Bytes of each standard region.
    RegionBytes(usize) = "region_bytes", int(u64::MAX)
);
keyword!(
    /// Each thread's cache of freed blocks: at most this many blocks.
    ThreadCacheBlocks(usize) = "thread_cache_blocks", int(u64::from(u32::MAX))
);
keyword!(
    /// Each thread's cache of freed blocks: at most this many bytes.
    ThreadCacheBytes(u64) = "thread_cache_bytes", int(u64::MAX)
);
keyword!(
    /// Threads that fault in a new region (0 picks).
    PopulateThreads(usize) = "populate_threads", int(4096)
);
keyword!(
    /// Whether regions are registered with CUDA.
    Register(bool) = "register", flag(BOOL)
);
keyword!(
    /// Whether each standard region is made in two halves.
    RegisterInParts(bool) = "register_in_parts", flag(BOOL)
);

/// `machine_budget`: `"auto"`, `"off"`, a fraction of each node's memory
/// (a float, or its text), bytes per node (an int, or text with a unit such
/// as `"64GiB"`). Its range is the library's to check.
pub(crate) struct MachineBudgetArg(MachineBudget);

impl<'py> FromPyObject<'_, 'py> for MachineBudgetArg {
    type Error = PyErr;

    fn extract(obj: Borrowed<'_, 'py, PyAny>) -> PyResult<Self> {
        let py = obj.py();
        if let Ok(s) = obj.cast::<PyString>() {
            return s.to_cow()?.parse().map(MachineBudgetArg).map_err(
                |e: ParseMachineBudgetError| {
                    input_error(
                        py,
                        format!("machine_budget={:?}: {}", e.text, e.problem),
                        ParseMachineBudgetError::FIX,
                    )
                },
            );
        }
        const FIX: &str = "pass \"auto\", \"off\", a fraction such as 0.5, bytes as an int, or a size such as \"64GiB\"";
        if obj.is_instance_of::<PyFloat>() && !args::is_bool(&obj) {
            return args::number(&obj, "machine_budget", FIX)
                .map(|f| MachineBudgetArg(MachineBudget::Fraction(f)));
        }
        args::int(&obj, "machine_budget", u64::MAX / 2)
            .map(|b| MachineBudgetArg(MachineBudget::Bytes(b)))
    }
}

/// Longest `budget_wait`: a year.
const MAX_WAIT_S: f64 = 86_400.0 * 365.0;

/// `budget_wait`: seconds, from 0 to a year.
pub(crate) struct BudgetWait(Duration);

impl<'py> FromPyObject<'_, 'py> for BudgetWait {
    type Error = PyErr;

    fn extract(obj: Borrowed<'_, 'py, PyAny>) -> PyResult<Self> {
        const FIX: &str = "pass the seconds to wait for pinned memory when over budget (e.g. 30.0), or None to fail at once";
        let w = args::number(&obj, "budget_wait", FIX)?;
        if w.is_finite() && (0.0..=MAX_WAIT_S).contains(&w) {
            return Ok(BudgetWait(Duration::from_secs_f64(w)));
        }
        Err(input_error(
            obj.py(),
            format!("budget_wait={w} is not a number of seconds from 0 to a year"),
            FIX,
        ))
    }
}

/// Sets `field` to `value` when one was given.
fn set<T>(field: &mut T, value: Option<T>) {
    if let Some(v) = value {
        *field = v;
    }
}

/// Sets the configuration of the runtime numapin makes on first use.
#[pyfunction]
#[pyo3(signature = (*, budget_bytes=None, budget_fraction=None, region_bytes=None, register=None, placement=None, thread_cache_blocks=None, thread_cache_bytes=None, populate_threads=None, backend=None, huge_pages=None, register_in_parts=None, machine_budget=None, budget_wait=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn configure(
    py: Python<'_>,
    budget_bytes: Option<BudgetBytes>,
    budget_fraction: Option<BudgetFraction>,
    region_bytes: Option<RegionBytes>,
    register: Option<Register>,
    placement: Option<Choice<OffNode>>,
    thread_cache_blocks: Option<ThreadCacheBlocks>,
    thread_cache_bytes: Option<ThreadCacheBytes>,
    populate_threads: Option<PopulateThreads>,
    backend: Option<Choice<Backend>>,
    huge_pages: Option<Choice<HugePages>>,
    register_in_parts: Option<RegisterInParts>,
    machine_budget: Option<MachineBudgetArg>,
    budget_wait: Option<BudgetWait>,
) -> PyResult<()> {
    let apply = |c: &mut RuntimeConfig| {
        set(&mut c.budget_bytes, budget_bytes.map(|b| Some(b.0)));
        set(&mut c.budget_fraction, budget_fraction.map(|f| f.0));
        set(&mut c.region_bytes, region_bytes.map(|r| r.0));
        set(&mut c.register, register.map(|r| r.0));
        set(&mut c.off_node, placement.map(|p| p.0));
        set(
            &mut c.thread_cache.max_blocks,
            thread_cache_blocks.map(|b| b.0),
        );
        set(
            &mut c.thread_cache.max_bytes,
            thread_cache_bytes.map(|b| b.0),
        );
        set(&mut c.populate_threads, populate_threads.map(|t| t.0));
        set(&mut c.backend, backend.map(|b| b.0));
        set(&mut c.huge_pages, huge_pages.map(|h| h.0));
        set(&mut c.register_in_parts, register_in_parts.map(|r| r.0));
        set(&mut c.machine_budget, machine_budget.map(|m| Some(m.0)));
        set(&mut c.budget_wait, budget_wait.map(|w| Some(w.0)));
    };
    store_config(apply).map_err(|e| match e {
        NotStored::Invalid(e) => to_py(py, &e),
        NotStored::RuntimeMade => input_error(
            py,
            "numapin.configure() after numapin already made its runtime (an empty(), pin(), stats() or copy call came first)",
            "call numapin.configure() once, before any other numapin call that allocates",
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each of the library's choices has its own name here, so a choice the
    /// library adds is one Python can ask for.
    fn named<T: Choices + PartialEq + std::fmt::Debug>(
        all: &[T],
        name: impl Fn(&T) -> &'static str,
    ) {
        for v in all {
            assert!(
                T::NAMES.iter().any(|(n, x, _)| x == v && *n == name(v)),
                "{} has no name {:?}",
                T::ARG,
                name(v)
            );
            assert_eq!(T::parse(name(v)), Some(*v));
        }
        assert_eq!(T::NAMES.len(), all.len());
    }

    #[test]
    fn every_backend_and_huge_page_choice_is_named() {
        named(&Backend::ALL, Backend::as_str);
        named(&HugePages::ALL, HugePages::as_str);
        assert_eq!(
            HugePages::parse("Transparent"),
            Some(HugePages::Transparent)
        );
    }
}
