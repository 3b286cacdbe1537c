//! `numapin ps`'s pass over 1,000 processes (the goal: under 1 s).
//!
//! Starts 1,000 sleeping children (`sleep 600`, killed and reaped at the
//! end), then measures, against the DGX H100 fixture (8 GPUs, 2 nodes):
//!
//! * `scan_1000`: one pass over `/proc` looking for processes with a GPU
//!   open (`numapin ps` without `--pid`): every process's descriptors.
//! * `read_1000`: every child read whole, not judged.
//! * `read_and_judge_1000`: every child read whole (status, threads,
//!   descriptors, mappings, environment, `numa_maps`) and judged, with the
//!   node summary: `numapin ps --pid` of all 1,000.
//!
//! `cargo bench --bench process`; results are recorded in docs/BENCHMARKS.md.
#![allow(clippy::unwrap_used)] // tests and examples fail loudly

use std::hint::black_box;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use numapin::procs::{judge, node_use, ProcReader};
use numapin::topology::{ProbeOptions, Topology};

const PROCESSES: usize = 1000;

/// The children, killed and reaped when dropped.
struct Sleepers(Vec<Child>);

impl Sleepers {
    fn start(n: usize) -> Self {
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            let c = Command::new("sleep")
                .arg("600")
                .env("LOCAL_RANK", "4")
                .stdin(Stdio::null())
                .spawn()
                .expect("start sleep");
            v.push(c);
        }
        Self(v)
    }

    fn pids(&self) -> Vec<u32> {
        self.0.iter().map(Child::id).collect()
    }
}

impl Drop for Sleepers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
        }
        for c in &mut self.0 {
            let _ = c.wait();
        }
    }
}

fn pass(c: &mut Criterion) {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("topology/dgx-h100.xml");
    let topo = Topology::load(&p, &ProbeOptions::default()).unwrap();
    let sleepers = Sleepers::start(PROCESSES);
    let pids = sleepers.pids();
    // Let every child reach its sleep (past exec).
    std::thread::sleep(Duration::from_millis(500));
    let mut g = c.benchmark_group("ps_pass");
    g.sample_size(10).measurement_time(Duration::from_secs(10));
    g.bench_function("scan_1000", |b| {
        b.iter(|| {
            let reader = ProcReader::new(&topo);
            let s = reader.scan().unwrap();
            assert!(s.looked_at >= PROCESSES);
            black_box(s)
        })
    });
    g.bench_function("read_1000", |b| {
        b.iter(|| black_box(ProcReader::new(&topo).read_pids(&pids).unwrap()))
    });
    g.bench_function("read_and_judge_1000", |b| {
        b.iter(|| {
            let reader = ProcReader::new(&topo);
            let s = reader.read_pids(&pids).unwrap();
            assert_eq!(s.processes.len(), PROCESSES);
            let reports: Vec<_> = s.processes.into_iter().map(|p| judge(&topo, p)).collect();
            black_box(node_use(&topo, &reports))
        })
    });
    g.finish();
    drop(sleepers);
}

criterion_group!(benches, pass);
criterion_main!(benches);
