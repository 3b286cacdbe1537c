//! Building hwloc topologies safely: one build at a time (hwloc reads
//! `HWLOC_*` variables while it builds), with the object filters numapin
//! needs, panics inside hwlocality turned into errors, and files read in a
//! child process (hwloc aborts on some malformed files).

use std::path::Path;
use std::sync::Mutex;

use hwlocality::object::types::ObjectType;
use hwlocality::topology::builder::{BuildFlags, TopologyBuilder, TypeFilter};
use hwlocality::Topology as Hw;

use crate::topology::{RawTopology, TopologyError as Error};

type Result<T, E = Error> = std::result::Result<T, E>;

/// hwloc reads `HWLOC_*` variables from the environment while it builds a
/// topology; numapin sets some of them (for filesystem roots) and must not
/// race with another build, so every build holds this lock.
static HWLOC_LOCK: Mutex<()> = Mutex::new(());

/// Takes [`HWLOC_LOCK`] (a panic while it was held does not poison it).
pub(super) fn lock() -> std::sync::MutexGuard<'static, ()> {
    HWLOC_LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// An hwloc failure: an input error naming `input` when a file was read, a
/// system error for this machine.
pub(super) fn hw_err(what: &str, input: Option<&Path>, e: impl std::fmt::Display) -> Error {
    match input {
        Some(p) => Error::input(
            p.display().to_string(),
            format!("hwloc could not read it ({what}: {e})"),
            "give a complete hwloc XML export (`lstopo --of xml FILE`) or capture (`hwloc-gather-topology`)",
        ),
        None => Error::system(
            format!("hwloc topology discovery ({what})"),
            "install hwloc 2.8 or later (Debian/Ubuntu: libhwloc15) and check that /sys is mounted",
            e.to_string(),
        ),
    }
}

/// A builder that keeps disallowed CPUs, every PCI device, and the bridges
/// and OS devices that matter.
pub(super) fn builder(input: Option<&Path>) -> Result<TopologyBuilder> {
    let b = Hw::builder();
    let b = b
        .with_flags(BuildFlags::INCLUDE_DISALLOWED)
        .map_err(|e| hw_err("flags", input, e))?;
    let b = b
        .with_type_filter(ObjectType::PCIDevice, TypeFilter::KeepAll)
        .map_err(|e| hw_err("PCI filter", input, e))?;
    let b = b
        .with_type_filter(ObjectType::Bridge, TypeFilter::KeepImportant)
        .map_err(|e| hw_err("bridge filter", input, e))?;
    let b = b
        .with_type_filter(ObjectType::OSDevice, TypeFilter::KeepImportant)
        .map_err(|e| hw_err("OS device filter", input, e))?;
    Ok(b)
}

/// Runs `f` and turns a panic inside hwlocality (on a hostile file) into an
/// error naming the input.
pub(super) fn guarded<T>(input: Option<&Path>, f: impl FnOnce() -> Result<T>) -> Result<T> {
    match crate::platform::panic_guard::catch(f) {
        Ok(r) => r,
        Err(msg) => Err(hw_err("unexpected content", input, msg)),
    }
}

/// Runs a file reader in a child process (see [`crate::platform::isolate`]).
pub(super) fn isolated(
    source: &str,
    f: impl FnOnce() -> Result<RawTopology> + Send,
) -> Result<RawTopology> {
    use crate::platform::isolate::in_child;
    in_child(source, || {
        guarded(Some(Path::new(source)), f).map_err(|e| to_child(e, source))
    })
    .map_err(from_child)
}

/// An error as it crosses the process boundary, as text: the message with
/// its causes, the fix, and whether the system (not the file) failed.
fn to_child(e: Error, source: &str) -> crate::platform::isolate::ChildError {
    use crate::platform::isolate::ChildError;
    match e {
        Error::Input {
            input,
            problem,
            fix,
            source,
        } => ChildError {
            input,
            problem: match source {
                Some(s) => format!("{problem}: {s}"),
                None => problem,
            },
            fix,
            system: false,
        },
        Error::System(e) => ChildError {
            input: e.what,
            problem: e.source.to_string(),
            fix: e.fix,
            system: true,
        },
        other => ChildError {
            input: source.to_string(),
            problem: crate::report::with_causes(&other),
            fix: "check the file".into(),
            system: false,
        },
    }
}

/// The error a child reported, as this side's error.
fn from_child(c: crate::platform::isolate::ChildError) -> Error {
    if c.system {
        Error::system(c.input, c.fix, c.problem)
    } else {
        Error::input(c.input, c.problem, c.fix)
    }
}
