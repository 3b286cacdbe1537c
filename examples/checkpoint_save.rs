//! A training loop that checkpoints asynchronously: every few steps the
//! weights are copied (at the device-to-host link's rate) into a pinned
//! staging buffer on the GPU's node, made once, and a thread writes that
//! copy to a safetensors file with numapin's writer while the training
//! goes on; the next checkpoint waits for the last write first.
//!
//! ```sh
//! cargo run --release --example checkpoint_save                # GPU 0, or host mode without a GPU
//! cargo run --release --example checkpoint_save -- /data/ckpt  # where the files go
//! ```
//!
//! The "model" is one buffer of f32 weights (device memory on a GPU, a
//! host vector without one) that each step changes.
// Made-up weights from small counters, as f32.
#![allow(clippy::cast_precision_loss)]
#![allow(clippy::unwrap_used)] // tests and examples fail loudly

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use numapin::storage::safetensors::{self, Checkpoint, Dtype, SaveOptions, SaveTensor};
use numapin::storage::write::Data;
use numapin::storage::DeviceMemory;
use numapin::topology::ProbeOptions;
use numapin::{CudaOrdinal, PinnedBuf, Runtime, RuntimeConfig, Target, Topology};

const WEIGHTS: usize = 64 << 20; // bytes
const STEPS: u32 = 12;
const EVERY: u32 = 4;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("checkpoint_save: {}", numapin::error::with_causes(&e));
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

/// The weights: on the GPU when there is one.
enum Model {
    Device(DeviceMemory),
    Host(Vec<u8>),
}

impl Model {
    /// One "training step": new weights (written from the host here; a
    /// real step runs kernels).
    fn step(&mut self, rt: &Runtime, gpu: CudaOrdinal, k: u32) -> numapin::Result<()> {
        let w: Vec<u8> = (0..WEIGHTS / 4)
            .flat_map(|i| ((i as f32) * 1e-3 + k as f32).to_le_bytes())
            .collect();
        match self {
            Model::Host(v) => v.copy_from_slice(&w),
            Model::Device(m) => numapin::staged::copy_to_device(rt, &w, m.ptr(), gpu)?,
        }
        Ok(())
    }

    /// Copies the weights into `staging` (the stall: the training waits
    /// for this copy only).
    fn stage(&self, staging: &mut PinnedBuf) -> numapin::Result<()> {
        match self {
            Model::Host(v) => staging[..WEIGHTS].copy_from_slice(v),
            Model::Device(m) => m.read_back(0, &mut staging[..WEIGHTS])?,
        }
        Ok(())
    }
}

fn run() -> numapin::Result<()> {
    let dir = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "/tmp/numapin-example-ckpt".into()),
    );
    std::fs::create_dir_all(&dir).unwrap();
    let topo = Topology::probe(&ProbeOptions::from_process())?;
    let gpu = CudaOrdinal(0);
    let have_gpu = topo.gpu_by_ordinal(gpu).is_some();
    let rt = Runtime::new(topo, RuntimeConfig::default())?;
    let target = if have_gpu {
        Target::Gpu(gpu)
    } else {
        Target::Host
    };
    let mut model = if have_gpu {
        Model::Device(DeviceMemory::new(gpu, WEIGHTS)?)
    } else {
        Model::Host(vec![0u8; WEIGHTS])
    };
    // Made once, on the GPU's node, counted in its budget.
    let opts = numapin::AllocOptions::default().with_staging(true);
    let mut staging = Some(rt.alloc_with(target, WEIGHTS, &opts)?);
    std::thread::scope(|s| -> numapin::Result<()> {
        let mut writing: Option<
            std::thread::ScopedJoinHandle<'_, (PinnedBuf, numapin::Result<f64>)>,
        > = None;
        for k in 1..=STEPS {
            model.step(&rt, gpu, k)?;
            if k % EVERY != 0 {
                continue;
            }
            // The last checkpoint's write must be done with the buffer.
            let mut buf = match writing.take() {
                Some(h) => {
                    let (buf, r) = h.join().unwrap();
                    println!("  written in {:.2} s", r?);
                    buf
                }
                None => staging.take().unwrap(),
            };
            let t0 = Instant::now();
            model.stage(&mut buf)?;
            println!(
                "step {k}: staged {} MiB in {:.1} ms; writing on a thread",
                WEIGHTS >> 20,
                t0.elapsed().as_secs_f64() * 1e3
            );
            let (rt, path) = (&rt, dir.join(format!("step-{k:04}.safetensors")));
            writing = Some(s.spawn(move || {
                let t0 = Instant::now();
                let t = [SaveTensor::new(
                    "weights",
                    Dtype::F32,
                    vec![WEIGHTS / 4],
                    Data::Host(&buf[..WEIGHTS]),
                )];
                let r = safetensors::save(rt, &path, &t, target, &SaveOptions::default());
                let r = r
                    .map(|_| t0.elapsed().as_secs_f64())
                    .map_err(numapin::Error::from);
                (buf, r)
            }));
        }
        if let Some(h) = writing.take() {
            let (_, r) = h.join().unwrap();
            println!("  written in {:.2} s", r?);
        }
        Ok(())
    })?;
    // The last checkpoint loads back as it was written.
    let last = dir.join(format!("step-{:04}.safetensors", STEPS / EVERY * EVERY));
    let ck = Checkpoint::open(&last)?;
    println!(
        "{}: {:?}",
        last.display(),
        ck.tensors()
            .iter()
            .map(|t| (&t.name, t.dtype, &t.shape))
            .collect::<Vec<_>>()
    );
    Ok(())
}
