//! How a trainer embeds numapin: probe the machine, bind this rank near its
//! GPU, make a runtime of pinned arenas, and feed the GPU from a loader whose
//! workers run on the GPU's own socket.
//!
//! ```sh
//! cargo run --release --example trainer            # GPU 0, or host mode without a GPU
//! LOCAL_RANK=1 cargo run --release --example trainer
//! ```
//!
//! The "model" here is a checksum of each batch: on a GPU the batch is
//! already in device memory when it arrives (a real trainer launches its
//! step on its own stream after `batch.wait_on(stream)`); without one the
//! loader delivers pinned host batches.
// A batch's index as its fill byte: the low bits are the point.
#![allow(clippy::cast_possible_truncation)]
#![allow(clippy::unwrap_used)] // tests and examples fail loudly

use std::process::ExitCode;

use numapin::affinity::launcher;
use numapin::topology::ProbeOptions;
use numapin::{CudaOrdinal, Loader, LoaderConfig, Runtime, RuntimeConfig, Target, Topology};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // What went wrong, each cause, and what to do.
            eprintln!("trainer: {}", numapin::error::with_causes(&e));
            if let Some(fix) = e.fix() {
                eprintln!("  fix: {fix}");
            }
            ExitCode::from(if e.kind() == numapin::ErrorKind::Input {
                2
            } else {
                1
            })
        }
    }
}

fn run() -> numapin::Result<()> {
    // 1. Which GPU hangs off which socket, as this process sees it.
    let topo = Topology::probe(&ProbeOptions::from_process())?;
    let rank = launcher::local_rank()?.map_or(0, |r| r.rank);
    let gpu = CudaOrdinal(rank);
    let have_gpu = topo.gpu_by_ordinal(gpu).is_some();

    // 2. Pinned arenas, one per node, with a budget this job can afford.
    let config = RuntimeConfig::default().with_budget_bytes(Some(1 << 30));
    let rt = Runtime::new(topo, config)?;

    // 3. This process near its GPU: every thread and the memory policy
    //    (what `numapin exec` does for launchers that run a wrapper).
    if have_gpu {
        let site = rt.bind_current_process(Target::Gpu(gpu))?;
        let bus = site
            .gpu
            .and_then(|g| rt.topology().gpu(g))
            .map_or("?", |g| g.pci_bus_id.as_str());
        println!(
            "rank {rank}: GPU {gpu} ({bus}), CPUs {}, memory node {}",
            site.cpus, site.node
        );
        for w in &site.warnings {
            eprintln!("trainer: warning: {w}");
        }
    } else {
        println!("rank {rank}: no CUDA device {gpu}: host-mode loader on this node");
    }

    // 4. A loader: workers on the GPU's CPUs fill pinned slots on its node;
    //    a copy engine moves each batch to the GPU behind the compute.
    let target = if have_gpu {
        Target::Gpu(gpu)
    } else {
        Target::Host
    };
    let batches = 64;
    let config = LoaderConfig::new(4 << 20).with_total_batches(Some(batches));
    let loader = Loader::new(&rt, target, config, |index, slot: &mut [u8]| {
        // A real producer decodes samples into the slot.
        slot.fill(index as u8);
        Ok::<usize, std::io::Error>(slot.len())
    })?;
    for w in loader.warnings() {
        eprintln!("trainer: warning: {w}");
    }

    // 5. The training loop.
    let mut seen = 0u64;
    for batch in &loader {
        let batch = batch?;
        match batch.host_bytes() {
            // Host mode: the batch is pinned host memory.
            Some(bytes) => assert!(bytes.iter().all(|&b| b == batch.index() as u8)),
            // GPU mode: wait on the device, never on the host, in a real
            // step (`unsafe { batch.wait_on(stream) }`); here, block.
            None => batch.synchronize()?,
        }
        seen += 1;
    }
    let stats = rt.stats();
    println!(
        "{seen} batches of 4 MiB; pinned on node(s) {:?}; loader held at most {} pinned bytes",
        stats.iter().map(|s| s.node).collect::<Vec<_>>(),
        loader.memory_bound().pinned_bytes
    );
    Ok(())
}
