//! `numapin doctor` as an operator runs it: on this machine, as an
//! unprivileged user, on saved machines, and with bad usage.
#![allow(clippy::unwrap_used)] // tests and examples fail loudly

#[path = "../../tests/common/mod.rs"]
mod common;

use std::os::unix::process::CommandExt;
use std::process::{Command, Output};

use common::{write_json, Shape};
use numapin::topology::PcieLink;
use serde_json::Value;

/// Every check name a report on this machine contains: the stable names
/// docs/doctor.md lists, in report order.
const NAMES: &[&str] = &[
    "memlock",
    "cgroup_memory",
    "cuda_driver",
    "gpu_visible",
    "pcie_link",
    "gpu_locality",
    "gpu_cpus_allowed",
    "gpu_memory_allowed",
    "nic_locality",
    "nic_pcie_link",
    "memory_policy",
    "numa_syscalls",
    "container",
    "transparent_hugepages",
    "huge_pages",
    "numa_balancing",
    "iommu",
    "storage_locality",
    "pin_probe",
];

/// The checks that read this machine's live state, not run for a saved
/// machine (docs/doctor.md).
const LIVE_CHECKS: &[&str] = &[
    "memlock",
    "cgroup_memory",
    "cuda_driver",
    "memory_policy",
    "numa_syscalls",
    "container",
    "transparent_hugepages",
    "huge_pages",
    "numa_balancing",
    "iommu",
    "storage_locality",
    "pin_probe",
];

fn numapin(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_numapin"));
    c.args(args)
        .env_remove("CUDA_VISIBLE_DEVICES")
        .env_remove("CUDA_DEVICE_ORDER");
    c
}

fn run(mut c: Command) -> Output {
    c.output().expect("numapin runs")
}

fn fixture(name: &str) -> String {
    format!("{}/../topology/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Parses `doctor --json` output and checks its documented shape; returns
/// the checks.
fn report(o: &Output) -> (Value, Vec<Value>) {
    let v: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", text(o)));
    let checks = v["checks"].as_array().expect("checks is an array").clone();
    assert!(!checks.is_empty());
    for c in &checks {
        let obj = c.as_object().unwrap();
        for key in ["name", "verdict", "evidence", "fix", "gpu", "node"] {
            assert!(obj.contains_key(key), "{key} missing from {c}");
        }
        assert!(c["name"].is_string(), "{c}");
        let verdict = c["verdict"].as_str().unwrap();
        assert!(["ok", "warn", "fail"].contains(&verdict), "{c}");
        assert!(!c["evidence"].as_str().unwrap().is_empty(), "{c}");
        // A warning or failure says what to do; a pass has nothing to do.
        if verdict == "ok" {
            assert!(c["fix"].is_null(), "{c}");
        } else {
            assert!(!c["fix"].as_str().unwrap().is_empty(), "{c}");
        }
        assert!(c["gpu"].is_null() || c["gpu"].is_u64(), "{c}");
        assert!(c["node"].is_null() || c["node"].is_u64(), "{c}");
    }
    let count = |v: &str| checks.iter().filter(|c| c["verdict"] == v).count();
    assert_eq!(v["summary"]["ok"], count("ok"));
    assert_eq!(v["summary"]["warn"], count("warn"));
    assert_eq!(v["summary"]["fail"], count("fail"));
    let code = i32::from(count("fail") > 0);
    assert_eq!(v["summary"]["exit_code"], code);
    assert_eq!(o.status.code(), Some(code), "{}", text(o));
    (v, checks)
}

fn named<'a>(checks: &'a [Value], name: &str) -> Vec<&'a Value> {
    checks.iter().filter(|c| c["name"] == name).collect()
}

fn one<'a>(checks: &'a [Value], name: &str) -> &'a Value {
    let v = named(checks, name);
    assert_eq!(v.len(), 1, "{name}: {v:?}");
    v[0]
}

/// The nodes of this machine that have memory.
fn memory_nodes() -> Vec<u64> {
    let t = numapin::Topology::probe(
        &numapin::topology::ProbeOptions::default().with_cuda(numapin::topology::CudaMode::Off),
    )
    .unwrap();
    t.numa_nodes
        .iter()
        .filter(|n| n.memory_bytes > 0)
        .map(|n| u64::from(n.os_index))
        .collect()
}

#[test]
fn every_check_runs_and_gives_evidence() {
    let o = run(numapin(&["doctor", "--json"]));
    let (v, checks) = report(&o);
    assert_eq!(v["source"], "live");
    assert_eq!(v["not_run"], Value::Array(vec![]));
    for name in NAMES {
        assert!(!named(&checks, name).is_empty(), "no {name} check");
    }
    let cuda = one(&checks, "cuda_driver");
    if !numapin::gpu::available() {
        let ev = cuda["evidence"].as_str().unwrap();
        assert!(ev.contains("no CUDA driver"), "{ev}");
        let gpus = named(&checks, "gpu_visible");
        if gpus.len() == 1 && gpus[0]["gpu"].is_null() {
            // No GPU: the GPU checks say so instead of passing silently.
            for name in [
                "gpu_visible",
                "pcie_link",
                "gpu_locality",
                "gpu_cpus_allowed",
            ] {
                let c = one(&checks, name);
                assert!(
                    c["evidence"].as_str().unwrap().contains("no GPUs found"),
                    "{c}"
                );
            }
            assert_eq!(cuda["verdict"], "ok", "no NVIDIA GPU, no driver needed");
        }
    }
    // The pin probe passes on every node with memory, each page read back there.
    let probes = named(&checks, "pin_probe");
    let nodes = memory_nodes();
    for n in &nodes {
        let p = probes
            .iter()
            .find(|p| p["node"] == *n)
            .unwrap_or_else(|| panic!("no probe of node {n}: {probes:?}"));
        assert_eq!(p["verdict"], "ok", "{p}");
        let ev = p["evidence"].as_str().unwrap();
        assert!(ev.contains(&format!("all 512 pages on node {n}")), "{ev}");
    }
    if nix::unistd::geteuid().is_root() {
        assert_eq!(
            one(&checks, "memlock")["verdict"],
            "ok",
            "root has CAP_IPC_LOCK"
        );
    }
}

#[test]
fn text_report_puts_the_verdict_first() {
    let o = run(numapin(&["doctor", "--no-pin-probe"]));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.starts_with("numapin doctor: this machine\n"), "{out}");
    let lines: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("ok ") || l.starts_with("WARN ") || l.starts_with("FAIL "))
        .collect();
    for name in NAMES.iter().filter(|n| **n != "pin_probe") {
        assert!(
            lines
                .iter()
                .any(|l| l.split_whitespace().nth(1) == Some(name)),
            "no line for {name}:\n{out}"
        );
    }
    assert!(out.contains("not run: pin_probe (--no-pin-probe)"), "{out}");
    assert!(!out.contains("pin_probe (node"), "{out}");
    assert!(out.contains(" checks: "), "{out}");
}

/// The huge pages section: the THP mode and each node's pools, in JSON and
/// in text; a pool reserved on a node (as root) shows up with its pages,
/// and the check says regions there cannot take it yet (too few pages for
/// one default region). A saved machine has no such section.
#[test]
fn huge_pages_section_shows_each_nodes_pools() {
    let check = |pool: Option<&common::HugePool>| {
        let (v, checks) = report(&run(numapin(&["doctor", "--json", "--no-pin-probe"])));
        let h = &v["huge_pages"];
        assert!(
            h["thp_enabled"].is_string() || h["thp_enabled"].is_null(),
            "{h}"
        );
        assert!(h["madv_populate_write"].is_boolean(), "{h}");
        assert!(h["error"].is_null(), "{h}");
        let pools = h["pools"].as_array().unwrap();
        for n in memory_nodes() {
            let row = pools
                .iter()
                .find(|r| r["node"] == n && r["page_bytes"] == 2u64 << 20)
                .unwrap_or_else(|| panic!("no 2 MiB pool row for node {n}: {h}"));
            for k in ["total", "free", "surplus"] {
                assert!(row[k].is_u64(), "{row}");
            }
            if let Some(p) = pool.filter(|p| u64::from(p.node) == n) {
                assert!(row["free"].as_u64().unwrap() >= p.free().min(4), "{row}");
                assert!(row["total"].as_u64().unwrap() >= 4, "{row}");
            }
        }
        let c = one(&checks, "huge_pages");
        let ev = c["evidence"].as_str().unwrap();
        if let Some(p) = pool {
            if p.free() < 128 {
                assert_eq!(c["verdict"], "warn", "{c}");
                assert!(ev.contains("fewer than 128 free 2 MiB pages"), "{ev}");
                assert!(c["fix"].as_str().unwrap().contains("nr_hugepages"), "{c}");
            }
        }
        let o = run(numapin(&["doctor", "--no-pin-probe"]));
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(out.contains("\nhuge pages: THP enabled "), "{out}");
        assert!(
            out.contains("  NODE  PAGE   TOTAL  FREE  SURPLUS\n"),
            "{out}"
        );
        out.into_owned()
    };
    check(None);
    let node = u32::try_from(memory_nodes()[0]).unwrap();
    match common::HugePool::reserve(node, 2 << 20, 4) {
        Err(why) => eprintln!("skipped the part with a pool: {why}"),
        Ok(p) => {
            let out = check(Some(&p));
            let row = out
                .lines()
                .find(|l| {
                    l.split_whitespace().take(3).collect::<Vec<_>>()
                        == [node.to_string().as_str(), "2", "MiB"]
                })
                .unwrap_or_else(|| panic!("no row for node {node}:\n{out}"));
            let total: u64 = row.split_whitespace().nth(3).unwrap().parse().unwrap();
            assert!(total >= 4, "{row}");
        }
    }
    // A saved machine: the section describes this machine, so it is absent.
    let f = fixture("dgx-h100.xml");
    let (v, _) = report(&run(numapin(&["doctor", "--json", "--input", &f])));
    assert!(v["huge_pages"].is_null(), "{v}");
    let out = run(numapin(&["doctor", "--input", &f]));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("huge pages:"));
}

#[test]
fn no_pin_probe_is_listed_as_not_run() {
    let (v, checks) = report(&run(numapin(&["doctor", "--json", "--no-pin-probe"])));
    assert!(named(&checks, "pin_probe").is_empty());
    assert_eq!(v["not_run"][0]["name"], "pin_probe");
}

/// As user `nobody` with an 8 MiB memlock limit (what ordinary users get):
/// the memlock check fails with the commands that raise the limit, the exit
/// code is 1, and the pin probe (one 2 MiB region at a time) still passes.
#[test]
fn unprivileged_user_below_the_memlock_need_fails_with_the_fix() {
    if !nix::unistd::geteuid().is_root() {
        common::skip(
            common::Need::Root,
            "needs root to run numapin as user nobody",
        );
        return;
    }
    let (_dir, exe) =
        common::runnable_by_everyone(std::path::Path::new(env!("CARGO_BIN_EXE_numapin")));
    let as_nobody = |args: &[&str]| {
        let mut c = Command::new(&exe);
        c.args(args)
            .env_remove("CUDA_VISIBLE_DEVICES")
            .env_remove("CUDA_DEVICE_ORDER")
            .current_dir("/")
            .env("HOME", "/");
        // SAFETY: only system calls (setrlimit, setgroups, setgid, setuid)
        // run between fork and exec.
        unsafe {
            c.pre_exec(common::as_nobody(8 << 20));
        }
        run(c)
    };
    let o = as_nobody(&["doctor", "--json"]);
    let (_, checks) = report(&o);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let m = one(&checks, "memlock");
    assert_eq!(m["verdict"], "fail", "{m}");
    let ev = m["evidence"].as_str().unwrap();
    assert!(
        ev.contains("RLIMIT_MEMLOCK soft 8 MiB, hard 8 MiB; no CAP_IPC_LOCK; numapin needs"),
        "{ev}"
    );
    let fix = m["fix"].as_str().unwrap();
    for want in ["ulimit -l", "LimitMEMLOCK=", "--ulimit memlock="] {
        assert!(fix.contains(want), "{want} missing from the fix: {fix}");
    }
    // The probe region is one 2 MiB huge page: it fits in 8 MiB.
    for p in named(&checks, "pin_probe") {
        assert_eq!(p["verdict"], "ok", "{p}");
    }
    // Only the memlock check fails.
    let failing: Vec<_> = checks.iter().filter(|c| c["verdict"] == "fail").collect();
    assert_eq!(failing.len(), 1, "{failing:?}");

    let o = as_nobody(&["doctor", "--no-pin-probe"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.lines().any(|l| l.starts_with("FAIL  memlock ")),
        "{out}"
    );
    assert!(out.contains("fix: raise the memlock limit"), "{out}");
}

#[test]
fn a_vm_without_gpu_locality_gets_the_locality_warning() {
    let f = fixture("cloud-vm-2n-nolocality.xml");
    let (v, checks) = report(&run(numapin(&["doctor", "--json", "--input", &f])));
    assert_eq!(v["source"], f.as_str());
    let loc = named(&checks, "gpu_locality");
    assert_eq!(loc.len(), 4, "{loc:?}");
    for (i, c) in loc.iter().enumerate() {
        assert_eq!(c["verdict"], "warn", "{c}");
        assert_eq!(c["gpu"], i);
        assert!(c["evidence"]
            .as_str()
            .unwrap()
            .contains("NUMA node unknown on a machine with 2 nodes"));
        assert!(c["fix"].as_str().unwrap().contains("SRAT"));
    }
    // Live checks describe this machine, not the file's: not run.
    let not_run: Vec<&str> = v["not_run"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap())
        .collect();
    assert_eq!(not_run, LIVE_CHECKS);
    for name in LIVE_CHECKS {
        assert!(
            named(&checks, name).is_empty(),
            "{name} ran on a saved machine"
        );
    }
    let text_out = run(numapin(&["doctor", "--input", &f]));
    let out = String::from_utf8_lossy(&text_out.stdout);
    assert!(out.contains("WARN  gpu_locality (GPU 0)"), "{out}");
    assert!(out.contains("a saved machine"), "{out}");
    assert!(
        out.contains("not run: memlock, cgroup_memory, cuda_driver"),
        "{out}"
    );
}

#[test]
fn every_fixture_gives_a_report() {
    // Each fixture with the checks that are not `ok` (name, GPU): only the
    // PCIe server, whose one InfiniBand HCA sits on socket 1, warns for
    // socket 0's GPUs.
    let sys_nic: Vec<(String, Option<u64>)> = (0..4)
        .map(|g| ("nic_locality".to_string(), Some(g)))
        .collect();
    for (f, want) in [
        ("cloud-vm-1n.xml", vec![]),
        ("dgx-a100-nps4.xml", vec![]),
        ("dgx-h100.xml", vec![]),
        ("grace-hopper.xml", vec![]),
        ("memoryless-node-2s.xml", vec![]),
        ("pcie-switch-2s.xml", sys_nic),
    ] {
        let o = run(numapin(&["doctor", "--json", "--input", &fixture(f)]));
        let (_, checks) = report(&o);
        assert_eq!(o.status.code(), Some(0), "{f}: {}", text(&o));
        let not_ok: Vec<(String, Option<u64>)> = checks
            .iter()
            .filter(|c| c["verdict"] != "ok")
            .map(|c| (c["name"].as_str().unwrap().to_string(), c["gpu"].as_u64()))
            .collect();
        assert_eq!(not_ok, want, "{f}: {checks:?}");
        assert!(checks.iter().all(|c| c["verdict"] != "fail"), "{f}");
    }
}

/// A VM that gives no locality: every GPU's NIC is SYS, and the fix speaks
/// of the topology file the cloud provides; NIC links below their maximum
/// warn.
#[test]
fn nic_checks_on_saved_machines() {
    let f = fixture("cloud-vm-ndv4-nolocality.xml");
    let (_, checks) = report(&run(numapin(&["doctor", "--json", "--input", &f])));
    let nic = named(&checks, "nic_locality");
    assert_eq!(nic.len(), 8);
    for c in &nic {
        assert_eq!(c["verdict"], "warn", "{c}");
        assert!(c["evidence"].as_str().unwrap().contains("SYS"), "{c}");
        assert!(c["fix"].as_str().unwrap().contains("NCCL_TOPO_FILE"), "{c}");
    }
    // A saved machine with a NIC whose link trained at x8.
    let mut t = numapin::Topology::load(
        std::path::Path::new(&fixture("dgx-h100.xml")),
        &Default::default(),
    )
    .unwrap();
    for n in &mut t.nics {
        n.pcie = Some(PcieLink {
            current_gen: Some(5),
            current_width: Some(16),
            max_gen: Some(5),
            max_width: Some(16),
            speed_gbps: None,
        });
    }
    t.nics[5].pcie.as_mut().unwrap().current_width = Some(8);
    let path = write_json(&t);
    let o = run(numapin(&[
        "doctor",
        "--json",
        "--input",
        path.to_str().unwrap(),
    ]));
    let (_, checks) = report(&o);
    let links: Vec<&str> = named(&checks, "nic_pcie_link")
        .iter()
        .map(|c| c["verdict"].as_str().unwrap())
        .collect();
    assert_eq!(links.len(), 12);
    assert_eq!(links.iter().filter(|v| **v == "warn").count(), 1);
    let slow = *named(&checks, "nic_pcie_link")
        .iter()
        .find(|c| c["verdict"] == "warn")
        .unwrap();
    assert_eq!(slow["nic"], 5);
    assert!(
        slow["evidence"].as_str().unwrap().contains("mlx5_3"),
        "{slow}"
    );
    assert_eq!(o.status.code(), Some(0), "a warning, not a failure");
    let o = run(numapin(&["doctor", "--input", path.to_str().unwrap()]));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("WARN  nic_pcie_link (NIC 5)"),
        "{}",
        text(&o)
    );
}

/// A saved machine whose topology is wrong fails, and the exit code says so.
#[test]
fn narrow_links_and_excluded_cpus_fail_a_saved_machine() {
    let mut t = Shape::new(2, 1, 2, 1, 4).build();
    let link = |cw: u8, cg: u8| {
        Some(PcieLink {
            current_gen: Some(cg),
            current_width: Some(cw),
            max_gen: Some(5),
            max_width: Some(16),
            speed_gbps: None,
        })
    };
    t.gpus[0].pcie = link(16, 5);
    t.gpus[1].pcie = link(16, 1); // idle
    t.gpus[2].pcie = link(8, 5); // half the lanes
    t.gpus[3].pcie = link(16, 5);
    // A cpuset that keeps only socket 0's CPUs.
    t.allowed.cpus = t.numa_nodes[0].cpus.clone();
    let path = write_json(&t);
    let p = path.to_str().unwrap();
    let (_, checks) = report(&run(numapin(&["doctor", "--json", "--input", p])));
    let verdicts = |name: &str| -> Vec<String> {
        named(&checks, name)
            .iter()
            .map(|c| c["verdict"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(verdicts("pcie_link"), ["ok", "warn", "fail", "ok"]);
    assert_eq!(verdicts("gpu_cpus_allowed"), ["ok", "ok", "fail", "fail"]);
    assert_eq!(verdicts("gpu_locality"), ["ok", "ok", "ok", "ok"]);
    let o = run(numapin(&["doctor", "--input", p]));
    assert_eq!(o.status.code(), Some(1));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("FAIL  pcie_link (GPU 2)"), "{out}");
    assert!(out.contains("3 fail"), "{out}");
}

#[test]
fn usage_and_input_errors_exit_2() {
    let o = run(numapin(&["doctor", "--bogus"]));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let o = run(numapin(&["doctor", "--input", "/nonexistent/machine.xml"]));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("/nonexistent/machine.xml"), "{err}");
    assert!(err.contains("fix:"), "{err}");
    assert!(o.stdout.is_empty());
}

/// On a GPU machine: the driver loads, CUDA sees every NVIDIA GPU, and the
/// pin probe registers each region with CUDA.
#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on a GPU machine"]
fn on_a_gpu_machine_the_driver_and_every_gpu_check_out() {
    if !numapin::gpu::available() {
        common::skip(common::Need::Gpu, "no CUDA driver on this machine");
        return;
    }
    let o = run(numapin(&["doctor", "--json"]));
    eprintln!("{}", String::from_utf8_lossy(&o.stdout));
    let (_, checks) = report(&o);
    let cuda = one(&checks, "cuda_driver");
    assert_eq!(cuda["verdict"], "ok", "{cuda}");
    assert!(cuda["evidence"].as_str().unwrap().contains("loaded"));
    let gpus: Vec<_> = named(&checks, "gpu_visible")
        .into_iter()
        .filter(|c| !c["gpu"].is_null())
        .collect();
    assert!(
        !gpus.is_empty(),
        "no GPU found on a machine with a CUDA driver"
    );
    for g in gpus {
        assert_eq!(g["verdict"], "ok", "{g}");
        assert!(
            g["evidence"].as_str().unwrap().contains("CUDA ordinal"),
            "{g}"
        );
    }
    for p in named(&checks, "pin_probe") {
        let ev = p["evidence"].as_str().unwrap();
        if !ev.contains("skipped") {
            assert_eq!(p["verdict"], "ok", "{p}");
            assert!(
                ev.contains("registered with CUDA") && !ev.contains("not registered"),
                "{ev}"
            );
        }
    }
}
