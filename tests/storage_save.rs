//! The storage writer and the safetensors saver through the public API:
//! files the `safetensors` crate reads back bit for bit (and that it
//! would have written byte for byte), every dtype, scalars and empty
//! tensors, metadata, sharded saves and their index as Hugging Face
//! writes them, numapin's own loader reading them; and faults: a full
//! filesystem, a read-only folder, targets that are folders, FIFOs or
//! links, a save killed mid-way, two saves to one path at once. After a
//! failure the old file is intact, no temporary file is left, nothing is
//! allocated or open. GPU tests are `#[ignore]`d (run them with
//! `--ignored` on a GPU machine; they skip without a driver).
#![allow(clippy::unwrap_used)] // tests fail loudly

mod common;

use common::storage::{assert_no_leak, pattern, runtime, DTYPES};

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use numapin::storage::safetensors::{save, Checkpoint, Dtype, SaveOptions, SaveTensor};
use numapin::storage::write::{Data, WriteOptions};
use numapin::storage::{IoMode, ReadOptions, StorageError};
use numapin::topology::ProbeOptions;
use numapin::{ErrorKind, Runtime, RuntimeConfig, Target, Topology};

/// No descriptor of this process names a file under `dir`.
fn assert_nothing_open_under(dir: &Path) {
    for e in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        if let Ok(t) = std::fs::read_link(e.path()) {
            assert!(!t.starts_with(dir), "still open: {}", t.display());
        }
    }
}

fn listing(d: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

type Owned = (String, Dtype, Vec<usize>, Vec<u8>);

/// Every dtype, an empty tensor, a scalar, odd sizes and one tensor over
/// several chunks.
fn tensors() -> Vec<Owned> {
    let mut v = Vec::new();
    for (i, &(d, size)) in DTYPES.iter().enumerate() {
        let shape = vec![3, 5 + i];
        let n = shape.iter().product::<usize>() * size;
        let bytes = if d == Dtype::BOOL {
            (0..n).map(|k| u8::from(k % 3 == 0)).collect()
        } else {
            pattern(n, u8::try_from(i).unwrap())
        };
        v.push((format!("layer.{i}.{d}"), d, shape, bytes));
    }
    v.push(("empty".into(), Dtype::F32, vec![0, 5], Vec::new()));
    v.push(("scalar".into(), Dtype::F64, vec![], pattern(8, 99)));
    v.push(("odd".into(), Dtype::U8, vec![4099], pattern(4099, 7)));
    v.push((
        "big".into(),
        Dtype::BF16,
        vec![3, 1_500_007],
        pattern(9_000_042, 3),
    ));
    v
}

fn views(ts: &[Owned]) -> Vec<SaveTensor<'_>> {
    ts.iter()
        .map(|(n, d, s, b)| SaveTensor::new(n.clone(), *d, s.clone(), Data::Host(b)))
        .collect()
}

fn small() -> SaveOptions {
    SaveOptions::default().with_write(
        WriteOptions::default()
            .with_chunk_bytes(1 << 20)
            .with_threads(3),
    )
}

fn meta(pairs: &[(&str, &str)]) -> Option<HashMap<String, String>> {
    Some(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

/// What the `safetensors` crate writes for `ts`.
fn crate_bytes(ts: &[Owned], metadata: Option<HashMap<String, String>>) -> Vec<u8> {
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = ts
        .iter()
        .map(|(n, d, s, b)| {
            let v = safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap();
            (n.clone(), v)
        })
        .collect();
    safetensors::serialize(views, metadata).unwrap()
}

/// The file holds `ts`, as the safetensors crate reads it.
fn assert_holds(bytes: &[u8], ts: &[Owned]) {
    let st = safetensors::SafeTensors::deserialize(bytes).unwrap();
    assert_eq!(st.len(), ts.len());
    for (n, d, s, b) in ts {
        let v = st.tensor(n).unwrap();
        assert_eq!((v.dtype(), v.shape()), (*d, &s[..]), "{n}");
        assert!(v.data() == &b[..], "{n}");
    }
}

#[test]
fn a_saved_file_is_the_one_the_safetensors_crate_writes_byte_for_byte() {
    let rt = runtime();
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("model.safetensors");
    let ts = tensors();
    for io in [IoMode::Auto, IoMode::Buffered] {
        for m in [None, meta(&[("format", "pt")])] {
            let opts = small()
                .with_metadata(m.clone())
                .with_write(small().write.with_io(io));
            let r = save(&rt, &p, &views(&ts), Target::Host, &opts).unwrap();
            let got = std::fs::read(&p).unwrap();
            assert!(got == crate_bytes(&ts, m.clone()), "{io:?} {m:?}");
            assert_holds(&got, &ts);
            let (_, md) = safetensors::SafeTensors::read_metadata(&got).unwrap();
            assert_eq!(md.metadata(), &m);
            assert_eq!(r.bytes, got.len() as u64);
            if io == IoMode::Buffered {
                assert_eq!(r.direct_bytes, 0);
            }
        }
    }
    // No tensor at all: the crate's empty file.
    save(&rt, &p, &[], Target::Host, &small()).unwrap();
    assert_eq!(std::fs::read(&p).unwrap(), crate_bytes(&[], None));
    assert_eq!(listing(d.path()), vec!["model.safetensors"]);
    assert_no_leak(&rt);
}

#[test]
fn numapin_loads_what_it_saves_and_saves_what_safetensors_wrote_unchanged() {
    let rt = runtime();
    let d = tempfile::tempdir().unwrap();
    let ts = tensors();
    // The crate writes; numapin loads it and saves it again.
    let first = d.path().join("first.safetensors");
    std::fs::write(&first, crate_bytes(&ts, meta(&[("k", "v")]))).unwrap();
    let ck = Checkpoint::open(&first).unwrap();
    let all = ck.select(None, None).unwrap();
    let loaded = ck
        .load_to_host(&rt, Target::Host, &all, &ReadOptions::default())
        .unwrap();
    let again: Vec<SaveTensor<'_>> = loaded
        .tensors
        .iter()
        .map(|h| {
            let t = &ck.tensors()[h.entry];
            SaveTensor::new(
                t.name.clone(),
                t.dtype,
                t.shape.clone(),
                Data::Host(h.bytes()),
            )
        })
        .collect();
    let second = d.path().join("second.safetensors");
    save(
        &rt,
        &second,
        &again,
        Target::Host,
        &small().with_metadata(meta(&[("k", "v")])),
    )
    .unwrap();
    assert!(std::fs::read(&first).unwrap() == std::fs::read(&second).unwrap());
    drop(loaded);
    // And numapin's loader reads numapin's file.
    let ck = Checkpoint::open(&second).unwrap();
    for t in ck.tensors() {
        let want = ts.iter().find(|x| x.0 == t.name).unwrap();
        assert_eq!((t.dtype, &t.shape), (want.1, &want.2));
    }
    assert_no_leak(&rt);
}

#[test]
fn sharded_saves_write_shards_and_an_index_as_hugging_face_does() {
    let rt = runtime();
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("ckpt");
    let ts = tensors();
    let total: usize = ts.iter().map(|t| t.3.len()).sum();
    // "big" alone is over the limit: a shard of its own.
    let opts = small().with_max_shard_size(Some(2000));
    save(&rt, &dir, &views(&ts), Target::Host, &opts).unwrap();
    let files = listing(&dir);
    let n = files.len() - 1;
    assert!(n > 3, "{files:?}");
    assert!(files.contains(&"model.safetensors.index.json".to_string()));
    assert!(files.contains(&format!("model-00001-of-{n:05}.safetensors")));
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("model.safetensors.index.json")).unwrap())
            .unwrap();
    assert_eq!(index["metadata"]["total_size"], total as u64);
    let map = index["weight_map"].as_object().unwrap();
    assert_eq!(map.len(), ts.len());
    for (name, file) in map {
        let bytes = std::fs::read(dir.join(file.as_str().unwrap())).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        assert!(st.tensor(name).is_ok(), "{name} in {file}");
    }
    // numapin's loader reads the index.
    let ck = Checkpoint::open(dir.join("model.safetensors.index.json")).unwrap();
    let all = ck.select(None, None).unwrap();
    let loaded = ck
        .load_to_host(&rt, Target::Host, &all, &ReadOptions::default())
        .unwrap();
    for h in &loaded.tensors {
        let t = &ck.tensors()[h.entry];
        let want = ts.iter().find(|x| x.0 == t.name).unwrap();
        assert!(h.bytes() == &want.3[..], "{}", t.name);
    }
    drop(loaded);
    // Saved again in one shard: model.safetensors alone, the old shards
    // and index gone, other files kept.
    std::fs::write(dir.join("notes.txt"), b"keep me").unwrap();
    save(
        &rt,
        &dir,
        &views(&ts),
        Target::Host,
        &small().with_max_shard_size(Some(1 << 30)),
    )
    .unwrap();
    assert_eq!(listing(&dir), vec!["model.safetensors", "notes.txt"]);
    assert_holds(&std::fs::read(dir.join("model.safetensors")).unwrap(), &ts);
    assert_no_leak(&rt);
}

#[test]
fn tensors_that_do_not_match_their_shape_or_repeat_a_name_are_refused_up_front() {
    let rt = runtime();
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("x.safetensors");
    let b = [0u8; 12];
    for ts in [
        vec![SaveTensor::new("a", Dtype::F32, vec![2], Data::Host(&b))],
        vec![
            SaveTensor::new("a", Dtype::U8, vec![12], Data::Host(&b)),
            SaveTensor::new("a", Dtype::U8, vec![12], Data::Host(&b)),
        ],
    ] {
        let e = save(&rt, &p, &ts, Target::Host, &small()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Input, "{e}");
    }
    assert!(listing(d.path()).is_empty());
}

#[test]
fn folders_and_fifos_are_refused_and_links_are_written_through() {
    let rt = runtime();
    let d = tempfile::tempdir().unwrap();
    let ts = tensors();
    let fifo = d.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    for (p, what) in [(d.path().to_path_buf(), "is a directory"), (fifo, "FIFO")] {
        let e = save(&rt, &p, &views(&ts), Target::Host, &small()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Input, "{e}");
        assert!(e.to_string().contains(what), "{e}");
    }
    // A link: the file it names is replaced, the link stays.
    let real = d.path().join("real.safetensors");
    std::fs::write(&real, b"old").unwrap();
    let link = d.path().join("link.safetensors");
    std::os::unix::fs::symlink("real.safetensors", &link).unwrap();
    save(&rt, &link, &views(&ts), Target::Host, &small()).unwrap();
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_holds(&std::fs::read(&real).unwrap(), &ts);
    assert_eq!(
        listing(d.path()),
        vec!["fifo", "link.safetensors", "real.safetensors"]
    );
    assert_no_leak(&rt);
}

/// Saves over `old` in `dir` and expects a failure that leaves it intact
/// and nothing behind.
fn fails_cleanly(rt: &Runtime, dir: &Path, ts: &[Owned]) -> StorageError {
    let p = dir.join("model.safetensors");
    let e = save(rt, &p, &views(ts), Target::Host, &small()).unwrap_err();
    eprintln!(
        "{}\n  fix: {}",
        numapin::error::with_causes(&e),
        e.fix().unwrap_or_default()
    );
    assert_no_leak(rt);
    assert_nothing_open_under(dir);
    e
}

/// A tmpfs mounted on a folder while it lives (lazily unmounted after).
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// A tmpfs with `opts` on a new folder `name` in `d`, when this process
/// may mount one.
fn tmpfs(d: &Path, name: &str, opts: &str) -> Option<Mounted> {
    let m = d.join(name);
    std::fs::create_dir(&m).unwrap();
    let ok = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", opts, "tmpfs"])
        .arg(&m)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        common::skip(
            common::Need::Root,
            "cannot mount a tmpfs (needs root and `mount`)",
        );
        return None;
    }
    Some(Mounted(m))
}

#[test]
fn a_full_filesystem_fails_before_copying_and_leaves_the_old_file() {
    let rt = runtime();
    let d = tempfile::tempdir().unwrap();
    let Some(m) = tmpfs(d.path(), "small", "size=4m") else {
        return;
    };
    std::fs::write(m.0.join("model.safetensors"), b"the old file").unwrap();
    let e = fails_cleanly(&rt, &m.0, &tensors());
    assert!(matches!(e, StorageError::Write { .. }), "{e:?}");
    assert_eq!(e.kind(), ErrorKind::System);
    let text = numapin::error::with_causes(&e);
    assert!(
        text.contains("model.safetensors") && text.contains("No space left"),
        "{text}"
    );
    assert!(e.fix().unwrap().contains("df -h"), "{e}");
    assert_eq!(
        std::fs::read(m.0.join("model.safetensors")).unwrap(),
        b"the old file"
    );
    assert_eq!(listing(&m.0), vec!["model.safetensors"]);
}

#[test]
fn a_read_only_filesystem_is_a_permission_error() {
    let rt = runtime();
    let d = tempfile::tempdir().unwrap();
    let Some(m) = tmpfs(d.path(), "ro", "size=1m,ro") else {
        return;
    };
    let e = fails_cleanly(&rt, &m.0, &tensors());
    assert_eq!(e.kind(), ErrorKind::Permission, "{e:?}");
    assert!(e.fix().unwrap().contains("read-only"), "{e}");
    assert!(listing(&m.0).is_empty());
}

/// Runs child test `name` with `env`, `pre` applied before it starts.
fn child(
    name: &str,
    env: &[(&str, &str)],
    pre: impl FnMut() -> std::io::Result<()> + Send + Sync + 'static,
) {
    if let Some(out) = common::run_child(name, env, pre) {
        common::assert_child_passed(&out);
    }
}

#[test]
fn a_file_over_the_size_limit_is_refused_before_anything_is_written() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("model.safetensors"), b"the old file").unwrap();
    let dir = d.path().to_str().unwrap().to_string();
    child("child_fsize", &[("SAVE_DIR", &dir)], || {
        nix::sys::resource::setrlimit(
            nix::sys::resource::Resource::RLIMIT_FSIZE,
            1 << 20,
            1 << 20,
        )?;
        // SAFETY: setting a signal's disposition to ignore between fork
        // and exec (inherited by the child program).
        unsafe {
            nix::sys::signal::signal(
                nix::sys::signal::SIGXFSZ,
                nix::sys::signal::SigHandler::SigIgn,
            )
        }
        .map_err(std::io::Error::from)?;
        Ok(())
    });
}

#[test]
#[ignore = "runs in a child process with `ulimit -f` at 1 MiB: started by a_file_over_the_size_limit_is_refused_before_anything_is_written"]
fn child_fsize() {
    if !common::in_child("child_fsize") {
        return;
    }
    let dir = PathBuf::from(std::env::var("SAVE_DIR").unwrap());
    let rt = runtime();
    let e = fails_cleanly(&rt, &dir, &tensors());
    assert!(
        matches!(&e, StorageError::Write { source, .. } if source.raw_os_error() == Some(libc::EFBIG)),
        "{e:?}"
    );
    assert!(e.fix().unwrap().contains("ulimit -f"), "{e}");
    assert_eq!(
        std::fs::read(dir.join("model.safetensors")).unwrap(),
        b"the old file"
    );
    assert_eq!(listing(&dir), vec!["model.safetensors"]);
}

#[test]
fn a_folder_this_user_may_not_write_is_a_permission_error() {
    if !nix::unistd::Uid::effective().is_root() {
        common::skip(
            common::Need::Root,
            "needs root to run a child as user nobody",
        );
        return;
    }
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        d.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    std::fs::write(d.path().join("model.safetensors"), b"the old file").unwrap();
    let dir = d.path().to_str().unwrap().to_string();
    child(
        "child_read_only_folder",
        &[("SAVE_DIR", &dir)],
        common::as_nobody(1 << 30),
    );
}

#[test]
#[ignore = "runs in a child process as user nobody: started by a_folder_this_user_may_not_write_is_a_permission_error"]
fn child_read_only_folder() {
    if !common::in_child("child_read_only_folder") {
        return;
    }
    let dir = PathBuf::from(std::env::var("SAVE_DIR").unwrap());
    let rt = runtime();
    let e = fails_cleanly(&rt, &dir, &tensors());
    assert_eq!(e.kind(), ErrorKind::Permission, "{e}");
    assert!(e.fix().unwrap().contains("may not create files"), "{e}");
    assert_eq!(listing(&dir), vec!["model.safetensors"]);
}

#[test]
fn a_save_killed_mid_way_leaves_the_old_file_and_the_next_save_cleans_up() {
    let d = tempfile::tempdir().unwrap();
    let target = d.path().join("ckpt.safetensors");
    std::fs::write(&target, b"the old file").unwrap();
    let (_exe_dir, exe) = common::runnable_by_everyone(&std::env::current_exe().unwrap());
    let mut c = std::process::Command::new(exe)
        .args([
            "--exact",
            "child_slow_save",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("NUMAPIN_TEST_CHILD", "child_slow_save")
        .env("SAVE_DIR", d.path())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = c.id();
    let prefix = format!(".ckpt.safetensors.numapin-tmp-{pid}-");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let temp = loop {
        let found = listing(d.path())
            .into_iter()
            .find(|n| n.starts_with(&prefix));
        if let Some(t) = found {
            break t;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the child made no temporary file"
        );
        assert!(
            c.try_wait().unwrap().is_none(),
            "the child ended before it was killed"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    };
    c.kill().unwrap();
    c.wait().unwrap();
    assert_eq!(std::fs::read(&target).unwrap(), b"the old file");
    assert!(d.path().join(&temp).exists(), "the killed save's {temp}");
    // The next save removes it and works.
    let rt = runtime();
    let ts = tensors();
    let r = numapin::storage::write::write_file(
        &rt,
        &numapin::storage::write::FileParts::new(&target, &[Data::Host(b"new")]),
        Target::Host,
        &WriteOptions::default(),
    )
    .unwrap();
    assert_eq!(r.removed_stale, 1);
    assert_eq!(listing(d.path()), vec!["ckpt.safetensors"]);
    save(&rt, &target, &views(&ts), Target::Host, &small()).unwrap();
    assert_holds(&std::fs::read(&target).unwrap(), &ts);
    assert_no_leak(&rt);
}

#[test]
#[ignore = "runs in a child process that is killed mid-save: started by a_save_killed_mid_way_leaves_the_old_file_and_the_next_save_cleans_up"]
fn child_slow_save() {
    if !common::in_child("child_slow_save") {
        return;
    }
    let dir = PathBuf::from(std::env::var("SAVE_DIR").unwrap());
    let rt = runtime();
    let big = vec![7u8; 1 << 30];
    let t = [SaveTensor::new(
        "w",
        Dtype::U8,
        vec![big.len()],
        Data::Host(&big),
    )];
    // Killed before it ends; should it end, it still passes.
    save(
        &rt,
        dir.join("ckpt.safetensors"),
        &t,
        Target::Host,
        &SaveOptions::default(),
    )
    .unwrap();
}

#[test]
fn two_saves_to_one_path_at_once_each_leave_a_whole_file() {
    let rt = runtime();
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("m.safetensors");
    let a: Vec<Owned> = vec![("w".into(), Dtype::U8, vec![3 << 20], vec![1u8; 3 << 20])];
    let b: Vec<Owned> = vec![
        ("w".into(), Dtype::U8, vec![5 << 20], vec![2u8; 5 << 20]),
        ("v".into(), Dtype::F32, vec![2], pattern(8, 1)),
    ];
    let (wa, wb) = (crate_bytes(&a, None), crate_bytes(&b, None));
    for _ in 0..4 {
        std::thread::scope(|s| {
            for ts in [&a, &b] {
                let (rt, p) = (&rt, &p);
                s.spawn(move || save(rt, p, &views(ts), Target::Host, &small()).unwrap());
            }
        });
        let got = std::fs::read(&p).unwrap();
        assert!(got == wa || got == wb, "a mix of two saves");
        assert_eq!(listing(d.path()), vec!["m.safetensors"]);
    }
    assert_no_leak(&rt);
}

/// GPU tests: need a CUDA GPU; they skip (pass with a message) without one.
mod gpu {
    use super::*;
    use numapin::storage::{self, DeviceMemory, Source};
    use numapin::CudaOrdinal;

    fn gpus() -> Option<(Runtime, Vec<CudaOrdinal>)> {
        if !numapin::gpu::available() {
            common::skip(common::Need::Gpu, "no CUDA driver");
            return None;
        }
        let t = Topology::probe(&ProbeOptions::from_process()).unwrap();
        let g: Vec<CudaOrdinal> = t.gpus.iter().filter_map(|g| g.cuda_ordinal).collect();
        if g.is_empty() {
            common::skip(common::Need::Gpu, "no CUDA GPU visible");
            return None;
        }
        Some((Runtime::new(t, RuntimeConfig::default()).unwrap(), g))
    }

    /// Device memory on `gpu` holding `bytes` (read there from a file).
    fn on_device(rt: &Runtime, dir: &Path, gpu: CudaOrdinal, bytes: &[u8]) -> DeviceMemory {
        let p = dir.join(format!("src-{}-{}", gpu.0, bytes.len()));
        std::fs::write(&p, bytes).unwrap();
        let mem = DeviceMemory::new(gpu, bytes.len().max(1)).unwrap();
        let src = Source::open(&p).unwrap();
        storage::read_to_device(
            rt,
            &src,
            0,
            mem.ptr(),
            bytes.len(),
            gpu,
            &ReadOptions::default(),
        )
        .unwrap();
        mem
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn gpu_tensors_on_every_gpu_save_byte_for_byte() {
        let Some((rt, gpus)) = gpus() else { return };
        let d = tempfile::tempdir().unwrap();
        let ts = tensors();
        // Tensors spread over the GPUs (two when there are two).
        let mems: Vec<(CudaOrdinal, DeviceMemory)> = ts
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let g = gpus[i % gpus.len().min(2)];
                (g, on_device(&rt, d.path(), g, &t.3))
            })
            .collect();
        let views: Vec<SaveTensor<'_>> = ts
            .iter()
            .zip(&mems)
            .map(|(t, (g, m))| {
                let data = Data::Device {
                    gpu: *g,
                    ptr: m.ptr(),
                    len: t.3.len(),
                };
                SaveTensor::new(t.0.clone(), t.1, t.2.clone(), data)
            })
            .collect();
        for io in [IoMode::Auto, IoMode::Buffered] {
            for chunk in [64 << 10, 8 << 20] {
                let p = d.path().join("gpu.safetensors");
                let opts = SaveOptions::default()
                    .with_write(WriteOptions::default().with_io(io).with_chunk_bytes(chunk));
                let r = save(&rt, &p, &views, Target::Gpu(gpus[0]), &opts).unwrap();
                assert!(
                    std::fs::read(&p).unwrap() == crate_bytes(&ts, None),
                    "{io:?} {chunk}"
                );
                assert!(r.staging_bytes > 0);
                assert!(
                    r.warnings.iter().all(|w| !w.contains("not registered")),
                    "{r:?}"
                );
            }
        }
        // Device memory past its allocation is refused before anything is
        // made.
        let (g, m) = &mems[0];
        let bad = [SaveTensor::new(
            "x",
            Dtype::U8,
            vec![1 << 20],
            Data::Device {
                gpu: *g,
                ptr: m.ptr(),
                len: 1 << 20,
            },
        )];
        let e = save(
            &rt,
            d.path().join("bad"),
            &bad,
            Target::Gpu(*g),
            &SaveOptions::default(),
        )
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Input, "{e}");
        assert!(!d.path().join("bad").exists());
        drop(mems);
        assert_no_leak(&rt);
    }
}
