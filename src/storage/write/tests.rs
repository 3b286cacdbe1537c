//! The writer under injected faults (`EINTR`, short writes, `ENOSPC`,
//! `EIO`, refused direct writes, a failed `fsync`), from host memory: the
//! files come out byte for byte, or the old file stays and nothing is
//! left behind.

use std::path::{Path, PathBuf};

use proptest::prelude::*;

use super::{write_files, Data, FileParts, WriteOptions};
use crate::runtime::{Runtime, RuntimeConfig, Target};
use crate::storage::faults::{self, Injected};
use crate::storage::{IoMode, StorageError};
use crate::topology::{CudaMode, ProbeOptions, Topology};

fn runtime() -> Runtime {
    let opts = ProbeOptions::from_process().with_cuda(CudaMode::Off);
    let t = Topology::probe(&opts).expect("probe");
    let c = RuntimeConfig::default()
        .with_region_bytes(16 << 20)
        .with_register(false);
    Runtime::new(t, c).expect("runtime")
}

#[allow(clippy::cast_possible_truncation)] // a byte pattern: the low bits are the point
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed) ^ (i >> 11) as u8)
        .collect()
}

fn small() -> WriteOptions {
    WriteOptions::default()
        .with_chunk_bytes(64 << 10)
        .with_threads(3)
}

fn listing(d: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(d)
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn assert_clean(rt: &Runtime) {
    for s in rt.stats() {
        assert_eq!(s.bytes_in_use, 0, "node {}: {s:?}", s.node);
    }
}

/// Writes `parts` to `path` and returns the result.
fn write(
    rt: &Runtime,
    path: &Path,
    parts: &[&[u8]],
    opts: &WriteOptions,
) -> crate::storage::Result<super::WriteReport> {
    let data: Vec<Data<'_>> = parts.iter().map(|p| Data::Host(p)).collect();
    let f = FileParts::new(path, &data);
    write_files(rt, &[f], Target::Host, opts)
}

#[test]
fn parts_become_the_file_byte_for_byte_in_every_mode() {
    let rt = runtime();
    let d = tempfile::tempdir().expect("a temporary folder");
    let p = d.path().join("out.bin");
    let (a, b, c) = (pattern(100, 1), pattern(300_001, 2), pattern(65_536, 3));
    let want: Vec<u8> = [&a[..], &[], &b[..], &c[..]].concat();
    for io in [IoMode::Auto, IoMode::Buffered] {
        for fsync in [true, false] {
            let _g = Injected::none();
            let opts = small().with_io(io).with_fsync(fsync);
            let r = write(&rt, &p, &[&a, &[], &b, &c], &opts).expect("write");
            assert_eq!(std::fs::read(&p).expect("read"), want, "{io:?}");
            assert_eq!(r.bytes, want.len() as u64);
            assert_eq!(
                r.direct_bytes + r.buffered_bytes,
                want.len() as u64,
                "{r:?}"
            );
            if io == IoMode::Buffered {
                assert_eq!(r.direct_bytes, 0);
            }
            assert_eq!(listing(d.path()), vec!["out.bin"]);
        }
    }
    // An empty file, and a file over an existing one keeps its mode.
    std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o640))
        .expect("chmod");
    write(&rt, &p, &[], &small()).expect("write");
    assert_eq!(std::fs::read(&p).expect("read"), b"");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&p).expect("stat").permissions(),
    );
    assert_eq!(mode & 0o777, 0o640);
    assert_clean(&rt);
}

#[test]
fn several_files_are_written_and_renamed_in_order() {
    let rt = runtime();
    let d = tempfile::tempdir().expect("a temporary folder");
    let (a, b) = (pattern(200_000, 5), pattern(7, 6));
    let (da, db) = ([Data::Host(&a)], [Data::Host(&b)]);
    let files = [
        FileParts::new(d.path().join("a"), &da),
        FileParts::new(d.path().join("b"), &db),
    ];
    let _g = Injected::none();
    let r = write_files(&rt, &files, Target::Host, &small()).expect("write");
    assert_eq!(r.files.len(), 2);
    assert_eq!(std::fs::read(d.path().join("a")).expect("a"), a);
    assert_eq!(std::fs::read(d.path().join("b")).expect("b"), b);
    // The same path twice is refused before anything is made.
    let twice = [files[0].clone(), files[0].clone()];
    let e = write_files(&rt, &twice, Target::Host, &small()).expect_err("twice");
    assert!(matches!(e, StorageError::Request { .. }), "{e}");
    assert_eq!(listing(d.path()), vec!["a", "b"]);
}

/// A write that fails leaves the old file, no temporary file and no slot.
fn fails_cleanly(f: faults::Faults, io: IoMode) -> StorageError {
    let rt = runtime();
    let d = tempfile::tempdir().expect("a temporary folder");
    let p = d.path().join("model.bin");
    std::fs::write(&p, b"the old file").expect("old");
    let data = pattern(1 << 20, 9);
    let e = {
        let _g = Injected::new(f);
        write(&rt, &p, &[&data], &small().with_io(io)).expect_err("a fault")
    };
    assert_eq!(std::fs::read(&p).expect("old"), b"the old file");
    assert_eq!(listing(d.path()), vec!["model.bin"]);
    assert_clean(&rt);
    e
}

#[test]
fn a_full_filesystem_names_the_file_the_offset_and_the_fix() {
    for io in [IoMode::Auto, IoMode::Buffered] {
        let e = fails_cleanly(
            faults::Faults {
                errno_at: Some((300_000, libc::ENOSPC)),
                ..Default::default()
            },
            io,
        );
        match &e {
            StorageError::Write {
                path, offset, op, ..
            } => {
                assert!(path.ends_with("model.bin"), "{e}");
                assert_eq!(*op, "writing");
                assert!(*offset <= 300_000 && 300_000 - offset < 64 << 10, "{e}");
            }
            other => panic!("{other:?}"),
        }
        let fix = e.fix().expect("a fix");
        assert!(fix.contains("df -h") && fix.contains("untouched"), "{fix}");
        assert_eq!(e.kind(), crate::ErrorKind::System);
        let text = crate::report::with_causes(&e);
        assert!(
            text.contains("No space left on device") && text.contains(".model.bin.numapin-tmp-"),
            "{text}"
        );
    }
}

#[test]
fn quota_size_limit_and_drive_errors_each_say_what_to_do() {
    for (errno, word) in [
        (libc::EDQUOT, "quota"),
        (libc::EFBIG, "ulimit -f"),
        (libc::EIO, "dmesg"),
    ] {
        let e = fails_cleanly(
            faults::Faults {
                errno_at: Some((700_000, errno)),
                short_max: 50_000,
                ..Default::default()
            },
            IoMode::Auto,
        );
        let fix = e.fix().expect("a fix");
        assert!(fix.contains(word), "{errno}: {fix}");
    }
    let e = fails_cleanly(
        faults::Faults {
            fsync_errno: Some(libc::EIO),
            ..Default::default()
        },
        IoMode::Auto,
    );
    assert!(matches!(e, StorageError::Write { op: "fsync", .. }), "{e}");
}

#[test]
fn a_refused_direct_write_goes_on_buffered_unless_direct_was_asked_for() {
    let rt = runtime();
    let d = tempfile::tempdir().expect("a temporary folder");
    let p = d.path().join("f.bin");
    let data = pattern(500_000, 4);
    let f = faults::Faults {
        refuse_direct: true,
        ..Default::default()
    };
    {
        let _g = Injected::new(f);
        let r = write(&rt, &p, &[&data], &small()).expect("write");
        assert_eq!(r.direct_bytes, 0);
        assert_eq!(std::fs::read(&p).expect("read"), data);
    }
    let direct_allowed = {
        let _g = Injected::none();
        write(&rt, &p, &[&data], &small().with_io(IoMode::Direct)).is_ok()
    };
    if direct_allowed {
        let e = fails_cleanly(f, IoMode::Direct);
        assert!(matches!(e, StorageError::Request { .. }), "{e}");
    }
}

#[test]
fn a_stale_temporary_file_of_a_dead_save_is_removed_by_the_next() {
    let rt = runtime();
    let d = tempfile::tempdir().expect("a temporary folder");
    let p = d.path().join("ck.bin");
    let stale = d.path().join(".ck.bin.numapin-tmp-2147483600-3");
    std::fs::write(&stale, b"half").expect("stale");
    let _g = Injected::none();
    let r = write(&rt, &p, &[b"new"], &small()).expect("write");
    assert_eq!(r.removed_stale, 1);
    assert_eq!(listing(d.path()), vec!["ck.bin"]);
}

#[test]
fn bad_options_are_refused() {
    let rt = runtime();
    let d = tempfile::tempdir().expect("a temporary folder");
    let p: PathBuf = d.path().join("x");
    for o in [
        small().with_chunk_bytes(0),
        small().with_slots_per_thread(0),
        small().with_threads(1 << 20),
    ] {
        let e = write(&rt, &p, &[b"x"], &o).expect_err("bad options");
        assert_eq!(e.kind(), crate::ErrorKind::Input, "{e}");
    }
    assert!(listing(d.path()).is_empty());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn any_file_arrives_whole_under_interrupted_and_short_writes(
        lens in proptest::collection::vec(0usize..90_000, 0..6),
        chunk_kib in 4usize..80,
        threads in 1usize..4,
        eintr in prop_oneof![Just(0u64), 2u64..5],
        short in prop_oneof![Just(0usize), 1usize..30_000],
        io in prop_oneof![Just(IoMode::Auto), Just(IoMode::Buffered)],
    ) {
        let rt = runtime();
        let d = tempfile::tempdir().expect("a temporary folder");
        let p = d.path().join("p.bin");
        let parts: Vec<Vec<u8>> = lens.iter().enumerate().map(|(i, &n)| pattern(n, u8::try_from(i).unwrap())).collect();
        let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        let _g = Injected::new(faults::Faults { eintr_every: eintr, short_max: short, ..Default::default() });
        let opts = WriteOptions::default()
            .with_chunk_bytes(chunk_kib << 10)
            .with_threads(threads)
            .with_io(io)
            .with_fsync(false);
        write(&rt, &p, &refs, &opts).expect("write");
        prop_assert_eq!(std::fs::read(&p).expect("read"), parts.concat());
    }
}
