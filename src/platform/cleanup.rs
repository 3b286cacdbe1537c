//! What numapin leaves behind when it stops: nothing.
//!
//! Reading a captured filesystem root unpacks it into a temporary folder and
//! forks an hwloc reader. Both are registered here while they exist:
//! [`TempTree`] removes its folder when dropped (also with few file
//! descriptors left: [`remove_tree`] holds at most one open), a
//! [`ChildGuard`] names the reader. A program that calls
//! [`install_signal_cleanup`] first thing in `main` (the `numapin` tool does)
//! also gets them removed and killed when SIGINT, SIGTERM or SIGHUP ends it:
//! those signals are then taken by a thread with `sigwait`, which cleans up
//! and ends the process with the same signal, so the exit status is the one
//! the signal would have given.
//!
//! [`restore_for_exec`] undoes what numapin changed about signals (the mask
//! above, the SIGPIPE that Rust's runtime ignores, and the SIGXFSZ a
//! command-line tool ignores with [`ignore_sigxfsz`]) before a command
//! replaces the process.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use nix::sys::signal::{SigSet, SigmaskHow, Signal};

#[derive(Default)]
struct Registry {
    dirs: Vec<PathBuf>,
    children: Vec<i32>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    dirs: Vec::new(),
    children: Vec::new(),
});

/// The signal mask the process had before [`install_signal_cleanup`].
static ORIGINAL_MASK: OnceLock<SigSet> = OnceLock::new();

/// Set by the signal thread before it takes the registry to clean up.
static TERMINATING: AtomicBool = AtomicBool::new(false);

/// The registry, for everyone but the signal thread. Once a terminating
/// signal has arrived, a thread asking for it parks for good instead: the
/// signal thread is about to end the process, and a thread that kept
/// taking the lock back (an unpacking loop takes it once per entry, and a
/// mutex does not queue its waiters) would otherwise keep the cleanup
/// waiting until the work was done, and the process could even exit 0.
fn registry() -> MutexGuard<'static, Registry> {
    while TERMINATING.load(Ordering::Acquire) {
        std::thread::park();
    }
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

/// Held while writing into a registered folder: a terminating signal waits
/// for the write to finish, then removes the folder, so nothing is created
/// after the removal.
pub(crate) struct WriteGuard(#[allow(dead_code)] MutexGuard<'static, Registry>);

/// Blocks the signal cleanup for the life of the guard (see [`WriteGuard`]).
pub(crate) fn write_guard() -> WriteGuard {
    WriteGuard(registry())
}

/// A temporary folder that is removed when dropped, when a terminating
/// signal ends the process (after [`install_signal_cleanup`]), and never
/// left behind for want of file descriptors.
#[derive(Debug)]
pub(crate) struct TempTree {
    path: PathBuf,
}

impl TempTree {
    /// A new empty folder in `TMPDIR` (or `/tmp`), named `numapin-<what>-*`.
    pub(crate) fn new(what: &str) -> io::Result<Self> {
        let mut reg = registry();
        let path = tempfile::Builder::new()
            .prefix(&format!("numapin-{what}-"))
            .tempdir()?
            .keep();
        reg.dirs.push(path.clone());
        Ok(Self { path })
    }

    /// The folder.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempTree {
    fn drop(&mut self) {
        let mut reg = registry();
        reg.dirs.retain(|d| d != &self.path);
        let _ = remove_tree(&self.path);
    }
}

/// A child process that is killed if a terminating signal ends this one.
pub(crate) struct ChildGuard(i32);

impl ChildGuard {
    /// Registers `pid` until the guard is dropped.
    pub(crate) fn new(pid: i32) -> Self {
        registry().children.push(pid);
        Self(pid)
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        registry().children.retain(|&p| p != self.0);
    }
}

/// Removes `path` and everything below it without following links, with at
/// most one directory open at a time (the standard library's version keeps
/// one open per level, and fails near the open-file limit). It works
/// through the tree with a list of its own rather than by recursion, so a
/// deep tree needs no more stack than a flat one.
pub(crate) fn remove_tree(path: &Path) -> io::Result<()> {
    let meta = std::fs::symlink_metadata(path)?;
    if !meta.is_dir() {
        return std::fs::remove_file(path);
    }
    // Folders still to empty, innermost last: a folder is read again once
    // the folders found in it are gone.
    let mut todo = vec![path.to_path_buf()];
    while let Some(dir) = todo.pop() {
        let batch = match names_in(&dir) {
            Err(e) if e.kind() == io::ErrorKind::NotFound && dir != path => continue,
            r => r?,
        };
        if batch.is_empty() {
            match std::fs::remove_dir(&dir) {
                Err(e) if e.kind() != io::ErrorKind::NotFound || dir == path => return Err(e),
                _ => continue,
            }
        }
        todo.push(dir);
        for (p, is_dir) in batch {
            if is_dir {
                todo.push(p);
                continue;
            }
            match std::fs::remove_file(&p) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
    }
    Ok(())
}

/// A batch of the names in `dir`, each with whether it is a folder (not a
/// link to one), read with the directory closed again before they are
/// removed.
fn names_in(dir: &Path) -> io::Result<Vec<(PathBuf, bool)>> {
    std::fs::read_dir(dir)?
        .take(4096)
        .map(|e| e.and_then(|e| Ok((e.path(), e.file_type()?.is_dir()))))
        .collect()
}

/// Kills the registered children and removes the registered folders; the
/// registry stays locked (the process is about to end).
fn clean_all(reg: &mut Registry) {
    for &pid in &reg.children {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
    }
    for d in &reg.dirs {
        let _ = remove_tree(d);
    }
}

/// Whether `sig`'s disposition is the default one (not ignored, no handler).
fn is_default(sig: Signal) -> bool {
    // SAFETY: sigaction with a null new action only reads the current one
    // into `old`, a valid, writable, zero-initialised struct.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig as libc::c_int, std::ptr::null(), &mut old) == 0
            && old.sa_sigaction == libc::SIG_DFL
    }
}

/// Makes SIGINT, SIGTERM and SIGHUP (those whose disposition is the
/// default: an ignored one, as under `nohup`, stays ignored) clean up
/// before they end the process: temporary folders are removed and reader
/// children killed, then the process ends with the signal. Call it first
/// thing in `main`, before any thread starts: the signals are blocked in the
/// calling thread and every thread it starts afterwards, and a thread of
/// its own waits for them. Calling it again does nothing.
pub(crate) fn install_signal_cleanup() -> io::Result<()> {
    if ORIGINAL_MASK.get().is_some() {
        return Ok(());
    }
    let mut set = SigSet::empty();
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        if is_default(sig) {
            set.add(sig);
        }
    }
    let mut old = SigSet::empty();
    nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&set), Some(&mut old))
        .map_err(io::Error::from)?;
    let _ = ORIGINAL_MASK.set(old);
    std::thread::Builder::new()
        .name("numapin-signals".into())
        .spawn(move || loop {
            let Ok(sig) = set.wait() else { continue };
            TERMINATING.store(true, Ordering::Release);
            let mut reg = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
            clean_all(&mut reg);
            // The disposition is the default one (checked above): with the
            // signal unblocked in this thread, raising it ends the process
            // as the signal would have.
            let _ = SigSet::from(sig).thread_unblock();
            let _ = nix::sys::signal::raise(sig);
            std::process::exit(128 + sig as i32);
        })?;
    Ok(())
}

/// Sets SIGPIPE back to its default action (Rust's runtime ignores it): a
/// write to a closed pipe then ends the process quietly, as it ends other
/// command-line tools.
pub(crate) fn default_sigpipe() {
    // SAFETY: setting a standard signal's disposition to SIG_DFL installs
    // no handler; no Rust code runs in signal context.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Whether SIGXFSZ had its default action before [`ignore_sigxfsz`]
/// changed it (it is then set back before `execvp`).
static SIGXFSZ_WAS_DEFAULT: AtomicBool = AtomicBool::new(false);

/// Ignores SIGXFSZ: a write past the file-size limit (`ulimit -f`) then
/// fails with `EFBIG`, an error the program reports, instead of ending the
/// process without a word (SIGXFSZ's default action). Python does the same
/// at start-up.
pub(crate) fn ignore_sigxfsz() {
    if is_default(Signal::SIGXFSZ) {
        SIGXFSZ_WAS_DEFAULT.store(true, Ordering::Release);
    }
    // SAFETY: setting a standard signal's disposition to SIG_IGN installs
    // no handler; no Rust code runs in signal context.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
}

/// Undoes numapin's changes to signals before `execvp`: SIGPIPE back to
/// its default action, SIGXFSZ too when [`ignore_sigxfsz`] found it so, and
/// the signal mask back to what the process started with (when
/// [`install_signal_cleanup`] changed it). Dispositions a parent chose
/// (`nohup`'s ignored SIGHUP, an ignored SIGXFSZ) are left alone.
pub(crate) fn restore_for_exec() -> io::Result<()> {
    default_sigpipe();
    if SIGXFSZ_WAS_DEFAULT.load(Ordering::Acquire) {
        // SAFETY: as in default_sigpipe.
        unsafe {
            libc::signal(libc::SIGXFSZ, libc::SIG_DFL);
        }
    }
    if let Some(mask) = ORIGINAL_MASK.get() {
        nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(mask), None)
            .map_err(io::Error::from)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deep_tree_is_removed_on_a_small_stack() {
        // 300 levels took more than 64 KiB of stack when each level was a
        // call.
        let t = tempfile::tempdir().unwrap();
        let top = t.path().join("top");
        let mut deep = top.clone();
        for _ in 0..300 {
            deep.push("d");
        }
        std::fs::create_dir_all(&deep).unwrap();
        std::fs::write(deep.join("f"), b"x").unwrap();
        let removed = top.clone();
        std::thread::Builder::new()
            .stack_size(64 << 10)
            .spawn(move || remove_tree(&removed))
            .unwrap()
            .join()
            .unwrap()
            .unwrap();
        assert!(!top.exists());
        assert!(remove_tree(&top).is_err(), "a missing tree is an error");
    }

    #[test]
    fn remove_tree_removes_deep_trees_and_links() {
        let t = TempTree::new("test").unwrap();
        let mut deep = t.path().to_path_buf();
        for i in 0..40 {
            deep.push(format!("d{i}"));
        }
        std::fs::create_dir_all(&deep).unwrap();
        std::fs::write(deep.join("f"), b"x").unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("keep"), b"k").unwrap();
        std::os::unix::fs::symlink(outside.path(), t.path().join("link")).unwrap();
        let p = t.path().to_path_buf();
        drop(t);
        assert!(!p.exists());
        assert!(
            outside.path().join("keep").exists(),
            "links are removed, not followed"
        );
    }
}
