#![no_main]
//! A fake `/proc/<pid>` made of the input (`numapin ps`'s reader, with the
//! judge on top): `status`, a thread's `stat`, `environ`, `numa_maps`,
//! `maps` and a numapin stats memfd, split at 0xff bytes. Reading and
//! judging never panic, and what is read stays within the reader's limits.
use libfuzzer_sys::fuzz_target;
use numapin::procs::{judge, node_use, ProcReader, ReadLimits};
use numapin::topology::{ProbeOptions, Topology};

fn topology() -> &'static Topology {
    static T: std::sync::OnceLock<Topology> = std::sync::OnceLock::new();
    T.get_or_init(|| {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../topology/dgx-h100.xml");
        Topology::load(&p, &ProbeOptions::default()).expect("the fixture loads")
    })
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
    let limits = ReadLimits::default()
        .with_max_map_lines(1000)
        .with_max_line_bytes(4096)
        .with_max_environ_bytes(1 << 16);
    let t = topology();
    if let Ok(s) = ProcReader::with_root(t, d.path()).with_limits(limits).read(42) {
        assert!(s.threads.count <= 1);
        if let Some(m) = &s.memory {
            assert!(m.vmas <= 1000);
        }
        let r = judge(t, s);
        let _ = node_use(t, std::slice::from_ref(&r));
    }
});
