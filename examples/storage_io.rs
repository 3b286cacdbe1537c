//! How to read a file fast: threads with blocking `pread` against one
//! thread with `io_uring`, with `O_DIRECT` and through the page cache, hot
//! and cold, at several block sizes and reads in flight; and numapin's own
//! reader (`numapin::storage`) beside them. The measurements behind the
//! reader's design (docs/storage.md; figures in docs/BENCHMARKS.md).
//!
//! ```text
//! cargo run --release --example storage_io -- --file /tmp/numapin-io.bin
//!     [--size 4G] [--create] [--cold] [--hot] [--threads 1,4,16,64]
//!     [--depth 1,4,16,64] [--block 1M,4M,16M] [--bytes 2G] [--reps 3]
//!     [--reader] [--gpu 0] [--json]
//! ```
//!
//! `--create` writes `--size` bytes of pseudo-random data to `--file` first
//! (otherwise the file must exist). `--cold` drops the page cache (`echo 3 >
//! /proc/sys/vm/drop_caches`, root only: without it cold figures are
//! skipped with a note) before each cold figure; `--hot` reads the file
//! once first, then measures buffered reads from the page cache. Each figure
//! reads `--bytes` (default: the whole file) from the start. `--reader`
//! adds numapin's reader (into pinned host memory, and to GPU `--gpu` when
//! a CUDA driver is present); `--reader-only` measures only that.
// An example's sizes, counts and rates, far inside every type's range.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss
)]
#![allow(clippy::unwrap_used)] // tests and examples fail loudly

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

#[path = "util/args.rs"]
mod args;
use args::{list, size};

struct Args {
    file: PathBuf,
    size: u64,
    create: bool,
    cold: bool,
    hot: bool,
    threads: Vec<usize>,
    depth: Vec<usize>,
    block: Vec<usize>,
    bytes: Option<u64>,
    reader: bool,
    reader_only: bool,
    gpu: u32,
    reps: usize,
    json: bool,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        file: PathBuf::from("/tmp/numapin-io.bin"),
        size: 4 << 30,
        create: false,
        cold: false,
        hot: false,
        threads: vec![1, 4, 16, 64],
        depth: vec![1, 4, 16, 64],
        block: vec![1 << 20, 4 << 20, 16 << 20],
        bytes: None,
        reader: false,
        reader_only: false,
        gpu: 0,
        reps: 3,
        json: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut val = || it.next().ok_or(format!("{k} needs a value"));
        let num = |v: &str| v.parse::<usize>().map_err(|e| format!("{k} {v}: {e}"));
        match k.as_str() {
            "--file" => a.file = PathBuf::from(val()?),
            "--size" => a.size = size(&val()?)?,
            "--bytes" => a.bytes = Some(size(&val()?)?),
            "--create" => a.create = true,
            "--cold" => a.cold = true,
            "--hot" => a.hot = true,
            "--threads" => a.threads = list(&val()?, num)?,
            "--depth" => a.depth = list(&val()?, num)?,
            "--block" => a.block = list(&val()?, |v| size(v).map(|b| b as usize))?,
            "--reader" => a.reader = true,
            "--reader-only" => {
                a.reader = true;
                a.reader_only = true;
            }
            "--gpu" => a.gpu = num(&val()?)? as u32,
            "--reps" => a.reps = num(&val()?)?.max(1),
            "--json" => a.json = true,
            "--help" | "-h" => {
                return Err("usage: storage_io --file PATH [--size 4G] [--create] [--cold] [--hot] [--threads 1,4,16,64] [--depth 1,4,16,64] [--block 1M,4M,16M] [--bytes N] [--reps 3] [--reader] [--reader-only] [--gpu N] [--json]".into())
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if !a.cold && !a.hot {
        a.cold = true;
        a.hot = true;
    }
    Ok(a)
}

/// A page-aligned anonymous buffer (what `O_DIRECT` needs).
struct Aligned {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is owned by one reader at a time.
unsafe impl Send for Aligned {}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let layout = std::alloc::Layout::from_size_align(len, 4096).unwrap();
        // SAFETY: a non-zero size with a valid alignment.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of memory");
        Aligned { ptr, len }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len, 4096).unwrap();
        // SAFETY: allocated above with this layout.
        unsafe { std::alloc::dealloc(self.ptr, layout) }
    }
}

fn create(a: &Args) -> std::io::Result<()> {
    let mut f = File::create(&a.file)?;
    let mut block = vec![0u8; 16 << 20];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut left = a.size;
    while left > 0 {
        for w in block.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            w.copy_from_slice(&x.to_le_bytes());
        }
        let n = left.min(block.len() as u64) as usize;
        f.write_all(&block[..n])?;
        left -= n as u64;
    }
    f.sync_all()
}

fn drop_caches() -> Result<(), String> {
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3")
        .map_err(|e| format!("cannot drop the page cache ({e}): run as root"))
}

fn open(a: &Args, direct: bool) -> File {
    let mut o = std::fs::OpenOptions::new();
    o.read(true);
    if direct {
        o.custom_flags(libc::O_DIRECT);
    }
    o.open(&a.file).unwrap()
}

/// `threads` threads each reading `block`-byte pieces at offsets handed out
/// in order; returns bytes read.
fn threads_read(f: &File, total: u64, threads: usize, block: usize) -> u64 {
    let next = AtomicU64::new(0);
    let done = AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let buf = Aligned::new(block);
                loop {
                    let off = next.fetch_add(block as u64, Ordering::Relaxed);
                    if off >= total {
                        break;
                    }
                    let want = (total - off).min(block as u64) as usize;
                    let want = want.div_ceil(4096) * 4096;
                    // SAFETY: buf holds `block` >= want bytes.
                    let n = unsafe { libc::pread(f.as_raw_fd(), buf.ptr.cast(), want, off as i64) };
                    assert!(n >= 0, "pread: {}", std::io::Error::last_os_error());
                    done.fetch_add(n as u64, Ordering::Relaxed);
                }
            });
        }
    });
    done.load(Ordering::Relaxed).min(total)
}

/// `threads_read` into one destination of `total` bytes (each block to its
/// place, as a loader writes a checkpoint into memory) instead of a reused
/// buffer per thread.
fn threads_read_into(f: &File, dst: &mut [u8], threads: usize, block: usize) -> u64 {
    let total = dst.len() as u64;
    let base = dst.as_mut_ptr() as usize;
    let next = AtomicU64::new(0);
    let done = AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let off = next.fetch_add(block as u64, Ordering::Relaxed);
                if off >= total {
                    break;
                }
                let want = (total - off).min(block as u64) as usize;
                // SAFETY: each block of dst is read by one thread (the
                // atomic counter hands it out once) and dst outlives the
                // scope.
                let n = unsafe {
                    libc::pread(
                        f.as_raw_fd(),
                        (base + off as usize) as *mut libc::c_void,
                        want,
                        off as i64,
                    )
                };
                assert!(n >= 0, "pread: {}", std::io::Error::last_os_error());
                done.fetch_add(n as u64, Ordering::Relaxed);
            });
        }
    });
    done.load(Ordering::Relaxed)
}

/// One thread keeping `depth` reads of `block` bytes in flight with
/// io_uring; returns bytes read, or why io_uring is unavailable.
fn uring_read(f: &File, total: u64, depth: usize, block: usize) -> Result<u64, String> {
    use io_uring::{opcode, types, IoUring};
    let mut ring = IoUring::new(depth.next_power_of_two() as u32)
        .map_err(|e| format!("io_uring_setup: {e}"))?;
    let bufs: Vec<Aligned> = (0..depth).map(|_| Aligned::new(block)).collect();
    let mut next = 0u64;
    let mut in_flight = 0usize;
    let mut done = 0u64;
    let mut free: Vec<usize> = (0..depth).collect();
    loop {
        while let Some(&b) = free.last() {
            if next >= total {
                break;
            }
            let want = ((total - next).min(block as u64) as usize).div_ceil(4096) * 4096;
            let e = opcode::Read::new(types::Fd(f.as_raw_fd()), bufs[b].ptr, want as u32)
                .offset(next)
                .build()
                .user_data(b as u64);
            // SAFETY: the buffer lives until its completion is reaped
            // (bufs outlive the loop, which drains every read).
            unsafe { ring.submission().push(&e) }.map_err(|e| e.to_string())?;
            free.pop();
            next += block as u64;
            in_flight += 1;
        }
        if in_flight == 0 {
            break;
        }
        ring.submit_and_wait(1).map_err(|e| e.to_string())?;
        for c in ring.completion() {
            assert!(
                c.result() >= 0,
                "read: {}",
                std::io::Error::from_raw_os_error(-c.result())
            );
            done += c.result() as u64;
            free.push(c.user_data() as usize);
            in_flight -= 1;
        }
    }
    Ok(done.min(total))
}

struct Figure {
    name: String,
    params: String,
    /// GB/s of each repetition.
    samples: Vec<f64>,
}

impl Figure {
    fn stats(&self) -> (f64, f64, f64) {
        let mut v = self.samples.clone();
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[0], v[v.len() - 1])
    }
}

fn time(f: impl FnOnce() -> u64) -> f64 {
    let t = Instant::now();
    let n = f();
    n as f64 / t.elapsed().as_secs_f64() / 1e9
}

/// One way of reading the file.
#[derive(Clone, Copy)]
enum Way {
    Threads(usize),
    Uring(usize),
}

/// The figures of one temperature: every way at every block size, the
/// repetitions interleaved (rep 1 of every case, then rep 2, ...) so that a
/// slow spell of a shared disk hits every case alike.
fn sweep(a: &Args, total: u64, cold: bool, direct: bool) -> Result<Vec<Figure>, String> {
    let kind = if direct { "O_DIRECT" } else { "buffered" };
    let temp = if cold { "cold" } else { "hot" };
    let mut cases = Vec::new();
    for &b in &a.block {
        cases.extend(a.threads.iter().map(|&t| (Way::Threads(t), b)));
        cases.extend(a.depth.iter().map(|&d| (Way::Uring(d), b)));
    }
    let mut figs: Vec<Figure> = cases
        .iter()
        .map(|&(w, b)| match w {
            Way::Threads(t) => Figure {
                name: format!("{temp} {kind} threads"),
                params: format!("threads={t} block={}K", b >> 10),
                samples: Vec::new(),
            },
            Way::Uring(d) => Figure {
                name: format!("{temp} {kind} io_uring"),
                params: format!("depth={d} block={}K", b >> 10),
                samples: Vec::new(),
            },
        })
        .collect();
    let mut uring_ok = true;
    for _ in 0..a.reps {
        for (i, &(w, b)) in cases.iter().enumerate() {
            if cold {
                drop_caches()?;
            }
            let f = open(a, direct);
            match w {
                Way::Threads(t) => figs[i].samples.push(time(|| threads_read(&f, total, t, b))),
                Way::Uring(d) if uring_ok => {
                    let t0 = Instant::now();
                    match uring_read(&f, total, d, b) {
                        Ok(n) => figs[i]
                            .samples
                            .push(n as f64 / t0.elapsed().as_secs_f64() / 1e9),
                        Err(e) => {
                            eprintln!("storage_io: io_uring skipped: {e}");
                            uring_ok = false;
                        }
                    }
                }
                Way::Uring(_) => {}
            }
        }
    }
    figs.retain(|f| !f.samples.is_empty());
    Ok(figs)
}

/// The reader's default thread count on `node`.
fn r_threads(rt: &numapin::Runtime, node: u32) -> usize {
    let cpus = rt.topology().node(node).map_or(1, |n| n.cpus.len());
    cpus.clamp(
        numapin::storage::MIN_READ_THREADS,
        numapin::storage::MAX_READ_THREADS,
    )
}

/// Adds a sample to the figure called `name`, made on first use.
fn sample(out: &mut Vec<Figure>, name: String, params: String, gbps: f64) {
    match out.iter_mut().find(|f| f.name == name) {
        Some(f) => f.samples.push(gbps),
        None => out.push(Figure {
            name,
            params,
            samples: vec![gbps],
        }),
    }
}

/// What numapin's reader figures use, made once (a runtime made per
/// figure would put its region's making and the last one's release inside
/// the timings).
struct Reader {
    rt: numapin::Runtime,
    node: u32,
    buf: numapin::PinnedBuf,
    src: numapin::storage::Source,
    dev: Option<numapin::storage::DeviceMemory>,
}

impl Reader {
    fn new(a: &Args, total: u64) -> Result<Reader, String> {
        use numapin::topology::{ProbeOptions, Topology};
        let e = |e: numapin::Error| e.to_string();
        let topo = Topology::probe(&ProbeOptions::from_process()).map_err(|x| e(x.into()))?;
        let rt = numapin::Runtime::new(topo, numapin::RuntimeConfig::default())
            .map_err(|x| e(x.into()))?;
        let gpu = numapin::CudaOrdinal(a.gpu);
        let node = if numapin::gpu::available() {
            rt.node_for_gpu(gpu).map_err(|x| e(x.into()))?
        } else {
            rt.calling_thread_node()
        };
        let buf = rt
            .alloc(numapin::Target::HostNode(node), total as usize)
            .map_err(|x| e(x.into()))?;
        // The standard region the slots come from, made before any timing.
        drop(
            rt.alloc(numapin::Target::HostNode(node), 4096)
                .map_err(|x| e(x.into()))?,
        );
        let src = numapin::storage::Source::open(&a.file).map_err(|x| e(x.into()))?;
        let dev = if numapin::gpu::available() {
            Some(
                numapin::storage::DeviceMemory::new(gpu, total as usize)
                    .map_err(|x| e(x.into()))?,
            )
        } else {
            None
        };
        Ok(Reader {
            rt,
            node,
            buf,
            src,
            dev,
        })
    }
}

/// numapin's reader over the whole range into pinned host memory (and to
/// GPU `--gpu` when CUDA is there), beside as many plain threads reading
/// into the same memory.
fn numapin_reader(
    a: &Args,
    rd: &mut Reader,
    total: u64,
    out: &mut Vec<Figure>,
    temp: &str,
) -> Result<(), String> {
    use numapin::storage::{self, ReadOptions};
    use numapin::Target;
    let opts = ReadOptions::default();
    // Reads into place use the largest automatic chunk (no slots).
    let block = storage::AUTO_CHUNK_MAX;
    let cold = temp == "cold";
    let threads = r_threads(&rd.rt, rd.node);
    if cold {
        drop_caches()?;
    }
    // The baseline: as many threads, reads of the reader's size, O_DIRECT
    // cold and buffered hot, into the same memory.
    let f = open(a, cold);
    let g = time(|| threads_read_into(&f, &mut rd.buf[..total as usize], threads, block));
    sample(
        out,
        format!("{temp} threads into pinned host"),
        format!("threads={threads} block={}K", block >> 10),
        g,
    );
    if cold {
        drop_caches()?;
    }
    let r = storage::read_to_host(
        &rd.rt,
        &rd.src,
        0,
        &mut rd.buf[..total as usize],
        Target::HostNode(rd.node),
        &opts,
    )
    .map_err(|e| e.to_string())?;
    sample(
        out,
        format!("{temp} numapin reader to pinned host"),
        format!("threads={} {}", r.threads, r.summary()),
        r.gbps(),
    );
    if let Some(dev) = &rd.dev {
        let gpu = dev.gpu();
        if cold {
            drop_caches()?;
        }
        let r = storage::read_to_device(&rd.rt, &rd.src, 0, dev.ptr(), total as usize, gpu, &opts)
            .map_err(|e| e.to_string())?;
        sample(
            out,
            format!("{temp} numapin reader to GPU {gpu}"),
            format!("threads={} {}", r.threads, r.summary()),
            r.gbps(),
        );
    }
    Ok(())
}

fn run(a: &Args) -> Result<Vec<Figure>, String> {
    if a.create {
        create(a).map_err(|e| format!("writing {}: {e}", a.file.display()))?;
    }
    let len = std::fs::metadata(&a.file)
        .map_err(|e| format!("{}: {e}", a.file.display()))?
        .len();
    let total = a.bytes.unwrap_or(len).min(len) / 4096 * 4096;
    let mut out = Vec::new();
    let mut rd = if a.reader {
        Some(Reader::new(a, total)?)
    } else {
        None
    };
    if a.cold {
        match drop_caches() {
            Err(e) => eprintln!("storage_io: cold figures skipped: {e}"),
            Ok(()) => {
                if !a.reader_only {
                    out.extend(sweep(a, total, true, true)?);
                    out.extend(sweep(a, total, true, false)?);
                }
                if let Some(rd) = rd.as_mut() {
                    for _ in 0..a.reps {
                        numapin_reader(a, rd, total, &mut out, "cold")?;
                    }
                }
            }
        }
    }
    if a.hot {
        // Bring the file into the page cache.
        let f = open(a, false);
        threads_read(&f, len.div_ceil(4096) * 4096, 4, 16 << 20);
        if !a.reader_only {
            out.extend(sweep(a, total, false, false)?);
        }
        if let Some(rd) = rd.as_mut() {
            for _ in 0..a.reps {
                numapin_reader(a, rd, total, &mut out, "hot")?;
            }
        }
    }
    Ok(out)
}

fn main() -> ExitCode {
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("storage_io: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&a) {
        Ok(figs) => {
            println!(
                "{:<36} {:<44} {:>7} {:>7} {:>7} {:>5}",
                "FIGURE", "PARAMETERS", "MEDIAN", "MIN", "MAX", "REPS"
            );
            for f in &figs {
                let (med, min, max) = f.stats();
                println!(
                    "{:<36} {:<44} {med:>7.2} {min:>7.2} {max:>7.2} {:>5}",
                    f.name,
                    f.params,
                    f.samples.len()
                );
            }
            println!("(GB/s)");
            if a.json {
                for f in &figs {
                    let (med, min, max) = f.stats();
                    println!(
                        "{}",
                        serde_json::json!({"figure": f.name, "params": f.params, "gbps_median": med, "gbps_min": min, "gbps_max": max, "samples": f.samples})
                    );
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("storage_io: {e}");
            ExitCode::from(1)
        }
    }
}
