//! How fast numapin's writer saves from host memory, against the drive's
//! own best sequential `O_DIRECT` write rate measured in the same run: the
//! measurements behind the writer's design (docs/storage.md "How a write
//! goes"; figures in docs/BENCHMARKS.md).
//!
//! ```text
//! cargo run --release --example storage_write -- [--dir /tmp/numapin-write]
//!     [--size 1G] [--reps 3] [--threads 0[,8..]] [--chunk 8M[,16M..]]
//!     [--slots 2] [--no-fsync] [--replace] [--drive basic|variants|none]
//!     [--drive-only]
//! ```
//!
//! The drive: one fresh file per figure, written sequentially with
//! `O_DIRECT` by 1, 4 or 8 threads in 8 or 16 MiB writes, synced at the
//! end, time split into writing and syncing. `--drive variants` adds the
//! ways the writer could make its file, each written as the writer writes
//! (4 threads, 8 MiB): space reserved first (`fallocate`), reserved
//! without changing the size (`FALLOC_FL_KEEP_SIZE`), only the size set
//! (`ftruncate`) or nothing (writes extend the file), synced with `fsync`
//! or `fdatasync`. The writer: `--size` bytes of host memory written by
//! `numapin::storage::write::write_file` (crash-safe: temporary file,
//! fsync, rename, folder fsync), for each `--threads` x `--chunk` given,
//! with the report's sync time, each save to a path that does not exist
//! (its file removed before the next); `--replace` adds each setting
//! again saving over its own last file (as a trainer that saves to one
//! path): the rename then frees the old file's blocks.
//!
//! Every figure is taken once per rep, in an order that rotates rep by
//! rep, so that a drive whose rate drifts (a shared or virtual disk)
//! drifts for all; medians are printed, and the ratio is the writer's
//! median over the drive's best median.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_precision_loss,
    reason = "sizes far inside every type's range; rates as f64"
)]
#![allow(clippy::unwrap_used)] // tests and examples fail loudly

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use numapin::storage::write::{self, Data, FileParts, WriteOptions};
use numapin::topology::ProbeOptions;
use numapin::{Runtime, RuntimeConfig, Target, Topology};

#[path = "util/args.rs"]
mod args;
use args::{list, size};

struct Args {
    dir: PathBuf,
    size: u64,
    reps: usize,
    opts: WriteOptions,
    threads: Vec<usize>,
    chunks: Vec<usize>,
    replace: bool,
    drive: Vec<DriveCfg>,
    writer: bool,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        dir: PathBuf::from("/tmp/numapin-write"),
        size: 1 << 30,
        reps: 3,
        opts: WriteOptions::default(),
        threads: vec![0],
        chunks: vec![8 << 20],
        replace: false,
        drive: DRIVE_BASIC.to_vec(),
        writer: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--dir" => a.dir = PathBuf::from(val()?),
            "--size" => a.size = size(&val()?)?,
            "--reps" => a.reps = val()?.parse().map_err(|e| format!("--reps: {e}"))?,
            "--threads" => {
                a.threads = list(&val()?, |t| {
                    t.parse().map_err(|e| format!("--threads: {e}"))
                })?;
            }
            "--chunk" => a.chunks = list(&val()?, |c| Ok(size(c)? as usize))?,
            "--slots" => {
                a.opts.slots_per_thread = val()?.parse().map_err(|e| format!("--slots: {e}"))?;
            }
            "--no-fsync" => a.opts.fsync = false,
            "--replace" => a.replace = true,
            "--drive" => {
                a.drive = match val()?.as_str() {
                    "basic" => DRIVE_BASIC.to_vec(),
                    "variants" => [DRIVE_BASIC.as_slice(), DRIVE_VARIANTS.as_slice()].concat(),
                    "none" => Vec::new(),
                    v => return Err(format!("--drive {v}: basic, variants or none")),
                }
            }
            "--no-drive" => a.drive.clear(),
            "--drive-only" => a.writer = false,
            _ => return Err(format!("unknown flag {flag} (see the example's doc)")),
        }
    }
    if a.reps == 0 || a.size == 0 {
        return Err("--reps and --size must be at least 1".into());
    }
    Ok(a)
}

fn main() -> ExitCode {
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("storage_write: {e}");
            return ExitCode::from(2);
        }
    };
    std::fs::create_dir_all(&a.dir).unwrap();
    match run(&a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("storage_write: {}", numapin::error::with_causes(&e));
            ExitCode::from(1)
        }
    }
}

/// How the drive's file is made before it is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reserve {
    /// Nothing: the writes extend the file (as `dd` writes).
    None,
    /// `fallocate(fd, 0, 0, len)`: blocks reserved, size set.
    Alloc,
    /// `fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, len)`: blocks reserved,
    /// size 0 until written.
    KeepSize,
    /// `ftruncate(fd, len)`: the size set, no block reserved.
    Truncate,
}

/// One drive configuration: writers, bytes per write, how the file is
/// made, and whether it ends with `fdatasync` (else `fsync`).
#[derive(Debug, Clone, Copy)]
struct DriveCfg {
    threads: usize,
    block: usize,
    reserve: Reserve,
    datasync: bool,
}

const fn cfg(threads: usize, block_mib: usize, reserve: Reserve, datasync: bool) -> DriveCfg {
    DriveCfg {
        threads,
        block: block_mib << 20,
        reserve,
        datasync,
    }
}

/// The largest block of the drive's configurations.
const DRIVE_MAX_BLOCK: usize = 16 << 20;

/// The drive's best sequential rate is the best of these.
const DRIVE_BASIC: [DriveCfg; 5] = [
    cfg(1, 16, Reserve::None, false),
    cfg(4, 16, Reserve::None, false),
    cfg(4, 16, Reserve::Alloc, false),
    cfg(8, 8, Reserve::None, false),
    cfg(8, 8, Reserve::Alloc, false),
];

/// The ways the writer could make its file, written as it writes.
const DRIVE_VARIANTS: [DriveCfg; 5] = [
    cfg(4, 8, Reserve::None, false),
    cfg(4, 8, Reserve::Alloc, false),
    cfg(4, 8, Reserve::KeepSize, false),
    cfg(4, 8, Reserve::Truncate, false),
    cfg(4, 8, Reserve::Alloc, true),
];

/// One figure of a rep.
#[derive(Debug, Clone, Copy)]
enum Figure {
    Drive(DriveCfg),
    /// A writer setting, and whether it saves over its last file.
    Writer(WriteOptions, bool),
}

impl Figure {
    fn label(&self) -> String {
        match self {
            Figure::Drive(c) => format!(
                "drive {}x{}M {:?}{}",
                c.threads,
                c.block >> 20,
                c.reserve,
                if c.datasync { " fdatasync" } else { "" }
            ),
            Figure::Writer(o, replace) => format!(
                "numapin threads={} chunk={}M{}",
                o.threads,
                o.chunk_bytes >> 20,
                if *replace { " replacing" } else { "" }
            ),
        }
    }
}

fn figures(a: &Args) -> Vec<Figure> {
    let mut out: Vec<Figure> = a.drive.iter().copied().map(Figure::Drive).collect();
    if a.writer {
        for &t in &a.threads {
            for &c in &a.chunks {
                for replace in [false, true].into_iter().take(1 + usize::from(a.replace)) {
                    let o = a.opts.with_threads(t).with_chunk_bytes(c);
                    out.push(Figure::Writer(o, replace));
                }
            }
        }
    }
    out
}

fn run(a: &Args) -> numapin::Result<()> {
    let rt = Runtime::new(
        Topology::probe(&ProbeOptions::from_process())?,
        RuntimeConfig::default(),
    )?;
    let data = random_bytes(a.size as usize);
    // The drive's writers' buffers, made (and filled) once, outside the
    // timing, as the writer's slots are.
    let most = a.drive.iter().map(|c| c.threads).max().unwrap_or(0);
    let bufs: Vec<AlignedBuf> = (0..most)
        .map(|k| {
            let b = AlignedBuf::new(DRIVE_MAX_BLOCK);
            let from = (k * DRIVE_MAX_BLOCK) % data.len().saturating_sub(DRIVE_MAX_BLOCK).max(1);
            let n = DRIVE_MAX_BLOCK.min(data.len() - from);
            b.0[..n].copy_from_slice(&data[from..from + n]);
            b
        })
        .collect();
    let figs = figures(a);
    let mut times: Vec<Vec<(f64, f64)>> = vec![Vec::new(); figs.len()];
    for rep in 0..a.reps {
        for k in 0..figs.len() {
            let i = (k + rep) % figs.len();
            times[i].push(match figs[i] {
                Figure::Drive(c) => drive_rate(&a.dir, a.size, c, &bufs),
                Figure::Writer(o, replace) => save(&rt, &a.dir, i, &data, (&o, replace), rep)?,
            });
        }
    }
    for (i, f) in figs.iter().enumerate() {
        if matches!(f, Figure::Writer(..)) {
            let _ = std::fs::remove_file(a.dir.join(format!("save-{i}.bin")));
        }
    }
    report(a, &figs, &times);
    Ok(())
}

/// Pseudo-random bytes (a drive that compresses sees no zeros).
fn random_bytes(len: usize) -> Vec<u8> {
    let mut data = vec![0u8; len];
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for c in data.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
    }
    data
}

/// One save by figure `i`: its seconds and sync seconds.
fn save(
    rt: &Runtime,
    dir: &Path,
    i: usize,
    data: &[u8],
    (opts, replace): (&WriteOptions, bool),
    rep: usize,
) -> numapin::Result<(f64, f64)> {
    let path = dir.join(format!("save-{i}.bin"));
    let parts = [Data::Host(data)];
    let r = write::write_file(rt, &FileParts::new(&path, &parts), Target::Host, opts)?;
    println!(
        "rep {rep}: {}: {:.3} s, {:.2} GB/s, threads {}, slots {} MiB, {}",
        Figure::Writer(*opts, replace).label(),
        r.seconds,
        r.gbps(),
        r.threads,
        r.staging_bytes >> 20,
        r.summary()
    );
    if !replace {
        std::fs::remove_file(&path).unwrap();
    }
    Ok((r.seconds, r.sync_seconds))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn report(a: &Args, figs: &[Figure], times: &[Vec<(f64, f64)>]) {
    let gb = a.size as f64 / 1e9;
    let (mut best, mut writer) = (0.0f64, 0.0f64);
    for (f, t) in figs.iter().zip(times) {
        let total = median(t.iter().map(|x| x.0).collect());
        let sync = median(t.iter().map(|x| x.1).collect());
        let rate = gb / total;
        match f {
            Figure::Drive(_) => best = best.max(rate),
            Figure::Writer(..) => writer = writer.max(rate),
        }
        println!(
            "{:<40}: {rate:.2} GB/s (median {total:.3} s, of it sync {sync:.3} s; all {})",
            f.label(),
            t.iter()
                .map(|x| format!("{:.2}", gb / x.0))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    if best > 0.0 && writer > 0.0 {
        println!(
            "numapin save (best setting) / drive best: {:.2}x",
            writer / best
        );
    }
}

/// Seconds to write `size` bytes sequentially with `O_DIRECT` (and of
/// them, seconds in the final sync).
fn drive_rate(dir: &Path, size: u64, c: DriveCfg, bufs: &[AlignedBuf]) -> (f64, f64) {
    let path = dir.join("drive.bin");
    let total = (size / c.block as u64).max(1) * c.block as u64;
    let t0 = Instant::now();
    let f = File::options()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .unwrap();
    let len = i64::try_from(total).unwrap();
    // SAFETY: fallocate and ftruncate on our own descriptor.
    let r = unsafe {
        match c.reserve {
            Reserve::None => 0,
            Reserve::Alloc => libc::fallocate(f.as_raw_fd(), 0, 0, len),
            Reserve::KeepSize => libc::fallocate(f.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, 0, len),
            Reserve::Truncate => libc::ftruncate(f.as_raw_fd(), len),
        }
    };
    assert_eq!(r, 0, "{:?}: {}", c.reserve, std::io::Error::last_os_error());
    let next = AtomicU64::new(0);
    std::thread::scope(|s| {
        let (f, next) = (&f, &next);
        for b in &bufs[..c.threads] {
            s.spawn(move || write_blocks(f, next, total, &b.0[..c.block]));
        }
    });
    let synced = Instant::now();
    if c.datasync {
        f.sync_data().unwrap();
    } else {
        f.sync_all().unwrap();
    }
    let sync = synced.elapsed().as_secs_f64();
    let all = t0.elapsed().as_secs_f64();
    drop(f);
    std::fs::remove_file(&path).unwrap();
    (all, sync)
}

/// One writer of [`drive_rate`]: the next `block` bytes until `total`.
fn write_blocks(f: &File, next: &AtomicU64, total: u64, buf: &[u8]) {
    let block = buf.len();
    loop {
        let off = next.fetch_add(block as u64, Ordering::Relaxed);
        if off >= total {
            return;
        }
        let mut done = 0;
        while done < block {
            let at = i64::try_from(off + done as u64).unwrap();
            // SAFETY: our buffer and descriptor.
            let n = unsafe {
                libc::pwrite(f.as_raw_fd(), buf[done..].as_ptr().cast(), block - done, at)
            };
            assert!(n > 0, "pwrite: {}", std::io::Error::last_os_error());
            done += n.unsigned_abs();
        }
    }
}

/// Page-aligned memory for `O_DIRECT` writes.
struct AlignedBuf(&'static mut [u8], std::alloc::Layout);

impl AlignedBuf {
    fn new(len: usize) -> AlignedBuf {
        let layout = std::alloc::Layout::from_size_align(len, 4096).unwrap();
        // SAFETY: a non-zero size; freed in Drop with the same layout.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!p.is_null());
        // SAFETY: `len` bytes just allocated, owned by this value.
        AlignedBuf(unsafe { std::slice::from_raw_parts_mut(p, len) }, layout)
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.0.as_mut_ptr(), self.1) }
    }
}
