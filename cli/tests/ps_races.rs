//! `numapin ps` over processes that race its reading: processes that exit,
//! `exec` or change their user (`setuid`, as root) while read, one with
//! 3,000 threads and one with 30,000 mappings. Every pass exits 0 or 1
//! (never 2, a panic or a signal), prints valid JSON, and never gives one
//! process (or program) another's data.
#![allow(clippy::unwrap_used)] // tests fail loudly

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The churn, in Python. Every process it makes has numapin's stats memfd
/// name open (fd 3), so the scan reads each; the variable
/// `NCCL_SOCKET_IFNAME` (one `ps` reports) tells its program apart:
/// `a` before `exec`, `bx<i>` after a plain one, `bu<i>` after one that
/// followed `setuid(nobody)`. Before its `exec` a child's command is
/// `ch<i>`, after it `sleep`. Writes `ready` (holding its pid and the
/// pids of the threads' and mappings' holders) once they are set up; on
/// SIGTERM kills and reaps every child, then exits.
const CHURN: &str = r#"
import ctypes, mmap, os, random, signal, sys, threading, time
libc = ctypes.CDLL(None, use_errno=True)
def die_with_parent():
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:
        os._exit(0)
fd = os.memfd_create("numapin-stats", 0)
os.dup2(fd, 3)
os.set_inheritable(3, True)
root = os.geteuid() == 0
kids = set()
def stop(*_):
    for k in kids:
        try: os.kill(k, signal.SIGKILL)
        except OSError: pass
    for k in kids:
        try: os.waitpid(k, 0)
        except OSError: pass
    os._exit(0)
def holder(body):
    pid = os.fork()
    if pid == 0:
        die_with_parent()
        body()
        while True: time.sleep(60)
    kids.add(pid)
    return pid
def threads():
    threading.stack_size(64 << 10)
    ev = threading.Event()
    ts = [threading.Thread(target=ev.wait, daemon=True) for _ in range(3000)]
    for t in ts: t.start()
    open(sys.argv[1] + ".threads", "w").close()
def failed(what):
    e = ctypes.get_errno()
    sys.stderr.write(f"churn: {what}: {os.strerror(e)} (errno {e})\n")
    os._exit(1)
def mappings():
    n, page = 30000, mmap.PAGESIZE
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    base = libc.mmap(None, n * page, 3, 0x22 | 0x4000, -1, 0)  # rw, private|anonymous|noreserve
    if base is None or base == ctypes.c_void_p(-1).value:  # MAP_FAILED
        failed(f"mmap of {n} pages")
    for i in range(0, n, 2):
        if libc.mprotect(ctypes.c_void_p(base + i * page), page, 1) != 0:  # every other page read-only
            failed(f"mprotect of page {i}")
    open(sys.argv[1] + ".maps", "w").close()
signal.signal(signal.SIGTERM, stop)
t = holder(threads)
m = holder(mappings)
while not (os.path.exists(sys.argv[1] + ".threads") and os.path.exists(sys.argv[1] + ".maps")):
    for k in (t, m):
        if os.waitpid(k, os.WNOHANG)[0]:
            sys.exit(f"churn: holder {k} ended before it was ready")
    time.sleep(0.01)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {t} {m}")
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
i = 0
while True:
    while len(kids) > 2 + 40:
        pid, _ = os.waitpid(-1, 0)
        kids.discard(pid)
    i += 1
    kind = i % 3 if root else i % 2
    pid = os.fork()
    if pid == 0:
        die_with_parent()
        libc.prctl(15, f"ch{i}".encode())  # PR_SET_NAME
        # 2,000 descriptors (closed by the exec) keep the reader between
        # the command and the environment a while: an exec lands there.
        for _ in range(2000): os.dup(0)
        time.sleep(random.random() * 0.02)
        if kind == 0:
            os._exit(0)
        tag = "bx"
        if kind == 2:
            os.setgroups([]); os.setgid(65534); os.setuid(65534)
            die_with_parent()
            time.sleep(random.random() * 0.02)
            tag = "bu"
        os.execve("/bin/sleep", ["sleep", str(0.3 + random.random() * 0.7)], {"NCCL_SOCKET_IFNAME": f"{tag}{i}"})
    kids.add(pid)
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        kids.discard(pid)
    time.sleep(0.002)
"#;

/// The churn's process group, stopped (and every process of it reaped)
/// when dropped.
struct Churn {
    child: Child,
    /// The churn's pid, its threads' holder's and its mappings' holder's.
    pids: [u32; 3],
    _dir: tempfile::TempDir,
}

impl Churn {
    fn start() -> Option<Self> {
        if Command::new("python3")
            .args(["-c", "pass"])
            .output()
            .is_err()
        {
            eprintln!("skipped: no python3 to make the churn of processes");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let ready = dir.path().join("ready");
        let child = Command::new("python3")
            .args(["-c", CHURN])
            .arg(&ready)
            .env("NCCL_SOCKET_IFNAME", "a")
            .stdin(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("python3 starts");
        let mut churn = Self {
            child,
            pids: [0; 3],
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !ready.exists() {
            if let Some(status) = churn.child.try_wait().unwrap() {
                panic!("the churn ended before it was ready: {status}");
            }
            assert!(Instant::now() < deadline, "the churn was never ready");
            std::thread::sleep(Duration::from_millis(20));
        }
        let text = std::fs::read_to_string(&ready).unwrap();
        let pids: Vec<u32> = text.split(' ').map(|p| p.parse().unwrap()).collect();
        churn.pids = pids.try_into().unwrap();
        Some(churn)
    }
}

/// The pids of the processes in process group `pgid` now.
fn group(pgid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let rest = &stat[stat.rfind(')').unwrap() + 1..];
        // Fields 3 (state), 4 (ppid), 5 (pgrp).
        if rest.split_whitespace().nth(2) == Some(&pgid.to_string()) {
            out.push(pid);
        }
    }
    out
}

impl Drop for Churn {
    fn drop(&mut self) {
        let pgid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap());
        let _ = nix::sys::signal::kill(pgid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

fn ps(args: &[&str]) -> (Output, Duration) {
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_numapin"))
        .arg("ps")
        .args(args)
        .args(["--no-cuda", "--no-nvml"])
        .env_remove("CUDA_VISIBLE_DEVICES")
        .output()
        .expect("numapin runs");
    (out, started.elapsed())
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Exit 0 or 1 (verdicts), never 2, a panic or a signal; and a loose
/// floor on the time of a pass.
fn check_exit(o: &Output, took: Duration) {
    assert!(
        matches!(o.status.code(), Some(0 | 1)),
        "{:?}: {}",
        o.status,
        text(o)
    );
    assert!(!text(o).contains("panicked"), "{}", text(o));
    assert!(took < Duration::from_secs(60), "a pass took {took:?}");
}

/// The program a process's `NCCL_SOCKET_IFNAME` names, if ours.
fn tag(p: &Value) -> Option<String> {
    p["environment"]["nic"]
        .as_array()?
        .iter()
        .find(|kv| kv[0] == "NCCL_SOCKET_IFNAME")
        .and_then(|kv| kv[1].as_str())
        .map(str::to_string)
}

/// One process of a pass: its command, its user and its environment are
/// of one program. Returns whether it was a churned child read after its
/// `exec`.
fn check_process(p: &Value, churn: &Churn) -> bool {
    let pid = p["pid"].as_u64().unwrap();
    let command = p["command"].as_str().unwrap();
    let uid = p["uid"].as_u64();
    let changing = p["unread"]
        .as_array()
        .unwrap()
        .iter()
        .any(|u| u["part"] == "process");
    let Some(tag) = tag(p) else {
        // Not ours, or an environment not read (a line says why).
        return false;
    };
    if changing {
        // It kept changing while read, and says so.
        return false;
    }
    if let Some(i) = command.strip_prefix("ch") {
        assert_eq!(tag, "a", "pid {pid}: child {i} before its exec: {p:#}");
    }
    if tag.starts_with('b') {
        assert_eq!(command, "sleep", "pid {pid}: read after its exec: {p:#}");
    }
    if tag.starts_with("bu") {
        assert_eq!(uid, Some(65534), "pid {pid}: exec'd as nobody: {p:#}");
    }
    if pid == u64::from(churn.pids[1]) {
        assert!(p["threads"]["count"].as_u64().unwrap() > 3000, "{p:#}");
    }
    if pid == u64::from(churn.pids[2]) {
        assert!(p["memory"]["vmas"].as_u64().unwrap() > 30000, "{p:#}");
    }
    tag.starts_with('b')
}

#[test]
fn ps_over_processes_that_exit_exec_and_change_user_while_read() {
    let Some(churn) = Churn::start() else {
        return;
    };
    let mut exec_read = 0;
    let mut exited = 0;
    for pass in 0..8 {
        let (o, took) = ps(&["--json"]);
        check_exit(&o, took);
        let r: Value = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("pass {pass}: not JSON ({e}):\n{}", text(&o)));
        let procs = r["processes"].as_array().unwrap();
        let listed: Vec<u64> = procs.iter().map(|p| p["pid"].as_u64().unwrap()).collect();
        for pid in churn.pids {
            assert!(
                listed.contains(&u64::from(pid)),
                "pass {pass}: {pid} not in {listed:?}"
            );
        }
        for p in procs {
            exec_read += usize::from(check_process(p, &churn));
        }
        for gone in r["exited"].as_array().unwrap() {
            assert!(!gone["why"].as_str().unwrap().is_empty(), "{gone}");
            assert!(!listed.contains(&gone["pid"].as_u64().unwrap()), "{r:#}");
            exited += 1;
        }
        // The named form over the long-lived ones.
        let named = churn.pids.map(|p| p.to_string()).join(",");
        let (o, took) = ps(&["--json", "--pid", &named]);
        check_exit(&o, took);
        let r: Value = serde_json::from_slice(&o.stdout).unwrap();
        for p in r["processes"].as_array().unwrap() {
            check_process(p, &churn);
        }
        if pass % 3 == 0 {
            let (o, took) = ps(&[]);
            check_exit(&o, took);
            assert!(String::from_utf8_lossy(&o.stdout).contains(&format!("pid {}", churn.pids[1])));
        }
    }
    eprintln!("children read after their exec: {exec_read}; listed as exited: {exited}");
    assert!(
        exec_read > 0,
        "no churned child was read after its exec: the churn did not run"
    );
    let pgid = churn.child.id();
    drop(churn);
    // Nothing of the churn is left (its processes may take a moment to go).
    let mut left = group(pgid);
    for _ in 0..100 {
        if left.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
        left = group(pgid);
    }
    assert!(left.is_empty(), "processes of the churn are left: {left:?}");
}
