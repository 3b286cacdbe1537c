//! [`Ledger`]: this process's side of the machine budget's state file. One
//! per state file and process, shared by every runtime of the process; it
//! holds the process's record (its bytes per node) and rewrites it when a
//! region is made or released, under the file's header lock.

use std::collections::BTreeMap;
use std::os::fd::{OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError, Weak};

use super::file::{self, HeaderLock, Live};
use super::format::{self, Entry, Record, BLOCK, ENTRIES, MAX_RECORDS};
use super::BudgetHolder;
use crate::arena::RuntimeError;
use crate::platform::statefile::{self as sf, Access, ForkClosedFd, Lock};

/// Test hook: where a process kills itself (`SIGKILL`) while it changes
/// the file ([`KillAt`] as a number; 0: nowhere).
pub(crate) static KILL_AT: AtomicU8 = AtomicU8::new(0);

/// The steps at which a test may have a process killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum KillAt {
    /// Holding the header lock, nothing written yet.
    Locked = 1,
    /// A record claimed (its lock taken), not yet written.
    Claimed = 2,
    /// The record written, the header lock still held.
    Written = 3,
    /// The header lock given back, the region not yet made.
    Reserved = 4,
    /// Releasing: the header lock taken, the record not yet rewritten.
    Releasing = 5,
}

impl KillAt {
    /// All steps, with the names tests give them.
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub(crate) const ALL: [(KillAt, &'static str); 5] = [
        (KillAt::Locked, "locked"),
        (KillAt::Claimed, "claimed"),
        (KillAt::Written, "written"),
        (KillAt::Reserved, "reserved"),
        (KillAt::Releasing, "releasing"),
    ];
}

/// Kills this process at `step` when a test asked for it.
pub(super) fn kill_point(step: KillAt) {
    if KILL_AT.load(Ordering::Relaxed) == step as u8 {
        sf::kill_self();
    }
}

/// This process's side of one state file.
pub(crate) struct Ledger {
    dir: PathBuf,
    name: String,
    uid: u32,
    inner: Mutex<Inner>,
    /// The process that has left at exit ([`Ledger::leave_at_exit`]), 0
    /// for none: regions released after that (the release thread still
    /// unregistering them) no longer touch the file, which would otherwise
    /// be made again with a record of a process about to end. Set before
    /// the exit handler waits for the state, so that a thread holding it
    /// then sees it too; a process id, so that a forked child is not
    /// taken for its parent.
    left: AtomicU32,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger")
            .field("path", &self.path())
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Inner {
    /// The process these figures are of (a forked child starts afresh).
    pid: u32,
    open: Option<Open>,
    /// The record this process holds (its lock taken), if any.
    slot: Option<usize>,
    /// Bytes held per node, and the limit last checked there.
    own: BTreeMap<u32, (u64, u64)>,
    /// This process's command name, read once.
    command: Option<String>,
}

/// The open file: its folder and the file (closed in a forked child).
struct Open {
    dir: OwnedFd,
    file: ForkClosedFd,
}

impl Open {
    fn fd(&self) -> Option<RawFd> {
        self.file.raw()
    }
}

/// What a reservation found when it was refused.
#[derive(Debug)]
pub(crate) struct Short {
    /// Bytes held on the node, this process's included.
    pub(crate) in_use: u64,
    /// Who holds them, largest first.
    pub(crate) holders: Vec<BudgetHolder>,
}

/// Why a reservation failed.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// Over the limit.
    Short(Short),
    /// The file cannot be used.
    State(RuntimeError),
}

impl From<RuntimeError> for Refusal {
    fn from(e: RuntimeError) -> Self {
        Refusal::State(e)
    }
}

/// The ledgers of this process's runtimes (by folder).
static LEDGERS: Mutex<Vec<Weak<Ledger>>> = Mutex::new(Vec::new());

/// The longest a process waits at exit for a lock: the state file's
/// header lock, or a ledger's state held by another of its threads.
const EXIT_LOCK_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// At exit: `attempt` every millisecond for at most [`EXIT_LOCK_WAIT`]
/// while it says busy (`Ok(None)`); `None` when it stayed busy or failed.
fn at_exit<T>(mut attempt: impl FnMut() -> Result<Option<T>, ()>) -> Option<T> {
    let until = std::time::Instant::now() + EXIT_LOCK_WAIT;
    loop {
        match attempt() {
            Ok(Some(v)) => return Some(v),
            Ok(None) if std::time::Instant::now() < until => {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            _ => return None,
        }
    }
}

/// Takes the header lock of `fd` at exit ([`at_exit`]); `false` when it
/// stayed busy or cannot be taken.
fn header_lock_at_exit(fd: RawFd) -> bool {
    at_exit(|| {
        sf::try_lock(fd, 0, BLOCK as u64, Lock::Write)
            .map(|taken| taken.then_some(()))
            .map_err(drop)
    })
    .is_some()
}

/// `m` locked at exit ([`at_exit`]), waiting for another thread of the
/// process holding it (a release from the release thread, a reservation
/// waiting for the file's lock, a runtime being made); `None` when it
/// stays held.
fn lock_at_exit<T>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    at_exit(|| match m.try_lock() {
        Ok(g) => Ok(Some(g)),
        Err(TryLockError::Poisoned(p)) => Ok(Some(p.into_inner())),
        Err(TryLockError::WouldBlock) => Ok(None),
    })
}

/// At exit: each ledger that holds a record removes its file when no
/// other live process holds one (see [`Ledger::leave_at_exit`]); one
/// ledger per budget folder (almost always one), each waiting its turn.
extern "C" fn leave_all_at_exit() {
    let Some(all) = lock_at_exit(&LEDGERS) else {
        return;
    };
    for l in all.iter().filter_map(Weak::upgrade) {
        l.leave_at_exit();
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn command_name() -> String {
    crate::platform::sys::proc_status_field("Name").unwrap_or_default()
}

impl Ledger {
    /// The ledger of the state file in `dir` for this user, shared by every
    /// runtime of the process that names the same folder. Touches no file.
    pub(crate) fn for_dir(dir: &Path) -> Arc<Ledger> {
        let mut all = lock(&LEDGERS);
        all.retain(|w| w.strong_count() > 0);
        if let Some(l) = all.iter().filter_map(Weak::upgrade).find(|l| l.dir == dir) {
            return l;
        }
        let l = Arc::new(Ledger::new(dir));
        all.push(Arc::downgrade(&l));
        l
    }

    /// A ledger of its own (tests: two of them on one file behave as two
    /// processes, their locks conflicting).
    pub(crate) fn new(dir: &Path) -> Ledger {
        let uid = sf::euid();
        Ledger {
            dir: dir.to_path_buf(),
            name: file::file_name(uid),
            uid,
            inner: Mutex::new(Inner::default()),
            left: AtomicU32::new(0),
        }
    }

    /// The state file's path.
    pub(crate) fn path(&self) -> PathBuf {
        self.dir.join(&self.name)
    }

    /// The inner state, started afresh in a forked child: the parent's
    /// regions are not this process's (their charges do nothing here), and
    /// the parent's descriptor is not used.
    fn inner(&self) -> MutexGuard<'_, Inner> {
        let mut g = lock(&self.inner);
        Self::of_this_process(&mut g);
        g
    }

    /// `g` started afresh unless it is this process's (see [`Self::inner`]).
    fn of_this_process(g: &mut Inner) {
        let pid = std::process::id();
        if g.pid != pid {
            *g = Inner {
                pid,
                ..Inner::default()
            };
        }
    }

    /// Whether this process has left at exit.
    fn has_left(&self) -> bool {
        self.left.load(Ordering::SeqCst) == std::process::id()
    }

    /// Whether another thread holds this ledger's state now (tests).
    #[cfg(test)]
    pub(crate) fn busy(&self) -> bool {
        matches!(self.inner.try_lock(), Err(TryLockError::WouldBlock))
    }

    /// Bytes this process holds on `node`.
    pub(crate) fn own_on(&self, node: u32) -> u64 {
        self.inner().own.get(&node).map_or(0, |o| o.0)
    }

    /// The open file with its header locked for writing and checked: made
    /// (with its header) when missing, opened again when another process
    /// removed it (the last one to leave does) or it was replaced.
    fn locked(&self, g: &mut Inner) -> Result<(RawFd, u64, HeaderLock), RuntimeError> {
        let path = self.path();
        for _ in 0..8 {
            if g.open.as_ref().and_then(Open::fd).is_none() {
                let o = file::open(&self.dir, &self.name, Access::ReadWriteCreate, self.uid)?;
                sf::at_exit_once(leave_all_at_exit);
                g.open = Some(Open {
                    dir: o.dir,
                    file: ForkClosedFd::new(o.file),
                });
                // A record in a file no longer there is gone with it.
                g.slot = None;
            }
            let open = g.open.as_ref().expect("opened above");
            let fd = open.fd().expect("opened above");
            let held = file::lock_header(&path, fd, Lock::Write)?;
            kill_point(KillAt::Locked);
            let facts = sf::stat(fd).map_err(|e| file::refused(&path, "fstat failed", Some(e)))?;
            file::check_facts(&path, &facts, self.uid)?;
            let here = sf::stat_at(&open.dir, &self.name)
                .map_err(|e| file::refused(&path, "fstatat failed", Some(e)))?;
            if facts.links == 0 || here.map(|f| f.id) != Some(facts.id) {
                drop(held);
                g.open = None;
                continue;
            }
            if facts.size == 0 {
                sf::write_at(fd, &format::header(), 0)
                    .map_err(|e| file::refused(&path, "writing its header failed", Some(e)))?;
                return Ok((fd, BLOCK as u64, held));
            }
            return Ok((fd, facts.size, held));
        }
        Err(file::refused(
            &path,
            "it was removed or replaced again and again while this process opened it",
            None,
        ))
    }

    /// Reserves `bytes` on `node` if the node's bytes over every live
    /// process, this one's included, stay within `limit`.
    pub(crate) fn reserve(&self, node: u32, bytes: u64, limit: u64) -> Result<(), Refusal> {
        let mut g = self.inner();
        if self.has_left() {
            return Err(Refusal::State(file::refused(
                &self.path(),
                "this process is exiting: it gave its record up at exit".to_string(),
                None,
            )));
        }
        let (fd, len, held) = self.locked(&mut g)?;
        let live = file::live_records(&self.path(), fd, len, g.slot, true)?;
        let others: u64 = live.iter().map(|(_, r)| on_node(r, node)).sum();
        let mine = g.own.get(&node).map_or(0, |o| o.0);
        let in_use = others.saturating_add(mine);
        if in_use.saturating_add(bytes) > limit {
            drop(held);
            if g.own.is_empty() {
                // Holding nothing, this process keeps no descriptor.
                g.open = None;
            }
            return Err(Refusal::Short(Short {
                in_use,
                holders: holders(&live, node, mine),
            }));
        }
        if !g.own.contains_key(&node) && g.own.len() >= ENTRIES {
            return Err(Refusal::State(file::refused(
                &self.path(),
                format!(
                    "this process would pin on more than {ENTRIES} nodes, more than a record holds"
                ),
                None,
            )));
        }
        let before = g.own.clone();
        let e = g.own.entry(node).or_insert((0, limit));
        *e = (e.0 + bytes, limit);
        if let Err(e) = self.write_own(&mut g, fd, &live) {
            g.own = before;
            return Err(Refusal::State(e));
        }
        kill_point(KillAt::Written);
        drop(held);
        Ok(())
    }

    /// Gives back `bytes` on `node` (a region released). Best effort: a
    /// file that cannot be written now is written with the right figures
    /// at the next change, and this process's record goes when it exits.
    pub(crate) fn release(&self, node: u32, bytes: u64) {
        let mut g = self.inner();
        if self.has_left() {
            return;
        }
        match g.own.get_mut(&node) {
            Some(e) if e.0 > bytes => e.0 -= bytes,
            Some(_) => {
                g.own.remove(&node);
            }
            None => return,
        }
        let Ok((fd, len, held)) = self.locked(&mut g) else {
            return;
        };
        kill_point(KillAt::Releasing);
        let Ok(live) = file::live_records(&self.path(), fd, len, g.slot, true) else {
            return;
        };
        if self.write_own(&mut g, fd, &live).is_err() {
            return;
        }
        if g.own.is_empty() {
            if live.is_empty() {
                // The last process to leave removes the file, under its
                // lock: a process waiting for the lock sees it removed and
                // makes a new one.
                if let Some(open) = &g.open {
                    let _ = sf::unlink_at(&open.dir, &self.name);
                }
            }
            // Holding nothing, this process keeps no descriptor.
            drop(held);
            g.open = None;
        }
    }

    /// At exit, holding a record (regions a process keeps to its end, as
    /// the Python package's runtime does): clears the record (the pages go
    /// with the process a moment later) and removes the file when no other
    /// live process holds one, so that a job whose processes all end
    /// leaves nothing in the folder, however closely together they end
    /// (the header lock orders them: the last one removes it). Waits for
    /// the header lock at most [`EXIT_LOCK_WAIT`] (processes ending
    /// together each take it in turn; a process that gave up at once would
    /// leave its record live to the others' look, and the file behind);
    /// its state, held by another thread of this process (a release or a
    /// reservation under way), is waited for as long; a lock or state still
    /// busy then leaves the record to the kernel and the file to the next
    /// process. After it, the
    /// ledger is done with the file: regions the release thread lets go of
    /// later (`cuMemHostUnregister` takes about 20 ms a GiB) change nothing
    /// (they made the file again, with a record of an ending process, and
    /// left it behind), and a reservation is refused.
    pub(super) fn leave_at_exit(&self) {
        let pid = std::process::id();
        // Whatever happens below, nothing after this touches the file. The
        // descriptor stays open: a record left live (the header lock busy)
        // stays so until the process ends.
        self.left.store(pid, Ordering::SeqCst);
        let Some(mut g) = lock_at_exit(&self.inner) else {
            return;
        };
        Self::of_this_process(&mut g);
        if let Some(open) = &g.open {
            self.leave_file(open, g.slot);
        }
    }

    /// [`Ledger::leave_at_exit`] on the open file `open`: clears record
    /// `slot`, and removes the file when no other live process holds one.
    fn leave_file(&self, open: &Open, slot: Option<usize>) {
        let Some(fd) = open.fd() else {
            return;
        };
        if !header_lock_at_exit(fd) {
            return;
        }
        let held = HeaderLock::taken(fd);
        if let Some(i) = slot {
            let (start, n) = format::record_range(i);
            if sf::write_at(fd, &[0u8; BLOCK], start).is_ok() {
                let _ = sf::try_lock(fd, start, n, Lock::Unlock);
            }
        }
        let alone = sf::stat(fd).is_ok_and(|f| {
            f.links > 0
                && file::live_records(&self.path(), fd, f.size.max(BLOCK as u64), slot, false)
                    .is_ok_and(|live| live.is_empty())
        });
        if alone {
            let _ = sf::unlink_at(&open.dir, &self.name);
        }
        drop(held);
    }

    /// Writes this process's record (claiming one first when it has none),
    /// or, holding nothing, clears it and gives its lock back. The header
    /// lock is held; `live` are the other processes' records.
    fn write_own(&self, g: &mut Inner, fd: RawFd, live: &[Live]) -> Result<(), RuntimeError> {
        let path = self.path();
        let failed = |what: &str, e| file::refused(&path, what.to_string(), Some(e));
        if g.own.is_empty() {
            if let Some(i) = g.slot.take() {
                let (start, n) = format::record_range(i);
                sf::write_at(fd, &[0u8; BLOCK], start)
                    .map_err(|e| failed("clearing this process's record failed", e))?;
                sf::try_lock(fd, start, n, Lock::Unlock)
                    .map_err(|e| failed("unlocking this process's record failed", e))?;
            }
            return Ok(());
        }
        let i = match g.slot {
            Some(i) => i,
            None => {
                let i = claim(fd, live).map_err(|e| failed("claiming a record failed", e))?;
                let i = i.ok_or_else(|| {
                    file::refused(
                        &path,
                        format!("all {MAX_RECORDS} records are held by live processes"),
                        None,
                    )
                })?;
                g.slot = Some(i);
                kill_point(KillAt::Claimed);
                i
            }
        };
        let record = Record {
            pid: std::process::id(),
            command: g.command.get_or_insert_with(command_name).clone(),
            entries: g
                .own
                .iter()
                .map(|(&node, &(bytes, limit))| Entry { node, bytes, limit })
                .collect(),
        };
        sf::write_at(fd, &format::encode(&record), format::record_range(i).0)
            .map_err(|e| failed("writing this process's record failed", e))
    }

    /// Bytes on `node` over every live process, this one's included, read
    /// now (the header lock taken for reading). A file that is not there
    /// is not made: only what this process holds counts then.
    pub(crate) fn used_on(&self, node: u32) -> Result<u64, RuntimeError> {
        let g = self.inner();
        let mine = g.own.get(&node).map_or(0, |o| o.0);
        // This process's own description, while its file is the current
        // one: its record is skipped by the lock test (counted from
        // memory). Otherwise a description of its own, for reading.
        if let Some(open) = &g.open {
            if let Some(others) = self.others_on(open, node, g.slot)? {
                return Ok(others + mine);
            }
        }
        let o = match file::open(&self.dir, &self.name, Access::Read, self.uid) {
            Ok(o) => o,
            Err(RuntimeError::MachineState {
                source: Some(e), ..
            }) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(mine),
            Err(e) => return Err(e),
        };
        let fresh = Open {
            dir: o.dir,
            file: ForkClosedFd::new(o.file),
        };
        Ok(self.others_on(&fresh, node, None)?.unwrap_or(0) + mine)
    }

    /// Bytes on `node` of the live records in `open`'s file other than
    /// `skip`; `None` when that file was removed or replaced.
    fn others_on(
        &self,
        open: &Open,
        node: u32,
        skip: Option<usize>,
    ) -> Result<Option<u64>, RuntimeError> {
        let path = self.path();
        let Some(fd) = open.fd() else {
            return Ok(None);
        };
        let _held = file::lock_header(&path, fd, Lock::Read)?;
        let facts = sf::stat(fd).map_err(|e| file::refused(&path, "fstat failed", Some(e)))?;
        let here = sf::stat_at(&open.dir, &self.name)
            .map_err(|e| file::refused(&path, "fstatat failed", Some(e)))?;
        if facts.links == 0 || here.map(|f| f.id) != Some(facts.id) {
            return Ok(None);
        }
        if facts.size == 0 {
            return Ok(Some(0));
        }
        let live = file::live_records(&path, fd, facts.size, skip, false)?;
        Ok(Some(live.iter().map(|(_, r)| on_node(r, node)).sum()))
    }
}

/// Claims a free record: the first whose lock this description can take
/// (skipping the live ones). `None` when every record is held.
fn claim(fd: RawFd, live: &[Live]) -> std::io::Result<Option<usize>> {
    for i in 0..MAX_RECORDS {
        if live.iter().any(|(j, _)| *j == i) {
            continue;
        }
        let (start, n) = format::record_range(i);
        if sf::try_lock(fd, start, n, Lock::Write)? {
            return Ok(Some(i));
        }
    }
    Ok(None)
}

/// Bytes record `r` holds on `node`.
pub(super) fn on_node(r: &Record, node: u32) -> u64 {
    r.entries
        .iter()
        .filter(|e| e.node == node)
        .map(|e| e.bytes)
        .sum()
}

/// The processes holding bytes on `node`, largest first, this one (with
/// `mine`) among them.
fn holders(live: &[Live], node: u32, mine: u64) -> Vec<BudgetHolder> {
    let mut h: Vec<BudgetHolder> = live
        .iter()
        .map(|(_, r)| BudgetHolder {
            pid: r.pid,
            command: r.command.clone(),
            bytes: on_node(r, node),
        })
        .filter(|h| h.bytes > 0)
        .collect();
    if mine > 0 {
        h.push(BudgetHolder {
            pid: std::process::id(),
            command: command_name(),
            bytes: mine,
        });
    }
    h.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.pid.cmp(&b.pid)));
    h
}
