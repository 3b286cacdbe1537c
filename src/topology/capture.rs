//! Captured filesystem roots (`hwloc-gather-topology`): a folder holding
//! `sys/` and `proc/`, or a `.tar.gz`/`.tar.bz2`/`.tar` of one.
//!
//! hwloc reads a capture as it reads `/sys` and `/proc`, following links
//! and reading files to their end; a hostile capture must therefore hold
//! nothing but folders, regular files and links that stay inside it. Every
//! capture is checked for that before hwloc sees it ([`folder`]): no FIFO or
//! device, no link that leaves it (`sys -> /sys` would describe this
//! machine, `cpuinfo -> /dev/zero` never ends), at most
//! [`MAX_CAPTURE_ENTRIES`] entries and [`MAX_CAPTURE_FILE_BYTES`] per file.
//! A live root (`/`, or a folder whose `sys` is the kernel's sysfs) is not
//! a capture.
//!
//! Archives ([`archive`]) are surveyed first without writing anything
//! (entry count, the real sizes PAX and GNU sparse headers declare, entry
//! types, link targets), then unpacked by numapin itself into a temporary
//! folder, counting the bytes actually written, never through a link; the
//! folder is then checked like any other. It is removed when the capture
//! is dropped, on error paths and on SIGINT/SIGTERM (see
//! `platform::cleanup`).

use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};

use super::census::{Census, PciIds};
use super::limits::{self, MAX_CAPTURE_BYTES, MAX_CAPTURE_ENTRIES, MAX_CAPTURE_FILE_BYTES};
use super::{PciId, TopologyError as Error};
use crate::platform::cleanup::{self, TempTree};

type Result<T, E = Error> = std::result::Result<T, E>;

/// A capture ready for hwloc: its root, and the temporary folder it was
/// unpacked into (removed on drop).
pub(crate) struct Capture {
    /// The folder holding `sys/` and `proc/`.
    pub(crate) root: PathBuf,
    _tmp: Option<TempTree>,
}

const FIX: &str = "give a folder (or .tar.gz/.tar.bz2 of one) captured by hwloc-gather-topology, holding only folders, regular files and links inside it";

fn bad(source: &str, problem: String) -> Error {
    Error::input(source, problem, FIX)
}

/// A captured folder, checked.
pub(crate) fn folder(path: &Path, source: &str) -> Result<Capture> {
    let root = find_root(path)
        .ok_or_else(|| bad(source, "no `sys/devices/system` folder found in it".into()))?;
    check_folder(&root, source)?;
    Ok(Capture { root, _tmp: None })
}

/// A capture archive (the file's bytes), surveyed, unpacked and checked.
pub(crate) fn archive(bytes: &[u8], source: &str) -> Result<Capture> {
    survey(bytes, source)?;
    let tmp = TempTree::new("capture").map_err(|e| {
        Error::system(
            "creating a temporary folder to unpack the capture in",
            "set TMPDIR to a writable folder with room",
            e,
        )
    })?;
    unpack(bytes, tmp.path(), source)?;
    let root = find_root(tmp.path())
        .ok_or_else(|| bad(source, "no `sys/devices/system` folder found in it".into()))?;
    check_folder(&root, source)?;
    Ok(Capture {
        root,
        _tmp: Some(tmp),
    })
}

fn find_root(dir: &Path) -> Option<PathBuf> {
    if dir.join("sys/devices/system").is_dir() {
        return Some(dir.to_path_buf());
    }
    let mut subdirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.is_dir() && !p.is_symlink())
        .collect();
    subdirs.sort();
    subdirs
        .into_iter()
        .find(|d| d.join("sys/devices/system").is_dir())
}

/// The reader of an archive's tar stream, by its magic bytes.
fn tar_stream(bytes: &[u8]) -> tar::Archive<Box<dyn Read + '_>> {
    let reader: Box<dyn Read> = if bytes.starts_with(b"BZh") {
        Box::new(bzip2::read::BzDecoder::new(bytes))
    } else if bytes.starts_with(&[0x1f, 0x8b]) {
        Box::new(flate2::read::GzDecoder::new(bytes))
    } else {
        Box::new(bytes)
    };
    tar::Archive::new(reader)
}

fn corrupt(source: &str, e: impl std::fmt::Display) -> Error {
    Error::input(
        source,
        format!("corrupt archive: {e}"),
        "give a .tar.gz or .tar.bz2 made by hwloc-gather-topology, or the unpacked folder",
    )
}

/// An entry's path inside the capture: relative, without `..`.
fn member_path(entry: &tar::Entry<'_, impl Read>, source: &str) -> Result<PathBuf> {
    let raw = entry.path().map_err(|e| corrupt(source, e))?;
    let mut out = PathBuf::new();
    for c in raw.components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir | Component::Prefix(_) => {
                return Err(bad(
                    source,
                    format!(
                        "member {} climbs out of the capture",
                        crate::report::quote(&raw.display().to_string())
                    ),
                ))
            }
        }
    }
    Ok(out)
}

/// Whether a link at `member` (a path inside the capture) to `target` stays
/// inside, read as written (relative, `..` counted against the member's
/// depth). The unpacked folder is checked again as the kernel resolves it.
fn link_stays_inside(member: &Path, target: &Path) -> bool {
    if target.is_absolute() {
        return false;
    }
    let mut depth =
        i64::try_from(member.components().count().saturating_sub(1)).unwrap_or(i64::MAX);
    for c in target.components() {
        match c {
            Component::ParentDir => depth -= 1,
            Component::Normal(_) => depth += 1,
            _ => {}
        }
        if depth < 0 {
            return false;
        }
    }
    true
}

fn entry_kind(source: &str, member: &Path, t: tar::EntryType) -> Result<()> {
    if t.is_file() || t.is_dir() || t.is_symlink() || t.is_gnu_sparse() || t.is_contiguous() {
        return Ok(());
    }
    let what = if t.is_hard_link() {
        "a hard link"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_character_special() || t.is_block_special() {
        "a device"
    } else {
        "of an unknown type"
    };
    Err(bad(
        source,
        format!(
            "member {} is {what}; a capture holds folders, regular files and links",
            crate::report::quote(&member.display().to_string())
        ),
    ))
}

/// Reads the archive once without writing anything: the entry count, the
/// sizes its headers declare, its entry types and link targets.
fn survey(bytes: &[u8], source: &str) -> Result<()> {
    let mut ar = tar_stream(bytes);
    let (mut count, mut total) = (0usize, 0u64);
    for entry in ar.entries().map_err(|e| corrupt(source, e))? {
        let entry = entry.map_err(|e| corrupt(source, e))?;
        count += 1;
        let member = member_path(&entry, source)?;
        entry_kind(source, &member, entry.header().entry_type())?;
        total = total.saturating_add(entry.size());
        check_sizes(source, &member, count, entry.size(), total)?;
        if entry.header().entry_type().is_symlink() {
            let target = entry
                .link_name()
                .map_err(|e| corrupt(source, e))?
                .unwrap_or_default();
            if !link_stays_inside(&member, &target) {
                return Err(leaves(source, &member, &target));
            }
        }
    }
    Ok(())
}

/// Checks the entry count so far, one member's size and the total so far.
fn check_sizes(source: &str, member: &Path, count: usize, size: u64, total: u64) -> Result<()> {
    if count > MAX_CAPTURE_ENTRIES {
        return Err(limits::over(
            source,
            format!("the capture holds more than {MAX_CAPTURE_ENTRIES} entries"),
        ));
    }
    if size > MAX_CAPTURE_FILE_BYTES {
        return Err(limits::over(
            source,
            format!(
                "member {} is {size} bytes, more than the limit of {} MiB per file",
                crate::report::quote(&member.display().to_string()),
                MAX_CAPTURE_FILE_BYTES >> 20
            ),
        ));
    }
    if total > MAX_CAPTURE_BYTES {
        return Err(unpacks_to_more(source));
    }
    Ok(())
}

fn unpacks_to_more(source: &str) -> Error {
    limits::over(
        source,
        format!(
            "the capture unpacks to more than {} MiB",
            MAX_CAPTURE_BYTES >> 20
        ),
    )
}

fn leaves(source: &str, member: &Path, target: &Path) -> Error {
    bad(
        source,
        format!(
            "{} links to {}, outside the capture (hwloc would read this machine, or a file that never ends, there)",
            crate::report::quote(&member.display().to_string()),
            crate::report::quote(&target.display().to_string())
        ),
    )
}

/// A write into the unpacked folder failed: the system's fault (a full
/// TMPDIR, too many open files), not the archive's.
fn write_error(source: &str, e: std::io::Error) -> Error {
    Error::io_named(source, "unpacking the capture into TMPDIR", e)
}

/// Creates the folders of `rel` below `dest`, one at a time, refusing to go
/// through anything but a folder numapin made.
fn make_parents(dest: &Path, rel: &Path, source: &str) -> Result<PathBuf> {
    let mut at = dest.to_path_buf();
    let parent = rel.parent().unwrap_or(Path::new(""));
    for c in parent.components() {
        at.push(c);
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(bad(
                    source,
                    format!(
                        "member {} would be written through {}, which is not a folder",
                        crate::report::quote(&rel.display().to_string()),
                        crate::report::quote(
                            &at.strip_prefix(dest).unwrap_or(&at).display().to_string()
                        )
                    ),
                ))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir(&at).map_err(|e| write_error(source, e))?
            }
            Err(e) => return Err(write_error(source, e)),
        }
    }
    Ok(dest.join(rel))
}

/// Unpacks the archive (already surveyed) into `dest`.
fn unpack(bytes: &[u8], dest: &Path, source: &str) -> Result<()> {
    let mut ar = tar_stream(bytes);
    let mut written = 0u64;
    let mut buf = vec![0u8; 64 << 10];
    for entry in ar.entries().map_err(|e| corrupt(source, e))? {
        let mut entry = entry.map_err(|e| corrupt(source, e))?;
        let rel = member_path(&entry, source)?;
        if rel.as_os_str().is_empty() {
            continue;
        }
        // A terminating signal waits for this entry, then removes `dest`.
        let _g = cleanup::write_guard();
        let path = make_parents(dest, &rel, source)?;
        let t = entry.header().entry_type();
        if let Ok(m) = std::fs::symlink_metadata(&path) {
            if m.is_dir() && t.is_dir() {
                continue;
            }
            // A later member replaces an earlier one, as tar does; a folder
            // is never replaced.
            if m.is_dir() {
                return Err(bad(
                    source,
                    format!(
                        "member {} replaces a folder",
                        crate::report::quote(&rel.display().to_string())
                    ),
                ));
            }
            std::fs::remove_file(&path).map_err(|e| write_error(source, e))?;
        }
        if t.is_dir() {
            std::fs::create_dir(&path).map_err(|e| write_error(source, e))?;
        } else if t.is_symlink() {
            let target = entry
                .link_name()
                .map_err(|e| corrupt(source, e))?
                .unwrap_or_default();
            if !link_stays_inside(&rel, &target) {
                return Err(leaves(source, &rel, &target));
            }
            std::os::unix::fs::symlink(&target, &path).map_err(|e| write_error(source, e))?;
        } else {
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&path)
                .map_err(|e| write_error(source, e))?;
            let mut this = 0u64;
            loop {
                let n = entry.read(&mut buf).map_err(|e| corrupt(source, e))?;
                if n == 0 {
                    break;
                }
                this += n as u64;
                written += n as u64;
                // The bytes actually written count, whatever the headers said.
                check_sizes(source, &rel, 0, this, written)?;
                f.write_all(&buf[..n]).map_err(|e| write_error(source, e))?;
            }
        }
    }
    Ok(())
}

/// Checks a capture folder: not a live root, no special files, no link
/// leaving it, within the entry and size limits.
fn check_folder(root: &Path, source: &str) -> Result<()> {
    let io = |e: std::io::Error| Error::io_named(source, "cannot read the capture", e);
    let canon = std::fs::canonicalize(root).map_err(io)?;
    let live = || {
        bad(
            source,
            "this is a live system's root (its sys/ is the kernel's sysfs), not a capture".into(),
        )
    };
    if canon == Path::new("/") {
        return Err(live());
    }
    let (mut count, mut total) = (0usize, 0u64);
    let mut dirs = vec![canon.clone()];
    while let Some(dir) = dirs.pop() {
        // The names first, with the folder closed again (few descriptors).
        let names: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map_err(io)?
            .map(|e| e.map(|e| e.path()))
            .take(MAX_CAPTURE_ENTRIES + 1)
            .collect::<std::io::Result<_>>()
            .map_err(io)?;
        for p in names {
            count += 1;
            let rel = p.strip_prefix(&canon).unwrap_or(&p).to_path_buf();
            let m = std::fs::symlink_metadata(&p).map_err(io)?;
            let ft = m.file_type();
            let size = if ft.is_file() { m.len() } else { 0 };
            total = total.saturating_add(size);
            check_sizes(source, &rel, count, size, total)?;
            if ft.is_dir() {
                dirs.push(p);
            } else if ft.is_symlink() {
                match std::fs::canonicalize(&p) {
                    Ok(t) if !t.starts_with(&canon) => {
                        return Err(leaves(source, &rel, &t));
                    }
                    Ok(_) => {}
                    Err(e) if super::error::is_system_io(&e) => return Err(io(e)),
                    // A link to nothing (or a loop) reads as nothing, as in
                    // sysfs itself.
                    Err(_) => {}
                }
            } else if !ft.is_file() {
                use std::os::unix::fs::FileTypeExt;
                let what = if ft.is_fifo() {
                    "a FIFO"
                } else if ft.is_socket() {
                    "a socket"
                } else {
                    "a device"
                };
                return Err(bad(
                    source,
                    format!(
                        "{} is {what}; a capture holds folders, regular files and links",
                        crate::report::quote(&rel.display().to_string())
                    ),
                ));
            }
        }
    }
    if crate::platform::sys::is_kernel_fs(&canon.join("sys"))
        || crate::platform::sys::is_kernel_fs(&canon.join("proc"))
    {
        return Err(live());
    }
    Ok(())
}

/// Counts what a checked capture holds before hwloc reads it: its CPUs
/// (entries `sys/devices/system/cpu/cpuN`), nodes
/// (`sys/devices/system/node/nodeN`) and PCI functions
/// (`sys/bus/pci/devices`, with their ids); the first count over a limit is
/// the error. hwloc's time on a capture grows faster than the number of
/// CPUs: 20,000 of them would keep it busy for minutes.
pub(crate) fn census(root: &Path, source: &str, accelerators: &[PciId]) -> Result<()> {
    let mut census = Census::new(source, accelerators);
    let io = |e: std::io::Error| Error::io_named(source, "cannot read the capture", e);
    for n in numbered(&root.join("sys/devices/system/cpu"), "cpu").map_err(io)? {
        census.cpu(Some(n))?;
    }
    for n in numbered(&root.join("sys/devices/system/node"), "node").map_err(io)? {
        census.node(Some(n))?;
    }
    for dev in entries(&root.join("sys/bus/pci/devices")).map_err(io)? {
        census.function(pci_ids(&dev))?;
    }
    Ok(())
}

/// The paths in `dir` (none when it does not exist).
fn entries(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    match std::fs::read_dir(dir) {
        Ok(d) => d.map(|e| e.map(|e| e.path())).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// The numbers N of the entries named `{prefix}N` in `dir` (a number too
/// large for 64 bits is `u64::MAX`).
fn numbered(dir: &Path, prefix: &str) -> std::io::Result<Vec<u64>> {
    Ok(entries(dir)?
        .iter()
        .filter_map(|p| {
            let digits = p.file_name()?.to_str()?.strip_prefix(prefix)?;
            (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
                .then(|| digits.parse().unwrap_or(u64::MAX))
        })
        .collect())
}

/// A captured PCI function's ids, from its `vendor`, `device` and `class`
/// files (`0x10de`, `0x2330`, `0x030200`).
fn pci_ids(dev: &Path) -> Option<PciIds> {
    let read = |f: &str| -> Option<u32> {
        let s = super::pcie::read_attribute(&dev.join(f))?;
        u32::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok()
    };
    Some(PciIds {
        vendor: u16::try_from(read("vendor")?).ok()?,
        device: u16::try_from(read("device")?).ok()?,
        class: u16::try_from(read("class")? >> 8).ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_are_judged_from_where_they_sit() {
        assert!(link_stays_inside(
            Path::new("sys/bus/pci/devices/0000:07:00.0"),
            Path::new("../../../devices/pci0000:00/0000:07:00.0")
        ));
        assert!(!link_stays_inside(Path::new("sys"), Path::new("/sys")));
        assert!(!link_stays_inside(
            Path::new("sys"),
            Path::new("../../../../sys")
        ));
        assert!(!link_stays_inside(Path::new("a/b"), Path::new("../../x")));
        assert!(link_stays_inside(Path::new("a/b"), Path::new("../x")));
    }
}
