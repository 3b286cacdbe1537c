//! Discovery through hwloc: this machine, an hwloc XML export, or a captured
//! filesystem root.
//!
//! [`build`] makes hwloc topologies (one at a time, files in a child
//! process), [`extract`] takes what numapin needs from one in named steps
//! (with [`nodes`], [`sets`] and [`locality`]); the PCI tree with the NICs
//! and drives is `iodev::hwloc`'s, which uses [`locality`] too.

mod build;
mod extract;
pub(super) mod locality;
mod nodes;
mod prescan;
mod sets;

use std::ffi::OsString;
use std::path::Path;

use self::build::{builder, guarded, hw_err, isolated, lock};
use self::extract::extract;
use super::{ProbeOptions, RawTopology, TopologyError as Error};

type Result<T, E = Error> = std::result::Result<T, E>;

/// The `HWLOC_*` variables that make hwloc describe something other than
/// this machine (in the order hwloc honours them). The live probe refuses
/// to run under them: numapin reads such descriptions only as an explicit
/// input (`--input`), with that input's limits.
pub(crate) const HWLOC_REPLACING_VARS: [&str; 4] = [
    "HWLOC_FSROOT",
    "HWLOC_CPUID_PATH",
    "HWLOC_SYNTHETIC",
    "HWLOC_XMLFILE",
];

/// Refuses a live probe that hwloc would answer from a file or a synthetic
/// description instead of this machine.
fn check_env_overrides() -> Result<()> {
    for var in HWLOC_REPLACING_VARS {
        if let Some(v) = std::env::var_os(var) {
            return Err(Error::env(
                var,
                v.to_string_lossy(),
                "hwloc would describe what this variable names instead of this machine",
                format!("unset {var} to describe this machine; to read a saved machine, give its file with --input"),
            ));
        }
    }
    Ok(())
}

/// This machine, with I/O objects, restricted to what this process may use.
pub(crate) fn discover_live(opts: &ProbeOptions) -> Result<RawTopology> {
    check_env_overrides()?;
    // The lock covers the whole life of the hwloc topology, its destruction
    // included: hwloc takes a process-wide mutex in init and destroy, and a
    // file reader forks (crate::isolate) only while holding this lock, so
    // the child never inherits that mutex locked.
    let mut raw = {
        let _g = lock();
        let topo = guarded(None, || {
            builder(None)?.build().map_err(|e| hw_err("build", None, e))
        })?;
        let raw = guarded(None, || {
            extract(&topo, opts, Some(Path::new("/")), "this machine")
        })?;
        drop(topo);
        raw
    };
    let affinity = crate::platform::sys::sched_getaffinity_self()
        .map_err(|e| Error::system("sched_getaffinity", "report this as a bug", e))?;
    raw.allowed.cpus = raw.allowed.cpus.intersection(&affinity);
    if raw.allowed.cpus.is_empty() {
        raw.allowed.cpus = affinity;
    }
    Ok(raw)
}

/// An hwloc XML export (its text), counted against the limits as it is
/// read ([`prescan`]), then built by hwloc in a child process: hwloc
/// aborts on some malformed files, and that must not take numapin down.
pub(crate) fn discover_xml(xml: &str, source: &str, opts: &ProbeOptions) -> Result<RawTopology> {
    prescan::check(xml, source, &opts.accelerator_ids)?;
    let _g = lock();
    let input = Path::new(source);
    isolated(source, || {
        let b = builder(Some(input))?
            .from_xml(xml)
            .map_err(|e| hw_err("XML", Some(input), e))?;
        let topo = b.build().map_err(|e| hw_err("XML", Some(input), e))?;
        extract(&topo, opts, None, source)
    })
}

/// A captured filesystem root (a folder holding `sys/` and `proc/`, already
/// checked by `topology::capture`), counted against the limits
/// (`capture::census`) before hwloc reads it in a child process.
pub(crate) fn discover_fsroot(
    root: &Path,
    source: &str,
    opts: &ProbeOptions,
) -> Result<RawTopology> {
    super::capture::census(root, source, &opts.accelerator_ids)?;
    let input = Path::new(source);
    let raw = {
        let _g = lock();
        with_fsroot_env(root, || {
            isolated(source, || {
                // hwloc's Linux reader needs a few descriptors at once;
                // without them it would skip files and describe a smaller
                // machine.
                crate::platform::sys::check_free_fds(8)
                    .map_err(|e| Error::io_named(source, "reading the capture", e))?;
                let topo = builder(Some(input))?
                    .build()
                    .map_err(|e| hw_err("filesystem root", Some(input), e))?;
                extract(&topo, opts, Some(root), source)
            })
        })?
    };
    if raw.numa_nodes.is_empty() && raw.packages.is_empty() {
        return Err(Error::input(
            source,
            "hwloc found no CPUs or NUMA nodes in the capture",
            "give a capture made by hwloc-gather-topology",
        ));
    }
    Ok(raw)
}

/// Runs `f` with hwloc's variables set to read the capture at `root`, and
/// sets them back afterwards. The caller holds [`lock`]: hwloc reads these
/// while it builds, the lock keeps other builds out until they are
/// restored, and numapin sets no other variable from other threads.
fn with_fsroot_env<T>(root: &Path, f: impl FnOnce() -> T) -> T {
    let saved: Vec<(&str, Option<OsString>)> = [
        "HWLOC_FSROOT",
        "HWLOC_THISSYSTEM",
        "HWLOC_COMPONENTS",
        "HWLOC_HIDE_ERRORS",
    ]
    .iter()
    .map(|k| (*k, std::env::var_os(k)))
    .collect();
    // HWLOC_FSROOT comes first among the variables hwloc honours, so a
    // user's HWLOC_XMLFILE cannot replace it.
    std::env::set_var("HWLOC_FSROOT", root);
    std::env::set_var("HWLOC_THISSYSTEM", "0");
    // A capture of a machine with broken firmware makes hwloc print a
    // banner; numapin reports what it found instead.
    std::env::set_var("HWLOC_HIDE_ERRORS", "2");
    // Only the Linux reader: the x86 CPUID reader would describe the
    // machine running numapin, not the captured one.
    std::env::set_var("HWLOC_COMPONENTS", "-x86");
    let r = f();
    for (k, v) in saved {
        match v {
            Some(v) => std::env::set_var(k, v),
            None => std::env::remove_var(k),
        }
    }
    r
}

/// This machine's hwloc XML (with I/O objects), as `lstopo --of xml`
/// writes it.
///
/// # Errors
///
/// [`TopologyError::Env`](Error::Env) for a `HWLOC_*` variable that would
/// describe something else than this machine;
/// [`TopologyError::System`](Error::System) when hwloc cannot discover or
/// export it.
pub fn export_live_xml() -> Result<Vec<u8>> {
    check_env_overrides()?;
    // Held until the topology is gone (see discover_live).
    let _g = lock();
    let topo = guarded(None, || {
        builder(None)?.build().map_err(|e| hw_err("build", None, e))
    })?;
    let xml = topo
        .export_xml(hwlocality::topology::export::xml::XMLExportFlags::empty())
        .map_err(|e| hw_err("XML export", None, e))?;
    let bytes = xml.as_str().as_bytes().to_vec();
    drop(xml);
    drop(topo);
    Ok(bytes)
}
