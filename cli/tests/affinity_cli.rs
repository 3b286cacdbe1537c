//! `numapin affinity` and `numapin exec` as a person or a launcher runs them.
#![allow(clippy::unwrap_used)] // tests and examples fail loudly

#[path = "../../tests/common/mod.rs"]
mod common;

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, Output};

use common::{add_gpu, add_nic, cpus, write_json, Shape};
use numapin::affinity::{plan, plan_node, Mode, PlanOptions};
use numapin::topology::{CudaMode, DeviceKind, ProbeOptions, Relation, Topology, VisibleEntry};
use numapin::CpuList;
use serde_json::Value;

const LAUNCHER_VARS: [&str; 5] = [
    "LOCAL_RANK",
    "SLURM_LOCALID",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "MV2_COMM_WORLD_LOCAL_RANK",
    "PMI_LOCAL_RANK",
];

/// `numapin ARGS` with no launcher or CUDA variables inherited.
fn numapin(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_numapin"));
    c.args(args);
    for v in LAUNCHER_VARS.iter().chain(&[
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "OMP_NUM_THREADS",
    ]) {
        c.env_remove(v);
    }
    c
}

fn out(mut c: Command) -> Output {
    c.output().expect("numapin runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn status_field(text: &str, name: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':')))
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

/// `numapin exec --no-cuda --node NODE [EXTRA...] -- CMD...`.
fn exec_node(node: u32, extra: &[&str], cmd: &[&str]) -> Command {
    let node = node.to_string();
    let mut args = vec!["exec", "--no-cuda", "--node", &node];
    args.extend_from_slice(extra);
    args.push("--");
    args.extend_from_slice(cmd);
    numapin(&args)
}

fn live() -> Topology {
    Topology::probe(&ProbeOptions::default().with_cuda(CudaMode::Off)).unwrap()
}

/// The first node of this machine that has CPUs this process may use.
fn first_node(t: &Topology) -> u32 {
    t.numa_nodes
        .iter()
        .find(|n| !n.cpus.intersection(&t.allowed.cpus).is_empty())
        .unwrap()
        .os_index
}

// ---- exec on this machine.

#[test]
fn exec_node_binds_cpus_as_planned() {
    let t = live();
    let node = first_node(&t);
    let expected = plan_node(&t, node).unwrap().cpus;
    let o = out({
        let mut c = exec_node(node, &[], &["cat", "/proc/self/status"]);
        c.env("LOCAL_RANK", "0");
        c
    });
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        CpuList::parse(&status_field(&stdout(&o), "Cpus_allowed_list")).unwrap(),
        expected
    );
    assert!(!status_field(&stdout(&o), "Mems_allowed_list").is_empty());
}

#[test]
fn exec_node_respects_a_narrower_starting_set() {
    // Started on one CPU (as under taskset), the plan keeps to it.
    let t = live();
    let node = first_node(&t);
    let last = t
        .node(node)
        .unwrap()
        .cpus
        .intersection(&t.allowed.cpus)
        .iter()
        .last()
        .unwrap();
    let mut c = exec_node(node, &[], &["cat", "/proc/self/status"]);
    let one = CpuList::from_iter_unsorted([last]);
    // SAFETY: between fork and exec the child only calls sched_setaffinity,
    // which is async-signal-safe, on its own pid.
    unsafe {
        c.pre_exec(move || numapin::internals::set_thread_cpus(&one));
    }
    let o = out(c);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        status_field(&stdout(&o), "Cpus_allowed_list"),
        last.to_string()
    );
}

#[test]
fn exec_sets_the_memory_policy() {
    let t = live();
    let node = first_node(&t);
    // numa_maps lists each mapping with the policy it was made under.
    let o = out(exec_node(node, &[], &["cat", "/proc/self/numa_maps"]));
    assert!(o.status.success(), "{}", stderr(&o));
    let maps = stdout(&o);
    assert!(
        maps.lines()
            .all(|l| l.split_whitespace().nth(1) == Some(&format!("bind:{node}"))),
        "{maps}"
    );
    let o = out(exec_node(
        node,
        &["--preferred"],
        &["cat", "/proc/self/numa_maps"],
    ));
    assert!(
        stdout(&o)
            .lines()
            .all(|l| l.split_whitespace().nth(1) == Some(&format!("prefer:{node}"))),
        "{}",
        stdout(&o)
    );
    // Without numapin the policy is the default.
    let o = out({
        let mut c = Command::new("cat");
        c.arg("/proc/self/numa_maps");
        c
    });
    assert!(
        stdout(&o)
            .lines()
            .any(|l| l.split_whitespace().nth(1) == Some("default")),
        "{}",
        stdout(&o)
    );
}

#[test]
fn exec_passes_exit_codes_and_signals_through() {
    let node = first_node(&live());
    let o = out(exec_node(node, &[], &["sh", "-c", "exit 7"]));
    assert_eq!(o.status.code(), Some(7), "{}", stderr(&o));
    let o = out(exec_node(node, &[], &["sh", "-c", "kill -TERM $$"]));
    assert_eq!(
        o.status.signal(),
        Some(libc::SIGTERM),
        "the command's own death, not a wrapper's exit code"
    );
    // The command is numapin's process itself: same pid as the child we made.
    let child = exec_node(node, &[], &["sh", "-c", "echo $$"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let o = child.wait_with_output().unwrap();
    assert_eq!(stdout(&o).trim(), pid.to_string());
}

#[test]
fn exec_threads_env_sets_omp_num_threads() {
    let t = live();
    let node = first_node(&t);
    let n = plan_node(&t, node).unwrap().cpus.len();
    let o = out(exec_node(
        node,
        &["--threads-env"],
        &["sh", "-c", "echo $OMP_NUM_THREADS"],
    ));
    assert_eq!(stdout(&o).trim(), n.to_string(), "{}", stderr(&o));
    let o = out(exec_node(
        node,
        &[],
        &["sh", "-c", "echo x$OMP_NUM_THREADS"],
    ));
    assert_eq!(stdout(&o).trim(), "x", "not set without --threads-env");
}

/// Arguments, environment, and what the error must say.
type Case<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, &'a str);

#[test]
fn exec_errors_exit_2_and_run_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let touch = format!("touch {}", marker.display());
    let cases: Vec<Case> = vec![
        (
            vec!["exec", "--no-cuda", "--", "sh", "-c", &touch],
            vec![],
            "no local rank",
        ),
        (
            vec!["exec", "--no-cuda", "--", "sh", "-c", &touch],
            vec![("SLURM_LOCALID", "two")],
            "SLURM_LOCALID=\"two\"",
        ),
        (
            vec![
                "exec",
                "--no-cuda",
                "--node",
                "1000",
                "--",
                "sh",
                "-c",
                &touch,
            ],
            vec![],
            "NUMA node 1000",
        ),
        (
            vec![
                "exec",
                "--no-cuda",
                "--node",
                "0",
                "--",
                "no-such-command-numapin",
            ],
            vec![],
            "no-such-command-numapin",
        ),
        (
            vec![
                "exec",
                "--no-cuda",
                "--node",
                "0",
                "--mode",
                "exclusive",
                "--",
                "sh",
                "-c",
                &touch,
            ],
            vec![],
            "--node",
        ),
        (
            vec!["exec", "--no-cuda", "--", "sh", "-c", &touch],
            vec![("LOCAL_RANK", "0")],
            "sees 0 GPUs",
        ),
    ];
    for (args, env, needle) in cases {
        let mut c = numapin(&args);
        c.envs(env.iter().copied());
        let o = out(c);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("fix:"), "{args:?}: {}", stderr(&o));
        assert!(!marker.exists(), "{args:?} ran the command");
    }
}

/// A machine with one node, CPUs 0 and 1 as two cores, two GPUs on it:
/// each rank gets a core of its own.
#[test]
fn exec_core_mode_gives_each_rank_its_own_cpu() {
    let mut m = Shape::new(1, 1, 2, 1, 2);
    m.smt = false;
    let file = write_json(&m.build());
    for (rank, cpu) in [("0", "0"), ("1", "1")] {
        for mode in ["core", "exclusive"] {
            // `--input` needs `--dry-run`: another machine's binding is
            // never applied here (the binding itself is tested with --node).
            let (o, v) = dry_run(
                file.to_str().unwrap(),
                &["--mode", mode],
                &[("LOCAL_RANK", rank)],
            );
            assert!(o.status.success(), "{}", stderr(&o));
            assert_eq!(v.unwrap()["binding"]["cpus"], cpu, "rank {rank} {mode}");
        }
    }
    // Without --dry-run, a described machine's binding is refused and the
    // command does not run.
    let mut c = numapin(&[
        "exec",
        "--input",
        file.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        "echo ran",
    ]);
    c.env("LOCAL_RANK", "0");
    let o = out(c);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--dry-run"), "{}", stderr(&o));
    assert!(stdout(&o).is_empty(), "the command ran");
}

// ---- Launchers: rank -> GPU, checked with --dry-run on described machines.

fn dry_run(file: &str, extra: &[&str], env: &[(&str, &str)]) -> (Output, Option<Value>) {
    let mut args = vec!["exec", "--dry-run", "--input", file];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "true"]);
    let mut c = numapin(&args);
    c.envs(env.iter().copied());
    let o = out(c);
    let v = serde_json::from_slice(&o.stdout).ok();
    (o, v)
}

fn gpu_of(v: &Option<Value>) -> u64 {
    v.as_ref().unwrap()["binding"]["gpu"].as_u64().unwrap()
}

#[test]
fn every_launcher_variable_picks_its_gpu() {
    // 2 sockets, 2 GPUs per socket.
    let t = Shape::new(2, 1, 2, 1, 4).build();
    let file = write_json(&t);
    let f = file.to_str().unwrap();
    for var in LAUNCHER_VARS {
        for rank in 0..4u64 {
            let (o, v) = dry_run(f, &[], &[(var, &rank.to_string())]);
            assert!(o.status.success(), "{var}={rank}: {}", stderr(&o));
            assert_eq!(gpu_of(&v), rank, "{var}={rank}");
            let b = &v.as_ref().unwrap()["binding"];
            assert_eq!(b["local_rank"], rank);
            assert_eq!(b["cpus"], if rank < 2 { "0-7" } else { "8-15" });
            assert!(v.as_ref().unwrap()["chosen_by"]
                .as_str()
                .unwrap()
                .contains(var));
        }
        let (o, _) = dry_run(f, &[], &[(var, "4")]);
        assert_eq!(o.status.code(), Some(2), "{var}=4 is beyond 4 GPUs");
        assert!(
            stderr(&o).contains(&format!("local rank 4 (from {var})")),
            "{}",
            stderr(&o)
        );
        let (o, _) = dry_run(f, &[], &[(var, "-1")]);
        assert_eq!(o.status.code(), Some(2));
        assert!(
            stderr(&o).contains(&format!("{var}=\"-1\"")),
            "{}",
            stderr(&o)
        );
    }
    // The first present variable wins; --gpu overrides them all.
    let (_, v) = dry_run(
        f,
        &[],
        &[("PMI_LOCAL_RANK", "3"), ("OMPI_COMM_WORLD_LOCAL_RANK", "1")],
    );
    assert_eq!(gpu_of(&v), 1);
    let (_, v) = dry_run(f, &["--gpu", "2"], &[("LOCAL_RANK", "0")]);
    assert_eq!(gpu_of(&v), 2);
    let (o, _) = dry_run(f, &["--gpu", "9"], &[]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn one_gpu_per_rank_from_the_launcher() {
    // srun --gpus-per-task=1 style: CUDA_VISIBLE_DEVICES names one GPU, and
    // the rank number says nothing about which.
    let mut t = Shape::new(2, 1, 2, 1, 4).build();
    t.cuda.visible_devices = Some("2".into());
    t.cuda.ordinals = vec![VisibleEntry {
        ordinal: numapin::CudaOrdinal(0),
        entry: "2".into(),
        gpu: Some(numapin::GpuIndex(2)),
        mig: false,
    }];
    // As `numapin topo --json` writes it: only GPU 2 has an ordinal.
    for g in &mut t.gpus {
        g.cuda_ordinal = (g.index == numapin::GpuIndex(2)).then_some(numapin::CudaOrdinal(0));
    }
    let file = write_json(&t);
    let f = file.to_str().unwrap();
    for rank in ["0", "3", "17"] {
        let (o, v) = dry_run(f, &["--mode", "exclusive"], &[("SLURM_LOCALID", rank)]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(gpu_of(&v), 2, "rank {rank}");
        // Its share is the one a plan of every GPU gives GPU 2, so the ranks
        // that see GPUs 2 and 3 alone still split node 1 between them.
        let full = plan(
            &t,
            &[0, 1, 2, 3].map(numapin::GpuIndex),
            Mode::Exclusive,
            &PlanOptions::default(),
        )
        .unwrap();
        assert_eq!(
            v.as_ref().unwrap()["binding"]["cpus"],
            full.ranks[2].cpus.to_string()
        );
        assert_eq!(v.as_ref().unwrap()["binding"]["cpus"], "8-11");
    }
    let (o, v) = dry_run(f, &[], &[]);
    assert!(
        o.status.success(),
        "no rank needed with one visible GPU: {}",
        stderr(&o)
    );
    assert_eq!(gpu_of(&v), 2);
}

#[test]
fn cuda_visible_devices_on_a_real_description() {
    let file = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/topologies/hwloc-xml/24em64t-2n6c2t-pci.xml");
    if !file.is_file() {
        common::skip(common::Need::Shared, "../shared/topologies is not there");
        return;
    }
    let f = file.to_str().unwrap();
    let odd = "1,3,5,7,9,11,13,15,17,19,21,23";
    // GPUs 0000:06 (node 0), 0000:11 and 0000:14 (node 1).
    for (cvd, rank, gpu, cpus_) in [
        ("2", "0", 2, odd),
        ("1,2", "1", 2, odd),
        ("2,0", "1", 0, "0,2,4,6,8,10,12,14,16,18,20,22"),
    ] {
        let mut c = numapin(&["exec", "--dry-run", "--no-cuda", "--input", f, "--", "true"]);
        c.env("CUDA_VISIBLE_DEVICES", cvd).env("LOCAL_RANK", rank);
        let o = out(c);
        assert!(o.status.success(), "{cvd}: {}", stderr(&o));
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(
            v["binding"]["gpu"], gpu,
            "CUDA_VISIBLE_DEVICES={cvd} LOCAL_RANK={rank}"
        );
        assert_eq!(v["binding"]["cpus"], cpus_);
    }
    let mut c = numapin(&["exec", "--dry-run", "--no-cuda", "--input", f, "--", "true"]);
    c.env("CUDA_VISIBLE_DEVICES", "1,2").env("LOCAL_RANK", "2");
    let o = out(c);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("sees 2 GPUs"), "{}", stderr(&o));
}

// ---- numapin affinity formats.

#[test]
fn affinity_formats() {
    let t = Shape::new(2, 1, 2, 1, 4).build();
    let file = write_json(&t);
    let f = file.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["affinity", "--input", f];
        args.extend_from_slice(extra);
        let o = out(numapin(&args));
        assert!(o.status.success(), "{extra:?}: {}", stderr(&o));
        stdout(&o)
    };
    let text = run(&["--format", "json", "--mode", "exclusive"]);
    // `--json`, as the other commands take it, is the same output.
    assert_eq!(run(&["--json", "--mode", "exclusive"]), text);
    let both = out(numapin(&[
        "affinity", "--input", f, "--json", "--format", "shell",
    ]));
    assert_eq!(both.status.code(), Some(2), "--json and --format conflict");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["mode"], "exclusive");
    let got: Vec<&str> = v["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["cpus"].as_str().unwrap())
        .collect();
    assert_eq!(got, ["0-3", "4-7", "8-11", "12-15"]);
    assert_eq!(v["ranks"][3]["mems"], serde_json::json!([1]));
    assert_eq!(
        run(&["--format", "numactl", "--gpus", "3,0"]),
        "numactl --physcpubind=8-15 --membind=1\nnumactl --physcpubind=0-7 --membind=0\n"
    );
    assert_eq!(
        run(&["--format", "numactl", "--gpus", "1", "--preferred"]),
        "numactl --physcpubind=0-7 --preferred=0\n"
    );
    assert_eq!(
        run(&["--format", "taskset", "--mode", "core", "--gpus", "0-1"]),
        "taskset -c 0-1\ntaskset -c 2-3\n"
    );
    let shell = run(&[
        "--format",
        "shell",
        "--local-rank",
        "2",
        "--mode",
        "exclusive",
    ]);
    assert!(shell.contains("export NUMAPIN_CPUS=8-11\n"), "{shell}");
    assert!(shell.contains("export OMP_NUM_THREADS=4\n"), "{shell}");
    assert!(shell.contains("export NUMAPIN_GPU_2=2\n"), "{shell}");
    let table = run(&["--mode", "core-complex"]);
    assert!(
        table.contains("mode cache") && table.contains("8-15"),
        "{table}"
    );
    // Bad requests exit 2.
    for bad in [
        &["--gpus", "4"][..],
        &["--gpus", "x"],
        &["--local-rank", "4"],
    ] {
        let mut args = vec!["affinity", "--input", f];
        args.extend_from_slice(bad);
        let o = out(numapin(&args));
        assert_eq!(o.status.code(), Some(2), "{bad:?}");
    }
    let o = out(numapin(&["affinity", "--no-cuda"]));
    if live().gpus.is_empty() {
        assert_eq!(o.status.code(), Some(2));
        assert!(stderr(&o).contains("--node"), "{}", stderr(&o));
    }
}

#[test]
fn affinity_warnings_reach_the_reader() {
    let mut t = Shape::new(2, 1, 1, 1, 2).build();
    t.gpus[1].numa_node = None;
    t.gpus[1].local_cpus = t.all_cpus();
    t.allowed.cpus = cpus("0-7");
    let file = write_json(&t);
    let o = out(numapin(&["affinity", "--input", file.to_str().unwrap()]));
    assert!(
        stdout(&o).contains("Warnings:") && stdout(&o).contains("unknown"),
        "{}",
        stdout(&o)
    );
    let o = out(numapin(&[
        "affinity",
        "--input",
        file.to_str().unwrap(),
        "--format",
        "taskset",
    ]));
    assert_eq!(stdout(&o), "taskset -c 0-3\ntaskset -c 0-7\n");
    assert!(stderr(&o).contains("warning: rank 1"), "{}", stderr(&o));
}

// ---- NICs: each rank's nearest, and the variables that select them.

fn fixture(name: &str) -> String {
    format!("{}/../topology/{name}", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn affinity_lists_each_ranks_nics() {
    let f = fixture("dgx-h100.xml");
    let o = out(numapin(&[
        "affinity",
        "--no-cuda",
        "--input",
        &f,
        "--format",
        "json",
    ]));
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    for (i, r) in v["ranks"].as_array().unwrap().iter().enumerate() {
        let nics = r["nics"].as_array().unwrap();
        assert_eq!(nics.len(), 1, "rank {i}: {r}");
        assert_eq!(nics[0]["names"][0], format!("mlx5_{i}"));
        assert_eq!(nics[0]["relation"], "PIX");
        assert!(nics[0]["pci_bus_id"].is_string());
    }
    let o = out(numapin(&["affinity", "--no-cuda", "--input", &f]));
    let text = stdout(&o);
    let header = text.lines().find(|l| l.starts_with("RANK")).unwrap();
    assert!(header.ends_with("NICS"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("5 ") && l.ends_with("mlx5_5 (PIX)")),
        "{text}"
    );
    // A machine without NICs keeps its table as it was.
    let o = out(numapin(&[
        "affinity",
        "--no-cuda",
        "--input",
        &fixture("cloud-vm-1n.xml"),
    ]));
    assert!(!stdout(&o).contains("NICS"), "{}", stdout(&o));
}

#[test]
fn exec_nic_env_sets_the_variable_only_when_asked() {
    // This machine's CPUs, a GPU on its first node, an RDMA NIC near it and
    // one far from it.
    let mut t = live();
    // This machine's own NICs and drives have no relation to the added GPU.
    t.nics.clear();
    t.storage.clear();
    let node = first_node(&t);
    let (local, package) = {
        let n = t.node(node).unwrap();
        (n.cpus.clone(), n.package)
    };
    add_gpu(&mut t, Some(node), package, local);
    add_nic(&mut t, "mlx5_7", DeviceKind::Roce, &[Relation::Sys]);
    add_nic(&mut t, "mlx5_2", DeviceKind::Infiniband, &[Relation::Node]);
    let path = write_json(&t);
    let p = path.to_str().unwrap();
    // `--input` needs `--dry-run` (another machine's binding is never
    // applied here): the dry run shows the environment the command would
    // get. The VM tests (cli/tests/vm.rs) run commands under `--nic-env`.
    let environment = |extra: &[&str]| {
        let mut args = vec!["--gpu", "0"];
        args.extend_from_slice(extra);
        let (o, v) = dry_run(p, &args, &[("UCX_NET_DEVICES", "all")]);
        assert!(o.status.success(), "{extra:?}: {}", stderr(&o));
        let v = v.unwrap();
        assert_eq!(v["binding"]["nics"][0]["relation"], "NODE", "{v}");
        v["environment"].clone()
    };
    assert_eq!(
        environment(&["--nic-env", "ucx"]),
        serde_json::json!({"UCX_NET_DEVICES": "mlx5_2:1"}),
        "the NODE NIC, not the SYS one"
    );
    assert_eq!(
        environment(&["--nic-env", "nccl"]),
        serde_json::json!({"NCCL_IB_HCA": "=mlx5_2:1"})
    );
    assert_eq!(
        environment(&[]),
        serde_json::json!({}),
        "nothing set unless asked"
    );
}

#[test]
fn exec_nic_env_refuses_nics_without_names_and_runs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let touch = format!("touch {}", marker.display());
    // The DGX A100 description has InfiniBand NICs without OS names.
    let f = fixture("dgx-a100-nps4.xml");
    let mut c = numapin(&[
        "exec",
        "--no-cuda",
        "--dry-run",
        "--input",
        &f,
        "--nic-env",
        "ucx",
        "--",
        "sh",
        "-c",
        &touch,
    ]);
    c.env("LOCAL_RANK", "2");
    let o = out(c);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("no verbs device name"),
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("fix:"), "{}", stderr(&o));
    assert!(!marker.exists(), "nothing ran");
    let o = out(numapin(&[
        "exec",
        "--no-cuda",
        "--nic-env",
        "rdma",
        "--",
        "true",
    ]));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}
