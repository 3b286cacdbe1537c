//! GPUs by the driver's per-GPU process lists: fake `/proc` folders (as in
//! `tests.rs`, the DGX H100 fixture) with given lists or a fake NVML.
//! Healthy ranks whose device files name every GPU; a second context; the
//! wrong GPU; host pids through `NSpid`; another PID namespace; a missing
//! `_v3`; a query that times out; a GPU whose list fails; a process NVML
//! does not list. Device files alone never warn.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::tests::{check, dgx, root, verdicts, Fake};
use super::*;
use crate::doctor::Verdict;
use crate::platform::nvml::fake::Fake as FakeNvml;
use crate::platform::nvml::{Api, List, Version};

/// The bus id of the DGX fixture's GPU `i` (`0000:18:00.0` for GPU 0).
fn bus(i: usize) -> String {
    dgx().gpus[i].pci_bus_id.clone()
}

/// A fake root whose `/proc` shows the host's PID namespace (kthreadd at
/// pid 2, as NVML's pids need).
fn host_root(procs: &[Fake]) -> tempfile::TempDir {
    let d = root(procs);
    let stat = "2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 7";
    let p = d.path().join("proc/2");
    std::fs::create_dir_all(&p).unwrap();
    std::fs::write(p.join("stat"), stat).unwrap();
    d
}

/// Lists: `(GPU index, [(host pid, MiB)])`.
fn lists(gpus: &[(usize, &[(u32, u64)])]) -> DriverLists {
    DriverLists {
        driver_version: Some("550.54.15".into()),
        gpus: gpus
            .iter()
            .map(|(i, procs)| DriverGpu {
                bus_id: Some(bus(*i)),
                gpu: None,
                minor: Some(u32::try_from(*i).unwrap()),
                processes: procs
                    .iter()
                    .map(|&(pid, mib)| DriverProcess {
                        pid,
                        used_bytes: Some(mib << 20),
                        kinds: vec![ContextKind::Compute],
                    })
                    .collect(),
                error: None,
            })
            .collect(),
        notes: Vec::new(),
    }
}

/// Reads `pids` of a fake root with `driver`, judges them.
fn pass(d: &tempfile::TempDir, driver: DriverQuery, pids: &[u32]) -> (Scan, Vec<ProcessReport>) {
    let t = dgx();
    let scan = ProcReader::with_root(&t, d.path())
        .with_driver(driver)
        .read_pids(pids)
        .unwrap();
    let reports = scan
        .processes
        .iter()
        .map(|s| judge(&t, s.clone()))
        .collect();
    (scan, reports)
}

/// A rank of GPU `rank` whose device files name all 8 GPUs, each open and
/// mapped: what the CUDA driver leaves in every CUDA process.
fn rank_with_every_device_file(pid: u32, rank: u32) -> Fake {
    let node_cpus = if rank < 4 {
        (0, "0-55")
    } else {
        (56, "56-111")
    };
    let mut f = Fake::new(pid)
        .env("LOCAL_RANK", &rank.to_string())
        .threads(&[(node_cpus.0, 4)])
        .allowed(node_cpus.1)
        .fd("/dev/nvidiactl")
        .fd("/dev/nvidia-uvm");
    for i in 0..8 {
        f = f
            .fd(&format!("/dev/nvidia{i}"))
            .map(&format!("/dev/nvidia{i}"));
    }
    f
}

#[test]
fn a_healthy_rank_is_ok_by_nvml_whatever_its_device_files() {
    let d = host_root(&[rank_with_every_device_file(500, 1)]);
    let l = lists(&[(0, &[]), (1, &[(500, 522)])]);
    // Given as NVML prints bus ids: normalised by the pass.
    let mut l = l;
    l.gpus[1].bus_id = Some(format!("0000{}", bus(1).to_ascii_uppercase()));
    let (scan, r) = pass(&d, DriverQuery::given(l), &[500]);
    assert_eq!(scan.driver.asked, "given");
    assert!(scan.driver.host_pids);
    assert_eq!(scan.driver.unavailable, None);
    let a = &r[0].snapshot.attribution;
    assert_eq!(a.source, GpuSource::Nvml);
    assert_eq!(a.contexts.len(), 1);
    assert_eq!(
        (a.contexts[0].gpu, a.contexts[0].used_bytes),
        (Some(crate::GpuIndex(1)), Some(522 << 20))
    );
    let g = check(&r[0], "gpu");
    assert_eq!(g.verdict, Verdict::Ok, "{g:?}");
    assert_eq!(
        g.evidence,
        "GPU 1 (0000:2a:00.0, node 0), chosen by local rank 1 from LOCAL_RANK (CUDA device = local rank); NVML lists it on GPU 1 (522 MiB)"
    );
    assert!(
        r[0].facts.iter().any(|f| f.starts_with(
            "GPUs: NVML lists it on GPU 1 (522 MiB); device files: GPU 0 (0000:18:00.0) open and mapped, "
        )),
        "{:?}",
        r[0].facts
    );
    // The lists' GPUs are matched to the topology's by bus id.
    let gl = scan.driver.lists.as_ref().unwrap();
    assert_eq!(gl.gpus[1].gpu, Some(crate::GpuIndex(1)));
    assert_eq!(gl.gpus[1].bus_id.as_deref(), Some("0000:2a:00.0"));
    // The same rank without NVML: ok too, in words saying approximate.
    let (_, r) = pass(&d, DriverQuery::off(), &[500]);
    let g = check(&r[0], "gpu");
    assert_eq!(g.verdict, Verdict::Ok, "{g:?}");
    assert!(
        g.evidence.contains("it has GPU 0-7 mapped (device files, approximate: the CUDA driver opens and maps every GPU it can see; NVML not asked)"),
        "{}",
        g.evidence
    );
    assert_eq!(r[0].snapshot.attribution.source, GpuSource::DeviceFiles);
}

#[test]
fn a_second_context_warns_with_the_memory_on_each_gpu() {
    let d = host_root(&[rank_with_every_device_file(501, 1)]);
    let l = lists(&[(0, &[(501, 500)]), (1, &[(501, 2048)])]);
    let (_, r) = pass(&d, DriverQuery::given(l), &[501]);
    let g = check(&r[0], "gpu");
    assert_eq!(g.verdict, Verdict::Warn, "{g:?}");
    assert!(
        g.evidence.ends_with("NVML lists it on GPU 0 (500 MiB), GPU 1 (2 GiB): GPU 0 as well, not its rank's (a CUDA context there: a tensor or call on the wrong device before `torch.cuda.set_device`)"),
        "{}",
        g.evidence
    );
    assert!(g
        .fix
        .as_deref()
        .unwrap()
        .contains("torch.cuda.set_device(local_rank)"));
}

#[test]
fn the_wrong_gpu_fails_by_nvml_and_is_not_judged_by_device_files() {
    // Rank 4 working on GPU 0 alone: set_device never called.
    let p = Fake::new(502)
        .env("LOCAL_RANK", "4")
        .threads(&[(56, 1)])
        .allowed("56-111")
        .fd("/dev/nvidia0")
        .map("/dev/nvidia0");
    let d = host_root(&[p]);
    let (_, r) = pass(&d, DriverQuery::given(lists(&[(0, &[(502, 700)])])), &[502]);
    let g = check(&r[0], "gpu");
    assert_eq!(g.verdict, Verdict::Fail, "{g:?}");
    assert!(
        g.evidence
            .ends_with("NVML lists it on GPU 0 (700 MiB): not its rank's GPU"),
        "{}",
        g.evidence
    );
    let (_, r) = pass(&d, DriverQuery::off(), &[502]);
    assert_eq!(check(&r[0], "gpu").verdict, Verdict::Skip);
    assert_eq!(r[0].verdict(), Verdict::Ok, "{:#?}", r[0].checks);
}

#[test]
fn host_pids_are_matched_through_nspid() {
    // A rank in a container: pid 6001 here (the host's view), 7 inside.
    let p = rank_with_every_device_file(6001, 2).nspid("6001\t7");
    // Another container's process whose own pid, 6001's inner 7, NVML
    // could never report (NVML speaks host pids only).
    let q = rank_with_every_device_file(6002, 3).nspid("6002\t7");
    let d = host_root(&[p, q]);
    let l = lists(&[(2, &[(6001, 900), (7, 1)]), (3, &[])]);
    let (scan, r) = pass(&d, DriverQuery::given(l), &[6001, 6002]);
    assert_eq!(r[0].snapshot.nspid, [6001, 7]);
    assert_eq!(r[0].snapshot.attribution.source, GpuSource::Nvml);
    assert_eq!(check(&r[0], "gpu").verdict, Verdict::Ok);
    // 7 is no host pid of a process read: not 6002's, listed as not read.
    assert_eq!(r[1].snapshot.attribution.source, GpuSource::DeviceFiles);
    assert_eq!(scan.driver.not_read, [7]);
}

#[test]
fn another_pid_namespace_falls_back_to_device_files() {
    // No kthreadd: a container's own /proc, whose pids are not NVML's.
    let d = root(&[rank_with_every_device_file(503, 1)]);
    let (scan, r) = pass(&d, DriverQuery::given(lists(&[(1, &[(503, 100)])])), &[503]);
    assert!(!scan.driver.host_pids);
    assert_eq!(scan.driver.lists, None);
    let why = scan.driver.unavailable.as_deref().unwrap();
    assert!(
        why.starts_with("this /proc shows a PID namespace other than the host's"),
        "{why}"
    );
    let a = &r[0].snapshot.attribution;
    assert_eq!(a.source, GpuSource::DeviceFiles);
    assert_eq!(
        a.approximate.as_deref(),
        Some("this /proc's pids are not the host's, which NVML's are")
    );
    assert_eq!(check(&r[0], "gpu").verdict, Verdict::Ok);
    assert!(r[0].facts.iter().any(|f| f.starts_with(
        "GPUs (device files, approximate: this /proc's pids are not the host's, which NVML's are): GPU 0"
    )));
    // NVML itself is not asked there: the fake would block if it were.
    let gate = Arc::new((Mutex::new(true), Condvar::new()));
    let nvml = Arc::new(gated(fake_nvml(&[(1, &[(503, 100)])]), &gate));
    let t = Instant::now();
    let (scan, _) = pass(
        &d,
        DriverQuery::fake(nvml.clone(), Duration::from_secs(30)),
        &[503],
    );
    assert!(t.elapsed() < Duration::from_secs(10));
    assert_eq!(scan.driver.asked, "nvml");
    assert_eq!(nvml.calls.load(Ordering::SeqCst), 0);
}

#[test]
fn a_process_nvml_does_not_list_is_by_device_files() {
    // A DataLoader worker: forked by rank 1 after CUDA started, it holds
    // its parent's device files and LOCAL_RANK, and no context at all.
    let worker = rank_with_every_device_file(505, 1);
    let d = host_root(&[rank_with_every_device_file(504, 1), worker]);
    let (scan, r) = pass(
        &d,
        DriverQuery::given(lists(&[(1, &[(504, 800)])])),
        &[504, 505],
    );
    assert_eq!(r[0].snapshot.attribution.source, GpuSource::Nvml);
    let a = &r[1].snapshot.attribution;
    assert_eq!(a.source, GpuSource::DeviceFiles);
    assert!(
        a.approximate
            .as_deref()
            .unwrap()
            .starts_with("NVML lists no context of it on any GPU"),
        "{a:?}"
    );
    assert_eq!(check(&r[1], "gpu").verdict, Verdict::Ok);
    assert!(scan.driver.not_read.is_empty());
}

#[test]
fn without_a_rank_nvml_chooses_the_gpu_and_may_warn() {
    let one = Fake::new(506)
        .threads(&[(0, 1)])
        .fd("/dev/nvidia0")
        .fd("/dev/nvidia3")
        .map("/dev/nvidia0")
        .map("/dev/nvidia3");
    let two = Fake::new(507)
        .threads(&[(0, 1)])
        .map("/dev/nvidia0")
        .map("/dev/nvidia7");
    let d = host_root(&[one, two]);
    let l = lists(&[(0, &[(507, 10)]), (3, &[(506, 10)]), (7, &[(507, 10)])]);
    let (_, r) = pass(&d, DriverQuery::given(l), &[506, 507]);
    let e = r[0].expected.as_ref().unwrap();
    assert_eq!(e.gpus, [crate::GpuIndex(3)]);
    assert!(
        e.how
            .ends_with(": the only GPU NVML lists it on; no launcher rank variable"),
        "{}",
        e.how
    );
    assert_eq!(check(&r[0], "gpu").verdict, Verdict::Ok);
    // Two GPUs on two nodes by NVML: a warning (device files: skip).
    let g = check(&r[1], "gpu");
    assert_eq!(g.verdict, Verdict::Warn, "{g:?}");
    assert!(g
        .evidence
        .contains("on nodes 0-1: one process cannot be near all of them"));
}

#[test]
fn a_gpu_nvml_lists_that_the_description_lacks() {
    let d = host_root(&[rank_with_every_device_file(508, 0)]);
    let mut l = lists(&[(0, &[(508, 64)])]);
    l.gpus.push(DriverGpu {
        bus_id: Some("0000:f1:00.0".into()),
        processes: vec![DriverProcess {
            pid: 508,
            used_bytes: None,
            kinds: vec![ContextKind::Graphics],
        }],
        ..DriverGpu::default()
    });
    let (_, r) = pass(&d, DriverQuery::given(l), &[508]);
    let g = check(&r[0], "gpu");
    assert_eq!(g.verdict, Verdict::Ok, "{g:?}");
    assert!(
        g.evidence.ends_with("NVML lists it on GPU 0 (64 MiB), 0000:f1:00.0 (not a GPU of the description) (memory not given)"),
        "{}",
        g.evidence
    );
}

/// A fake NVML over the DGX fixture's GPUs `(index, compute [(pid, MiB)])`,
/// whose bus ids it prints as NVML does (8-digit domain, upper case).
fn fake_nvml(gpus: &[(usize, &[(u32, u64)])]) -> FakeNvml {
    FakeNvml::new(
        gpus.iter()
            .map(|(i, procs)| {
                let bus = format!("0000{}", bus(*i).to_ascii_uppercase());
                let procs = procs.iter().map(|&(p, mib)| (p, mib << 20)).collect();
                (bus, procs, Vec::new())
            })
            .collect(),
    )
}

fn gated(mut f: FakeNvml, gate: &Arc<(Mutex<bool>, Condvar)>) -> FakeNvml {
    f.gate = Some(Arc::clone(gate));
    f
}

#[test]
fn nvml_without_v3_is_read_through_v2() {
    let d = host_root(&[rank_with_every_device_file(509, 1)]);
    let mut f = fake_nvml(&[(0, &[]), (1, &[(509, 300)])]);
    f.version = "470.161.03";
    f.missing = List::ALL.map(|l| (l, Version::V3)).to_vec();
    let (scan, r) = pass(
        &d,
        DriverQuery::fake(Arc::new(f), Duration::from_secs(30)),
        &[509],
    );
    let l = scan.driver.lists.as_ref().unwrap();
    assert_eq!(l.driver_version.as_deref(), Some("470.161.03"));
    assert!(
        l.notes.iter().any(|n| n.contains("_v3 is missing")),
        "{:?}",
        l.notes
    );
    // NVML's "00000000:2A:00.0" is the topology's 0000:2a:00.0.
    assert_eq!(l.gpus[1].bus_id.as_deref(), Some("0000:2a:00.0"));
    assert_eq!(l.gpus[1].gpu, Some(crate::GpuIndex(1)));
    assert_eq!(r[0].snapshot.attribution.source, GpuSource::Nvml);
    assert_eq!(check(&r[0], "gpu").verdict, Verdict::Ok);
}

#[test]
fn a_query_that_blocks_is_given_up_and_reported() {
    let d = host_root(&[rank_with_every_device_file(510, 1)]);
    let gate = Arc::new((Mutex::new(true), Condvar::new()));
    let nvml: Arc<dyn Api> = Arc::new(gated(fake_nvml(&[(1, &[(510, 300)])]), &gate));
    let q = DriverQuery::fake(nvml, Duration::from_millis(200));
    let t = Instant::now();
    let (scan, r) = pass(&d, q.clone(), &[510]);
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    let why = scan.driver.unavailable.as_deref().unwrap();
    assert!(why.starts_with("NVML: no answer within 0.2 s"), "{why}");
    assert_eq!(
        r[0].snapshot.attribution.approximate.as_deref(),
        Some("NVML gave no answer within 0.2 s")
    );
    assert_eq!(check(&r[0], "gpu").verdict, Verdict::Ok);
    // The next pass (a --watch) does not start a second query beside it.
    let (scan, _) = pass(&d, q.clone(), &[510]);
    let why = scan.driver.unavailable.as_deref().unwrap();
    assert!(why.contains("has not returned yet"), "{why}");
    // Released, it answers again.
    *gate.0.lock().unwrap() = false;
    gate.1.notify_all();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (scan, r) = pass(&d, q.clone(), &[510]);
        if scan.driver.lists.is_some() {
            assert_eq!(r[0].snapshot.attribution.source, GpuSource::Nvml);
            break;
        }
        assert!(Instant::now() < deadline, "{:?}", scan.driver);
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_gpu_whose_list_fails_leaves_its_processes_to_device_files() {
    // 511 has GPU 2's file, whose list NVML refuses; 512 only GPU 1's.
    let p = Fake::new(511)
        .env("LOCAL_RANK", "2")
        .fd("/dev/nvidia2")
        .map("/dev/nvidia2");
    let q = Fake::new(512)
        .env("LOCAL_RANK", "1")
        .fd("/dev/nvidia1")
        .map("/dev/nvidia1");
    let d = host_root(&[p, q]);
    let mut f = fake_nvml(&[(1, &[(512, 10)]), (2, &[(511, 10)])]);
    f.fail = Some((1, List::Compute, 4));
    let (scan, r) = pass(
        &d,
        DriverQuery::fake(Arc::new(f), Duration::from_secs(30)),
        &[511, 512],
    );
    let l = scan.driver.lists.as_ref().unwrap();
    assert_eq!(
        l.gpus[1].error.as_deref(),
        Some("nvmlDeviceGetComputeRunningProcesses_v3 failed: NVML_ERROR_NO_PERMISSION (Insufficient Permissions)")
    );
    let a = &r[0].snapshot.attribution;
    assert_eq!(a.source, GpuSource::DeviceFiles);
    assert_eq!(
        a.approximate.as_deref(),
        Some("NVML could not list GPU 2 (0000:3a:00.0)'s processes: nvmlDeviceGetComputeRunningProcesses_v3 failed: NVML_ERROR_NO_PERMISSION (Insufficient Permissions)")
    );
    assert_eq!(r[1].snapshot.attribution.source, GpuSource::Nvml);
    assert_eq!(verdicts(&r[1])[0], ("gpu", Verdict::Ok));
}

/// Without NVML on this machine (or with it), a live pass never fails for
/// want of it: device files, and the reason.
#[test]
fn the_live_driver_answers_or_says_why() {
    let t = dgx();
    let me = std::process::id();
    let scan = ProcReader::new(&t)
        .with_driver(DriverQuery::nvml(Duration::from_secs(20)))
        .read_pids(&[me])
        .unwrap();
    let d = &scan.driver;
    assert_eq!(d.asked, "nvml");
    assert!(d.lists.is_some() != d.unavailable.is_some(), "{d:?}");
    let a = &scan.processes[0].attribution;
    assert_eq!(a.source == GpuSource::DeviceFiles, a.approximate.is_some());
}

#[test]
fn nvml_asks_as_many_gpus_as_a_topology_holds() {
    assert_eq!(
        crate::platform::nvml::MAX_GPUS as usize,
        crate::topology::limits::MAX_GPUS
    );
}
