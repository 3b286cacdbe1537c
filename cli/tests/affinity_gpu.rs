//! `numapin exec` on a machine with CUDA GPUs: each local rank lands on its
//! GPU's NUMA node. Run with `cargo test --release -- --ignored` there.
#![allow(clippy::unwrap_used)] // tests and examples fail loudly

#[path = "../../tests/common/mod.rs"]
mod common;

use std::process::Command;

use numapin::affinity::{launcher, plan, Mode, PlanOptions};
use numapin::topology::{ProbeOptions, Topology};
use numapin::CpuList;

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on a GPU machine"]
fn every_local_rank_binds_near_its_gpu() {
    if !numapin::gpu::available() {
        common::skip(common::Need::Gpu, "no CUDA driver or GPU here");
        return;
    }
    let t = Topology::probe(&ProbeOptions::from_process()).unwrap();
    if launcher::one_visible_gpu(&t) {
        eprintln!("skipped: CUDA_VISIBLE_DEVICES names one GPU; unset it to check every rank");
        return;
    }
    let gpus = launcher::rank_gpus(&t);
    assert!(
        !gpus.is_empty(),
        "the driver is there but numapin sees no GPU"
    );
    let p = plan(&t, &gpus, Mode::Node, &PlanOptions::default()).unwrap();
    for (rank, r) in p.ranks.iter().enumerate() {
        let g = &t.gpus[r.gpu.unwrap().as_usize()];
        if let Some(n) = g.numa_node {
            assert!(
                r.cpus.is_subset(&t.node(n).unwrap().cpus),
                "rank {rank}: {r:?}"
            );
        }
        let o = Command::new(env!("CARGO_BIN_EXE_numapin"))
            .args(["exec", "--", "cat", "/proc/self/status"])
            .env("LOCAL_RANK", rank.to_string())
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "rank {rank}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let text = String::from_utf8_lossy(&o.stdout);
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .unwrap();
        assert_eq!(
            CpuList::parse(line).unwrap(),
            r.cpus,
            "rank {rank} on GPU {} ({})",
            g.index,
            g.pci_bus_id
        );
    }
}
