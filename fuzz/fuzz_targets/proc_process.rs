#![no_main]
//! A fake `/proc/<pid>` made of the input (`numapin ps`'s reader, with the
//! judge on top): `status` (with `NSpid`), a thread's `stat`, `environ`,
//! `numa_maps`, `maps`, a numapin stats memfd, pid 2's `stat` (whether the
//! `/proc` shows the host's pids) and the driver's per-GPU process lists
//! (9-byte records: GPU, pid, MiB), split at 0xff bytes. Reading,
//! attributing GPUs and judging never panic, what is read stays within the
//! reader's limits, and a process is attributed to NVML only where the
//! lists name it on a GPU.
use libfuzzer_sys::fuzz_target;
use numapin::procs::{
    judge, node_use, ContextKind, DriverGpu, DriverLists, DriverProcess, DriverQuery, GpuSource,
    ProcReader, ReadLimits,
};
use numapin::topology::{ProbeOptions, Topology};

fn topology() -> &'static Topology {
    static T: std::sync::OnceLock<Topology> = std::sync::OnceLock::new();
    T.get_or_init(|| {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../topology/dgx-h100.xml");
        Topology::load(&p, &ProbeOptions::default()).expect("the fixture loads")
    })
}

/// Lists of records `[gpu, pid (4 bytes), MiB (4 bytes)]`: GPU `g % 9` is
/// the fixture's GPU `g` (its bus id), 8 one it lacks; pid 0 stands for 42.
fn lists(bytes: &[u8]) -> DriverLists {
    let mut gpus: Vec<DriverGpu> = topology()
        .gpus
        .iter()
        .map(|g| g.pci_bus_id.clone())
        .chain(["0000:f1:00.0".to_string()])
        .map(|b| DriverGpu {
            bus_id: Some(b),
            ..DriverGpu::default()
        })
        .collect();
    let n = gpus.len();
    for r in bytes.chunks_exact(9) {
        let pid = u32::from_le_bytes([r[1], r[2], r[3], r[4]]);
        let mib = u32::from_le_bytes([r[5], r[6], r[7], r[8]]);
        gpus[usize::from(r[0]) % n].processes.push(DriverProcess {
            pid: if pid == 0 { 42 } else { pid },
            used_bytes: (mib != u32::MAX).then(|| u64::from(mib) << 20),
            kinds: vec![ContextKind::Compute],
        });
    }
    DriverLists {
        gpus,
        ..DriverLists::default()
    }
}

fuzz_target!(|data: &[u8]| {
    let mut parts = data.split(|&b| b == 0xff);
    let mut next = || parts.next().unwrap_or_default();
    let d = tempfile::tempdir().expect("a temporary folder");
    let dir = d.path().join("proc/42");
    std::fs::create_dir_all(dir.join("task/42")).unwrap();
    std::fs::create_dir_all(dir.join("fd")).unwrap();
    std::fs::write(dir.join("status"), next()).unwrap();
    std::fs::write(dir.join("task/42/stat"), next()).unwrap();
    std::fs::write(dir.join("environ"), next()).unwrap();
    std::fs::write(dir.join("numa_maps"), next()).unwrap();
    std::fs::write(dir.join("maps"), next()).unwrap();
    let memfd = d.path().join("memfd:numapin-stats (deleted)");
    std::fs::write(&memfd, next()).unwrap();
    std::os::unix::fs::symlink(&memfd, dir.join("fd/3")).unwrap();
    std::os::unix::fs::symlink("/dev/nvidia4", dir.join("fd/4")).unwrap();
    std::fs::create_dir_all(d.path().join("proc/2")).unwrap();
    std::fs::write(d.path().join("proc/2/stat"), next()).unwrap();
    let lists = lists(next());
    let limits = ReadLimits::default()
        .with_max_map_lines(1000)
        .with_max_line_bytes(4096)
        .with_max_environ_bytes(1 << 16);
    let t = topology();
    let reader = ProcReader::with_root(t, d.path())
        .with_limits(limits)
        .with_driver(DriverQuery::given(lists.clone()));
    let Ok(scan) = reader.read_pids(&[42]) else {
        return;
    };
    for s in scan.processes {
        assert!(s.threads.count <= 1);
        if let Some(m) = &s.memory {
            assert!(m.vmas <= 1000);
        }
        let host = s.nspid.first().copied().unwrap_or(s.pid);
        let listed = lists
            .gpus
            .iter()
            .any(|g| g.processes.iter().any(|p| p.pid == host));
        if s.attribution.source == GpuSource::Nvml {
            assert!(listed && scan.driver.host_pids);
        }
        let r = judge(t, s);
        let _ = node_use(t, std::slice::from_ref(&r));
    }
});
