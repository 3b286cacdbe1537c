//! safetensors checkpoints written from GPU (or host) memory through the
//! storage writer: one file, or shards and a `model.safetensors.index.json`
//! as Hugging Face writes them.
//!
//! ```no_run
//! use numapin::storage::safetensors::{save, Dtype, SaveOptions, SaveTensor};
//! use numapin::storage::write::Data;
//! use numapin::{CudaOrdinal, Runtime, RuntimeConfig, Target, Topology};
//! # let rt = Runtime::new(Topology::probe(&Default::default())?, RuntimeConfig::default())?;
//! # let (ptr, gpu) = (0u64, CudaOrdinal(0));
//! let t = SaveTensor::new("w", Dtype::BF16, vec![1024, 1024], Data::Device { gpu, ptr, len: 2 << 20 });
//! save(&rt, "model.safetensors", &[t], Target::Gpu(gpu), &SaveOptions::default())?;
//! # Ok::<(), numapin::Error>(())
//! ```
//!
//! The header is the one the `safetensors` crate (and so
//! `safetensors.torch.save_file`) writes: tensors sorted by dtype
//! alignment (largest first), then by name; `__metadata__` a map of
//! strings; the JSON padded with spaces to a multiple of 8 bytes.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use ::safetensors::tensor::{Metadata, TensorInfo};
use ::safetensors::Dtype;

use crate::gpu::{CUstream, CudaOrdinal};
use crate::runtime::{Runtime, Target};

use super::super::write::{self, Data, FileParts, WriteOptions, WriteReport};
use super::super::StorageError;
use super::MAX_HEADER_BYTES;

type Result<T, E = StorageError> = std::result::Result<T, E>;

/// One tensor to save: its name, dtype, shape and bytes (row-major,
/// little-endian, exactly `shape`'s elements of `dtype`).
#[derive(Debug, Clone)]
pub struct SaveTensor<'a> {
    /// Its name.
    pub name: String,
    /// Its element type.
    pub dtype: Dtype,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Its bytes.
    pub data: Data<'a>,
}

impl<'a> SaveTensor<'a> {
    /// A tensor called `name`.
    pub fn new(name: impl Into<String>, dtype: Dtype, shape: Vec<usize>, data: Data<'a>) -> Self {
        SaveTensor {
            name: name.into(),
            dtype,
            shape,
            data,
        }
    }
}

/// How a checkpoint is saved (start from `SaveOptions::default()`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SaveOptions {
    /// The header's `__metadata__` (default none). Sharded saves also put
    /// it in the index's `metadata`, beside `total_size`.
    pub metadata: Option<HashMap<String, String>>,
    /// Shard at this many bytes of tensors per file (default `None`: one
    /// file). The path is then a folder (made if missing) that gets
    /// `<prefix>-00001-of-0000N.safetensors` files and
    /// `<prefix>.safetensors.index.json`, or `<prefix>.safetensors` alone
    /// when everything fits in one shard, as Hugging Face's
    /// `save_torch_state_dict` writes them.
    pub max_shard_size: Option<u64>,
    /// The file name prefix of a sharded save (default `model`).
    pub prefix: String,
    /// How the files are written.
    pub write: WriteOptions,
}

impl Default for SaveOptions {
    fn default() -> Self {
        SaveOptions {
            metadata: None,
            max_shard_size: None,
            prefix: "model".into(),
            write: WriteOptions::default(),
        }
    }
}

with_setters!(SaveOptions {
    with_metadata => metadata: Option<HashMap<String, String>>,
    with_max_shard_size => max_shard_size: Option<u64>,
    with_prefix => prefix: String,
    with_write => write: WriteOptions,
});

/// The tensors of `tensors` in file order (the `safetensors` crate's:
/// dtype alignment, largest first, then name) and the file's start: the
/// 8-byte header length and the header.
///
/// # Errors
/// [`StorageError::Request`] for a tensor whose bytes do not match its
/// dtype and shape, two tensors of one name, a header over the format's
/// limit.
pub fn header(
    tensors: &[&SaveTensor<'_>],
    metadata: Option<&HashMap<String, String>>,
) -> Result<(Vec<usize>, Vec<u8>)> {
    check_tensors(tensors)?;
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by(|&a, &b| {
        let (l, r) = (tensors[a], tensors[b]);
        r.dtype.cmp(&l.dtype).then(l.name.cmp(&r.name))
    });
    let mut infos = Vec::with_capacity(order.len());
    let mut at = 0usize;
    for &i in &order {
        let t = tensors[i];
        let n = t.data.len();
        infos.push((
            t.name.clone(),
            TensorInfo {
                dtype: t.dtype,
                shape: t.shape.clone(),
                data_offsets: (at, at + n),
            },
        ));
        at += n;
    }
    let meta = Metadata::new(metadata.cloned(), infos).map_err(|e| {
        StorageError::request(
            format!("the tensors do not make a safetensors header: {e}"),
            "check each tensor's dtype, shape and bytes",
        )
    })?;
    let mut json = serde_json::to_string(&meta)
        .map_err(|e| {
            StorageError::request(
                format!("the header does not serialize: {e}"),
                "check the names",
            )
        })?
        .into_bytes();
    json.resize(json.len().next_multiple_of(8), b' ');
    if json.len() as u64 > MAX_HEADER_BYTES {
        return Err(StorageError::request(
            format!(
                "the header is {} bytes, over the format's {MAX_HEADER_BYTES}-byte limit",
                json.len()
            ),
            "save fewer tensors per file (max_shard_size), or shorter names and metadata",
        ));
    }
    let mut start = (json.len() as u64).to_le_bytes().to_vec();
    start.extend_from_slice(&json);
    Ok((order, start))
}

/// Refuses tensors whose bytes are not their dtype and shape, and
/// repeated names.
fn check_tensors(tensors: &[&SaveTensor<'_>]) -> Result<()> {
    let mut names = std::collections::HashSet::with_capacity(tensors.len());
    for t in tensors {
        if !names.insert(t.name.as_str()) {
            return Err(StorageError::request(
                format!("two tensors are called {:?}", t.name),
                "give each tensor its own name",
            ));
        }
        if t.name == "__metadata__" {
            return Err(StorageError::request(
                "a tensor is called \"__metadata__\", the header's metadata key",
                "rename the tensor",
            ));
        }
        let bits = t
            .shape
            .iter()
            .try_fold(t.dtype.bitsize(), |a, &d| a.checked_mul(d));
        if bits.is_none_or(|b| b % 8 != 0 || b / 8 != t.data.len()) {
            return Err(StorageError::request(
                format!(
                    "tensor {:?} of {} {:?} has {} bytes, which is not its size",
                    t.name,
                    t.dtype,
                    t.shape,
                    t.data.len()
                ),
                "pass exactly the tensor's bytes (row-major, contiguous)",
            ));
        }
    }
    Ok(())
}

/// The shards of tensors of `sizes` bytes (in the order given) at most
/// `max` bytes each, as Hugging Face's `split_state_dict_into_shards`
/// makes them: in order, a new shard when the next tensor would overflow
/// the current one, a tensor larger than `max` alone in a shard of its
/// own (placed where it comes, before the shard being filled).
pub fn shard_plan(sizes: &[u64], max: u64) -> Vec<Vec<usize>> {
    let mut shards: Vec<Vec<usize>> = Vec::new();
    let mut cur: Vec<usize> = Vec::new();
    let mut cur_size = 0u64;
    for (i, &s) in sizes.iter().enumerate() {
        if s > max {
            shards.push(vec![i]);
            continue;
        }
        if cur_size + s > max {
            shards.push(std::mem::take(&mut cur));
            cur_size = 0;
        }
        cur.push(i);
        cur_size += s;
    }
    if !cur.is_empty() || shards.is_empty() {
        shards.push(cur);
    }
    shards
}

/// The name of shard `i` (from 0) of `n` with `prefix`:
/// `model-00001-of-00003.safetensors`, or `model.safetensors` alone.
pub fn shard_name(prefix: &str, i: usize, n: usize) -> String {
    if n == 1 {
        format!("{prefix}.safetensors")
    } else {
        format!("{prefix}-{:05}-of-{n:05}.safetensors", i + 1)
    }
}

/// The index of a sharded save as Hugging Face writes it (keys sorted,
/// two-space indent, a final newline): `metadata` (`total_size`, then
/// `extra`'s strings) and the `weight_map`.
pub fn index_json(
    total_size: u64,
    extra: Option<&HashMap<String, String>>,
    weight_map: &BTreeMap<String, String>,
) -> String {
    let mut meta = serde_json::Map::new();
    for (k, v) in extra.into_iter().flatten() {
        meta.insert(k.clone(), serde_json::Value::String(v.clone()));
    }
    meta.insert("total_size".into(), total_size.into());
    let v = serde_json::json!({ "metadata": meta, "weight_map": weight_map });
    let mut s = serde_json::to_string_pretty(&v).expect("maps of strings and numbers serialize");
    s.push('\n');
    s
}

/// Saves `tensors` to `path` as one safetensors file (or, with
/// [`SaveOptions::max_shard_size`], to the folder `path` as shards and an
/// index), crash-safely, through pinned slots on `target`'s node (see
/// [`write::write_files`]).
///
/// # Errors
/// [`StorageError::Request`] for tensors that do not make a header
/// ([`header`]); otherwise as [`write::write_files`]. Nothing is left
/// behind by a failure, and the files there before are untouched.
///
/// # Examples
///
/// Three tensors from host memory in shards of at most 1 KiB of tensors
/// (filled in order, as Hugging Face's `save_torch_state_dict` fills
/// them), read back with the `safetensors` crate:
///
/// ```
/// use numapin::runtime::{Runtime, RuntimeConfig, Target};
/// use numapin::storage::safetensors::{save, Dtype, SaveOptions, SaveTensor};
/// use numapin::storage::write::Data;
/// use numapin::topology::{CudaMode, ProbeOptions, Topology};
///
/// let topo = Topology::probe(&ProbeOptions::from_process().with_cuda(CudaMode::Off))?;
/// let rt = Runtime::new(topo, RuntimeConfig::default().with_region_bytes(2 << 20))?;
/// let (a, b, c) = (vec![1u8; 1000], vec![2u8; 1000], vec![3u8; 24]);
/// let tensors = [
///     SaveTensor::new("layer.0", Dtype::U8, vec![1000], Data::Host(&a)),
///     SaveTensor::new("layer.1", Dtype::U8, vec![10, 100], Data::Host(&b)),
///     SaveTensor::new("bias", Dtype::F32, vec![6], Data::Host(&c)),
/// ];
/// let dir = tempfile::tempdir()?;
/// let opts = SaveOptions::default().with_max_shard_size(Some(1024));
/// // Through pinned slots on this thread's node (for device data, the GPU's).
/// let report = save(&rt, dir.path(), &tensors, Target::Host, &opts)?;
/// assert_eq!(report.files.len(), 3, "two shards and the index");
/// assert!(dir.path().join("model.safetensors.index.json").is_file());
///
/// let second = std::fs::read(dir.path().join("model-00002-of-00002.safetensors"))?;
/// let st = safetensors::SafeTensors::deserialize(&second)?;
/// let mut names = st.names();
/// names.sort();
/// assert_eq!(names, ["bias", "layer.1"]);
/// assert_eq!(st.tensor("layer.1")?.shape(), [10, 100]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn save(
    rt: &Runtime,
    path: impl AsRef<Path>,
    tensors: &[SaveTensor<'_>],
    target: Target,
    opts: &SaveOptions,
) -> Result<WriteReport> {
    // SAFETY: no stream to order after.
    unsafe { save_on(rt, path, tensors, target, &[], opts) }
}

/// [`save`], with the copies from each GPU ordered after the work queued
/// on its stream in `after` (see [`write::write_files_on`]).
///
/// # Errors
/// As [`save`].
///
/// # Safety
/// As [`write::write_files_on`].
pub unsafe fn save_on(
    rt: &Runtime,
    path: impl AsRef<Path>,
    tensors: &[SaveTensor<'_>],
    target: Target,
    after: &[(CudaOrdinal, CUstream)],
    opts: &SaveOptions,
) -> Result<WriteReport> {
    let path = path.as_ref();
    let Some(max) = opts.max_shard_size else {
        let all: Vec<&SaveTensor<'_>> = tensors.iter().collect();
        let file = FileOut::new(&all, opts.metadata.as_ref())?;
        let parts = file.parts();
        let f = FileParts::new(path, &parts);
        // SAFETY: per this function's contract.
        return unsafe { write::write_files_on(rt, &[f], target, after, &opts.write) };
    };
    let sharded = Sharded::plan(path, tensors, max, opts)?;
    let parts: Vec<Vec<Data<'_>>> = sharded.files.iter().map(FileOut::parts).collect();
    let mut files: Vec<FileParts<'_>> = sharded
        .names
        .iter()
        .zip(&parts)
        .map(|(n, p)| FileParts::new(path.join(n), p))
        .collect();
    let index = [Data::Host(sharded.index.as_bytes())];
    if let Some(name) = &sharded.index_name {
        files.push(FileParts::new(path.join(name), &index));
    }
    // SAFETY: per this function's contract.
    let report = unsafe { write::write_files_on(rt, &files, target, after, &opts.write) }?;
    let _removed = remove_old_shards(
        path,
        &opts.prefix,
        &sharded.names,
        sharded.index_name.as_deref(),
    );
    Ok(report)
}

/// One file's start and tensors, in file order.
struct FileOut<'t, 'a> {
    start: Vec<u8>,
    tensors: Vec<&'t SaveTensor<'a>>,
}

impl<'t, 'a> FileOut<'t, 'a> {
    fn new(
        tensors: &[&'t SaveTensor<'a>],
        metadata: Option<&HashMap<String, String>>,
    ) -> Result<Self> {
        let (order, start) = header(tensors, metadata)?;
        Ok(FileOut {
            start,
            tensors: order.into_iter().map(|i| tensors[i]).collect(),
        })
    }

    fn parts(&self) -> Vec<Data<'_>> {
        let mut v = Vec::with_capacity(self.tensors.len() + 1);
        v.push(Data::Host(&self.start));
        v.extend(self.tensors.iter().map(|t| t.data));
        v
    }
}

/// A sharded save: the shard files, their names, the index.
struct Sharded<'t, 'a> {
    files: Vec<FileOut<'t, 'a>>,
    names: Vec<String>,
    index_name: Option<String>,
    index: String,
}

impl<'t, 'a> Sharded<'t, 'a> {
    fn plan(
        dir: &Path,
        tensors: &'t [SaveTensor<'a>],
        max: u64,
        opts: &SaveOptions,
    ) -> Result<Self> {
        check_prefix(&opts.prefix)?;
        make_folder(dir)?;
        let sizes: Vec<u64> = tensors.iter().map(|t| t.data.len() as u64).collect();
        let plan = shard_plan(&sizes, max.max(1));
        let n = plan.len();
        let mut files = Vec::with_capacity(n);
        let mut names = Vec::with_capacity(n);
        let mut map = BTreeMap::new();
        for (i, shard) in plan.iter().enumerate() {
            let name = shard_name(&opts.prefix, i, n);
            let ts: Vec<&SaveTensor<'a>> = shard.iter().map(|&k| &tensors[k]).collect();
            for t in &ts {
                map.insert(t.name.clone(), name.clone());
            }
            files.push(FileOut::new(&ts, opts.metadata.as_ref())?);
            names.push(name);
        }
        if map.len() != tensors.len() {
            // Two tensors of one name in different shards.
            let all: Vec<&SaveTensor<'a>> = tensors.iter().collect();
            check_tensors(&all)?;
        }
        let index_name = (n > 1).then(|| format!("{}.safetensors.index.json", opts.prefix));
        Ok(Sharded {
            files,
            names,
            index_name,
            index: index_json(sizes.iter().sum(), opts.metadata.as_ref(), &map),
        })
    }
}

fn check_prefix(prefix: &str) -> Result<()> {
    if prefix.is_empty() || prefix.contains('/') || prefix == "." || prefix == ".." {
        return Err(StorageError::request(
            format!("the shard file prefix {prefix:?} is not a file name"),
            "use a plain name such as \"model\"",
        ));
    }
    Ok(())
}

/// Makes the folder of a sharded save (and its parents) if missing.
fn make_folder(dir: &Path) -> Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if dir.exists() {
        return Err(StorageError::input(
            dir,
            "is not a folder, and a sharded save writes a folder of shards",
            "pass a folder (made if missing), or save one file without max_shard_size",
        ));
    }
    std::fs::create_dir_all(dir).map_err(|source| StorageError::Write {
        path: dir.to_path_buf(),
        temp: None,
        op: "making the folder",
        offset: 0,
        len: 0,
        source,
    })
}

/// After a sharded save to `dir`: removes the files of an earlier save
/// with `prefix` that this one did not write (`<prefix>.safetensors`,
/// `<prefix>-NNNNN-of-NNNNN.safetensors`, the index), as Hugging Face's
/// `save_torch_state_dict` cleans the folder. Best effort.
fn remove_old_shards(
    dir: &Path,
    prefix: &str,
    written: &[String],
    index: Option<&str>,
) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let ours = written.contains(&name) || index == Some(name.as_str());
        if !ours && is_shard_name(prefix, &name) && std::fs::remove_file(e.path()).is_ok() {
            removed.push(e.path());
        }
    }
    removed
}

/// Whether `name` is a file a sharded save with `prefix` writes.
fn is_shard_name(prefix: &str, name: &str) -> bool {
    let Some(rest) = name.strip_prefix(prefix) else {
        return false;
    };
    let rest = rest.strip_suffix(".index.json").unwrap_or(rest);
    let Some(rest) = rest.strip_suffix(".safetensors") else {
        return false;
    };
    if rest.is_empty() {
        return true;
    }
    let b = rest.as_bytes();
    b.len() == 15
        && b[0] == b'-'
        && &b[6..10] == b"-of-"
        && b[1..6].iter().chain(&b[10..15]).all(u8::is_ascii_digit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn shards_split_as_hugging_face_does() {
        assert_eq!(shard_plan(&[4, 4, 4], 8), vec![vec![0, 1], vec![2]]);
        // A tensor over the limit is alone, where it comes.
        assert_eq!(
            shard_plan(&[4, 20, 4, 4], 8),
            vec![vec![1], vec![0, 2], vec![3]]
        );
        assert_eq!(shard_plan(&[], 8), vec![Vec::<usize>::new()]);
        assert_eq!(shard_name("model", 0, 1), "model.safetensors");
        assert_eq!(
            shard_name("model", 1, 3),
            "model-00002-of-00003.safetensors"
        );
        assert!(is_shard_name("model", "model-00002-of-00003.safetensors"));
        assert!(is_shard_name("model", "model.safetensors.index.json"));
        assert!(is_shard_name("model", "model.safetensors"));
        assert!(!is_shard_name("model", "model-2-of-3.safetensors"));
        assert!(!is_shard_name("model", "other.safetensors"));
    }

    #[test]
    fn the_index_is_sorted_pretty_json_with_the_total_size() {
        let map: BTreeMap<String, String> = [("b", "f2"), ("a", "f1")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let extra: HashMap<String, String> = [("format".to_string(), "pt".to_string())].into();
        let s = index_json(12, Some(&extra), &map);
        assert_eq!(
            s,
            "{\n  \"metadata\": {\n    \"format\": \"pt\",\n    \"total_size\": 12\n  },\n  \"weight_map\": {\n    \"a\": \"f1\",\n    \"b\": \"f2\"\n  }\n}\n"
        );
    }

    #[test]
    fn headers_sort_by_alignment_then_name_and_pad_with_spaces() {
        let (b1, b4) = ([0u8; 2], [0u8; 4]);
        let ts = [
            SaveTensor::new("z", Dtype::U8, vec![2], Data::Host(&b1)),
            SaveTensor::new("b", Dtype::F32, vec![1], Data::Host(&b4)),
            SaveTensor::new("a", Dtype::U8, vec![2], Data::Host(&b1)),
        ];
        let refs: Vec<&SaveTensor<'_>> = ts.iter().collect();
        let (order, start) = header(&refs, None).expect("header");
        assert_eq!(order, vec![1, 2, 0]);
        let n = crate::num::usize_from(u64::from_le_bytes(start[..8].try_into().expect("8 bytes")));
        assert_eq!(n % 8, 0);
        assert_eq!(start.len(), 8 + n);
        let json = std::str::from_utf8(&start[8..]).expect("utf-8");
        assert!(
            json.starts_with(r#"{"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a""#),
            "{json}"
        );
        assert!(json.trim_end().ends_with('}'));
        // The crate's own serializer writes the same bytes.
        let views: Vec<(String, ::safetensors::tensor::TensorView<'_>)> = ts
            .iter()
            .map(|t| {
                let Data::Host(b) = t.data else {
                    unreachable!()
                };
                (
                    t.name.clone(),
                    ::safetensors::tensor::TensorView::new(t.dtype, t.shape.clone(), b)
                        .expect("view"),
                )
            })
            .collect();
        let whole = ::safetensors::serialize(views, None).expect("serialize");
        assert_eq!(&whole[..start.len()], &start[..]);
    }

    #[test]
    fn tensors_that_lie_about_their_size_or_repeat_a_name_are_refused() {
        let b = [0u8; 4];
        let bad = SaveTensor::new("x", Dtype::F32, vec![2], Data::Host(&b));
        assert!(header(&[&bad], None).is_err());
        let ok = SaveTensor::new("x", Dtype::F32, vec![1], Data::Host(&b));
        assert!(header(&[&ok, &ok], None)
            .unwrap_err()
            .to_string()
            .contains("two tensors"));
        let meta = SaveTensor::new("__metadata__", Dtype::F32, vec![1], Data::Host(&b));
        assert!(header(&[&meta], None).is_err());
    }

    proptest! {
        #[test]
        fn shards_hold_every_tensor_once_in_order_within_the_limit(
            sizes in proptest::collection::vec(0u64..100, 0..40),
            max in 1u64..150,
        ) {
            let plan = shard_plan(&sizes, max);
            let mut all: Vec<usize> = plan.iter().flatten().copied().collect();
            all.sort_unstable();
            prop_assert_eq!(all, (0..sizes.len()).collect::<Vec<_>>());
            for s in &plan {
                let total: u64 = s.iter().map(|&i| sizes[i]).sum();
                prop_assert!(total <= max || s.len() == 1);
                prop_assert!(s.windows(2).all(|w| w[0] < w[1]));
            }
        }
    }
}
