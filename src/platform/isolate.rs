//! Running a risky parse in a child process.
//!
//! hwloc is a C library: a malformed or hostile XML file or capture can make
//! it abort on an internal assertion, which no Rust code can catch. numapin
//! therefore reads untrusted files in a forked child that sends its result
//! back as JSON through a pipe; if the child dies, the parent reports an
//! error naming the file and keeps running. The live probe does not need
//! this and runs in-process.

use std::io::{Read, Seek, Write};
use std::os::fd::{AsRawFd, OwnedFd};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// An error as it crosses the process boundary.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ChildError {
    /// What was read.
    pub input: String,
    /// What is wrong.
    pub problem: String,
    /// What to do.
    pub fix: String,
    /// Whether the system failed (a limit, a full disk) rather than the
    /// file: such errors are reported as system errors, never as a
    /// malformed file.
    #[serde(default)]
    pub system: bool,
}

thread_local! {
    /// Readers this thread started ([`in_child`]), for tests that check a
    /// file was refused before hwloc saw it.
    static STARTED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many file readers (children) the calling thread has started.
#[cfg(feature = "internals")]
pub(crate) fn readers_started() -> u64 {
    STARTED.with(std::cell::Cell::get)
}

/// Runs `f` in a forked child and returns what it returned. `input` names
/// the file for the error when the child crashes.
pub(crate) fn in_child<T: Serialize + DeserializeOwned + Send>(
    input: &str,
    f: impl FnOnce() -> Result<T, ChildError> + Send,
) -> Result<T, ChildError> {
    STARTED.with(|s| s.set(s.get() + 1));
    in_child_with_deadline(input, READ_DEADLINE, f)
}

/// [`in_child`], the child stopped after `deadline`.
fn in_child_with_deadline<T: Serialize + DeserializeOwned + Send>(
    input: &str,
    deadline: std::time::Duration,
    f: impl FnOnce() -> Result<T, ChildError> + Send,
) -> Result<T, ChildError> {
    let crashed = |problem: String| {
        ChildError {
        input: input.to_string(),
        problem,
        fix: "the file is malformed: give a complete hwloc XML export (`lstopo --of xml FILE`) or an unmodified hwloc-gather-topology capture".into(),
        system: false,
    }
    };
    let sys = |what: &str, e: std::io::Error| ChildError {
        input: input.to_string(),
        problem: format!("could not {what} to read it: {e}"),
        fix: super::sys::fix_for_io(&e).into(),
        system: true,
    };
    let parent = nix::unistd::getpid();
    // Take every lock the child will need now, in the parent: a lock another
    // thread holds at fork time stays locked forever in the child.
    super::panic_guard::install_hook();
    let (rd, wr) = nix::unistd::pipe().map_err(|e| sys("create a pipe", e.into()))?;
    let mut errlog = tempfile::tempfile().map_err(|e| sys("create a temporary file", e))?;
    // SAFETY: the child only runs `f` (which allocates; glibc keeps malloc
    // usable after fork through its atfork handlers), writes to the pipe and
    // calls _exit without running destructors or atexit handlers. It never
    // returns into the caller's stack frames.
    match unsafe { nix::unistd::fork() } {
        Err(e) => Err(sys("fork", e.into())),
        Ok(nix::unistd::ForkResult::Child) => {
            // The reader dies with numapin, whatever ends numapin (SIGKILL
            // included); if numapin is already gone, it stops at once.
            let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
            if nix::unistd::getppid() != parent {
                // SAFETY: _exit ends the child at once, as a forked child should.
                unsafe { libc::_exit(4) }
            }
            drop(rd);
            // SAFETY: both descriptors are open; dup2 onto 2 redirects this
            // child's stderr (hwloc's messages) into the log file.
            unsafe { libc::dup2(errlog.as_raw_fd(), 2) };
            // One descriptor fewer for the reader to run short of.
            drop(errlog);
            // On a stack of the reader's own: hwloc's recursion must not
            // depend on the caller's thread.
            let r = on_reader_stack(|| {
                super::panic_guard::catch(f)
                    .unwrap_or_else(|msg| Err(crashed(format!("internal error: {msg}"))))
            })
            .unwrap_or_else(|| Err(crashed("internal error: the reader's thread failed".into())));
            let text = serde_json::to_vec(&r).unwrap_or_default();
            let mut w = std::fs::File::from(wr);
            let ok = w.write_all(&text).is_ok();
            // SAFETY: _exit ends the child at once, as a forked child should.
            unsafe { libc::_exit(if ok { 0 } else { 3 }) }
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            drop(wr);
            let registered = super::cleanup::ChildGuard::new(child.as_raw());
            let (buf, read) = read_with_deadline(rd, deadline);
            if read.is_err() {
                let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
            }
            let status = nix::sys::wait::waitpid(child, None);
            drop(registered);
            let tail = log_tail(&mut errlog);
            let timed_out = read
                .as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::TimedOut);
            let reply = |buf: &[u8]| {
                serde_json::from_slice(buf).unwrap_or_else(|e| {
                    Err(crashed(format!(
                        "internal error: bad reply from the reader ({e})"
                    )))
                })
            };
            // ECHILD: the reader was reaped without us (the caller ignores
            // SIGCHLD, or a handler of its reaped every child): it has
            // ended, and its reply alone says how.
            let reaped = matches!(status, Err(nix::errno::Errno::ECHILD));
            match status {
                Ok(nix::sys::wait::WaitStatus::Exited(_, 0)) if read.is_ok() => reply(&buf),
                _ if reaped && read.is_ok() && !buf.is_empty() => reply(&buf),
                // The reader was stopped by numapin: report why, not the
                // SIGKILL it took.
                _ if timed_out => Err(ChildError {
                    input: input.to_string(),
                    problem: format!(
                        "the reader did not finish in {} s and was stopped",
                        deadline.as_secs()
                    ),
                    fix: "give a capture of regular files only (a file that never ends, such as a link to /dev/zero, keeps hwloc reading)".into(),
                    system: false,
                }),
                _ if read.is_err() => Err(ChildError {
                    input: input.to_string(),
                    problem: format!(
                        "the reader's reply could not be read ({})",
                        read.as_ref().err().map_or(String::new(), ToString::to_string)
                    ),
                    fix: "check the file; a description that big is beyond numapin's limits".into(),
                    system: false,
                }),
                Ok(nix::sys::wait::WaitStatus::Signaled(_, sig, _)) => {
                    Err(crashed(format!("hwloc crashed reading it ({sig}){tail}")))
                }
                _ if reaped => Err(crashed(format!(
                    "the reader ended without a reply (a crash; its exit status is not known: this process ignores SIGCHLD, so the system reaped it){tail}"
                ))),
                other => Err(crashed(format!("the reader failed ({other:?}){tail}"))),
            }
        }
    }
}

/// The last line the reader wrote to stderr (hwloc's last message) as
/// `": line"`, or nothing; a hostile file can make hwloc write without
/// end, so only the log's last 64 KiB are read.
fn log_tail(errlog: &mut std::fs::File) -> String {
    let mut tail = Vec::new();
    let end = errlog.seek(std::io::SeekFrom::End(0)).unwrap_or(0);
    let _ = errlog.seek(std::io::SeekFrom::Start(end.saturating_sub(64 << 10)));
    let _ = errlog.take(64 << 10).read_to_end(&mut tail);
    let log = String::from_utf8_lossy(&tail);
    let last = log
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim();
    if last.is_empty() {
        String::new()
    } else {
        format!(": {}", crate::report::shorten(last))
    }
}

/// The stack a reader runs on: hwloc reads nested objects recursively,
/// and the caller's thread (forked with its stack) may be small.
const READER_STACK: usize = 16 << 20;

/// Runs `f` on a thread with a [`READER_STACK`] stack (on this one when
/// no thread can be made); `None` if it could not finish (a panic that
/// escaped it).
fn on_reader_stack<T: Send>(f: impl FnOnce() -> T + Send) -> Option<T> {
    let work = std::sync::Mutex::new(Some(f));
    let take = || work.lock().ok().and_then(|mut w| w.take());
    std::thread::scope(|s| {
        let spawned = std::thread::Builder::new()
            .stack_size(READER_STACK)
            .spawn_scoped(s, || take().map(call));
        match spawned {
            Ok(h) => h.join().ok().flatten(),
            Err(_) => take().map(call),
        }
    })
}

/// Calls `f` in a frame of its own (inlined, its locals would be reserved
/// on the caller's stack).
#[inline(never)]
fn call<T>(f: impl FnOnce() -> T) -> T {
    f()
}

/// How long a reader may take before it is killed (a sysfs capture of a
/// large machine reads in well under a second).
const READ_DEADLINE: std::time::Duration = std::time::Duration::from_secs(120);

/// Largest reply a reader may send (a description within numapin's limits
/// is a few MiB).
const MAX_REPLY: usize = 256 << 20;

fn read_with_deadline(rd: OwnedFd, limit: std::time::Duration) -> (Vec<u8>, std::io::Result<()>) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let deadline = std::time::Instant::now() + limit;
    let mut file = std::fs::File::from(rd);
    let mut buf = Vec::new();
    // On the heap: the caller's thread may have a small stack.
    let mut chunk = vec![0u8; 65536];
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return (
                buf,
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the reader took too long",
                )),
            );
        }
        let ms =
            PollTimeout::try_from(left.as_millis().min(60_000) as i32).unwrap_or(PollTimeout::MAX);
        let mut fds = [PollFd::new(
            std::os::fd::AsFd::as_fd(&file),
            PollFlags::POLLIN,
        )];
        match poll(&mut fds, ms) {
            Ok(0) => continue,
            Ok(_) => match file.read(&mut chunk) {
                Ok(0) => return (buf, Ok(())),
                Ok(n) if buf.len() + n > MAX_REPLY => {
                    return (
                        buf,
                        Err(std::io::Error::new(
                            std::io::ErrorKind::OutOfMemory,
                            format!("the reply is over {} MiB", MAX_REPLY >> 20),
                        )),
                    )
                }
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return (buf, Err(e)),
            },
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return (buf, Err(e.into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_the_childs_value() {
        let v: u32 = in_child("x", || Ok(41 + 1)).unwrap();
        assert_eq!(v, 42);
    }

    #[test]
    fn reports_the_childs_error() {
        let e = in_child::<u32>("f.xml", || {
            Err(ChildError {
                input: "f.xml".into(),
                problem: "bad".into(),
                fix: "fix".into(),
                system: false,
            })
        })
        .unwrap_err();
        assert_eq!(e.problem, "bad");
    }

    #[test]
    fn a_reader_past_its_deadline_is_reported_as_a_timeout() {
        let e = in_child_with_deadline::<u32>("f.xml", std::time::Duration::from_secs(1), || {
            std::thread::sleep(std::time::Duration::from_secs(30));
            Ok(0)
        })
        .unwrap_err();
        assert!(e.problem.contains("did not finish in 1 s"), "{}", e.problem);
        assert!(!e.problem.contains("crash"), "{}", e.problem);
        assert!(!e.system);
    }

    /// Started by `the_reader_dies_with_its_parent` in a process of its own:
    /// starts a reader that records its pid and waits.
    #[test]
    #[ignore = "runs in a child process: started by the_reader_dies_with_its_parent"]
    fn reader_parent_role() {
        let Some(pidfile) = std::env::var_os("NUMAPIN_READER_PIDFILE") else {
            return;
        };
        let _ = in_child::<u32>("f.xml", || {
            let me = std::process::id().to_string();
            let _ = std::fs::write(&pidfile, me);
            std::thread::sleep(std::time::Duration::from_secs(60));
            Ok(0)
        });
    }

    #[test]
    fn the_reader_dies_with_its_parent() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("reader.pid");
        let mut parent = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "platform::isolate::tests::reader_parent_role",
                "--ignored",
                "--test-threads=1",
            ])
            .env("NUMAPIN_READER_PIDFILE", &pidfile)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let start = std::time::Instant::now();
        let reader: i32 = loop {
            if let Some(pid) = std::fs::read_to_string(&pidfile)
                .ok()
                .and_then(|s| s.parse().ok())
            {
                break pid;
            }
            assert!(start.elapsed().as_secs() < 20, "the reader never started");
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        parent.kill().unwrap();
        parent.wait().unwrap();
        let gone = || {
            std::fs::read_to_string(format!("/proc/{reader}/stat")).map_or(true, |s| {
                s.rsplit(')')
                    .next()
                    .is_some_and(|r| r.trim_start().starts_with('Z'))
            })
        };
        let start = std::time::Instant::now();
        while !gone() && start.elapsed().as_secs() < 5 {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let alive = !gone();
        if alive {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(reader),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        assert!(!alive, "reader {reader} outlived its parent's SIGKILL");
    }

    /// Started by `a_caller_ignoring_sigchld_still_gets_the_reply` in a
    /// process of its own (the disposition is process-wide): with SIGCHLD
    /// ignored, a reader's reply and a reader's crash.
    #[test]
    #[ignore = "runs in a child process: started by a_caller_ignoring_sigchld_still_gets_the_reply"]
    fn sigchld_ignored_role() {
        if std::env::var_os("NUMAPIN_SIGCHLD_ROLE").is_none() {
            return;
        }
        // SAFETY: SIG_IGN is a valid disposition; this process runs this
        // test alone.
        unsafe { libc::signal(libc::SIGCHLD, libc::SIG_IGN) };
        let v = in_child("x.xml", || Ok(41u32 + 1));
        println!("reply: {v:?}");
        let e = in_child::<u32>("x.xml", || std::process::abort()).unwrap_err();
        println!("crash: {}", e.problem);
    }

    #[test]
    fn a_caller_ignoring_sigchld_still_gets_the_reply() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "platform::isolate::tests::sigchld_ignored_role",
                "--ignored",
                "--test-threads=1",
                "--nocapture",
            ])
            .env("NUMAPIN_SIGCHLD_ROLE", "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        assert!(text.contains("reply: Ok(42)"), "{text}");
        assert!(
            text.contains("crash: the reader ended without a reply (a crash; its exit status is not known: this process ignores SIGCHLD"),
            "{text}"
        );
    }

    #[test]
    fn survives_an_abort() {
        let e = in_child::<u32>("f.xml", || {
            let msg = b"topology.c:1: check: Assertion `x' failed.\n";
            // SAFETY: writes a valid buffer to fd 2 (the test harness
            // captures eprintln!, hwloc writes to the descriptor).
            unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
            std::process::abort()
        })
        .unwrap_err();
        assert!(e.problem.contains("crashed"), "{}", e.problem);
        assert!(e.problem.contains("Assertion"), "{}", e.problem);
        assert_eq!(e.input, "f.xml");
    }
}
