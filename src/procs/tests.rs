//! Processes in a fake `/proc` (a folder), judged against the DGX H100
//! fixture: GPUs 0-3 on node 0 (CPUs 0-55,112-167), 4-7 on node 1 (CPUs
//! 56-111,168-223), one InfiniBand NIC per GPU (`mlx5_0`..`mlx5_7`).

use std::path::Path;

use super::*;
use crate::doctor::{Check, Subject, Verdict};
use crate::topology::{ProbeOptions, Topology};

pub(super) fn dgx() -> Topology {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("topology/dgx-h100.xml");
    Topology::load(&p, &ProbeOptions::default()).unwrap()
}

/// One process of a fake `/proc`.
pub(super) struct Fake {
    pid: u32,
    env: Vec<(&'static str, String)>,
    /// `(cpu, threads)`.
    threads: Vec<(u32, u32)>,
    allowed: &'static str,
    /// Descriptor targets.
    fds: Vec<String>,
    maps: Vec<String>,
    numa_maps: String,
    /// The `NSpid:` line's value (none when unset).
    nspid: Option<String>,
}

impl Fake {
    pub(super) fn new(pid: u32) -> Self {
        Self {
            pid,
            env: vec![("PATH", "/bin".into())],
            threads: vec![(0, 1)],
            allowed: "0-223",
            fds: vec!["/dev/null".into()],
            maps: vec![],
            numa_maps: String::new(),
            nspid: None,
        }
    }

    /// `NSpid:` in its `status`: its pid in each namespace, tab-separated.
    pub(super) fn nspid(mut self, list: &str) -> Self {
        self.nspid = Some(list.into());
        self
    }

    pub(super) fn env(mut self, k: &'static str, v: &str) -> Self {
        self.env.push((k, v.into()));
        self
    }

    pub(super) fn threads(mut self, t: &[(u32, u32)]) -> Self {
        self.threads = t.to_vec();
        self
    }

    pub(super) fn allowed(mut self, a: &'static str) -> Self {
        self.allowed = a;
        self
    }

    pub(super) fn fd(mut self, target: &str) -> Self {
        self.fds.push(target.into());
        self
    }

    pub(super) fn map(mut self, path: &str) -> Self {
        self.maps.push(path.into());
        self
    }

    /// Data of `mib` MiB on each `(node, mib)`, and the policy.
    pub(super) fn memory(mut self, policy: &str, data: &[(u32, u64)]) -> Self {
        let mut s = String::from(
            "55d0a000 default file=/usr/bin/python3 mapped=100 N0=100 kernelpagesize_kB=4\n",
        );
        for (i, (n, mib)) in data.iter().enumerate() {
            s.push_str(&format!(
                "7f{i:02x}00000000 {policy} anon={p} dirty={p} N{n}={p} kernelpagesize_kB=4\n",
                p = mib * 256
            ));
        }
        s.push_str(&format!(
            "7ffd1000 {policy} stack anon=3 dirty=3 N{}=3 kernelpagesize_kB=4\n",
            data.first().map_or(0, |d| d.0)
        ));
        self.numa_maps = s;
        self
    }

    pub(super) fn write(&self, root: &Path) {
        let dir = root.join(format!("proc/{}", self.pid));
        let w = |rel: &str, data: &[u8]| {
            let p = dir.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, data).unwrap();
        };
        let count: u32 = self.threads.iter().map(|t| t.1).sum();
        w(
            "status",
            format!(
                "Name:\tpython3\nState:\tS (sleeping)\nUid:\t1000\t1000\t1000\t1000\nVmRSS:\t2048 kB\nVmLck:\t0 kB\nVmPin:\t0 kB\nThreads:\t{count}\nCpus_allowed_list:\t{}\nMems_allowed_list:\t0-1\n{}",
                self.allowed,
                self.nspid
                    .as_ref()
                    .map_or(String::new(), |n| format!("NSpid:\t{n}\n"))
            )
            .as_bytes(),
        );
        w("comm", b"python3\n");
        w("cmdline", b"python3\0train.py\0");
        let env: Vec<u8> = self
            .env
            .iter()
            .flat_map(|(k, v)| format!("{k}={v}\0").into_bytes())
            .collect();
        w("environ", &env);
        let mut tid = self.pid;
        for &(cpu, n) in &self.threads {
            for _ in 0..n {
                let fields: Vec<String> = (3..=52)
                    .map(|f| if f == 39 { cpu.to_string() } else { "0".into() })
                    .collect();
                w(
                    &format!("task/{tid}/stat"),
                    format!("{tid} (python3) {}", fields.join(" ")).as_bytes(),
                );
                tid += 1;
            }
        }
        std::fs::create_dir_all(dir.join("fd")).unwrap();
        for (i, t) in self.fds.iter().enumerate() {
            std::os::unix::fs::symlink(t, dir.join(format!("fd/{i}"))).unwrap();
        }
        let maps: String = self
            .maps
            .iter()
            .enumerate()
            .map(|(i, p)| {
                format!("7e{i:02x}00000000-7e{i:02x}00200000 rw-s 00000000 00:05 1 {p}\n")
            })
            .collect();
        w("maps", maps.as_bytes());
        w("numa_maps", self.numa_maps.as_bytes());
    }
}

/// A fake root with the NVIDIA driver's files for GPUs 0-7 (minor = index).
pub(super) fn root(procs: &[Fake]) -> tempfile::TempDir {
    let t = dgx();
    let d = tempfile::tempdir().unwrap();
    for g in &t.gpus {
        let p = d.path().join(format!(
            "proc/driver/nvidia/gpus/{}/information",
            g.pci_bus_id
        ));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(
            p,
            format!(
                "Bus Location: \t {}\nDevice Minor: \t {}\n",
                g.pci_bus_id, g.index
            ),
        )
        .unwrap();
    }
    for p in procs {
        p.write(d.path());
    }
    d
}

fn judged(p: Fake) -> ProcessReport {
    let d = root(std::slice::from_ref(&p));
    let t = dgx();
    let s = ProcReader::with_root(&t, d.path()).read(p.pid).unwrap();
    judge(&t, s)
}

pub(super) fn check<'a>(r: &'a ProcessReport, name: &str) -> &'a Check {
    r.checks
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no {name} check: {:#?}", r.checks))
}

pub(super) fn verdicts(r: &ProcessReport) -> Vec<(&'static str, Verdict)> {
    r.checks.iter().map(|c| (c.name, c.verdict)).collect()
}

/// Rank 4 (GPU 4, node 1) on node 1's CPUs, bound there, data on node 1,
/// told to use GPU 4's NIC.
fn rank4_bound_right(pid: u32) -> Fake {
    Fake::new(pid)
        .env("LOCAL_RANK", "4")
        .env("UCX_NET_DEVICES", "mlx5_4:1")
        .threads(&[(56, 10), (57, 2)])
        .allowed("56-111,168-223")
        .fd("/dev/nvidiactl")
        .fd("/dev/nvidia4")
        .map("/dev/nvidia4")
        .memory("bind:1", &[(1, 1024)])
}

#[test]
fn a_rank_bound_near_its_gpu_is_ok() {
    let r = judged(rank4_bound_right(100));
    use Verdict::Ok;
    assert_eq!(
        verdicts(&r),
        [("gpu", Ok), ("cpus", Ok), ("memory", Ok), ("nic", Ok)],
        "{:#?}",
        r.checks
    );
    let e = r.expected.as_ref().unwrap();
    assert_eq!(
        (e.gpus.clone(), e.nodes.clone()),
        (vec![crate::GpuIndex(4)], vec![1])
    );
    assert_eq!(e.plan.as_ref().unwrap().cpus.to_string(), "56-111,168-223");
    let gpu = &check(&r, "gpu").evidence;
    assert!(gpu.contains("GPU 4 (0000:9a:00.0, node 1), chosen by local rank 4 from LOCAL_RANK (CUDA device = local rank); it has GPU 4 mapped"), "{gpu}");
    assert!(gpu.contains("it has GPU 4 mapped"), "{gpu}");
    assert!(check(&r, "nic")
        .evidence
        .contains("UCX_NET_DEVICES=mlx5_4:1 selects mlx5_4 (PIX from GPU 4)"));
    let s = &r.snapshot;
    assert_eq!(
        (s.threads.count, s.nvidia_driver, s.uid),
        (12, true, Some(1000))
    );
    assert_eq!(s.gpus.len(), 1);
    assert!(s.gpus[0].descriptor && s.gpus[0].mapped);
    assert_eq!(s.gpus[0].bus_id.as_deref(), Some("0000:9a:00.0"));
    assert!(
        r.facts
            .iter()
            .any(|f| f.starts_with("threads: 12, last ran 12 on node 1 (CPUs 56-57)")),
        "{:?}",
        r.facts
    );
    assert!(s.unread.is_empty(), "{:?}", s.unread);
}

#[test]
fn a_rank_on_the_other_socket_fails_with_the_fix() {
    let p = Fake::new(101)
        .env("LOCAL_RANK", "4")
        .env("UCX_NET_DEVICES", "mlx5_0:1")
        .threads(&[(0, 11), (1, 1)])
        .fd("/dev/nvidia4")
        .map("/dev/nvidia4")
        .memory("default", &[(0, 40 << 10), (1, 1 << 10)]);
    let r = judged(p);
    use Verdict::{Fail, Ok};
    assert_eq!(
        verdicts(&r),
        [("gpu", Ok), ("cpus", Fail), ("memory", Fail), ("nic", Fail)],
        "{:#?}",
        r.checks
    );
    let cpus = check(&r, "cpus");
    assert!(
        cpus.evidence.starts_with("GPU 4 is on node 1; its 12 threads last ran on node 0 (CPUs 0-1); it may run on CPUs 0-223 (nodes 0-1)"),
        "{}",
        cpus.evidence
    );
    let fix = cpus.fix.as_deref().unwrap();
    assert!(
        fix.contains("`numapin exec -- CMD`") && fix.contains("`numapin.bind()`"),
        "{fix}"
    );
    assert!(
        fix.contains("CPUs 56-111,168-223, memory on node 1"),
        "{fix}"
    );
    let mem = check(&r, "memory");
    assert!(
        mem.evidence
            .contains("97% of its 41.0 GiB of data is off it (node 0 40.0 GiB, node 1 1 GiB)"),
        "{}",
        mem.evidence
    );
    assert!(mem
        .fix
        .as_deref()
        .unwrap()
        .contains("migratepages 101 <from-nodes> 1"));
    let nic = check(&r, "nic");
    assert!(nic.evidence.contains("selects mlx5_0 (SYS from GPU 4): all farther than its nearest; its nearest NIC is mlx5_4 (PIX from GPU 4)"), "{}", nic.evidence);
    assert!(
        nic.fix
            .as_deref()
            .unwrap()
            .contains("`numapin exec --nic-env ucx -- CMD`, which sets UCX_NET_DEVICES=mlx5_4:1"),
        "{:?}",
        nic.fix
    );
    assert_eq!(r.verdict(), Fail);
}

#[test]
fn unbound_processes_and_minorities_warn() {
    // Right now on node 1, but free to run anywhere; a few MiB elsewhere.
    let p = Fake::new(102)
        .env("LOCAL_RANK", "4")
        .threads(&[(56, 4)])
        .fd("/dev/nvidia4")
        .memory("default", &[(1, 100), (0, 8)]);
    let r = judged(p);
    let cpus = check(&r, "cpus");
    assert_eq!(cpus.verdict, Verdict::Warn, "{cpus:?}");
    assert!(
        cpus.evidence
            .ends_with("nothing keeps them on its GPU's node"),
        "{}",
        cpus.evidence
    );
    assert_eq!(
        check(&r, "memory").verdict,
        Verdict::Ok,
        "8 MiB off node is below the floor"
    );
    // No NIC variable: fine, NCCL chooses.
    let nic = check(&r, "nic");
    assert_eq!(nic.verdict, Verdict::Ok);
    assert!(nic.evidence.contains("not set"), "{}", nic.evidence);
    // A minority of threads and of data (20%) elsewhere.
    let p = Fake::new(103)
        .env("LOCAL_RANK", "4")
        .threads(&[(56, 3), (0, 1)])
        .fd("/dev/nvidia4")
        .memory("default", &[(1, 400), (0, 100)]);
    let r = judged(p);
    let cpus = check(&r, "cpus");
    assert_eq!(cpus.verdict, Verdict::Warn);
    assert!(
        cpus.evidence
            .contains("of its 4 threads, 1 last ran on node 0 (CPUs 0), 3 on node 1 (CPUs 56)"),
        "{}",
        cpus.evidence
    );
    assert_eq!(check(&r, "memory").verdict, Verdict::Warn);
    // Bound to the other socket's CPUs: the fix says where that may come from.
    let p = Fake::new(117)
        .env("LOCAL_RANK", "4")
        .threads(&[(3, 1)])
        .allowed("0-55");
    let r = judged(p);
    let cpus = check(&r, "cpus");
    assert_eq!(cpus.verdict, Verdict::Fail);
    assert!(
        cpus.evidence
            .contains("its thread last ran on CPU 3 (node 0)"),
        "{}",
        cpus.evidence
    );
    let fix = cpus.fix.as_deref().unwrap();
    assert!(
        fix.starts_with(
            "it may run only on CPUs 0-55, none of node 1's: drop the binding that put it there"
        ),
        "{fix}"
    );
    assert!(
        fix.contains(
            "`numapin exec -- CMD` under the launcher (CPUs 56-111,168-223, memory on node 1)"
        ),
        "{fix}"
    );
}

#[test]
fn memory_policies_against_the_gpus_node() {
    let with = |policy: &str| {
        let r = judged(
            Fake::new(104)
                .env("LOCAL_RANK", "4")
                .threads(&[(56, 1)])
                .allowed("56-111")
                .memory(policy, &[(1, 1)]),
        );
        let m = check(&r, "memory");
        (m.verdict, m.evidence.clone())
    };
    assert_eq!(with("bind:1").0, Verdict::Ok);
    assert_eq!(with("default").0, Verdict::Ok);
    let (v, ev) = with("bind:0");
    assert_eq!(v, Verdict::Fail);
    assert!(
        ev.contains("memory policy bind:0: its new memory comes from node 0 only"),
        "{ev}"
    );
    assert_eq!(with("prefer:0").0, Verdict::Fail);
    assert_eq!(with("interleave:0-1").0, Verdict::Warn);
    assert_eq!(with("bind=static:0-1").0, Verdict::Warn);
    assert_eq!(with("prefer (many):1").0, Verdict::Ok);
}

/// By device files alone (NVML's verdicts: `driver_tests.rs`), the GPU
/// check never warns nor fails: the CUDA driver opens and maps every GPU's
/// device file it can see, so they cannot tell which GPU a rank works on.
#[test]
fn the_launchers_gpu_against_its_device_files_is_words_only() {
    // Rank 4 with GPU 0 mapped only: by device files, not judged.
    let r = judged(
        Fake::new(105)
            .env("LOCAL_RANK", "4")
            .threads(&[(56, 1)])
            .fd("/dev/nvidia0")
            .fd("/dev/nvidia4")
            .map("/dev/nvidia0"),
    );
    let g = check(&r, "gpu");
    assert_eq!(g.verdict, Verdict::Skip, "{g:?}");
    assert!(
        g.evidence.contains("it has GPU 0 mapped, not its rank's (device files, approximate: the CUDA driver opens and maps every GPU it can see; the driver's process lists were not asked): not judged"),
        "{}",
        g.evidence
    );
    assert_eq!(g.fix, None);
    // The rank is still judged against its GPU's node.
    assert_eq!(check(&r, "cpus").verdict, Verdict::Warn);
    // Its rank's GPU and GPU 0 mapped: ok, in words saying approximate.
    let r = judged(
        Fake::new(106)
            .env("LOCAL_RANK", "4")
            .threads(&[(56, 1)])
            .map("/dev/nvidia0")
            .map("/dev/nvidia4"),
    );
    let g = check(&r, "gpu");
    assert_eq!(g.verdict, Verdict::Ok);
    assert!(
        g.evidence
            .contains("it has GPU 0,4 mapped (device files, approximate"),
        "{}",
        g.evidence
    );
    // Descriptors of every GPU (CUDA opens them all) but no mapping: the rank decides.
    let mut p = Fake::new(107).env("LOCAL_RANK", "4").threads(&[(56, 1)]);
    for i in 0..8 {
        p = p.fd(&format!("/dev/nvidia{i}"));
    }
    assert_eq!(check(&judged(p), "gpu").verdict, Verdict::Ok);
}

#[test]
fn gpus_chosen_without_a_rank() {
    // The only GPU it has open.
    let r = judged(Fake::new(108).threads(&[(0, 1)]).fd("/dev/nvidia3"));
    assert_eq!(r.expected.as_ref().unwrap().gpus, [crate::GpuIndex(3)]);
    assert!(check(&r, "gpu")
        .evidence
        .contains("the only GPU it has open"));
    assert_eq!(
        check(&r, "cpus").verdict,
        Verdict::Warn,
        "node 0 is GPU 3's, but unbound"
    );
    // CUDA_VISIBLE_DEVICES with one GPU: that one, whatever is open.
    let r = judged(
        Fake::new(109)
            .env("CUDA_VISIBLE_DEVICES", "6")
            .threads(&[(0, 1)]),
    );
    assert_eq!(r.expected.as_ref().unwrap().gpus, [crate::GpuIndex(6)]);
    // CUDA_VISIBLE_DEVICES reorders: local rank 1 of "5,2" is GPU 2.
    let r = judged(
        Fake::new(110)
            .env("CUDA_VISIBLE_DEVICES", "5,2")
            .env("SLURM_LOCALID", "1")
            .threads(&[(0, 1)]),
    );
    assert_eq!(r.expected.as_ref().unwrap().gpus, [crate::GpuIndex(2)]);
    assert!(check(&r, "gpu").evidence.contains("from SLURM_LOCALID"));
    // Several GPUs on both sockets by device files, no rank: not judged
    // (device files are approximate), judged against both nodes.
    let r = judged(
        Fake::new(111)
            .threads(&[(0, 1)])
            .map("/dev/nvidia0")
            .map("/dev/nvidia7"),
    );
    let g = check(&r, "gpu");
    assert_eq!(g.verdict, Verdict::Skip);
    assert!(
        g.evidence
            .contains("on nodes 0-1: one process cannot be near all of them"),
        "{}",
        g.evidence
    );
    assert_eq!(r.expected.as_ref().unwrap().nodes, [0, 1]);
    // Nothing at all.
    let r = judged(Fake::new(112));
    assert_eq!(verdicts(&r), [("gpu", Verdict::Warn)]);
    assert!(check(&r, "gpu").evidence.contains("nothing to judge"));
    // A bad rank or CUDA_VISIBLE_DEVICES is named, not a crash.
    let r = judged(
        Fake::new(113)
            .env("LOCAL_RANK", "banana")
            .fd("/dev/nvidia1"),
    );
    let g = check(&r, "gpu");
    assert_eq!(g.verdict, Verdict::Warn);
    assert!(
        g.evidence.contains("LOCAL_RANK=\"banana\""),
        "{}",
        g.evidence
    );
    let r = judged(
        Fake::new(114)
            .env("CUDA_VISIBLE_DEVICES", "0,banana")
            .env("LOCAL_RANK", "0"),
    );
    assert!(check(&r, "gpu").evidence.contains("CUDA_VISIBLE_DEVICES"));
    let r = judged(Fake::new(115).env("LOCAL_RANK", "9"));
    let g = check(&r, "gpu");
    assert!(
        g.evidence.contains("asks for CUDA device 9"),
        "{}",
        g.evidence
    );
}

#[test]
fn nic_variables_in_ucx_and_nccl_forms() {
    let nic = |var: &'static str, value: &str| {
        let r = judged(
            Fake::new(116)
                .env("LOCAL_RANK", "4")
                .env(var, value)
                .threads(&[(56, 1)])
                .allowed("56-111"),
        );
        let c = check(&r, "nic").clone();
        (c.verdict, c.evidence)
    };
    use Verdict::{Fail, Ok, Warn};
    assert_eq!(nic("NCCL_IB_HCA", "=mlx5_4:1").0, Ok);
    assert_eq!(nic("NCCL_IB_HCA", "mlx5_4").0, Ok);
    // A prefix: mlx5_1 also selects mlx5_10 and mlx5_11 (node 1's RoCE
    // ports); mlx5_1 itself is on node 0.
    let (v, ev) = nic("NCCL_IB_HCA", "mlx5_1");
    assert_eq!(v, Warn, "{ev}");
    assert!(ev.contains("mlx5_10"), "{ev}");
    assert_eq!(nic("NCCL_IB_HCA", "=mlx5_1").0, Fail);
    // Excluding the node-1 devices leaves only node 0's.
    assert_eq!(
        nic(
            "NCCL_IB_HCA",
            "^mlx5_4,mlx5_5,mlx5_6,mlx5_7,mlx5_10,mlx5_11"
        )
        .0,
        Fail
    );
    assert_eq!(nic("UCX_NET_DEVICES", "all").0, Ok);
    assert_eq!(nic("UCX_NET_DEVICES", "mlx5_4:1,mlx5_0:1").0, Warn);
    let (v, ev) = nic("UCX_NET_DEVICES", "mlx5_99:1");
    assert_eq!(v, Warn);
    assert!(
        ev.contains("selects no NIC of this machine, and names mlx5_99"),
        "{ev}"
    );
    assert_eq!(nic("UCX_NET_DEVICES", "ibp155s0").0, Ok);
}

fn stats_image(pid: u32, nodes: &str) -> Vec<u8> {
    let json = format!(r#"{{"version":1,"pid":{pid},"runtimes":[{{"nodes":[{nodes}]}}]}}"#);
    let mut v = STATS_MAGIC.to_le_bytes().to_vec();
    v.extend(2u32.to_le_bytes());
    v.extend(u32::try_from(json.len()).unwrap().to_le_bytes());
    v.extend(json.as_bytes());
    v.resize(STATS_FILE_BYTES, 0);
    v
}

/// A process whose descriptor 9 is numapin's stats memfd holding `image`.
fn with_stats(p: Fake, image: &[u8]) -> (tempfile::TempDir, Fake) {
    let d = root(&[]);
    let memfd = d.path().join("memfd:numapin-stats (deleted)");
    std::fs::write(&memfd, image).unwrap();
    let p = p.fd(memfd.to_str().unwrap());
    p.write(d.path());
    (d, p)
}

#[test]
fn numapins_own_arenas_are_read_and_judged() {
    let node1 = r#"{"node":1,"regions":2,"bytes_reserved":536870912,"bytes_in_use":1048576}"#;
    let (d, p) = with_stats(rank4_bound_right(120), &stats_image(120, node1));
    let t = dgx();
    let r = judge(&t, ProcReader::with_root(&t, d.path()).read(p.pid).unwrap());
    let c = check(&r, "numapin");
    assert_eq!(c.verdict, Verdict::Ok, "{c:?}");
    assert_eq!(
        c.evidence,
        "numapin holds node 1: 512 MiB pinned in 2 region(s)"
    );
    assert!(
        r.facts
            .iter()
            .any(|f| f == "numapin: 1 runtime(s); node 1 2 region(s) 512 MiB pinned, 1 MiB in use"),
        "{:?}",
        r.facts
    );
    // Its arena on the other socket.
    let node0 = r#"{"node":0,"regions":1,"bytes_reserved":268435456}"#;
    let (d, p) = with_stats(rank4_bound_right(121), &stats_image(121, node0));
    let r = judge(&t, ProcReader::with_root(&t, d.path()).read(p.pid).unwrap());
    let c = check(&r, "numapin");
    assert_eq!(c.verdict, Verdict::Warn, "{c:?}");
    assert!(
        c.evidence.contains("its GPU is on node 1"),
        "{}",
        c.evidence
    );
    // Inherited from a parent (another pid), or garbled: a line, no check.
    for (image, why) in [
        (stats_image(1, node1), "written by pid 1"),
        (vec![0u8; 10], "ends inside its header"),
    ] {
        let (d, p) = with_stats(rank4_bound_right(122), &image);
        let s = ProcReader::with_root(&t, d.path()).read(p.pid).unwrap();
        match &s.numapin {
            Publication::Unusable(w) => assert!(w.contains(why), "{w}"),
            other => panic!("{other:?}"),
        }
        let r = judge(&t, s);
        assert!(r.checks.iter().all(|c| c.name != "numapin"));
        assert!(r
            .facts
            .iter()
            .any(|f| f.starts_with("numapin: stats not published:")));
    }
}

#[test]
fn node_use_sums_processes_and_warns_past_the_budget() {
    let t = dgx();
    let big = format!(
        r#"{{"node":1,"regions":1,"bytes_reserved":{}}}"#,
        t.node(1).unwrap().memory_bytes / 2 + 1
    );
    let (d, p) = with_stats(rank4_bound_right(130), &stats_image(130, &big));
    rank4_bound_right(131).write(d.path());
    let reader = ProcReader::with_root(&t, d.path());
    let reports: Vec<_> = reader
        .read_pids(&[p.pid, 131])
        .unwrap()
        .processes
        .into_iter()
        .map(|s| judge(&t, s))
        .collect();
    let (rows, checks) = node_use(&t, &reports);
    assert_eq!(rows.len(), 2);
    let n1 = &rows[1];
    assert_eq!(n1.node, 1);
    assert_eq!(n1.data_bytes, 2 * ((1024 << 20) + 3 * 4096));
    assert_eq!(n1.processes, 2);
    assert_eq!(n1.default_budget_bytes, t.node(1).unwrap().memory_bytes / 2);
    assert_eq!(rows[0].file_bytes, 2 * 100 * 4096);
    assert_eq!(checks.len(), 1);
    assert_eq!(checks[0].subject, Subject::Node(1));
    assert_eq!(checks[0].verdict, Verdict::Warn);
}

#[test]
fn a_scan_lists_gpu_processes_only() {
    let d = root(&[
        rank4_bound_right(200),
        Fake::new(201),
        Fake::new(202).fd("/dev/nvidia-uvm"),
    ]);
    let t = dgx();
    let scan = ProcReader::with_root(&t, d.path()).scan().unwrap();
    let pids: Vec<u32> = scan.processes.iter().map(|s| s.pid).collect();
    assert_eq!(pids, [200, 202]);
    assert_eq!(scan.looked_at, 3);
    assert!(scan.unreadable.is_empty() && scan.exited.is_empty());
    assert!(!scan.truncated);
    // A driver-only process's mappings are read too.
    assert!(scan.processes[1].nvidia_driver);
}

#[test]
fn hostile_proc_contents_give_lines_not_crashes() {
    let t = dgx();
    let d = root(&[rank4_bound_right(300)]);
    let dir = d.path().join("proc/300");
    // More mappings than the limit, and a line longer than the limit.
    let lines: String = (0..50)
        .map(|i| format!("7f{i:04x}000 default anon=1 N1=1 kernelpagesize_kB=4\n"))
        .collect();
    std::fs::write(dir.join("numa_maps"), lines).unwrap();
    std::fs::write(dir.join("maps"), "x".repeat(10_000)).unwrap();
    let limits = ReadLimits::default()
        .with_max_map_lines(20)
        .with_max_line_bytes(4096)
        .with_max_descriptors(1)
        .with_max_environ_bytes(8);
    let s = ProcReader::with_root(&t, d.path())
        .with_limits(limits)
        .read(300)
        .unwrap();
    let whys: Vec<&str> = s.unread.iter().map(|u| u.why.as_str()).collect();
    let all = whys.join("\n");
    for want in [
        "numa_maps: cannot be used: more than the 20-line limit",
        "maps: cannot be used: line 1 is longer than the 4096-byte limit",
        "environ: cannot be used: longer than the 8-byte limit",
        "more than 1 descriptors: only the first 1 were read",
    ] {
        assert!(all.contains(want), "{want} missing from:\n{all}");
    }
    assert!(s.memory.is_none() && s.environment.is_none());
    let r = judge(&t, s);
    assert!(r.facts.iter().any(|f| f.starts_with("not read: memory:")));
    // Nothing to judge without the environment and the device: a warning.
    assert_eq!(r.verdict(), Verdict::Warn);

    // Garbage in every file, folders where files belong, files where
    // folders belong.
    let d = root(&[]);
    let dir = d.path().join("proc/301");
    std::fs::create_dir_all(dir.join("environ")).unwrap();
    std::fs::write(dir.join("status"), [0xffu8, 0, 0x80, b'\n', b':']).unwrap();
    std::fs::write(dir.join("task"), "not a folder").unwrap();
    std::fs::write(dir.join("fd"), "not a folder").unwrap();
    std::fs::write(
        dir.join("numa_maps"),
        "\u{0}\u{1}garbage N99999999999=1\n7f default N5000=1 kernelpagesize_kB=4\n",
    )
    .unwrap();
    let s = ProcReader::with_root(&t, d.path()).read(301).unwrap();
    let parts: Vec<&str> = s.unread.iter().map(|u| u.part.as_str()).collect();
    assert_eq!(
        parts,
        [
            "threads",
            "descriptors",
            "mappings",
            "environment",
            "memory"
        ],
        "{:?}",
        s.unread
    );
    assert!(
        s.unread[4].why.contains("name a node past 1024"),
        "{}",
        s.unread[3].why
    );
    let r = judge(&t, s);
    assert_eq!(r.verdict(), Verdict::Warn, "{:#?}", r.checks);
    // A status that lies about huge CPU lists is not believed.
    std::fs::write(
        dir.join("status"),
        format!("Cpus_allowed_list:\t{}\n", vec!["0-8191"; 50].join(",")),
    )
    .unwrap();
    let s = ProcReader::with_root(&t, d.path()).read(301).unwrap();
    assert_eq!(s.allowed_cpus, None);
}

#[test]
fn processes_that_are_not_there() {
    let t = dgx();
    let d = root(&[rank4_bound_right(400)]);
    let reader = ProcReader::with_root(&t, d.path());
    match reader.read(999) {
        Err(e @ ProcessError::NoSuchProcess { pid: 999 }) => {
            assert_eq!(e.kind(), crate::ErrorKind::Input);
            assert!(e.fix().unwrap().contains("ps -ef"));
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        reader.read_pids(&[400, 998]),
        Err(ProcessError::NoSuchProcess { pid: 998 })
    ));
    // A zombie: exited, not reaped.
    let z = d.path().join("proc/400/status");
    std::fs::write(&z, "Name:\tpython3\nState:\tZ (zombie)\n").unwrap();
    match reader.read(400) {
        Err(ProcessError::Exited { pid: 400, how }) => assert!(how.contains("zombie"), "{how}"),
        other => panic!("{other:?}"),
    }
    let scan = reader.read_pids(&[400]).unwrap();
    assert_eq!(scan.exited.len(), 1);
    assert!(scan.processes.is_empty());
    // No /proc at all.
    let e = ProcReader::with_root(&t, "/nonexistent")
        .scan()
        .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("/nonexistent/proc: cannot be read"),
        "{e}"
    );
}

/// This test process itself, on the live `/proc`: readable, with threads,
/// memory and an environment; a real zombie child is reported as exited.
#[test]
fn the_live_proc_of_this_process_and_a_zombie() {
    let t = dgx();
    let reader = ProcReader::new(&t);
    let me = std::process::id();
    let s = reader.read(me).unwrap();
    assert!(s.threads.count >= 1);
    assert!(s.environment.is_some());
    let m = s.memory.as_ref().expect("numa_maps of this process");
    assert!(m.data_total() > 0 && m.policy.is_some(), "{m:?}");
    assert!(s.allowed_cpus.is_some());
    assert!(s.unread.is_empty(), "{:?}", s.unread);
    let child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    // Not waited for: a zombie once it has exited.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match reader.read(pid) {
            Err(ProcessError::Exited { how, .. }) => {
                assert!(how.contains("zombie"));
                break;
            }
            _ if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10))
            }
            other => panic!("{other:?}"),
        }
    }
    let mut child = child;
    child.wait().unwrap();
    assert!(matches!(
        reader.read(pid),
        Err(ProcessError::NoSuchProcess { .. })
    ));
}

/// A `stat` line of process `pid` running `comm`, started at `start`
/// ticks, its stack at `stack`.
fn stat_line(pid: u32, comm: &str, start: u64, stack: u64) -> String {
    let fields: Vec<String> = (3..=52)
        .map(|f| match f {
            3 => "S".into(),
            22 => start.to_string(),
            26 => "4096".into(),
            27 => "8192".into(),
            28 => stack.to_string(),
            _ => "0".into(),
        })
        .collect();
    format!("{pid} ({comm}) {}", fields.join(" "))
}

/// Makes `dir/environ` a FIFO and, on a thread, feeds each reading of it
/// in turn: once the reader has opened it, writes each `(file, contents)`
/// of the step into `dir` (the process changing while read), puts a new
/// FIFO in its place (a regular file holding `last` after the last step),
/// then writes `LOCAL_RANK=<step>` and closes it.
fn feed_environ(
    dir: &Path,
    steps: Vec<Vec<(&'static str, String)>>,
    last: &'static str,
) -> std::thread::JoinHandle<()> {
    let env = dir.join("environ");
    let _ = std::fs::remove_file(&env);
    nix::unistd::mkfifo(&env, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let dir = dir.to_path_buf();
    let n = steps.len();
    std::thread::spawn(move || {
        for (i, files) in steps.into_iter().enumerate() {
            let mut w = open_fifo_writer(&env);
            for (name, text) in files {
                std::fs::write(dir.join(name), text).unwrap();
            }
            let next = dir.join("environ.next");
            if i + 1 == n {
                std::fs::write(&next, last).unwrap();
            } else {
                nix::unistd::mkfifo(&next, nix::sys::stat::Mode::from_bits_truncate(0o600))
                    .unwrap();
            }
            std::fs::rename(&next, &env).unwrap();
            use std::io::Write;
            w.write_all(format!("LOCAL_RANK={i}\0").as_bytes()).unwrap();
        }
    })
}

/// Opens the FIFO `path` for writing once a reader has it open: without
/// blocking (`ENXIO` while no reader has it), so a reader that never opens
/// it fails the test after 10 s instead of hanging it; then blocking again.
fn open_fifo_writer(path: &Path) -> std::fs::File {
    use std::os::unix::fs::OpenOptionsExt;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let w = loop {
        match std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
        {
            Ok(w) => break w,
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the reader never opened environ"
                );
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            Err(e) => panic!("{}: {e}", path.display()),
        }
    };
    let flags = nix::fcntl::OFlag::from_bits_truncate(
        nix::fcntl::fcntl(&w, nix::fcntl::FcntlArg::F_GETFL).unwrap(),
    );
    nix::fcntl::fcntl(
        &w,
        nix::fcntl::FcntlArg::F_SETFL(flags - nix::fcntl::OFlag::O_NONBLOCK),
    )
    .unwrap();
    w
}

/// A `stat` read before and none after, or another user (real or
/// effective), is told apart from a process read whole.
#[test]
fn identity_changes() {
    use super::identity::{Change, Identity};
    let stat = stat_line(400, "python3", 1000, 77);
    let (stat, user) = (
        Some(stat.as_bytes()),
        Some(&b"Uid:\t1000\t1000\t1000\t1000\n"[..]),
    );
    let seen = Identity::from_files(stat, user);
    assert_eq!(seen.change(&Identity::from_files(stat, user)), Change::None);
    // Its folder there again but no `stat` to read: another process.
    assert_eq!(
        seen.change(&Identity::from_files(None, user)),
        Change::Reused
    );
    // A seteuid: the real uid the same, the effective one not.
    let euid = Some(&b"Uid:\t1000\t0\t1000\t1000\n"[..]);
    assert_eq!(
        seen.change(&Identity::from_files(stat, euid)),
        Change::Changed("user (setuid)")
    );
    // A rename (PR_SET_NAME) is seen as a change of program.
    let renamed = stat_line(400, "worker", 1000, 77);
    assert_eq!(
        seen.change(&Identity::from_files(Some(renamed.as_bytes()), user)),
        Change::Changed("program (exec or rename)")
    );
}

/// A pid given to another process while it is read is an exited process,
/// never the first one's status with the second one's memory; a process
/// that execs or changes its user while read is read again, and one that
/// keeps changing says so.
#[test]
fn a_process_that_changes_while_read_is_read_again_or_said_to_have_exited() {
    let t = dgx();
    let d = root(&[rank4_bound_right(400)]);
    let dir = d.path().join("proc/400");
    let reader = ProcReader::with_root(&t, d.path());
    let stat = |comm: &str, start: u64, stack: u64| ("stat", stat_line(400, comm, start, stack));
    std::fs::write(dir.join("stat"), stat("python3", 1000, 77).1).unwrap();
    let env_rank = |s: &ProcessSnapshot| {
        s.environment
            .as_ref()
            .and_then(|e| e.get("LOCAL_RANK"))
            .map(str::to_string)
    };

    // The pid now names a process started later.
    let feeder = feed_environ(&dir, vec![vec![stat("sleep", 2000, 78)]], "LOCAL_RANK=9\0");
    match reader.read(400) {
        Err(ProcessError::Exited { pid: 400, how }) => {
            assert!(how.contains("now names another process"), "{how}");
        }
        other => panic!("{other:?}"),
    }
    feeder.join().unwrap();
    let scan = reader.read_pids(&[400]).unwrap();
    assert!(
        scan.processes.len() == 1 && scan.exited.is_empty(),
        "{scan:?}"
    );

    // It execs while read (another command and stack): the second reading
    // is of the new program only.
    let feeder = feed_environ(&dir, vec![vec![stat("sleep", 2000, 99)]], "LOCAL_RANK=7\0");
    let s = reader.read(400).unwrap();
    feeder.join().unwrap();
    assert_eq!(env_rank(&s).as_deref(), Some("7"), "{s:?}");
    assert!(s.unread.is_empty(), "{:?}", s.unread);

    // It changes its user (setuid as root to nobody) while read.
    let status = std::fs::read_to_string(dir.join("status")).unwrap();
    let nobody = status.replace(
        "Uid:\t1000\t1000\t1000\t1000",
        "Uid:\t65534\t65534\t65534\t65534",
    );
    assert_ne!(status, nobody);
    let feeder = feed_environ(&dir, vec![vec![("status", nobody)]], "LOCAL_RANK=6\0");
    let s = reader.read(400).unwrap();
    feeder.join().unwrap();
    assert_eq!(
        (s.uid, env_rank(&s).as_deref()),
        (Some(65534), Some("6")),
        "{s:?}"
    );

    // It execs during each of three readings: the last says so.
    let steps = (0..3).map(|i| vec![stat("sh", 2000, 200 + i)]).collect();
    let feeder = feed_environ(&dir, steps, "LOCAL_RANK=5\0");
    let s = reader.read(400).unwrap();
    feeder.join().unwrap();
    assert_eq!(env_rank(&s).as_deref(), Some("2"), "{s:?}");
    let last = s.unread.last().expect("a line saying it kept changing");
    assert_eq!(last.part, "process");
    assert!(
        last.why
            .contains("program (exec or rename) changed while it was read, 3 times"),
        "{}",
        last.why
    );
}

#[test]
fn stat_identity_reads_start_time_command_and_program_addresses() {
    use crate::platform::procfs::stat_identity;
    let id = stat_identity(stat_line(7, "a) (b", 123, 456).as_bytes()).unwrap();
    assert_eq!(id.start, Some(123));
    assert_eq!(id.program, (b"a) (b".to_vec(), [4096, 8192, 456]));
    for bad in ["", "7 (x", "7 (x) S 1 2", "7 x) S"] {
        assert_eq!(stat_identity(bad.as_bytes()), None, "{bad}");
    }
}
