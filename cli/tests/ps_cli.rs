//! `numapin ps` on this machine's real processes (no GPU needed): ranks
//! named with `--pid` and judged against a saved two-socket machine, a
//! process found by the scan through an accelerator's sysfs file, hostile
//! `/proc` folders, another user's processes, `--watch`, and bad usage.
#![allow(clippy::unwrap_used)] // tests and examples fail loudly

#[path = "../../tests/common/mod.rs"]
mod common;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn numapin(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_numapin"));
    c.args(args)
        .env_remove("CUDA_VISIBLE_DEVICES")
        .env_remove("CUDA_DEVICE_ORDER")
        .env_remove("LOCAL_RANK");
    c
}

fn run(mut c: Command) -> Output {
    c.output().expect("numapin runs")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../topology")
        .join(name)
        .display()
        .to_string()
}

/// Processes this test started, killed and reaped when dropped.
struct Procs(Vec<Child>);

impl Procs {
    fn new() -> Self {
        Self(Vec::new())
    }

    /// Starts `sh -c script` with `env`; it creates `ready` (in a temporary
    /// folder) when set up. Returns its pid once it is ready.
    fn start(&mut self, script: &str, env: &[(&str, &str)], ready: &Path) -> u32 {
        let child = Command::new("sh")
            .args([
                "-c",
                &format!("{script}; : > {}; exec sleep 120", ready.display()),
            ])
            .env_remove("LOCAL_RANK")
            .env_remove("CUDA_VISIBLE_DEVICES")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .spawn()
            .expect("sh starts");
        let pid = child.id();
        self.0.push(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !ready.exists() {
            assert!(Instant::now() < deadline, "{script}: never ready");
            std::thread::sleep(Duration::from_millis(10));
        }
        // Past the `exec`: the pid is sleep's now, with what sh set up.
        std::thread::sleep(Duration::from_millis(50));
        pid
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn report(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", text(o)))
}

/// The `(name, verdict)` of each check of process `pid`.
fn verdicts(r: &Value, pid: u32) -> Vec<(String, String)> {
    let p = r["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap_or_else(|| panic!("pid {pid} not in {r:#}"));
    p["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_string(),
                c["verdict"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn v(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

/// Whether this machine's CPUs all fall in node 0 of the DGX H100 fixture
/// (CPUs 0-55): then every thread here "runs on node 0" there.
fn fits_dgx_node0() -> bool {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    if n > 56 {
        eprintln!("skipped: {n} CPUs here; the test needs at most 56 (node 0 of the DGX fixture)");
        return false;
    }
    true
}

/// Rank 0 (GPU 0, node 0 of the DGX H100 fixture) is where it belongs;
/// rank 4 (GPU 4, node 1), told to use GPU 0's NIC, fails on threads and
/// NIC; the exit code is 1.
#[test]
fn ranks_judged_against_a_saved_two_socket_machine() {
    if !fits_dgx_node0() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let mut procs = Procs::new();
    let right = procs.start("true", &[("LOCAL_RANK", "0")], &d.path().join("a"));
    let wrong = procs.start(
        "true",
        &[("LOCAL_RANK", "4"), ("UCX_NET_DEVICES", "mlx5_0:1")],
        &d.path().join("b"),
    );
    let dgx = fixture("dgx-h100.xml");
    let pids = format!("{right},{wrong}");
    let o = run(numapin(&["ps", "--json", "--input", &dgx, "--pid", &pids]));
    let r = report(&o);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert_eq!(r["summary"]["exit_code"], 1);
    // Every CPU here is in node 0 of the fixture: rank 0 is bound there
    // by its cpuset. sleep has too little data for a memory verdict.
    assert_eq!(
        verdicts(&r, right),
        v(&[
            ("gpu", "ok"),
            ("cpus", "ok"),
            ("memory", "ok"),
            ("nic", "ok")
        ]),
        "{r:#}"
    );
    assert_eq!(
        verdicts(&r, wrong),
        v(&[
            ("gpu", "ok"),
            ("cpus", "fail"),
            ("memory", "ok"),
            ("nic", "fail")
        ]),
        "{r:#}"
    );
    let out = run(numapin(&["ps", "--input", &dgx, "--pid", &pids]));
    let t = String::from_utf8_lossy(&out.stdout);
    assert!(t.contains(&format!("pid {wrong}  sleep")), "{t}");
    assert!(t.contains("FAIL  cpus    GPU 4 is on node 1"), "{t}");
    assert!(t.contains("fix: start it with `numapin exec --nic-env ucx -- CMD`, which sets UCX_NET_DEVICES=mlx5_4:1 for GPU 4"), "{t}");
    assert!(t.contains("NODE  MEMORY"), "{t}");
}

/// A process holding 32 MiB (a shell variable) whose GPU is on the other
/// socket of the saved machine: its memory check fails.
#[test]
fn data_on_the_other_node_fails_the_memory_check() {
    if !fits_dgx_node0() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let ready = d.path().join("ready");
    let mut sh = Command::new("sh")
        .args([
            "-c",
            &format!(
                "x=$(head -c 33554432 /dev/zero | tr '\\0' a); : > {}; sleep 120; echo ${{#x}}",
                ready.display()
            ),
        ])
        .env("LOCAL_RANK", "5")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let pid = sh.id().to_string();
    let o = run(numapin(&[
        "ps",
        "--json",
        "--input",
        &fixture("dgx-h100.xml"),
        "--pid",
        &pid,
    ]));
    let _ = sh.kill();
    let _ = sh.wait();
    let r = report(&o);
    let checks = r["processes"][0]["checks"].as_array().unwrap();
    let mem = checks.iter().find(|c| c["name"] == "memory").unwrap();
    assert_eq!(mem["verdict"], "fail", "{mem}");
    let ev = mem["evidence"].as_str().unwrap();
    assert!(ev.starts_with("GPU 5 is on node 1; 100% of its "), "{ev}");
    assert!(mem["fix"]
        .as_str()
        .unwrap()
        .contains(&format!("migratepages {pid} <from-nodes> 1")));
    assert_eq!(o.status.code(), Some(1));
}

#[test]
fn missing_processes_and_bad_flags_exit_2() {
    let o = run(numapin(&["ps", "--pid", "4194304"]));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let t = text(&o);
    assert!(
        t.contains("numapin: error: pid 4194304: no such process"),
        "{t}"
    );
    assert!(t.contains("fix: check the process id"), "{t}");
    let me = std::process::id().to_string();
    for args in [
        &["ps", "--pid", "0"][..],
        &["ps", "--pid", "abc"],
        &["ps", "--watch", "0"],
        &["ps", "--watch", "x"],
        &["ps", "--count", "2"],
        &["ps", "--watch", "1", "--count", "0"],
        &["ps", "--root", "/nonexistent", "--pid", &me],
        &["ps", "--bogus"],
    ] {
        let o = run(numapin(args));
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
    }
    let o = run(numapin(&["ps", "--root", "/nonexistent"]));
    assert!(
        text(&o).contains("--root /nonexistent: no proc folder in it"),
        "{}",
        text(&o)
    );
}

/// `--watch` prints one JSON line per pass; a process that ends is listed
/// as exited and the watch ends when none is left.
#[test]
fn watch_passes_and_a_process_that_ends() {
    let mut short = Command::new("sleep").arg("0.6").spawn().unwrap();
    let pid = short.id().to_string();
    // Reaped by a thread as soon as it ends, so it does not linger as a zombie.
    let reaper = std::thread::spawn(move || short.wait());
    let o = run(numapin(&[
        "ps", "--json", "--watch", "0.25", "--count", "20", "--pid", &pid,
    ]));
    reaper.join().unwrap().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let passes: Vec<Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        passes.len() >= 2 && passes.len() < 20,
        "{} passes",
        passes.len()
    );
    assert_eq!(passes[0]["pass"], 1);
    assert_eq!(passes[0]["processes"][0]["pid"].to_string(), pid);
    let last = passes.last().unwrap();
    assert!(last["processes"].as_array().unwrap().is_empty(), "{last}");
    assert_eq!(last["exited"][0]["pid"].to_string(), pid, "{last}");
    // Text passes say which pass.
    let me = std::process::id().to_string();
    let o = run(numapin(&[
        "ps", "--watch", "0.1", "--count", "2", "--pid", &me,
    ]));
    let t = String::from_utf8_lossy(&o.stdout);
    assert!(
        t.contains("numapin ps: pass 1 at +") && t.contains("numapin ps: pass 2 at +"),
        "{t}"
    );
}

/// A PCI device of this machine treated as an accelerator: a process with
/// its sysfs `config` open is found by the scan (no --pid), this test
/// process is not.
#[test]
fn the_scan_finds_a_process_with_an_accelerator_open() {
    let Some((bus, id)) = some_pci_device() else {
        eprintln!("skipped: no PCI device in /sys/bus/pci/devices");
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let mut procs = Procs::new();
    let config = format!("/sys/bus/pci/devices/{bus}/config");
    let pid = procs.start(&format!("exec 3< {config}"), &[], &d.path().join("r"));
    let o = run(numapin(&[
        "ps",
        "--json",
        "--no-cuda",
        "--accelerator-pci-id",
        &id,
    ]));
    let r = report(&o);
    let listed: Vec<u64> = r["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pid"].as_u64().unwrap())
        .collect();
    assert!(listed.contains(&u64::from(pid)), "{listed:?}: {r:#}");
    let p = r["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap();
    assert_eq!(p["gpus"][0]["bus_id"], bus.as_str(), "{p:#}");
    assert_eq!(p["gpus"][0]["descriptor"], true);
    assert_eq!(p["checks"][0]["name"], "gpu");
    assert_eq!(p["checks"][0]["verdict"], "ok", "{p:#}");
    assert!(!listed.contains(&u64::from(std::process::id())));
    assert!(r["looked_at"].as_u64().unwrap() > 2);
}

/// `(bus id, VENDOR:DEVICE)` of a PCI device that is no bridge.
fn some_pci_device() -> Option<(String, String)> {
    let read = |p: PathBuf| {
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_string())
    };
    let mut entries: Vec<_> = std::fs::read_dir("/sys/bus/pci/devices")
        .ok()?
        .flatten()
        .collect();
    entries.sort_by_key(|e| e.file_name());
    entries.into_iter().find_map(|e| {
        let p = e.path();
        let class = read(p.join("class"))?;
        if class.starts_with("0x06") {
            return None;
        }
        let (v, dv) = (read(p.join("vendor"))?, read(p.join("device"))?);
        let bus = e.file_name().to_string_lossy().into_owned();
        Some((
            bus,
            format!(
                "{}:{}",
                v.trim_start_matches("0x"),
                dv.trim_start_matches("0x")
            ),
        ))
    })
}

/// A fake `/proc` with hostile contents: a `numa_maps` past the line
/// limit, a line of a MiB, binary environments, dangling links. Lines,
/// never a crash, and the exit code of the verdicts.
#[test]
fn hostile_proc_folders_give_lines() {
    let d = tempfile::tempdir().unwrap();
    let proc_dir = |pid: u32| d.path().join(format!("proc/{pid}"));
    for pid in [10, 11] {
        let p = proc_dir(pid);
        std::fs::create_dir_all(p.join("fd")).unwrap();
        std::fs::create_dir_all(p.join("task/1")).unwrap();
        std::fs::write(
            p.join("status"),
            "Name:\tx\nState:\tS\nCpus_allowed_list:\t0\n",
        )
        .unwrap();
        std::fs::write(p.join("task/1/stat"), "1 (x) S 1").unwrap();
        std::fs::write(p.join("environ"), [0xff, 0, b'=', 0, b'L', b'O']).unwrap();
        std::os::unix::fs::symlink("/dev/nvidia0", p.join("fd/3")).unwrap();
        std::fs::write(p.join("maps"), "").unwrap();
    }
    // 4,194,305 one-line mappings: past the default limit of 4,194,304.
    {
        use std::io::Write;
        let mut f =
            std::io::BufWriter::new(std::fs::File::create(proc_dir(10).join("numa_maps")).unwrap());
        for _ in 0..=(1u32 << 22) {
            f.write_all(b"1 default\n").unwrap();
        }
    }
    std::fs::write(
        proc_dir(11).join("numa_maps"),
        "7f default ".to_string() + &"x".repeat(1 << 20),
    )
    .unwrap();
    let root = d.path().to_str().unwrap();
    let started = Instant::now();
    let o = run(numapin(&[
        "ps",
        "--json",
        "--root",
        root,
        "--input",
        &fixture("dgx-h100.xml"),
    ]));
    eprintln!(
        "a pass over 4 million numa_maps lines: {:?}",
        started.elapsed()
    );
    let r = report(&o);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let procs = r["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 2, "{r:#}");
    let why = |i: usize| procs[i]["unread"].to_string();
    assert!(
        why(0).contains("more than the 4194304-line limit"),
        "{}",
        why(0)
    );
    assert!(
        why(1).contains("line 1 is longer than the 65536-byte limit"),
        "{}",
        why(1)
    );
    // Each has GPU 0 open (minor 0, but no driver files: bus id unknown).
    assert_eq!(procs[0]["gpus"][0]["path"], "/dev/nvidia0");
    assert_eq!(procs[0]["gpus"][0]["bus_id"], Value::Null);
    let t = String::from_utf8_lossy(&run(numapin(&["ps", "--root", root])).stdout).into_owned();
    assert!(t.contains("not read: memory:"), "{t}");
}

/// As user `nobody`: another user's process is read as far as allowed,
/// with a line for each part that is not; the scan lists it as not readable.
#[test]
fn another_users_process_gives_lines_not_guesses() {
    if !nix::unistd::geteuid().is_root() {
        common::skip(
            common::Need::Root,
            "needs root to run numapin as user nobody",
        );
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let mut procs = Procs::new();
    let pid = procs.start("true", &[("LOCAL_RANK", "0")], &d.path().join("r"));
    let (_dir, exe) = common::runnable_by_everyone(Path::new(env!("CARGO_BIN_EXE_numapin")));
    let as_nobody = |args: &[&str]| {
        let mut c = Command::new(&exe);
        c.args(args).current_dir("/").env("HOME", "/");
        // SAFETY: only system calls (setrlimit, setgroups, setgid, setuid)
        // run between fork and exec.
        unsafe {
            c.pre_exec(common::as_nobody(8 << 20));
        }
        run(c)
    };
    let o = as_nobody(&["ps", "--json", "--no-cuda", "--pid", &pid.to_string()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r = report(&o);
    let p = &r["processes"][0];
    let parts: Vec<&str> = p["unread"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| {
            assert_eq!(u["permission"], true, "{u}");
            u["part"].as_str().unwrap()
        })
        .collect();
    assert_eq!(
        parts,
        ["descriptors", "mappings", "environment", "memory"],
        "{p:#}"
    );
    assert!(
        p["threads"]["count"].as_u64().unwrap() >= 1,
        "threads are world-readable"
    );
    assert_eq!(p["checks"][0]["verdict"], "warn");
    assert!(p["checks"][0]["evidence"]
        .as_str()
        .unwrap()
        .contains("its environment is not readable"));
    let o = as_nobody(&["ps", "--json", "--no-cuda"]);
    let r = report(&o);
    let unreadable: Vec<u64> = r["unreadable"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["pid"].as_u64().unwrap())
        .collect();
    assert!(unreadable.contains(&u64::from(pid)), "{unreadable:?}");
    let t = String::from_utf8_lossy(&as_nobody(&["ps", "--no-cuda"]).stdout).into_owned();
    assert!(
        t.contains("not readable by this user (run as root, or as their user, to check them):"),
        "{t}"
    );
}

/// Set in the child [`a_process_using_numapin_shows_its_arenas`] starts:
/// the file it writes its node to once its buffer is made.
const ARENA_CHILD: &str = "NUMAPIN_TEST_PS_ARENA_CHILD";

/// The child: a numapin runtime with a 1 MiB buffer on the first node
/// (one 32 MiB region), held until standard input closes.
#[test]
#[ignore = "runs as the child of a_process_using_numapin_shows_its_arenas"]
fn arena_child() {
    use numapin::runtime::{Runtime, RuntimeConfig};
    use numapin::topology::{CudaMode, ProbeOptions, Topology};
    let Some(ready) = std::env::var_os(ARENA_CHILD) else {
        return;
    };
    let t = Topology::probe(&ProbeOptions::default().with_cuda(CudaMode::Off)).unwrap();
    let node = t.numa_nodes[0].os_index;
    let rt = Runtime::new(t, RuntimeConfig::default().with_region_bytes(32 << 20)).unwrap();
    let mut b = rt.alloc(numapin::Target::HostNode(node), 1 << 20).unwrap();
    b.fill(1);
    std::fs::write(ready, node.to_string()).unwrap();
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    drop(b);
}

/// A process using numapin publishes its arenas; `numapin ps --pid` shows
/// them (the region on its node, pinned) with an `ok` numapin check.
#[test]
fn a_process_using_numapin_shows_its_arenas() {
    use std::io::Write;
    let d = tempfile::tempdir().unwrap();
    let ready = d.path().join("ready");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "arena_child", "--ignored", "--test-threads=1"])
        .env(ARENA_CHILD, &ready)
        .env("LOCAL_RANK", "0")
        .env("NUMAPIN_MACHINE_BUDGET", "64MiB")
        .env("NUMAPIN_MACHINE_BUDGET_DIR", d.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let node: u64 = loop {
        if let Some(n) = std::fs::read_to_string(&ready)
            .ok()
            .and_then(|n| n.parse().ok())
        {
            break n;
        }
        if Instant::now() > deadline || child.try_wait().unwrap().is_some() {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the child never made its buffer");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let pid = child.id().to_string();
    let ps = |args: &[&str]| {
        let mut c = numapin(args);
        c.env("NUMAPIN_MACHINE_BUDGET_DIR", d.path());
        run(c)
    };
    let o = ps(&["ps", "--json", "--no-cuda", "--pid", &pid]);
    let t = ps(&["ps", "--no-cuda", "--pid", &pid]);
    let _ = child.stdin.take().unwrap().write_all(b"\n");
    let _ = child.wait();
    let r = report(&o);
    let p = &r["processes"][0];
    let runtimes = &p["numapin"]["read"]["runtimes"];
    assert_eq!(runtimes.as_array().map(Vec::len), Some(1), "{p:#}");
    let stats = runtimes[0]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node"] == node)
        .unwrap_or_else(|| panic!("node {node}: {p:#}"));
    assert_eq!(stats["regions"], 1, "{stats}");
    assert_eq!(stats["bytes_reserved"], 32 << 20, "{stats}");
    assert_eq!(stats["bytes_in_use"], 1 << 20, "{stats}");
    let nodes = &r["nodes"].as_array().unwrap();
    let row = nodes.iter().find(|n| n["node"] == node).unwrap();
    assert_eq!(row["numapin_pinned_bytes"], 32 << 20, "{row}");
    let text = String::from_utf8_lossy(&t.stdout);
    assert!(
        text.contains(&format!(
            "numapin: 1 runtime(s); node {node} 1 region(s) 32 MiB pinned, 1 MiB in use"
        )),
        "{text}"
    );
    // The machine budget: the child's region, held on its node.
    let files = r["machine_budget"].as_array().unwrap();
    assert_eq!(files.len(), 1, "{:#}", r["machine_budget"]);
    let row = files[0]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node"] == node)
        .unwrap();
    assert_eq!(row["used"], 32 << 20, "{row}");
    assert_eq!(row["limit_min"], 64 << 20, "{row}");
    assert_eq!(
        row["holders"][0]["pid"].as_u64(),
        Some(u64::from(child.id())),
        "{row}"
    );
    assert!(text.contains("machine budget of user"), "{text}");
    let line = text
        .lines()
        .find(|l| l.contains(&format!("pid {pid} (")))
        .unwrap_or_else(|| panic!("no machine budget line for {pid}: {text}"));
    assert!(
        line.starts_with(&node.to_string()) && line.contains("64 MiB") && line.contains("32 MiB"),
        "{line}"
    );
}

/// Builds the fake `libnvidia-ml.so.1` (`tests/fake_nvml/fake_nvml.c`)
/// into `dir` with the C compiler, `-DNO_V3` when `no_v3`; `None` (the
/// test skips) without a compiler.
fn fake_nvml(dir: &Path, no_v3: bool) -> Option<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake_nvml/fake_nvml.c");
    let out = dir.join(if no_v3 { "no-v3" } else { "v3" });
    std::fs::create_dir_all(&out).unwrap();
    let lib = out.join("libnvidia-ml.so.1");
    let mut cc = Command::new(std::env::var_os("CC").unwrap_or_else(|| "cc".into()));
    cc.args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&lib)
        .arg(&src);
    if no_v3 {
        cc.arg("-DNO_V3");
    }
    match cc.output() {
        Ok(o) if o.status.success() => Some(lib),
        Ok(o) => panic!("the fake NVML does not build:\n{}", text(&o)),
        Err(e) => {
            common::skip(
                common::Need::Tool,
                &format!("no C compiler to build the fake NVML ({e})"),
            );
            None
        }
    }
}

/// `numapin ps` with the fake NVML: `(bus ids, "gpu:pid:bytes" entries)`.
fn ps_with_nvml(lib: &Path, procs: &str, args: &[&str]) -> Output {
    // The DGX fixture's GPUs 0, 1 and 4, as NVML prints bus ids.
    let gpus = "00000000:18:00.0,00000000:2A:00.0,00000000:9A:00.0";
    let mut c = numapin(args);
    c.env("NUMAPIN_NVML_LIBRARY", lib)
        .env("FAKE_NVML_GPUS", gpus)
        .env("FAKE_NVML_PROCS", procs)
        .env_remove("NUMAPIN_NO_CUDA");
    run(c)
}

/// The process `pid` of a report.
fn process(r: &Value, pid: u32) -> &Value {
    r["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap_or_else(|| panic!("pid {pid} not in {r:#}"))
}

/// Four ranks and the fake NVML's entries for them: a healthy rank 1
/// (on GPU 1), rank 1 with a second context (GPUs 0 and 1), rank 4 on
/// GPU 0, and a rank-1 worker NVML does not list.
struct NvmlRanks {
    dir: tempfile::TempDir,
    _procs: Procs,
    lib: PathBuf,
    /// healthy, second, wrong, worker.
    pids: [u32; 4],
    entries: String,
    dgx: String,
}

impl NvmlRanks {
    fn start() -> Option<Self> {
        if !fits_dgx_node0() {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let lib = fake_nvml(dir.path(), false)?;
        let mut procs = Procs::new();
        let mut rank =
            |r: &str, name: &str| procs.start("true", &[("LOCAL_RANK", r)], &dir.path().join(name));
        let pids = [
            rank("1", "a"),
            rank("1", "b"),
            rank("4", "c"),
            rank("1", "d"),
        ];
        let [healthy, second, wrong, _] = pids;
        let entries = format!(
            "1:{healthy}:547356672,0:{second}:524288000,1:{second}:2147483648,0:{wrong}:734003200"
        );
        Some(Self {
            dir,
            _procs: procs,
            lib,
            pids,
            entries,
            dgx: fixture("dgx-h100.xml"),
        })
    }

    /// `numapin ps ARGS --input dgx --pid <the four>` with `lib`.
    fn ps(&self, lib: &Path, args: &[&str]) -> Output {
        let pids = self.pids.map(|p| p.to_string()).join(",");
        let mut a = args.to_vec();
        a.extend(["--input", &self.dgx, "--pid", &pids]);
        ps_with_nvml(lib, &self.entries, &a)
    }
}

/// `(attribution source, gpu verdict, gpu evidence)` of process `pid`.
fn gpu_check(r: &Value, pid: u32) -> (String, String, String) {
    let p = process(r, pid);
    let c = &p["checks"][0];
    assert_eq!(c["name"], "gpu");
    let s = |v: &Value| v.as_str().unwrap().to_string();
    (
        s(&p["attribution"]["source"]),
        s(&c["verdict"]),
        s(&c["evidence"]),
    )
}

/// Ranks judged by a fake NVML library loaded at run time (the real
/// loading, symbols and buffers): a healthy rank (ok), one with a second
/// context (warn, the memory on each GPU), one on the wrong GPU (fail), a
/// worker NVML does not list (device files, approximate, ok).
#[test]
fn ranks_judged_by_nvmls_process_lists() {
    let Some(j) = NvmlRanks::start() else { return };
    let [healthy, second, wrong, worker] = j.pids;
    let o = j.ps(&j.lib, &["ps", "--json"]);
    let r = report(&o);
    if r["nvml"]["host_pids"] == false {
        // This machine's /proc is a container's: NVML's pids cannot be
        // matched, and every process is judged by its device files.
        eprintln!("skipped NVML's verdicts: this /proc is not the host's PID namespace");
        let why = r["nvml"]["unavailable"].as_str().unwrap();
        assert!(why.contains("PID namespace other than the host's"), "{why}");
        return;
    }
    let l = &r["nvml"]["lists"];
    assert_eq!(l["driver_version"], "550.54.15", "{r:#}");
    assert_eq!(l["gpus"][1]["bus_id"], "0000:2a:00.0");
    assert_eq!(l["gpus"][1]["gpu"], 1);
    let (src, v, ev) = gpu_check(&r, healthy);
    assert_eq!((src.as_str(), v.as_str()), ("nvml", "ok"), "{ev}");
    assert!(ev.ends_with("NVML lists it on GPU 1 (522 MiB)"), "{ev}");
    let (src, v, ev) = gpu_check(&r, second);
    assert_eq!((src.as_str(), v.as_str()), ("nvml", "warn"), "{ev}");
    assert!(
        ev.contains(
            "NVML lists it on GPU 0 (500 MiB), GPU 1 (2 GiB): GPU 0 as well, not its rank's"
        ),
        "{ev}"
    );
    let (src, v, ev) = gpu_check(&r, wrong);
    assert_eq!((src.as_str(), v.as_str()), ("nvml", "fail"), "{ev}");
    assert!(
        ev.ends_with("NVML lists it on GPU 0 (700 MiB): not its rank's GPU"),
        "{ev}"
    );
    let (src, v, ev) = gpu_check(&r, worker);
    assert_eq!((src.as_str(), v.as_str()), ("device files", "ok"), "{ev}");
    assert!(
        ev.contains("NVML lists no context of it on any GPU"),
        "{ev}"
    );
    assert_eq!(o.status.code(), Some(1));
    // The text says where each process's GPUs come from.
    let t = j.ps(&j.lib, &["ps"]);
    let t = String::from_utf8_lossy(&t.stdout).into_owned();
    for line in [
        "GPUs of each process: NVML's per-GPU process lists (driver 550.54.15; 3 GPU(s); ",
        "    GPUs: NVML lists it on GPU 1 (522 MiB); device files: none open or mapped",
        "    GPUs (device files, approximate: NVML lists no context of it on any GPU",
    ] {
        assert!(t.contains(line), "{line}:\n{t}");
    }
}

/// A driver without `_v3` (read through `_v2`); an NVML that blocks
/// (given up after `--nvml-timeout`: device files); `--no-nvml`.
#[test]
fn an_older_nvml_one_that_blocks_and_none() {
    let Some(j) = NvmlRanks::start() else { return };
    let [_, second, wrong, _] = j.pids;
    let Some(old) = fake_nvml(j.dir.path(), true) else {
        return;
    };
    let r = report(&j.ps(&old, &["ps", "--json"]));
    if r["nvml"]["host_pids"] == true {
        let notes = r["nvml"]["lists"]["notes"].to_string();
        assert!(
            notes.contains("nvmlDeviceGetComputeRunningProcesses_v3 is missing from this driver's NVML: nvmlDeviceGetComputeRunningProcesses_v2 was used"),
            "{notes}"
        );
        assert_eq!(process(&r, second)["checks"][0]["verdict"], "warn");
    }
    let started = Instant::now();
    let mut c = numapin(&["ps", "--json", "--nvml-timeout", "0.5", "--input", &j.dgx]);
    c.args(["--pid", &second.to_string()])
        .env("NUMAPIN_NVML_LIBRARY", &j.lib)
        .env("FAKE_NVML_GPUS", "00000000:18:00.0")
        .env("FAKE_NVML_HANG", "1");
    let r = report(&run(c));
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    if r["nvml"]["host_pids"] == true {
        let why = r["nvml"]["unavailable"].as_str().unwrap();
        assert!(why.starts_with("NVML: no answer within 0.5 s"), "{why}");
    }
    assert_eq!(process(&r, second)["checks"][0]["verdict"], "ok");
    assert_eq!(process(&r, second)["attribution"]["source"], "device files");
    let r = report(&j.ps(&j.lib, &["ps", "--json", "--no-nvml"]));
    assert_eq!(r["nvml"]["asked"], "off");
    assert_eq!(process(&r, wrong)["checks"][0]["verdict"], "ok");
}
