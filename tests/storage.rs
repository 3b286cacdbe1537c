//! The storage reader and the safetensors loader through the public API:
//! files read into pinned host memory byte for byte, checkpoints of every
//! dtype against the `safetensors` crate's own reading of the same file,
//! indexes and shards, hostile files refused with an input error and
//! nothing left allocated. GPU tests are `#[ignore]`d (run them with
//! `--ignored` on a GPU machine; they skip without a driver).
// Test data: counts, sizes, indices and byte patterns far inside every type's range.
#![allow(clippy::cast_possible_truncation)]
#![allow(clippy::unwrap_used)] // tests fail loudly

mod common;

use common::storage::{assert_no_leak, pattern, runtime, DTYPES};

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use numapin::storage::safetensors::{Checkpoint, Dtype, Shard};
use numapin::storage::{self, HostRange, IoMode, ReadOptions, Source, StorageError};
use numapin::topology::ProbeOptions;
use numapin::{ErrorKind, Runtime, RuntimeConfig, Topology};
use safetensors::tensor::TensorView;

use common::storage::node;

/// A checkpoint of every dtype, an empty tensor, odd sizes and a large
/// tensor spanning several reads, written by the safetensors crate.
fn tensors() -> Vec<(String, Dtype, Vec<usize>, Vec<u8>)> {
    let mut v = Vec::new();
    for (i, &(d, size)) in DTYPES.iter().enumerate() {
        let shape = vec![3, 7 + i];
        let n = shape.iter().product::<usize>() * size;
        v.push((format!("t.{i}.{d}"), d, shape, pattern(n, i as u8)));
    }
    v.push(("empty".into(), Dtype::F32, vec![0, 5], Vec::new()));
    v.push(("scalar".into(), Dtype::F64, vec![], pattern(8, 99)));
    v.push(("odd".into(), Dtype::U8, vec![4097], pattern(4097, 7)));
    v.push((
        "big".into(),
        Dtype::BF16,
        vec![3, 1_500_007],
        pattern(9_000_042, 3),
    ));
    v
}

fn write(dir: &Path, name: &str, ts: &[(String, Dtype, Vec<usize>, Vec<u8>)]) -> PathBuf {
    let views: Vec<(String, TensorView<'_>)> = ts
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    let bytes = safetensors::serialize(views, None).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// What the safetensors crate reads from the file: name to (dtype, shape,
/// bytes).
fn reference(p: &Path) -> HashMap<String, (Dtype, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(p).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(n, t)| (n, (t.dtype(), t.shape().to_vec(), t.data().to_vec())))
        .collect()
}

fn load_host(
    rt: &Runtime,
    ck: &Checkpoint,
    sel: &[usize],
    io: IoMode,
) -> HashMap<String, (Dtype, Vec<usize>, Vec<u8>)> {
    let opts = ReadOptions::default().with_io(io).with_chunk_bytes(1 << 20);
    let h = ck.load_to_host(rt, node(rt), sel, &opts).unwrap();
    h.tensors
        .iter()
        .map(|t| {
            let e = &ck.tensors()[t.entry];
            (
                e.name.clone(),
                (e.dtype, e.shape.clone(), t.bytes().to_vec()),
            )
        })
        .collect()
}

#[test]
fn a_checkpoint_of_every_dtype_loads_as_the_safetensors_crate_reads_it() {
    let rt = runtime();
    let d = tempfile::tempdir().unwrap();
    let p = write(d.path(), "model.safetensors", &tensors());
    let want = reference(&p);
    let ck = Checkpoint::open(&p).unwrap();
    assert_eq!(ck.tensors().len(), want.len());
    let all = ck.select(None, None).unwrap();
    for io in [IoMode::Auto, IoMode::Buffered] {
        assert_eq!(load_host(&rt, &ck, &all, io), want, "{io:?}");
    }
    // Subsets, by name.
    let sel = ck.select(Some(&["odd", "empty", "big"]), None).unwrap();
    let got = load_host(&rt, &ck, &sel, IoMode::Auto);
    assert_eq!(got.len(), 3);
    assert_eq!(got["big"], want["big"]);
    assert_no_leak(&rt);
}

/// A safetensors file written by hand: the header padded with `pad`
/// spaces (so the data starts at an odd offset) and tensors packed with no
/// regard for alignment (an F32 right after 3 bytes).
fn hand_written(dir: &Path, pad: usize) -> (PathBuf, Vec<(String, Vec<u8>)>) {
    let a = pattern(3, 1);
    let b = pattern(4 * 5000, 2);
    let c = pattern(2 * 333, 3);
    let header = format!(
        r#"{{"a":{{"dtype":"U8","shape":[3],"data_offsets":[0,3]}},"b":{{"dtype":"F32","shape":[5000],"data_offsets":[3,20003]}},"c":{{"dtype":"F16","shape":[333],"data_offsets":[20003,20669]}},"__metadata__":{{"format":"pt"}}}}{}"#,
        " ".repeat(pad)
    );
    let mut f = (header.len() as u64).to_le_bytes().to_vec();
    f.extend_from_slice(header.as_bytes());
    f.extend_from_slice(&a);
    f.extend_from_slice(&b);
    f.extend_from_slice(&c);
    let p = dir.join(format!("hand{pad}.safetensors"));
    std::fs::write(&p, &f).unwrap();
    (p, vec![("a".into(), a), ("b".into(), b), ("c".into(), c)])
}

#[test]
fn tensors_at_offsets_that_are_not_page_aligned_arrive_whole() {
    let rt = runtime();
    let d = tempfile::tempdir().unwrap();
    for pad in [0, 1, 5, 4091] {
        let (p, want) = hand_written(d.path(), pad);
        let reference = reference(&p);
        let ck = Checkpoint::open(&p).unwrap();
        let all = ck.select(None, None).unwrap();
        let got = load_host(&rt, &ck, &all, IoMode::Auto);
        assert_eq!(got, reference, "pad {pad}");
        for (n, bytes) in want {
            assert_eq!(got[&n].2, bytes, "{n} pad {pad}");
        }
    }
    assert_no_leak(&rt);
}

#[test]
fn ranges_of_a_file_arrive_in_host_memory_byte_for_byte() {
    let rt = runtime();
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("data.bin");
    let data = pattern(5 << 20, 11);
    std::fs::write(&p, &data).unwrap();
    let src = Source::open(&p).unwrap();
    let spans = [
        (0usize, 1usize),
        (1, 4095),
        (4096, 1 << 20),
        (123_457, 2_000_001),
        (data.len() - 3, 3),
    ];
    let mut bufs: Vec<Vec<u8>> = spans.iter().map(|&(_, n)| vec![0u8; n]).collect();
    let ranges: Vec<HostRange<'_>> = spans
        .iter()
        .zip(bufs.iter_mut())
        .map(|(&(off, _), b)| HostRange {
            source: 0,
            offset: off as u64,
            dst: b,
        })
        .collect();
    let opts = ReadOptions::default()
        .with_chunk_bytes(256 << 10)
        .with_threads(3);
    let r = storage::read_ranges_to_host(&rt, std::slice::from_ref(&src), ranges, node(&rt), &opts)
        .unwrap();
    assert_eq!(r.bytes, spans.iter().map(|s| s.1 as u64).sum::<u64>());
    assert_eq!(r.cached_bytes + r.direct_bytes + r.buffered_bytes, r.bytes);
    for (&(off, n), b) in spans.iter().zip(&bufs) {
        assert!(b[..] == data[off..off + n], "range at {off}");
    }
    // Into arena memory, aligned like the file: the whole file at once.
    let mut buf = rt
        .alloc(
            numapin::Target::HostNode(rt.calling_thread_node()),
            data.len(),
        )
        .unwrap();
    storage::read_to_host(
        &rt,
        &src,
        0,
        &mut buf[..],
        node(&rt),
        &ReadOptions::default(),
    )
    .unwrap();
    assert!(buf[..] == data[..]);
    drop(buf);
    // A range past the end is refused before anything is read.
    let mut b = vec![0u8; 10];
    let e = storage::read_to_host(&rt, &src, data.len() as u64 - 5, &mut b, node(&rt), &opts)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Input, "{e}");
    assert!(e.to_string().contains("past the end"), "{e}");
    assert_no_leak(&rt);
}

/// Writes `ts` as `n` shard files and an index over them.
fn sharded(dir: &Path, ts: &[(String, Dtype, Vec<usize>, Vec<u8>)], n: usize) -> PathBuf {
    let mut map = serde_json::Map::new();
    for k in 0..n {
        let part: Vec<_> = ts.iter().skip(k).step_by(n).cloned().collect();
        let name = format!("model-{:05}-of-{n:05}.safetensors", k + 1);
        write(dir, &name, &part);
        for t in &part {
            map.insert(t.0.clone(), serde_json::Value::String(name.clone()));
        }
    }
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": map});
    let p = dir.join("model.safetensors.index.json");
    std::fs::write(&p, index.to_string()).unwrap();
    p
}

#[test]
fn an_index_loads_every_shard_and_ranks_split_it_without_overlap() {
    let rt = runtime();
    let d = tempfile::tempdir().unwrap();
    let ts = tensors();
    let p = sharded(d.path(), &ts, 3);
    let ck = Checkpoint::open(&p).unwrap();
    assert_eq!(ck.files().len(), 3);
    let all = ck.select(None, None).unwrap();
    let got = load_host(&rt, &ck, &all, IoMode::Auto);
    assert_eq!(got.len(), ts.len());
    for (n, d, s, b) in &ts {
        assert_eq!(got[n], (*d, s.clone(), b.clone()), "{n}");
    }
    // Four ranks: disjoint, together everything, bytes balanced to within
    // the largest tensor.
    let shards = ck.shards(None, 4).unwrap();
    let mut seen: Vec<usize> = shards.iter().flatten().copied().collect();
    seen.sort_unstable();
    let mut every = all.clone();
    every.sort_unstable();
    assert_eq!(seen, every);
    for (r, s) in shards.iter().enumerate() {
        assert_eq!(
            &ck.select(None, Some(Shard::new(r, 4).unwrap())).unwrap(),
            s
        );
    }
    assert!(Shard::new(4, 4).is_err());
    assert_no_leak(&rt);
}

fn input_error(r: Result<Checkpoint, StorageError>, what: &str) -> String {
    let e = r.expect_err(what);
    assert_eq!(e.kind(), ErrorKind::Input, "{what}: {e}");
    assert!(e.fix().is_some(), "{what}: no fix");
    numapin::error::with_causes(&e)
}

#[test]
fn hostile_files_are_refused_with_an_input_error() {
    let rt = runtime();
    let d = tempfile::tempdir().unwrap();
    let good = std::fs::read(write(d.path(), "good.safetensors", &tensors()[..4])).unwrap();
    let n = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8(good[8..8 + n].to_vec()).unwrap();
    let case = |name: &str, bytes: &[u8]| -> String {
        let p = d.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        input_error(Checkpoint::open(&p), name)
    };
    let with_header = |h: &[u8], data: &[u8]| -> Vec<u8> {
        let mut f = (h.len() as u64).to_le_bytes().to_vec();
        f.extend_from_slice(h);
        f.extend_from_slice(data);
        f
    };
    // Truncated anywhere: in the length, in the header, in the data.
    for cut in [0, 5, 8, 8 + n / 2, 8 + n, good.len() - 1] {
        case(&format!("cut{cut}.safetensors"), &good[..cut]);
    }
    // Trailing bytes after the data (safetensors' own loader refuses them).
    let mut longer = good.clone();
    longer.push(0);
    assert!(case("longer.safetensors", &longer).contains("after the last tensor"));
    // A header length of 2^63, and one just past the file.
    let mut huge = good.clone();
    huge[..8].copy_from_slice(&(1u64 << 63).to_le_bytes());
    assert!(case("huge.safetensors", &huge).contains("over the format's"));
    let mut past = good.clone();
    past[..8].copy_from_slice(&((good.len() - 7) as u64).to_le_bytes());
    case("past.safetensors", &past);
    // Bad JSON, JSON that is not a header, bad UTF-8.
    case("json.safetensors", &with_header(b"{\"a\": [", b""));
    case("list.safetensors", &with_header(b"[1, 2]", b""));
    case("utf8.safetensors", &with_header(b"{\"\xff\": 1}", b""));
    // Offsets past the end of the data, overlapping, with a gap, a size that
    // does not match the shape, an unknown dtype.
    let t = |o: &str| {
        format!(
            r#"{{"x":{{"dtype":"F32","shape":[2],"data_offsets":[0,8]}},"y":{{"dtype":"F32","shape":[2],"data_offsets":{o}}}}}"#
        )
    };
    assert!(case(
        "past_end.safetensors",
        &with_header(t("[8,16]").as_bytes(), &[0; 12])
    )
    .contains("past the end"));
    case(
        "overlap.safetensors",
        &with_header(t("[4,12]").as_bytes(), &[0; 12]),
    );
    case(
        "gap.safetensors",
        &with_header(t("[12,20]").as_bytes(), &[0; 20]),
    );
    case(
        "size.safetensors",
        &with_header(t("[8,20]").as_bytes(), &[0; 20]),
    );
    case(
        "dtype.safetensors",
        &with_header(
            br#"{"x":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}}"#,
            &[0; 16],
        ),
    );
    case(
        "overflow.safetensors",
        &with_header(
            br#"{"x":{"dtype":"F64","shape":[4611686018427387904,8],"data_offsets":[0,8]}}"#,
            &[0; 8],
        ),
    );
    // The tampered good header still parses (the cases above fail for what
    // they changed, not for the test's own writing).
    assert!(Checkpoint::open(d.path().join("good.safetensors")).is_ok());
    assert!(header.starts_with('{'));
    // Not regular files.
    let fifo = d.path().join("fifo.safetensors");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    assert!(input_error(Checkpoint::open(&fifo), "fifo").contains("FIFO"));
    assert!(input_error(Checkpoint::open(d.path()), "dir").contains("directory"));
    assert!(input_error(
        Checkpoint::open(d.path().join("none.safetensors")),
        "missing"
    )
    .contains("does not exist"));
    assert_no_leak(&rt);
}

#[test]
fn hostile_indexes_are_refused_with_an_input_error() {
    let d = tempfile::tempdir().unwrap();
    write(d.path(), "a.safetensors", &tensors()[..2]);
    let names: Vec<String> = tensors()[..2].iter().map(|t| t.0.clone()).collect();
    let case = |name: &str, text: &str| -> String {
        let p = d.path().join(name);
        std::fs::write(&p, text).unwrap();
        input_error(Checkpoint::open(&p), name)
    };
    case("bad.json", "{\"weight_map\": ");
    case("nomap.json", "{\"metadata\": {}}");
    case("notstr.json", "{\"weight_map\": {\"x\": 3}}");
    assert!(case(
        "up.json",
        &format!(
            "{{\"weight_map\": {{\"{}\": \"../a.safetensors\"}}}}",
            names[0]
        )
    )
    .contains("relative path"));
    case(
        "abs.json",
        &format!("{{\"weight_map\": {{\"{}\": \"/etc/passwd\"}}}}", names[0]),
    );
    case(
        "empty.json",
        &format!("{{\"weight_map\": {{\"{}\": \"\"}}}}", names[0]),
    );
    assert!(case(
        "gone.json",
        &format!(
            "{{\"weight_map\": {{\"{}\": \"b.safetensors\"}}}}",
            names[0]
        )
    )
    .contains("does not exist"));
    assert!(case(
        "wrong.json",
        "{\"weight_map\": {\"nope\": \"a.safetensors\"}}"
    )
    .contains("no tensor of that name"));
    // The good one.
    let p = d.path().join("ok.json");
    std::fs::write(
        &p,
        format!(
            "{{\"weight_map\": {{\"{}\": \"a.safetensors\"}}}}",
            names[0]
        ),
    )
    .unwrap();
    let ck = Checkpoint::open(&p).unwrap();
    assert_eq!(ck.tensors().len(), 1, "only what the map names");
    // Unknown names are input errors too.
    let e = ck.select(Some(&["nope"]), None).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Input);
}

#[test]
fn a_file_that_shrinks_before_it_loads_is_an_error_and_nothing_stays_lent() {
    let rt = runtime();
    let d = tempfile::tempdir().unwrap();
    let p = write(d.path(), "m.safetensors", &tensors());
    let ck = Checkpoint::open(&p).unwrap();
    let len = std::fs::metadata(&p).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let all = ck.select(None, None).unwrap();
    let e = ck
        .load_to_host(&rt, node(&rt), &all, &ReadOptions::default())
        .unwrap_err();
    // Found when the file is opened again for the load, before a byte of
    // it is read.
    assert!(matches!(e, StorageError::Input { .. }), "{e}");
    assert!(
        e.to_string().contains("m.safetensors") && e.to_string().contains("length changed"),
        "{e}"
    );
    assert_no_leak(&rt);
}

#[test]
fn where_a_file_lives_is_found_or_explained() {
    let rt = runtime();
    let loc = storage::locate(file!(), rt.topology()).unwrap();
    assert!(!loc.describe().is_empty());
    assert!(loc.device.is_some() || loc.filesystem.is_some() || loc.note.is_some());
}

/// GPU tests: need a CUDA GPU; they skip (pass with a message) without one.
mod gpu {
    use super::*;
    use numapin::CudaOrdinal;

    pub(super) fn gpu_runtime() -> Option<(Runtime, CudaOrdinal)> {
        if !numapin::gpu::available() {
            common::skip(common::Need::Gpu, "no CUDA driver");
            return None;
        }
        let t = Topology::probe(&ProbeOptions::from_process()).unwrap();
        let g = t.gpus.iter().find_map(|g| g.cuda_ordinal);
        let Some(g) = g else {
            common::skip(common::Need::Gpu, "no CUDA GPU visible");
            return None;
        };
        Some((Runtime::new(t, RuntimeConfig::default()).unwrap(), g))
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn gpu_checkpoints_load_into_device_memory_byte_for_byte() {
        let Some((rt, gpu)) = gpu_runtime() else {
            return;
        };
        let d = tempfile::tempdir().unwrap();
        let p = sharded(d.path(), &tensors(), 2);
        let ck = Checkpoint::open(&p).unwrap();
        let all = ck.select(None, None).unwrap();
        for io in [IoMode::Auto, IoMode::Buffered, IoMode::Direct] {
            for chunk in [64 << 10, 4 << 20] {
                let opts = ReadOptions::default().with_io(io).with_chunk_bytes(chunk);
                let loaded = ck.load_to_device(&rt, gpu, &all, &opts).unwrap();
                for (i, ptr) in loaded.iter() {
                    let t = &ck.tensors()[i];
                    let want = tensors().into_iter().find(|x| x.0 == t.name).unwrap().3;
                    let mut back = vec![0u8; t.len];
                    let off = (ptr - loaded.memory().ptr()) as usize;
                    loaded.memory().read_back(off, &mut back).unwrap();
                    assert!(back == want, "{} {io:?} chunk {chunk}", t.name);
                }
                assert!(loaded.report().staging_bytes > 0);
            }
        }
        assert_no_leak(&rt);
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn gpu_ranges_at_any_offset_reach_device_memory() {
        let Some((rt, gpu)) = gpu_runtime() else {
            return;
        };
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("data.bin");
        let data = pattern((9 << 20) + 123, 5);
        std::fs::write(&p, &data).unwrap();
        let src = Source::open(&p).unwrap();
        let dev = storage::DeviceMemory::new(gpu, data.len()).unwrap();
        for (off, len) in [
            (0usize, data.len()),
            (1, 4095),
            (4097, 5 << 20),
            (data.len() - 1, 1),
        ] {
            let opts = ReadOptions::default().with_chunk_bytes(1 << 20);
            storage::read_to_device(
                &rt,
                &src,
                off as u64,
                dev.ptr() + 7,
                len.min(data.len() - 7),
                gpu,
                &opts,
            )
            .unwrap();
            let n = len.min(data.len() - 7);
            let mut back = vec![0u8; n];
            dev.read_back(7, &mut back).unwrap();
            assert!(back[..] == data[off..off + n], "{off} {len}");
        }
        // Past the allocation: refused before anything is read.
        let e = storage::read_to_device(
            &rt,
            &src,
            0,
            dev.ptr() + 8,
            data.len(),
            gpu,
            &ReadOptions::default(),
        )
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Input, "{e}");
        // Host memory is not device memory.
        let host = [0u8; 64];
        let e = storage::read_to_device(
            &rt,
            &src,
            0,
            host.as_ptr() as u64,
            64,
            gpu,
            &ReadOptions::default(),
        )
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Input, "{e}");
        assert_no_leak(&rt);
    }
}

/// GPU tests of destinations made while the read runs.
mod gpu_as_made {
    use super::*;
    use numapin::storage::{DeviceMemory, SourceRange};
    use numapin::CudaOrdinal;
    use std::time::Duration;

    /// Why a test's read stopped.
    #[derive(Debug)]
    pub(super) enum Stop {
        Read(StorageError),
        Maker(usize),
    }

    impl From<StorageError> for Stop {
        fn from(e: StorageError) -> Self {
            Stop::Read(e)
        }
    }

    pub(super) fn setup() -> Option<(Runtime, CudaOrdinal, tempfile::TempDir, Vec<u8>, Source)> {
        let (rt, gpu) = super::gpu::gpu_runtime()?;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("data.bin");
        let data = pattern((6 << 20) + 321, 9);
        std::fs::write(&p, &data).unwrap();
        let src = Source::open(&p).unwrap();
        Some((rt, gpu, d, data, src))
    }

    /// Reads `rs` of `src`, on the legacy default stream, to what `dest`
    /// makes.
    pub(super) fn read_made<E: From<StorageError>>(
        rt: &Runtime,
        src: &Source,
        rs: &[SourceRange],
        gpu: CudaOrdinal,
        opts: &ReadOptions,
        dest: impl FnMut(usize) -> Result<u64, E>,
    ) -> Result<storage::ReadReport, E> {
        // SAFETY: the legacy default stream; the callers keep each
        // destination until the call returns.
        unsafe {
            storage::read_ranges_to_device_as_made(
                rt,
                std::slice::from_ref(src),
                rs,
                gpu,
                std::ptr::null_mut(),
                opts,
                dest,
            )
        }
    }

    /// `len` bytes of new device memory, kept in `mem`: its address.
    pub(super) fn keep(
        mem: &mut Vec<DeviceMemory>,
        gpu: CudaOrdinal,
        len: usize,
    ) -> Result<u64, Stop> {
        let m = DeviceMemory::new(gpu, len)?;
        let p = m.ptr();
        mem.push(m);
        Ok(p)
    }

    /// 40 ranges of the file: neighbours (sharing reads), a gap, one
    /// crossing many chunks, one empty.
    pub(super) fn ranges(len: usize) -> Vec<SourceRange> {
        let mut out = Vec::new();
        let mut at = 0u64;
        for k in 0..40u64 {
            let n = match k {
                7 => 0,
                20 => 2 << 20,
                _ => 1000 + 777 * k as usize,
            };
            out.push(SourceRange {
                source: 0,
                offset: at,
                len: n,
            });
            at += n as u64 + if k % 5 == 0 { 100_000 } else { 0 };
        }
        assert!(at as usize <= len);
        out
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn gpu_destinations_made_during_the_read_get_their_bytes() {
        let Some((rt, gpu, _d, data, src)) = setup() else {
            return;
        };
        let rs = ranges(data.len());
        let opts = ReadOptions::default().with_chunk_bytes(64 << 10);
        let mut mem: Vec<DeviceMemory> = Vec::new();
        let mut order = Vec::new();
        let r = read_made(&rt, &src, &rs, gpu, &opts, |i| {
            // Slow to make: the workers wait for them.
            std::thread::sleep(Duration::from_millis(2));
            order.push(i);
            keep(&mut mem, gpu, rs[i].len)
        })
        .unwrap();
        assert_eq!(order, (0..rs.len()).collect::<Vec<_>>());
        assert_eq!(r.bytes, rs.iter().map(|r| r.len as u64).sum::<u64>());
        for (r, m) in rs.iter().zip(&mem) {
            let mut back = vec![0u8; r.len];
            m.read_back(0, &mut back).unwrap();
            let o = r.offset as usize;
            assert!(back[..] == data[o..o + r.len], "range at {o}");
        }
        drop(mem);
        assert_no_leak(&rt);
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn gpu_a_maker_error_or_a_bad_destination_stops_the_read() {
        let Some((rt, gpu, _d, data, src)) = setup() else {
            return;
        };
        let rs = ranges(data.len());
        let opts = ReadOptions::default().with_chunk_bytes(64 << 10);
        let host = vec![0u8; 1 << 20];
        for bad in ["maker", "host memory", "too small"] {
            let mut mem: Vec<DeviceMemory> = Vec::new();
            let mut calls = 0;
            let r = read_made(&rt, &src, &rs, gpu, &opts, |i| {
                calls += 1;
                match (i, bad) {
                    (5, "maker") => Err(Stop::Maker(i)),
                    (5, "host memory") => Ok(host.as_ptr() as u64),
                    (5, _) => keep(&mut mem, gpu, rs[i].len - 1),
                    _ => keep(&mut mem, gpu, rs[i].len),
                }
            });
            match (bad, r) {
                ("maker", Err(Stop::Maker(5))) => {}
                (_, Err(Stop::Read(e))) if bad != "maker" => {
                    assert_eq!(e.kind(), ErrorKind::Input, "{bad}: {e}");
                    let why = if bad == "host memory" {
                        "is not device memory"
                    } else {
                        "run past the end of their device allocation"
                    };
                    assert!(e.to_string().contains(why), "{bad}: {e}");
                }
                (_, r) => panic!("{bad}: {r:?}"),
            }
            assert_eq!(
                calls, 6,
                "{bad}: no destination is asked for after the error"
            );
            // Every copy ended with the call: the memory goes now.
            drop(mem);
        }
        assert_no_leak(&rt);
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn gpu_empty_ranges_still_get_their_destinations_made() {
        let Some((rt, gpu, _d, _data, src)) = setup() else {
            return;
        };
        let rs = vec![
            SourceRange {
                source: 0,
                offset: 10,
                len: 0
            };
            3
        ];
        let mut calls = Vec::new();
        let r = read_made(&rt, &src, &rs, gpu, &ReadOptions::default(), |i| {
            calls.push(i);
            Ok::<u64, StorageError>(0)
        })
        .unwrap();
        assert_eq!((r.bytes, calls), (0, vec![0, 1, 2]));
        assert_no_leak(&rt);
    }
}

/// GPU tests of a read whose other side fails while destinations come.
mod gpu_as_made_failures {
    use super::gpu_as_made::{keep, ranges, read_made, setup, Stop};
    use super::*;
    use numapin::storage::DeviceMemory;
    use std::time::Duration;

    /// Runs `f` on a thread of its own: its result, or a failure once it
    /// has run for a minute (a hang).
    fn within_a_minute<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(60))
            .expect("the read hung")
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn gpu_a_read_error_while_destinations_come_ends_the_call() {
        let Some((rt, gpu, d, data, src)) = setup() else {
            return;
        };
        let path = d.path().join("data.bin");
        let (calls, r, rt) = within_a_minute(move || {
            let rs = ranges(data.len());
            let opts = ReadOptions::default().with_chunk_bytes(64 << 10);
            let mut mem: Vec<DeviceMemory> = Vec::new();
            let mut calls = 0;
            let r = read_made(&rt, &src, &rs, gpu, &opts, |i| {
                calls += 1;
                if i == 3 {
                    // The workers' later reads find the file's end.
                    std::fs::OpenOptions::new()
                        .write(true)
                        .open(&path)
                        .unwrap()
                        .set_len(0)
                        .unwrap();
                }
                std::thread::sleep(Duration::from_millis(2));
                keep(&mut mem, gpu, rs[i].len)
            })
            .map(|r| r.bytes);
            drop(mem);
            (calls, r, rt)
        });
        match r {
            Err(Stop::Read(e @ StorageError::Truncated { .. })) => {
                assert!(calls < 40, "the destinations stopped: {calls}: {e}")
            }
            r => panic!("{r:?} after {calls} destinations"),
        }
        assert_no_leak(&rt);
        drop(d);
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn gpu_a_panicking_maker_ends_the_call_with_its_panic() {
        let Some((rt, gpu, d, data, src)) = setup() else {
            return;
        };
        let (panicked, rt) = within_a_minute(move || {
            let rs = ranges(data.len());
            let opts = ReadOptions::default().with_chunk_bytes(64 << 10);
            let mut mem: Vec<DeviceMemory> = Vec::new();
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                read_made(&rt, &src, &rs, gpu, &opts, |i| {
                    assert!(i < 5, "the maker fails at 5");
                    keep(&mut mem, gpu, rs[i].len)
                })
            }));
            drop(mem);
            (r.is_err(), rt)
        });
        assert!(panicked, "the maker's panic reaches the caller");
        assert_no_leak(&rt);
        drop(d);
    }
}

/// Without the GPU named: the read is refused before any destination is
/// asked for.
#[test]
fn a_read_to_an_unknown_gpu_asks_for_no_destination() {
    use numapin::storage::SourceRange;
    use numapin::topology::CudaMode;

    let t = Topology::probe(&ProbeOptions::from_process().with_cuda(CudaMode::Off)).unwrap();
    let rt = Runtime::new(t, RuntimeConfig::default().with_region_bytes(2 << 20)).unwrap();
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("data.bin");
    std::fs::write(&p, pattern(1 << 16, 3)).unwrap();
    let src = Source::open(&p).unwrap();
    let rs = [SourceRange {
        source: 0,
        offset: 0,
        len: 1 << 16,
    }];
    let mut asked = 0;
    // SAFETY: the legacy default stream; nothing is read.
    let r = unsafe {
        storage::read_ranges_to_device_as_made(
            &rt,
            std::slice::from_ref(&src),
            &rs,
            numapin::CudaOrdinal(7),
            std::ptr::null_mut(),
            &ReadOptions::default(),
            |_| -> Result<u64, StorageError> {
                asked += 1;
                Ok(0)
            },
        )
    };
    let e = r.unwrap_err();
    assert_eq!(asked, 0, "{e}");
    assert!(e.to_string().contains("GPU 7"), "{e}");
    assert_no_leak(&rt);
}
