//! The reader's loops under injected faults (short reads, `EINTR`, `EIO`),
//! every mode and alignment, and the drive warnings.

use proptest::prelude::*;

use super::faults::{self, Injected};
use super::io::read_exact_at;
use super::{IoMode, Source, StorageError};

#[allow(clippy::cast_possible_truncation)] // a byte pattern: the low bits are the point
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
}

/// A file of `len` pattern bytes.
fn file(len: usize) -> (tempfile::TempDir, std::path::PathBuf, Vec<u8>) {
    let d = tempfile::tempdir().expect("a temporary folder");
    let p = d.path().join("data.bin");
    let data = pattern(len);
    std::fs::write(&p, &data).expect("write");
    (d, p, data)
}

/// `len` bytes of memory starting `skew` bytes past a 4 KiB boundary.
struct Mem {
    v: Vec<u8>,
    at: usize,
}

impl Mem {
    fn new(len: usize, skew: usize) -> Mem {
        let v = vec![0xAAu8; len + 8192 + skew];
        let at = v.as_ptr().align_offset(4096) + skew;
        Mem { v, at }
    }
    fn slice(&mut self, len: usize) -> &mut [u8] {
        &mut self.v[self.at..self.at + len]
    }
}

/// Drops the file's pages from the page cache (clean pages go without
/// root), so that reads go to the drive.
fn evict(p: &std::path::Path) {
    let f = std::fs::File::open(p).expect("open");
    f.sync_all().expect("fsync");
    nix::fcntl::posix_fadvise(
        &f,
        0,
        0,
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
    )
    .expect("fadvise");
}

fn check(mode: IoMode, offset: usize, len: usize, skew: usize, slack: usize, f: faults::Faults) {
    let (_d, p, data) = file(200_000);
    evict(&p);
    let src = Source::open(&p).expect("open");
    let mut bounce = Mem::new(4096, 0);
    let mut m = Mem::new(len + slack, skew);
    let _g = Injected::new(f);
    let c = read_exact_at(
        &src,
        offset as u64,
        m.slice(len + slack),
        len,
        mode,
        Some(bounce.slice(4096)),
    )
    .expect("read");
    assert_eq!(c.cached + c.direct + c.buffered, len as u64, "{c:?}");
    assert!(
        m.slice(len)[..] == data[offset..offset + len],
        "mode {mode:?} offset {offset} len {len} skew {skew}"
    );
    if mode == IoMode::Buffered {
        assert_eq!(c.buffered, len as u64);
    }
    // Memory that lines up with the file is read with O_DIRECT wherever
    // the filesystem allows it (the file is not in the page cache).
    if mode != IoMode::Buffered && src.direct_io() && offset % 4096 == skew % 4096 {
        assert_eq!(c.direct, len as u64, "{c:?}");
    }
}

#[test]
fn auto_copies_cached_reads_and_reads_the_others_direct() {
    let (_d, p, data) = file(1 << 20);
    evict(&p);
    // Bring the first quarter into the page cache (without readahead).
    let f = std::fs::File::open(&p).expect("open");
    nix::fcntl::posix_fadvise(&f, 0, 0, nix::fcntl::PosixFadviseAdvice::POSIX_FADV_RANDOM)
        .expect("fadvise");
    let mut q = vec![0u8; 256 << 10];
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut q, 0).expect("read");
    let src = Source::open(&p).expect("open");
    let mut m = Mem::new(1 << 20, 0);
    // The cached quarter comes from the page cache, when the kernel can
    // say it is there (cachestat); otherwise buffered.
    let c =
        read_exact_at(&src, 0, m.slice(256 << 10), 256 << 10, IoMode::Auto, None).expect("read");
    assert!(m.slice(256 << 10)[..] == data[..256 << 10]);
    match src.page_cache_unknown() {
        None => assert_eq!(c.cached, 256 << 10, "{c:?}"),
        Some(_) => assert_eq!(c.buffered, 256 << 10, "{c:?}"),
    }
    // A read only partly cached goes to the drive whole, direct where the
    // filesystem allows it.
    let c = read_exact_at(&src, 0, m.slice(1 << 20), 1 << 20, IoMode::Auto, None).expect("read");
    assert!(m.slice(1 << 20)[..] == data[..]);
    assert_eq!(c.cached + c.direct + c.buffered, 1 << 20);
    if src.direct_io() && src.page_cache_unknown().is_none() {
        assert_eq!(c.direct, 1 << 20, "{c:?}");
    }
}

#[test]
fn an_io_error_names_the_file_and_offset() {
    let (_d, p, _) = file(100_000);
    let src = Source::open(&p).expect("open");
    let mut m = Mem::new(100_000, 0);
    let _g = Injected::new(faults::Faults {
        errno_at: Some((70_000, libc::EIO)),
        short_max: 8192,
        ..Default::default()
    });
    let e =
        read_exact_at(&src, 0, m.slice(100_000), 100_000, IoMode::Buffered, None).expect_err("EIO");
    match &e {
        StorageError::Read { path, offset, .. } => {
            assert_eq!(path, &p);
            assert!((65_536..=70_000).contains(offset), "{e}");
        }
        other => panic!("{other:?}"),
    }
    let text = crate::report::with_causes(&e);
    assert!(
        text.contains("data.bin") && text.contains("Input/output error"),
        "{text}"
    );
    assert!(e.fix().is_some_and(|f| f.contains("dmesg")));
}

#[test]
fn a_file_shorter_than_the_read_is_truncated_not_short() {
    let (_d, p, _) = file(10_000);
    let src = Source::open(&p).expect("open");
    // The file shrinks after it was opened.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .expect("open for writing")
        .set_len(5000)
        .expect("truncate");
    let mut m = Mem::new(10_000, 0);
    for mode in [IoMode::Auto, IoMode::Buffered] {
        let e = read_exact_at(&src, 0, m.slice(10_000), 10_000, mode, None).expect_err("short");
        match e {
            StorageError::Truncated {
                file_len,
                wanted_end,
                ..
            } => assert_eq!((file_len, wanted_end), (5000, 10_000)),
            other => panic!("{other:?}"),
        }
        assert_eq!(e.kind(), crate::ErrorKind::Input);
    }
}

#[test]
fn directories_fifos_and_missing_files_are_input_errors() {
    let d = tempfile::tempdir().expect("a temporary folder");
    let fifo = d.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
    for (p, what) in [
        (d.path().to_path_buf(), "is a directory"),
        (fifo, "is a FIFO"),
        (d.path().join("nope"), "does not exist"),
    ] {
        let e = Source::open(&p).expect_err("not a regular file");
        assert_eq!(e.kind(), crate::ErrorKind::Input, "{e}");
        assert!(e.to_string().contains(what), "{e}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn any_range_arrives_whole(
        offset in 0usize..150_000,
        len in 1usize..40_000,
        skew in 0usize..4096,
        congruent in any::<bool>(),
        slack in 0usize..9000,
        eintr in prop_oneof![Just(0u64), 2u64..5],
        short in prop_oneof![Just(0usize), 1usize..20_000],
        mode in prop_oneof![Just(IoMode::Auto), Just(IoMode::Buffered)],
    ) {
        let skew = if congruent { offset % 4096 } else { skew };
        check(mode, offset, len.min(200_000 - offset), skew, slack, faults::Faults {
            eintr_every: eintr,
            short_max: short,
            ..Default::default()
        });
    }
}

mod drives {
    use crate::storage::{Drive, FileLocation};
    use crate::topology::{Relation, Topology};

    fn two_sockets() -> Topology {
        let p = concat!(env!("CARGO_MANIFEST_DIR"), "/topology/dgx-h100.xml");
        Topology::load(std::path::Path::new(p), &Default::default()).expect("fixture")
    }

    fn at(node: u32, rel: Vec<Relation>) -> FileLocation {
        FileLocation {
            path: "/data/model.safetensors".into(),
            device: Some("nvme3n1p1".into()),
            drives: vec![Drive {
                name: "nvme3n1".into(),
                pci_bus_id: Some("0000:c1:00.0".into()),
                numa_node: Some(node),
                package: None,
                kind: None,
                gpu_relations: rel,
            }],
            filesystem: None,
            note: None,
        }
    }

    #[test]
    fn a_drive_behind_the_other_socket_is_said() {
        let t = two_sockets();
        let g0 = t.gpus[0].index;
        let n0 = t.gpus[0].numa_node.expect("the fixture places its GPUs");
        let far_node = t
            .numa_nodes
            .iter()
            .map(|n| n.os_index)
            .find(|&n| t.node(n).and_then(|x| x.package) != t.node(n0).and_then(|x| x.package));
        let far_node = far_node.expect("two sockets");
        // By the topology's relation.
        let w = at(far_node, vec![Relation::Sys; t.gpus.len()]).warnings_for(&t, n0, Some(g0));
        assert_eq!(w.len(), 1);
        assert!(
            w[0].contains("behind the other socket") && w[0].contains("nvme3n1"),
            "{w:?}"
        );
        // By nodes alone (a drive the topology does not list).
        let w = at(far_node, vec![]).warnings_for(&t, n0, Some(g0));
        assert!(w[0].contains("behind the other socket"), "{w:?}");
        // Near: nothing to say.
        assert!(at(n0, vec![Relation::Node; t.gpus.len()])
            .warnings_for(&t, n0, Some(g0))
            .is_empty());
        assert!(at(n0, vec![]).warnings_for(&t, n0, None).is_empty());
    }
}

#[test]
fn a_filesystem_refusing_o_direct_at_open_or_at_read_is_read_buffered() {
    let (_d, p, data) = file(100_000);
    for (open, read) in [(true, false), (false, true)] {
        evict(&p);
        let f = faults::Faults {
            refuse_direct_open: open,
            refuse_direct: read,
            ..Default::default()
        };
        let g = Injected::new(f);
        let src = Source::open(&p).expect("open");
        if open {
            assert!(!src.direct_io());
            assert!(src.why_buffered().is_some_and(|w| w.contains("O_DIRECT")));
        }
        let mut m = Mem::new(100_000, 0);
        let c =
            read_exact_at(&src, 0, m.slice(100_000), 100_000, IoMode::Auto, None).expect("read");
        assert!(m.slice(100_000)[..] == data[..]);
        assert_eq!(c.direct, 0, "{c:?}");
        // Asked for O_DIRECT alone: an error saying why, not a fallback.
        let e = read_exact_at(&src, 0, m.slice(8192), 8192, IoMode::Direct, None);
        if src.why_buffered().is_some() {
            let e = e.expect_err("direct refused");
            assert!(matches!(e, StorageError::Request { .. }), "{e}");
            assert!(e.to_string().contains("data.bin"), "{e}");
        }
        drop(g);
    }
}

#[test]
fn a_source_says_when_its_file_changed_since_it_was_opened() {
    let (_d, p, _) = file(10_000);
    let src = Source::open(&p).expect("open");
    assert_eq!(src.changed(), None);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .expect("open for writing");
    f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(3))
        .expect("set the time");
    assert!(src.changed().is_some_and(|w| w.contains("written")));
    f.set_len(5).expect("truncate");
    assert!(src.changed().is_some_and(|w| w.contains("5 bytes")));
}

/// numapin's chunk: 4 MiB for one reader's 32 slots beside a 300 MiB L3,
/// 1 MiB for four readers (their 128 slots fit half of it only then), 2
/// MiB for two; never below 1 MiB however many, 4 MiB when no cache size
/// is known.
#[test]
fn the_automatic_chunk_keeps_every_readers_slots_in_half_the_cache() {
    const MIB: u64 = 1 << 20;
    let l3 = 300 * MIB;
    assert_eq!(super::auto_chunk(l3, 32), 4 << 20);
    assert_eq!(super::auto_chunk(l3, 2 * 32), 2 << 20);
    assert_eq!(super::auto_chunk(l3, 4 * 32), 1 << 20);
    assert_eq!(super::auto_chunk(l3, 1 << 20), super::AUTO_CHUNK_MIN);
    assert_eq!(super::auto_chunk(l3, 0), 4 << 20);
    assert_eq!(super::auto_chunk(0, 128), super::AUTO_CHUNK_MAX);
    assert_eq!(super::auto_chunk(32 * MIB, 32), 1 << 20);
    for slots in 1..512 {
        let c = super::auto_chunk(l3, slots) as u64;
        assert!(c.is_power_of_two() && (1 << 20..=4 << 20).contains(&c));
        assert!(
            c == 1 << 20 || c * slots as u64 <= l3 / 2,
            "{slots} slots of {c}"
        );
    }
}

/// The options' chunk wins; else the readers, the threads and the slots a
/// thread all count: 16 threads of 2 slots beside a 300 MiB L3 read 4 MiB
/// alone, 2 MiB as one of two readers, 1 MiB as one of four.
#[test]
fn the_chunk_counts_readers_threads_and_slots_unless_given() {
    use super::ReadOptions;
    let l3 = 300u64 << 20;
    let o = ReadOptions::default();
    assert_eq!(super::chunk_beside(&o, l3, 16), 4 << 20);
    assert_eq!(super::chunk_beside(&o.with_readers(0), l3, 16), 4 << 20);
    assert_eq!(super::chunk_beside(&o.with_readers(2), l3, 16), 2 << 20);
    assert_eq!(super::chunk_beside(&o.with_readers(4), l3, 16), 1 << 20);
    assert_eq!(super::chunk_beside(&o, l3, 64), 1 << 20);
    assert_eq!(
        super::chunk_beside(&o.with_slots_per_thread(4), l3, 16),
        2 << 20
    );
    assert_eq!(
        super::chunk_beside(&o.with_readers(4).with_chunk_bytes(3 << 20), l3, 16),
        3 << 20
    );
    assert_eq!(
        super::chunk_beside(&o.with_readers(64), 0, 16),
        super::AUTO_CHUNK_MAX
    );
}
