//! `numapin topo` as a person runs it: exit codes, messages, output forms,
//! and the live probe checked against the kernel's own files.
#![allow(clippy::unwrap_used)] // tests and examples fail loudly

#[path = "../../tests/common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::process::{Command, Output};

use numapin::topology::{ProbeOptions, Topology};
use numapin::CpuList;

/// Keeps the timing test and the many-thread test apart (both use the
/// process-wide hwloc lock).
static TIMING: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn numapin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_numapin"));
    c.env_remove("CUDA_VISIBLE_DEVICES")
        .env_remove("CUDA_DEVICE_ORDER");
    c
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../topology")
        .join(name)
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn live_probe_matches_sysfs_and_affinity() {
    let t = Topology::probe(
        &numapin::topology::ProbeOptions::default().with_cuda(numapin::topology::CudaMode::Off),
    )
    .unwrap();
    let mut sysfs_nodes = Vec::new();
    for e in std::fs::read_dir("/sys/devices/system/node").unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        if let Some(n) = name
            .strip_prefix("node")
            .and_then(|n| n.parse::<u32>().ok())
        {
            let cpus = std::fs::read_to_string(format!("/sys/devices/system/node/node{n}/cpulist"))
                .unwrap();
            sysfs_nodes.push((n, CpuList::parse(&cpus).unwrap()));
        }
    }
    sysfs_nodes.sort();
    let ours: Vec<(u32, CpuList)> = t
        .numa_nodes
        .iter()
        .map(|n| (n.os_index, n.cpus.clone()))
        .collect();
    assert_eq!(
        ours, sysfs_nodes,
        "node CPUs differ from /sys/devices/system/node/node*/cpulist"
    );
    assert_eq!(t.allowed.cpus, numapin::internals::thread_cpus().unwrap());
    for n in &t.numa_nodes {
        assert!(n.memory_bytes > 0, "node {} memory", n.os_index);
    }
}

#[test]
fn json_is_the_documented_schema() {
    let o = numapin()
        .args(["topo", "--json", "--no-cuda"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{:?}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["schema_version"], 1);
    assert_eq!(v["source"], "live");
    for key in ["packages", "numa_nodes", "gpus", "warnings"] {
        assert!(v[key].is_array(), "{key}");
    }
    assert!(v["allowed"]["cpus"].is_string());
    assert!(v["numa_nodes"][0]["distances"].is_array());
    CpuList::parse(v["allowed"]["cpus"].as_str().unwrap()).unwrap();
}

#[test]
fn taskset_restriction_shows_in_allowed_cpus() {
    if Command::new("taskset").arg("--version").output().is_err() {
        common::skip(common::Need::Tool, "taskset is not installed");
        return;
    }
    let o = Command::new("taskset")
        .args([
            "-c",
            "0",
            env!("CARGO_BIN_EXE_numapin"),
            "topo",
            "--json",
            "--no-cuda",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{:?}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["allowed"]["cpus"], "0");
}

#[test]
fn table_shows_gpus_nodes_and_warnings() {
    let o = numapin()
        .args(["topo", "--input"])
        .arg(fixture("cloud-vm-2n-nolocality.xml"))
        .output()
        .unwrap();
    let (out, _) = text(&o);
    assert!(o.status.success());
    assert!(out.contains("0001:00:00.0"), "{out}");
    assert!(out.contains("unknown"), "{out}");
    assert!(out.contains("Warnings:"), "{out}");
    let o = numapin()
        .args(["topo", "--input"])
        .arg(fixture("dgx-a100-nps4.xml"))
        .output()
        .unwrap();
    let (out, _) = text(&o);
    assert!(
        out.lines()
            .any(|l| l.starts_with("0    0     0000:07:00.0") && l.contains("48-63,176-191")),
        "{out}"
    );
}

#[test]
fn bad_inputs_exit_2_with_a_message_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(PathBuf, &str)> = vec![
        (dir.path().join("missing.xml"), "cannot read it"),
        (
            {
                let p = dir.path().join("truncated.xml");
                let full = std::fs::read_to_string(fixture("dgx-h100.xml")).unwrap();
                std::fs::write(&p, &full[..full.len() / 3]).unwrap();
                p
            },
            "hwloc",
        ),
        (
            {
                let p = dir.path().join("hostile.xml");
                let full = std::fs::read_to_string(fixture("grace-hopper.xml")).unwrap();
                // Two nodes with the same number: hwloc asserts on this.
                std::fs::write(
                    &p,
                    full.replace("os_index=\"1\" subtype", "os_index=\"0\" subtype"),
                )
                .unwrap();
                p
            },
            "malformed",
        ),
        (
            {
                let p = dir.path().join("bad.json");
                std::fs::write(&p, "{\"schema_version\": 1, \"gpus\": 3}").unwrap();
                p
            },
            "numapin topology JSON",
        ),
        (
            {
                let p = dir.path().join("bad-nccl.xml");
                std::fs::write(&p, "<system><cpu numaid=\"0\" affinity=\"0xzz\"/></system>")
                    .unwrap();
                p
            },
            "affinity",
        ),
        (
            {
                let p = dir.path().join("binary.bin");
                std::fs::write(&p, [0u8, 159, 146, 150, 1, 2, 3]).unwrap();
                p
            },
            "not",
        ),
    ];
    for (path, needle) in cases {
        let o = numapin()
            .args(["topo", "--input"])
            .arg(&path)
            .output()
            .unwrap();
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(2), "{}: {err}", path.display());
        assert!(
            err.contains(path.file_name().unwrap().to_str().unwrap()),
            "{}: names the file: {err}",
            path.display()
        );
        assert!(
            err.contains(needle),
            "{}: expected {needle:?} in {err}",
            path.display()
        );
        assert!(err.contains("fix:"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn bad_environment_exits_2_naming_the_variable() {
    let o = numapin()
        .args(["topo", "--no-cuda", "--input"])
        .arg(fixture("dgx-h100.xml"))
        .env("CUDA_VISIBLE_DEVICES", "0,zero")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).1.contains("CUDA_VISIBLE_DEVICES"));
    let o = numapin()
        .args(["topo", "--no-cuda"])
        .env("CUDA_DEVICE_ORDER", "RANDOM")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).1.contains("CUDA_DEVICE_ORDER"));
}

#[test]
fn bad_usage_exits_2() {
    let o = numapin()
        .args(["topo", "--accelerator-pci-id", "nvidia"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let o = numapin()
        .args(["topo", "--export", "/tmp/x.xml", "--input"])
        .arg(fixture("dgx-h100.xml"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn export_writes_xml_that_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let xml = dir.path().join("this.xml");
    let o = numapin()
        .args(["topo", "--no-cuda", "--export"])
        .arg(&xml)
        .output()
        .unwrap();
    assert!(o.status.success(), "{:?}", text(&o));
    let live = Topology::probe(
        &numapin::topology::ProbeOptions::default().with_cuda(numapin::topology::CudaMode::Off),
    )
    .unwrap();
    let back = Topology::load(&xml, &ProbeOptions::default()).unwrap();
    assert_eq!(
        back.numa_nodes.iter().map(|n| &n.cpus).collect::<Vec<_>>(),
        live.numa_nodes.iter().map(|n| &n.cpus).collect::<Vec<_>>()
    );
    assert_eq!(back.gpus.len(), live.gpus.len());
}

#[test]
fn probe_is_fast_without_cuda() {
    let _quiet = TIMING.lock().unwrap_or_else(|p| p.into_inner());
    // hwloc discovery without CUDA: under 100 ms on this machine (median of 5).
    let mut times = Vec::new();
    for _ in 0..5 {
        let t0 = std::time::Instant::now();
        Topology::probe(
            &numapin::topology::ProbeOptions::default().with_cuda(numapin::topology::CudaMode::Off),
        )
        .unwrap();
        times.push(t0.elapsed());
    }
    times.sort();
    let median = times[2];
    eprintln!("live probe without CUDA: median {median:?} of 5");
    assert!(
        median < std::time::Duration::from_millis(if cfg!(debug_assertions) { 400 } else { 100 }),
        "{median:?}"
    );
}

#[test]
fn file_reads_and_live_probes_mix_across_threads() {
    let _quiet = TIMING.lock().unwrap_or_else(|p| p.into_inner());
    // A file read forks a child; a live probe in another thread must never
    // leave hwloc's own mutex locked in that child (it would hang until the
    // reader's deadline and fail).
    let t0 = std::time::Instant::now();
    std::thread::scope(|s| {
        for k in 0..4 {
            s.spawn(move || {
                for i in 0..12 {
                    if (i + k) % 2 == 0 {
                        Topology::probe(
                            &numapin::topology::ProbeOptions::default()
                                .with_cuda(numapin::topology::CudaMode::Off),
                        )
                        .unwrap();
                    } else {
                        Topology::load(&fixture("dgx-h100.xml"), &ProbeOptions::default()).unwrap();
                    }
                }
            });
        }
    });
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(60),
        "{:?}",
        t0.elapsed()
    );
}
