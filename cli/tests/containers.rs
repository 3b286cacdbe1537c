//! The tools where users run them: under a seccomp filter that refuses the
//! NUMA system calls with `EPERM`, as Docker's default profile does in a
//! container without CAP_SYS_NICE (`tests/common/seccomp.rs`). `exec`
//! binds the CPUs with a warning (and `--strict` fails), the plans say
//! which binding applies, `doctor` names the cause and the fix, and `bench`
//! gives its host figures from regions placed by first touch.
#![allow(clippy::unwrap_used)] // tests and examples fail loudly

#[path = "../../tests/common/mod.rs"]
mod common;

use std::os::unix::process::CommandExt;
use std::process::{Command, Output};

use common::seccomp::under_filter;
use numapin::topology::{NodeKind, NumaNode};
use serde_json::Value;

fn numapin(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_numapin"));
    c.args(args).env("NUMAPIN_NO_CUDA", "1");
    c
}

fn filtered(args: &[&str]) -> Output {
    let mut c = numapin(args);
    under_filter(&mut c);
    c.output().unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Fails naming the first of `parts` that `text` lacks.
#[track_caller]
fn has_all(text: &str, parts: &[&str]) {
    for part in parts {
        assert!(text.contains(part), "{part:?} missing from: {text}");
    }
}

fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(o)))
}

/// A one-node machine whose node 0 has only the last CPU this process may
/// use (for dry runs: `--input` is never bound here).
fn one_cpu_machine() -> (tempfile::TempPath, u32) {
    let cpu = numapin::internals::thread_cpus()
        .unwrap()
        .iter()
        .last()
        .unwrap();
    let mut t = common::empty("one-cpu");
    t.numa_nodes.push(NumaNode {
        os_index: 0,
        package: None,
        cpus: numapin::CpuList::from_iter_unsorted([cpu]),
        memory_bytes: 1 << 30,
        distances: vec![],
        kind: NodeKind::Normal,
    });
    common::allow_everything(&mut t);
    (common::write_json(&t), cpu)
}

/// The last CPU this process may use, and its node on this machine. `exec`
/// applies only this machine's bindings (`--input` needs `--dry-run`): run
/// on that CPU alone ([`filtered_on`]), a binding to the node shows in
/// `Cpus_allowed_list` as that one CPU.
fn last_cpu() -> (u32, String) {
    let cpu = numapin::internals::thread_cpus()
        .unwrap()
        .iter()
        .last()
        .unwrap();
    let live = numapin::topology::Topology::probe(
        &numapin::topology::ProbeOptions::default().with_cuda(numapin::topology::CudaMode::Off),
    )
    .unwrap();
    (cpu, live.node_of_cpu(cpu).unwrap().to_string())
}

/// `numapin ARGS` on CPU `cpu` alone, under the filter.
fn filtered_on(cpu: u32, args: &[&str]) -> Output {
    let mut c = numapin(args);
    let one = numapin::CpuList::from_iter_unsorted([cpu]);
    // SAFETY: the closure runs in the forked child before exec and makes one
    // system call on a CPU set built before the fork.
    unsafe {
        c.pre_exec(move || numapin::internals::set_thread_cpus(&one));
    }
    under_filter(&mut c);
    c.output().unwrap()
}

#[test]
fn the_filter_refuses_the_numa_calls_and_shows_in_proc_status() {
    let mut c = Command::new("sh");
    c.args(["-c", "grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status"]);
    under_filter(&mut c);
    let o = c.output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("Seccomp:\t2"), "{}", text(&o));
    assert!(out.contains("NoNewPrivs:\t1"), "{}", text(&o));
}

#[test]
fn exec_binds_the_cpus_only_with_a_warning() {
    let cmd =
        "grep Cpus_allowed_list /proc/self/status; grep -c ' bind:' /proc/self/numa_maps || true";
    let (cpu, node) = last_cpu();
    let o = filtered_on(cpu, &["exec", "--node", &node, "--", "sh", "-c", cmd]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains(&format!("Cpus_allowed_list:\t{cpu}\n")),
        "bound to CPU {cpu}: {t}"
    );
    // No VMA got a bind policy: memory was not bound.
    assert!(out.lines().any(|l| l == "0"), "{t}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("numapin: warning: set_mempolicy was refused (EPERM"),
        "{t}"
    );
    assert!(err.contains("first touches it"), "{t}");

    // Unfiltered, the same command binds memory too, without a warning.
    let o = numapin(&["exec", "--node", &node, "--", "sh", "-c", cmd])
        .output()
        .unwrap();
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("warning"),
        "{t}"
    );
    assert!(
        !String::from_utf8_lossy(&o.stdout).lines().any(|l| l == "0"),
        "bind policy in numa_maps: {t}"
    );
}

#[test]
fn exec_strict_fails_before_running_anything() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let (cpu, node) = last_cpu();
    let o = filtered_on(
        cpu,
        &[
            "exec",
            "--strict",
            "--node",
            &node,
            "--",
            "touch",
            marker.to_str().unwrap(),
        ],
    );
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(!marker.exists(), "the command ran: {t}");
    let err = String::from_utf8_lossy(&o.stderr);
    has_all(
        &err,
        &[
            "numapin: error: --strict asks for the memory binding",
            "set_mempolicy was refused (EPERM",
            "fix: give the container CAP_SYS_NICE",
            "--cap-add SYS_NICE",
            "drop --strict",
        ],
    );
}

#[test]
fn plans_say_which_binding_applies() {
    let (topo, _) = one_cpu_machine();
    let dry = [
        "exec",
        "--dry-run",
        "--input",
        topo.to_str().unwrap(),
        "--node",
        "0",
        "--",
        "true",
    ];
    let v = json(&filtered(&dry));
    assert_eq!(v["memory_binding"]["applies"], "cpus_only", "{v}");
    assert!(v["memory_binding"]["reason"]
        .as_str()
        .unwrap()
        .contains("set_mempolicy was refused (EPERM"));
    let v = json(&numapin(&dry).output().unwrap());
    assert_eq!(v["memory_binding"]["applies"], "cpus_and_memory", "{v}");
    assert!(v["memory_binding"].get("reason").is_none());

    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/../topology/dgx-h100.xml");
    let plan = ["affinity", "--input", fixture, "--format", "json"];
    let v = json(&filtered(&plan));
    assert_eq!(v["memory_binding"]["applies"], "cpus_only", "{v}");
    assert_eq!(v["ranks"].as_array().unwrap().len(), 8);
    let v = json(&numapin(&plan).output().unwrap());
    assert_eq!(v["memory_binding"]["applies"], "cpus_and_memory", "{v}");
    // People reading the table are told too.
    let o = filtered(&["affinity", "--input", fixture]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("CPUs only: set_mempolicy was refused"),
        "{}",
        text(&o)
    );
}

#[test]
fn doctor_names_the_cause_and_the_fix() {
    let o = filtered(&["doctor", "--json", "--no-cuda"]);
    let t = text(&o);
    // Warnings only: numapin works through its fallbacks.
    assert_eq!(o.status.code(), Some(0), "{t}");
    let v = json(&o);
    let checks = v["checks"].as_array().unwrap();
    let one = |name: &str| {
        checks
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no {name}: {t}"))
    };
    let c = one("numa_syscalls");
    assert_eq!(c["verdict"], "warn", "{c}");
    let ev = c["evidence"].as_str().unwrap();
    has_all(
        ev,
        &[
            "mbind refused (EPERM)",
            "set_mempolicy refused (EPERM)",
            "get_mempolicy refused (EPERM)",
            "move_pages refused (EPERM)",
            "migrate_pages refused (EPERM)",
            "set_mempolicy_home_node refused (EPERM)",
            "Seccomp: 2",
            "first touch",
            "numa_maps",
        ],
    );
    let fix = c["fix"].as_str().unwrap();
    has_all(
        fix,
        &[
            "seccomp profile",
            "--cap-add SYS_NICE",
            "securityContext",
            "move_pages",
        ],
    );
    // The policy is still read, from numa_maps.
    let p = one("memory_policy");
    assert_eq!(p["verdict"], "ok", "{p}");
    assert!(p["evidence"]
        .as_str()
        .unwrap()
        .contains("read from /proc/self/numa_maps: get_mempolicy is refused (EPERM)"));
    assert!(one("container")["evidence"].as_str().is_some());
    assert!(one("cgroup_memory")["evidence"].as_str().is_some());
    // The pin probe places by first touch and verifies through numa_maps.
    let probe = checks
        .iter()
        .find(|c| c["name"] == "pin_probe" && c["node"] == 0)
        .unwrap_or_else(|| panic!("no pin probe of node 0: {t}"));
    assert_eq!(probe["verdict"], "ok", "{probe}");
    let ev = probe["evidence"].as_str().unwrap();
    has_all(
        ev,
        &[
            "placed by first touch",
            "mbind refused (EPERM)",
            "numa_maps: all 512 pages on node 0",
        ],
    );
}

#[test]
fn bench_gives_its_host_figures_from_first_touch_regions() {
    let o = filtered(&[
        "bench",
        "--json",
        "--no-cuda",
        "--only",
        "arena",
        "--reps",
        "2",
    ]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    let v = json(&o);
    let results = v["results"].as_array().unwrap();
    let region = results
        .iter()
        .find(|r| r["name"] == "region_create_per_gib")
        .unwrap_or_else(|| panic!("no region figure: {t}"));
    assert_eq!(region["placed"], "first_touch", "{region}");
    assert_eq!(region["verified"], "numa_maps", "{region}");
    assert!(region["median"].as_f64().unwrap() > 0.0, "{region}");
    for r in results.iter().filter(|r| r["name"] == "arena_alloc_free") {
        assert_eq!(r["placed"], "first_touch", "{r}");
        assert!(r["median"].as_f64().unwrap() > 0.0, "{r}");
    }
    // Unfiltered, the same figures name mbind and move_pages.
    let o = numapin(&[
        "bench",
        "--json",
        "--no-cuda",
        "--only",
        "arena",
        "--reps",
        "1",
    ])
    .output()
    .unwrap();
    let v = json(&o);
    let r = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "region_create_per_gib")
        .cloned()
        .unwrap();
    assert_eq!(
        (&r["placed"], &r["verified"]),
        (&Value::from("mbind"), &Value::from("move_pages")),
        "{r}"
    );
}
