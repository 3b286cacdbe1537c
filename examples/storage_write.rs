//! How fast numapin's writer saves from host memory, against the drive's
//! own best sequential `O_DIRECT` write rate measured in the same run: the
//! measurements behind the writer's design (docs/storage.md "How a write
//! goes"; figures in docs/BENCHMARKS.md).
//!
//! ```text
//! cargo run --release --example storage_write -- [--dir /tmp/numapin-write]
//!     [--size 1G] [--reps 3] [--threads 0[,8..]] [--chunk 8M[,16M..]]
//!     [--slots 2] [--no-fsync] [--replace] [--drive basic|variants|none]
//!     [--no-drive] [--drive-only]
//! ```
//!
//! `--size` is a multiple of 16M (the drive's largest write), so that
//! the drive and the writer write the same bytes.
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
//! path; each such file is written once before the timed reps, so that
//! every timed save replaces one): the rename then frees the old file's
//! blocks. What the run writes in `--dir` is removed however it ends (and
//! `--dir` too, if the run made it).
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
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use nix::fcntl::{fallocate, FallocateFlags};

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
    if a.size % DRIVE_MAX_BLOCK as u64 != 0 {
        return Err("--size must be a multiple of 16M".into());
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
    let made = !a.dir.exists();
    if let Err(e) = std::fs::create_dir_all(&a.dir) {
        eprintln!(
            "storage_write: --dir {}: cannot create it: {e}; give a folder you can write",
            a.dir.display()
        );
        return ExitCode::from(2);
    }
    let _cleanup = Cleanup {
        dir: a.dir.clone(),
        saves: figures(&a).len(),
        made,
    };
    match run(&a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("storage_write: {e}");
            ExitCode::from(1)
        }
    }
}

/// Removes what the run writes in `--dir` (and the folder, if the run
/// made it) however the run ends.
struct Cleanup {
    dir: PathBuf,
    saves: usize,
    made: bool,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for i in 0..self.saves {
            let _ = std::fs::remove_file(save_path(&self.dir, i));
        }
        let _ = std::fs::remove_file(self.dir.join("drive.bin"));
        if self.made {
            let _ = std::fs::remove_dir(&self.dir);
        }
    }
}

/// An error as text, with its causes.
fn why(e: &(dyn std::error::Error + 'static)) -> String {
    numapin::error::with_causes(e)
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

fn run(a: &Args) -> Result<(), String> {
    let rt = runtime().map_err(|e| why(&e))?;
    let data = random_bytes(a.size as usize);
    let bufs = drive_bufs(a, &data);
    let figs = figures(a);
    // Each replacing figure's file, written once outside the timing: every
    // timed save of it replaces an existing file.
    for (i, f) in figs.iter().enumerate() {
        if let Figure::Writer(o, true) = f {
            write_once(&rt, &save_path(&a.dir, i), &data, o)?;
        }
    }
    let mut times: Vec<Vec<(f64, f64)>> = vec![Vec::new(); figs.len()];
    for rep in 0..a.reps {
        for k in 0..figs.len() {
            let i = (k + rep) % figs.len();
            times[i].push(match figs[i] {
                Figure::Drive(c) => drive_rate(&a.dir, a.size, c, &bufs)?,
                Figure::Writer(o, replace) => save(&rt, &a.dir, i, &data, (&o, replace), rep)?,
            });
        }
    }
    report(a, &figs, &times);
    Ok(())
}

fn runtime() -> numapin::Result<Runtime> {
    Ok(Runtime::new(
        Topology::probe(&ProbeOptions::from_process())?,
        RuntimeConfig::default(),
    )?)
}

/// The drive's writers' buffers (see [`aligned`]), made and filled once,
/// outside the timing, as the writer's slots are.
fn drive_bufs(a: &Args, data: &[u8]) -> Vec<Vec<u8>> {
    let most = a.drive.iter().map(|c| c.threads).max().unwrap_or(0);
    (0..most)
        .map(|k| {
            let mut b = vec![0u8; DRIVE_MAX_BLOCK + 4096];
            // `--size` is a multiple of the block: a whole block from `from`.
            let from = (k * DRIVE_MAX_BLOCK) % (data.len() - DRIVE_MAX_BLOCK).max(1);
            aligned_mut(&mut b).copy_from_slice(&data[from..from + DRIVE_MAX_BLOCK]);
            b
        })
        .collect()
}

/// The page-aligned `DRIVE_MAX_BLOCK` bytes of a buffer of
/// [`drive_bufs`] (`O_DIRECT` writes from aligned memory).
fn aligned(b: &[u8]) -> &[u8] {
    let at = b.as_ptr().align_offset(4096);
    &b[at..at + DRIVE_MAX_BLOCK]
}

fn aligned_mut(b: &mut [u8]) -> &mut [u8] {
    let at = b.as_ptr().align_offset(4096);
    &mut b[at..at + DRIVE_MAX_BLOCK]
}

fn save_path(dir: &Path, i: usize) -> PathBuf {
    dir.join(format!("save-{i}.bin"))
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
) -> Result<(f64, f64), String> {
    let path = save_path(dir, i);
    let r = write_once(rt, &path, data, opts)?;
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
        std::fs::remove_file(&path).map_err(|e| format!("removing {}: {e}", path.display()))?;
    }
    Ok((r.seconds, r.sync_seconds))
}

/// `data` saved to `path` by numapin's writer.
fn write_once(
    rt: &Runtime,
    path: &Path,
    data: &[u8],
    opts: &WriteOptions,
) -> Result<write::WriteReport, String> {
    let parts = [Data::Host(data)];
    write::write_file(rt, &FileParts::new(path, &parts), Target::Host, opts).map_err(|e| why(&e))
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

/// Seconds to write `size` bytes (a multiple of every block)
/// sequentially with `O_DIRECT` (and of them, seconds in the final sync).
fn drive_rate(dir: &Path, size: u64, c: DriveCfg, bufs: &[Vec<u8>]) -> Result<(f64, f64), String> {
    let path = dir.join("drive.bin");
    let failed = |what: &str, e: std::io::Error| format!("{what} {}: {e}", path.display());
    let t0 = Instant::now();
    let f = open_direct(&path)?;
    let len = i64::try_from(size).map_err(|e| format!("--size: {e}"))?;
    match c.reserve {
        Reserve::None => Ok(()),
        Reserve::Alloc => fallocate(&f, FallocateFlags::empty(), 0, len).map_err(Into::into),
        Reserve::KeepSize => {
            fallocate(&f, FallocateFlags::FALLOC_FL_KEEP_SIZE, 0, len).map_err(Into::into)
        }
        Reserve::Truncate => f.set_len(size),
    }
    .map_err(|e| failed(&format!("{:?} of", c.reserve), e))?;
    let next = AtomicU64::new(0);
    std::thread::scope(|s| {
        let (f, next) = (&f, &next);
        let writers: Vec<_> = bufs[..c.threads]
            .iter()
            .map(|b| s.spawn(move || write_blocks(f, next, size, &aligned(b)[..c.block])))
            .collect();
        writers.into_iter().try_for_each(|w| w.join().unwrap())
    })
    .map_err(|e| failed("writing", e))?;
    let synced = Instant::now();
    if c.datasync {
        f.sync_data()
    } else {
        f.sync_all()
    }
    .map_err(|e| failed("syncing", e))?;
    let sync = synced.elapsed().as_secs_f64();
    let all = t0.elapsed().as_secs_f64();
    drop(f);
    std::fs::remove_file(&path).map_err(|e| failed("removing", e))?;
    Ok((all, sync))
}

/// `path` made anew for `O_DIRECT` writes.
fn open_direct(path: &Path) -> Result<File, String> {
    File::options()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .map_err(|e| {
            let fix = if e.raw_os_error() == Some(libc::EINVAL) {
                "; --dir must be on a filesystem that supports O_DIRECT (not tmpfs)"
            } else {
                ""
            };
            format!("opening {} with O_DIRECT: {e}{fix}", path.display())
        })
}

/// One writer of [`drive_rate`]: the next `block` bytes until `total`.
fn write_blocks(f: &File, next: &AtomicU64, total: u64, buf: &[u8]) -> std::io::Result<()> {
    loop {
        let off = next.fetch_add(buf.len() as u64, Ordering::Relaxed);
        if off >= total {
            return Ok(());
        }
        f.write_all_at(buf, off)?;
    }
}
