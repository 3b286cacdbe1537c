//! The ledger against its file, in one process: two [`Ledger`]s of one
//! file hold two open file descriptions, whose locks conflict as two
//! processes' do, and dropping one is what the kernel does when a process
//! dies (its locks go, its record stays until someone clears it).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use proptest::prelude::*;

use super::format::{self, BLOCK};
use super::ledger::{Ledger, Refusal};
use super::read_usage;
use crate::arena::RuntimeError;

const MIB: u64 = 1 << 20;

fn dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("a temporary folder")
}

fn short(r: Result<(), Refusal>) -> super::ledger::Short {
    match r {
        Err(Refusal::Short(s)) => s,
        other => panic!("expected a refusal for the limit, got {other:?}"),
    }
}

fn state_error(r: Result<(), Refusal>) -> RuntimeError {
    match r {
        Err(Refusal::State(e)) => e,
        other => panic!("expected the state file refused, got {other:?}"),
    }
}

#[test]
fn ledgers_share_a_limit_and_a_refusal_names_the_holders() {
    let d = dir();
    let (a, b) = (Ledger::new(d.path()), Ledger::new(d.path()));
    a.reserve(0, 6 * MIB, 8 * MIB).expect("fits");
    b.reserve(1, 8 * MIB, 8 * MIB)
        .expect("another node has its own budget");
    let s = short(b.reserve(0, 4 * MIB, 8 * MIB));
    assert_eq!(s.in_use, 6 * MIB);
    assert_eq!(s.holders.len(), 1);
    assert_eq!(s.holders[0].pid, std::process::id());
    assert_eq!(s.holders[0].bytes, 6 * MIB);
    b.reserve(0, 2 * MIB, 8 * MIB).expect("the last bytes fit");
    assert_eq!(a.used_on(0).expect("read"), 8 * MIB);
    assert_eq!(b.used_on(0).expect("read"), 8 * MIB);
    assert_eq!(b.own_on(0), 2 * MIB);
    a.release(0, 6 * MIB);
    b.reserve(0, 6 * MIB, 8 * MIB).expect("room again");
    assert_eq!(a.used_on(0).expect("read"), 8 * MIB);
}

#[test]
fn a_dead_holders_bytes_come_back_and_its_record_is_cleared() {
    let d = dir();
    let a = Ledger::new(d.path());
    let b = Ledger::new(d.path());
    a.reserve(0, 8 * MIB, 8 * MIB).expect("fits");
    short(b.reserve(0, MIB, 8 * MIB));
    // "Killed": its descriptor closes, its record stays written.
    drop(a);
    let path = b.path();
    let before = std::fs::read(&path).expect("read");
    assert!(
        before[BLOCK..].iter().any(|&x| x != 0),
        "the dead record is still there"
    );
    b.reserve(0, 8 * MIB, 8 * MIB)
        .expect("the dead process's share came back");
    let after = std::fs::read(&path).expect("read");
    let records: Vec<_> = after[BLOCK..]
        .chunks(BLOCK)
        .filter_map(|c| format::decode(c).expect("well formed"))
        .collect();
    assert_eq!(records.len(), 1, "the dead record was cleared: {records:?}");
    assert_eq!(records[0].entries[0].bytes, 8 * MIB);
}

/// Two ledgers of one file (two processes), each holding 1 MiB of node 0's
/// 8 MiB.
fn two_holding(dir: &Path) -> (Ledger, Ledger) {
    let (a, b) = (Ledger::new(dir), Ledger::new(dir));
    a.reserve(0, MIB, 8 * MIB).expect("fits");
    b.reserve(0, MIB, 8 * MIB).expect("fits");
    (a, b)
}

#[test]
fn the_last_to_leave_removes_the_file_and_holding_nothing_keeps_no_descriptor() {
    let d = dir();
    let (a, b) = two_holding(d.path());
    b.release(0, MIB);
    assert!(a.path().exists(), "a still holds bytes");
    a.release(0, MIB);
    assert!(!a.path().exists(), "the last one out removed the file");
    // Neither keeps the file open: nothing of it is left in this process.
    let fds: Vec<_> = std::fs::read_dir("/proc/self/fd")
        .expect("fds")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|t| t.starts_with(d.path()))
        .collect();
    assert!(fds.is_empty(), "{fds:?}");
    b.reserve(0, 8 * MIB, 8 * MIB).expect("fits in a new file");
    short(a.reserve(0, MIB, 8 * MIB));
}

/// Two processes ending together, each holding its bytes to its end: the
/// one that finds the header lock taken waits its turn (here a third
/// description holds the lock for 10 ms), clears its record, and the last
/// one out removes the file. Giving up at once on the busy lock left its
/// record live to the other's look, and the file behind.
/// A third open file description of the state file at `path`, holding its
/// header lock (as another process would) until dropped.
fn header_locked(path: &Path) -> std::fs::File {
    use crate::platform::statefile::{self as sf, Lock};
    use std::os::fd::AsRawFd;
    let other = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .expect("open");
    assert!(sf::try_lock(other.as_raw_fd(), 0, BLOCK as u64, Lock::Write).expect("lock"));
    other
}

/// A thread that drops `other` (lets go of its lock) after `ms`
/// milliseconds.
fn let_go_after(other: std::fs::File, ms: u64) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(ms));
        drop(other);
    })
}

#[test]
fn processes_leaving_at_exit_together_take_turns_and_the_last_removes_the_file() {
    let d = dir();
    let (a, b) = two_holding(d.path());
    let unlock = let_go_after(header_locked(&a.path()), 10);
    b.leave_at_exit();
    unlock.join().expect("the unlocking thread");
    assert!(a.path().exists(), "a still holds its record");
    a.leave_at_exit();
    assert!(!a.path().exists(), "the last one out removed the file");
}

/// The last process out removes the file at exit while its release thread
/// still unregisters regions: those releases, after the exit handler, must
/// not make the file again (they did, with a record of the ending process,
/// and the folder kept it), and nothing more is reserved.
#[test]
fn releases_after_leaving_at_exit_leave_the_file_gone() {
    let d = dir();
    let a = Ledger::new(d.path());
    a.reserve(0, 3 * MIB, 8 * MIB).expect("fits");
    a.leave_at_exit();
    assert!(!a.path().exists(), "the last one out removed the file");
    // Two of its three regions are let go of before the process ends.
    a.release(0, MIB);
    assert!(
        !a.path().exists(),
        "a release after leaving made the file again"
    );
    a.release(0, MIB);
    assert!(
        !a.path().exists(),
        "a release after leaving made the file again"
    );
    let e = state_error(a.reserve(0, MIB, 8 * MIB));
    assert!(e.to_string().contains("exiting"), "{e}");
    assert!(
        e.fix().is_some_and(|f| f.contains("exit handlers")),
        "{:?}",
        e.fix()
    );
    assert!(!a.path().exists());
}

/// A process ending while another of its threads is inside the ledger (a
/// reservation waiting for the file's lock, held by a third description
/// until 50 ms after): the exit handler waits for that thread, then
/// clears the record and removes the file. Giving up at once left both
/// behind.
#[test]
fn leaving_at_exit_waits_for_the_ledger_busy_in_another_thread() {
    let d = dir();
    let a = std::sync::Arc::new(Ledger::new(d.path()));
    a.reserve(0, MIB, 8 * MIB).expect("fits");
    let other = header_locked(&a.path());
    let inside = std::thread::spawn({
        let a = a.clone();
        move || a.reserve(0, MIB, 8 * MIB)
    });
    while !a.busy() {
        assert!(
            !inside.is_finished(),
            "the reservation never waited inside the ledger"
        );
        std::thread::yield_now();
    }
    let unlock = let_go_after(other, 50);
    a.leave_at_exit();
    unlock.join().expect("the unlocking thread");
    inside
        .join()
        .expect("the reserving thread")
        .expect("its reservation, made before the exit handler went on");
    assert!(
        !a.path().exists(),
        "the exit handler waited, then removed the file"
    );
}

#[test]
fn a_file_removed_under_live_processes_is_made_again_with_their_records() {
    let d = dir();
    let (a, b) = two_holding(d.path());
    std::fs::remove_file(a.path()).expect("someone removes it");
    // b sees its description's file gone, opens a new one and writes its
    // whole share there.
    b.reserve(0, MIB, 8 * MIB).expect("fits");
    assert_eq!(
        a.used_on(0).expect("read"),
        3 * MIB,
        "b's 2 MiB there, a's own 1 MiB"
    );
    a.reserve(0, MIB, 8 * MIB).expect("a moves over too");
    let (found, _) = read_usage(Some(d.path()));
    assert_eq!(found[0].nodes[0].used, 4 * MIB);
    assert_eq!(found[0].nodes[0].holders.len(), 2);
}

#[test]
fn used_on_reads_without_making_the_file() {
    let d = dir();
    let a = Ledger::new(d.path());
    assert_eq!(a.used_on(3).expect("no file: nothing used"), 0);
    assert!(!a.path().exists(), "reading made no file");
}

#[test]
fn the_usage_reader_sums_live_processes_per_node() {
    let d = dir();
    let (a, b) = (Ledger::new(d.path()), Ledger::new(d.path()));
    a.reserve(0, 4 * MIB, 8 * MIB).expect("fits");
    b.reserve(0, 2 * MIB, 16 * MIB).expect("fits");
    b.reserve(2, 2 * MIB, 16 * MIB).expect("fits");
    let (found, refused) = read_usage(Some(d.path()));
    assert!(refused.is_empty(), "{refused:?}");
    assert_eq!(found.len(), 1);
    let nodes = &found[0].nodes;
    assert_eq!(
        nodes.iter().map(|n| (n.node, n.used)).collect::<Vec<_>>(),
        [(0, 6 * MIB), (2, 2 * MIB)]
    );
    assert_eq!(
        (nodes[0].limit_min, nodes[0].limit_max),
        (8 * MIB, 16 * MIB)
    );
    assert_eq!(
        nodes[0].holders.iter().map(|h| h.bytes).collect::<Vec<_>>(),
        [4 * MIB, 2 * MIB]
    );
    drop(a);
    let (found, _) = read_usage(Some(d.path()));
    assert_eq!(
        found[0].nodes[0].used,
        2 * MIB,
        "a dead process is not counted"
    );
}

/// Makes the state file at `path` what `make` writes there, checks that a
/// ledger refuses it with an error naming the file and saying `why`, and
/// that the file is left as it was.
fn refused_as(d: &Path, why: &str, make: impl FnOnce(&Path)) {
    let l = Ledger::new(d);
    let path = l.path();
    make(&path);
    let before = std::fs::symlink_metadata(&path).map(|m| (m.len(), m.mode()));
    // Never open a FIFO or a folder to look (a FIFO would block).
    let regular = || std::fs::metadata(&path).is_ok_and(|m| m.is_file());
    let before_bytes = regular().then(|| std::fs::read(&path).ok()).flatten();
    let e = state_error(l.reserve(0, MIB, 8 * MIB));
    let text = e.to_string();
    assert!(text.contains(&path.display().to_string()), "{text}");
    assert!(text.contains(why), "{text} (wanted {why:?})");
    assert!(e.fix().is_some_and(|f| f.contains("rm ")), "{:?}", e.fix());
    assert_eq!(
        std::fs::symlink_metadata(&path)
            .map(|m| (m.len(), m.mode()))
            .ok(),
        before.ok(),
        "left as it was"
    );
    assert_eq!(
        regular().then(|| std::fs::read(&path).ok()).flatten(),
        before_bytes
    );
    // The usage reader refuses it too.
    let (found, refused) = read_usage(Some(d));
    assert!(found.is_empty());
    assert!(
        refused.iter().any(|r| r.to_string().contains(why)),
        "{refused:?}"
    );
}

use std::os::unix::fs::MetadataExt;

fn write_private(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).expect("write");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
}

#[test]
fn hostile_state_files_are_refused_and_left_alone() {
    let d = dir();
    let mut old = format::header();
    old[8..12].copy_from_slice(&0u32.to_le_bytes());
    refused_as(d.path(), "another numapin version", |p| {
        write_private(p, &old)
    });
    let d = dir();
    refused_as(d.path(), "numapin's mark", |p| {
        write_private(p, &[7u8; 3 * BLOCK])
    });
    let d = dir();
    refused_as(d.path(), "shorter than its header", |p| {
        write_private(p, b"numapmb1")
    });
    let d = dir();
    refused_as(d.path(), "more than a state file", |p| {
        let mut big = format::header().to_vec();
        big.resize(crate::num::usize_from(format::MAX_FILE) + 1, 0);
        write_private(p, &big);
    });
    let d = dir();
    refused_as(d.path(), "mode is 0644", |p| {
        write_private(p, &format::header());
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    });
    let d = dir();
    let target = d.path().join("elsewhere");
    write_private(&target, &format::header());
    refused_as(d.path(), "symbolic link", |p| {
        std::os::unix::fs::symlink(&target, p).expect("link")
    });
    let d = dir();
    refused_as(d.path(), "symbolic link", |p| {
        std::os::unix::fs::symlink("/nonexistent/x", p).expect("link")
    });
    assert!(
        !Path::new("/nonexistent/x").exists(),
        "a dangling link was not followed"
    );
    let d = dir();
    refused_as(d.path(), "not a regular file", |p| {
        std::fs::create_dir(p).expect("mkdir")
    });
    let d = dir();
    refused_as(d.path(), "not a regular file", |p| {
        nix::unistd::mkfifo(p, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    });
    if nix::unistd::geteuid().is_root() {
        let d = dir();
        refused_as(d.path(), "belongs to user 65534", |p| {
            write_private(p, &format::header());
            std::os::unix::fs::chown(p, Some(65534), Some(65534)).expect("chown");
        });
    } else {
        eprintln!("skipped: another user's file needs root to make");
    }
}

#[test]
fn a_corrupted_live_record_is_refused_and_a_corrupted_dead_one_cleared() {
    let d = dir();
    let (a, b) = (Ledger::new(d.path()), Ledger::new(d.path()));
    a.reserve(0, MIB, 8 * MIB).expect("fits");
    let path = a.path();
    let mut bytes = std::fs::read(&path).expect("read");
    bytes[BLOCK + 24] = 99; // 99 entries
    std::fs::write(&path, &bytes).expect("write");
    let e = state_error(b.reserve(0, MIB, 8 * MIB));
    assert!(
        e.to_string()
            .contains("held by a live process, is corrupted"),
        "{e}"
    );
    assert_eq!(std::fs::read(&path).expect("read"), bytes, "never changed");
    // Once its holder is gone the record is garbage of no one: cleared.
    drop(a);
    b.reserve(0, 8 * MIB, 8 * MIB).expect("fits");
}

#[test]
fn an_unsafe_folder_is_refused() {
    let d = dir();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let l = Ledger::new(d.path());
    let e = state_error(l.reserve(0, MIB, 8 * MIB));
    assert!(e.to_string().contains("not writable by others"), "{e}");
    assert!(e
        .fix()
        .is_some_and(|f| f.contains("NUMAPIN_MACHINE_BUDGET_DIR")));
    // Sticky, as /dev/shm and /tmp are: fine.
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    l.reserve(0, MIB, 8 * MIB).expect("a sticky folder is fine");
    let missing = Ledger::new(&d.path().join("missing"));
    let e = state_error(missing.reserve(0, MIB, 8 * MIB));
    assert!(e.to_string().contains("cannot be opened"), "{e}");
}

/// What `l` reads as used on `node`, read again for up to 2 s while it is
/// not `want`: a "killed" ledger's record lock lingers while another test
/// of this process has just spawned a child (the child holds the
/// close-on-exec descriptor until its exec), so the record reads live for
/// that moment, as a real process's would beside a spawning one.
fn settled_used(l: &Ledger, node: u32, want: u64) -> u64 {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        let got = l.used_on(node).expect("read");
        if got == want || std::time::Instant::now() > until {
            return got;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

#[derive(Debug, Clone)]
enum Op {
    Reserve(usize, u32, u64),
    Release(usize, u32),
    Kill(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..3usize, 0..2u32, 1..6u64).prop_map(|(l, n, b)| Op::Reserve(l, n, b)),
        2 => (0..3usize, 0..2u32).prop_map(|(l, n)| Op::Release(l, n)),
        1 => (0..3usize).prop_map(Op::Kill),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Three "processes" reserving, releasing and dying at random: every
    /// grant and refusal is the model's, and the file's sum per node never
    /// passes the limit.
    #[test]
    fn ledgers_agree_with_a_model(ops in proptest::collection::vec(op(), 1..40)) {
        const LIMIT: u64 = 10;
        let d = dir();
        let mut ledgers: Vec<Ledger> = (0..3).map(|_| Ledger::new(d.path())).collect();
        let mut model = [[0u64; 2]; 3];
        for op in ops {
            match op {
                Op::Reserve(l, n, b) => {
                    let total: u64 = model.iter().map(|m| m[n as usize]).sum();
                    let r = ledgers[l].reserve(n, b, LIMIT);
                    if total + b <= LIMIT {
                        prop_assert!(r.is_ok(), "{:?}", r);
                        model[l][n as usize] += b;
                    } else {
                        prop_assert_eq!(short(r).in_use, total);
                    }
                }
                Op::Release(l, n) => {
                    let b = model[l][n as usize];
                    if b > 0 {
                        ledgers[l].release(n, b);
                        model[l][n as usize] = 0;
                    }
                }
                Op::Kill(l) => {
                    ledgers[l] = Ledger::new(d.path());
                    model[l] = [0, 0];
                }
            }
            for n in 0..2u32 {
                let total: u64 = model.iter().map(|m| m[n as usize]).sum();
                prop_assert!(total <= LIMIT);
                prop_assert_eq!(settled_used(&ledgers[0], n, total), total);
            }
        }
    }
}

#[cfg(feature = "internals")]
#[test]
fn the_fuzz_check_holds_for_files_numapin_writes_and_for_garbage() {
    let r = format::Record {
        pid: 7,
        command: "python3".into(),
        entries: vec![format::Entry {
            node: 1,
            bytes: MIB,
            limit: 8 * MIB,
        }],
    };
    let mut file = format::header().to_vec();
    file.extend_from_slice(&format::encode(&r));
    super::fuzz_one(&file);
    super::fuzz_one(b"64GiB");
    super::fuzz_one(b"0.25");
    super::fuzz_one(&[0xff; 3000]);
    super::fuzz_one(&[]);
}
