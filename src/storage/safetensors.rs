//! safetensors checkpoints (one file, or the shards of a
//! `model.safetensors.index.json`) loaded into one GPU's memory, or into
//! pinned host memory, through the storage reader: each tensor's bytes are
//! read once, straight from the file into their place (through a pinned
//! slot on the GPU's node for device memory); and saved from GPU or host
//! memory through the storage writer ([`save`], [`SaveTensor`]).
//!
//! ```no_run
//! use numapin::storage::safetensors::Checkpoint;
//! use numapin::storage::ReadOptions;
//! # use numapin::{CudaOrdinal, Runtime, RuntimeConfig, Topology};
//! # let rt = Runtime::new(Topology::probe(&Default::default())?, RuntimeConfig::default())?;
//! let ck = Checkpoint::open("model.safetensors.index.json")?;
//! let all = ck.select(None, None)?;
//! let loaded = ck.load_to_device(&rt, CudaOrdinal(0), &all, &ReadOptions::default())?;
//! for (entry, ptr) in loaded.iter() {
//!     let t = &ck.tensors()[entry];
//!     println!("{} {} {:?} at {ptr:#x}", t.name, t.dtype, t.shape);
//! }
//! # Ok::<(), numapin::Error>(())
//! ```
//!
//! Headers are parsed by the `safetensors` crate (the format's own Rust
//! implementation), which checks that the tensors tile the data section
//! without gaps or overlaps and that each one's size matches its dtype and
//! shape; numapin adds what needs the file: the 8-byte length and the
//! header within the file, and the data ending exactly at the file's end
//! (as `safetensors.torch.load_file` requires).

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::{Component, Path, PathBuf};

use ::safetensors::tensor::Metadata;

use crate::gpu::{CUdeviceptr, CudaOrdinal};
use crate::runtime::{PinnedBuf, Runtime, Target};

use super::{
    read_ranges_to_device, read_ranges_to_host, DeviceMemory, DeviceRange, HostRange, ReadOptions,
    ReadReport, Source, StorageError,
};

pub use ::safetensors::Dtype;

mod save;
pub use save::{
    header, index_json, save, save_on, shard_name, shard_plan, SaveOptions, SaveTensor,
};

type Result<T, E = StorageError> = std::result::Result<T, E>;

/// Largest header a file may have: the format's own limit (the
/// `safetensors` crate refuses larger ones), checked before it is read.
pub const MAX_HEADER_BYTES: u64 = 100_000_000;
/// Largest index file read.
pub const MAX_INDEX_BYTES: u64 = 64 << 20;
/// Most shard files an index may name.
pub const MAX_INDEX_FILES: usize = 65_536;
/// Device placement of each tensor in [`Checkpoint::load_to_device`]'s one
/// allocation (as `cudaMalloc` aligns allocations).
pub const DEVICE_ALIGN: usize = 256;

/// One tensor of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TensorEntry {
    /// Its name.
    pub name: String,
    /// Its element type.
    pub dtype: Dtype,
    /// Its shape (row-major, little-endian elements).
    pub shape: Vec<usize>,
    /// The file it is in (index into [`Checkpoint::sources`]).
    pub source: usize,
    /// Offset of its first byte in that file.
    pub offset: u64,
    /// Bytes.
    pub len: usize,
}

/// Which share of a checkpoint a rank loads: `rank` of `world`.
///
/// The rule: the selected tensors in file order (the index's files in name
/// order, then by offset) are cut into `world` runs of contiguous tensors
/// of nearly equal bytes; rank r loads the tensors whose middle byte falls
/// in the r-th of `world` equal parts of the selected bytes. Each rank
/// reads one stretch of the files (sequential for the drive), the shares
/// are disjoint and together hold every tensor, and every rank computes the
/// same cut without talking to the others ([`Checkpoint::shards`] gives
/// all of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// This rank, `0..world`.
    pub rank: usize,
    /// How many ranks share the checkpoint.
    pub world: usize,
}

impl Shard {
    /// Rank `rank` of `world`.
    ///
    /// # Errors
    /// [`StorageError::Request`] unless `rank < world`.
    pub fn new(rank: usize, world: usize) -> Result<Shard> {
        if rank >= world {
            return Err(StorageError::request(
                format!("shard rank {rank} of {world}: the rank must be below the world size"),
                "pass a rank from 0 to world - 1 (LOCAL_RANK and LOCAL_WORLD_SIZE under torchrun)",
            ));
        }
        Ok(Shard { rank, world })
    }
}

/// The rank of each of `sizes` (bytes of tensors in file order) under the
/// rule of [`Shard`].
pub fn shard_ranks(sizes: &[u64], world: usize) -> Vec<usize> {
    let world = world.max(1);
    let total: u128 = sizes.iter().map(|&s| u128::from(s)).sum();
    let n = sizes.len();
    let mut before = 0u128;
    sizes
        .iter()
        .enumerate()
        .map(|(i, &s)| {
            let r = if total == 0 {
                i * world / n.max(1)
            } else {
                // Twice the middle byte over twice the total.
                let mid2 = 2 * before + u128::from(s);
                (mid2 * world as u128 / (2 * total)) as usize
            };
            before += u128::from(s);
            r.min(world - 1)
        })
        .collect()
}

/// A safetensors checkpoint, opened and checked: its files and tensors.
#[derive(Debug)]
pub struct Checkpoint {
    path: PathBuf,
    sources: Vec<Source>,
    /// Sorted by name.
    tensors: Vec<TensorEntry>,
    by_name: HashMap<String, usize>,
}

impl Checkpoint {
    /// Opens a `.safetensors` file, or an index (`*.json`, as
    /// `model.safetensors.index.json`) and every shard file it names
    /// (relative to the index's folder), and checks every header.
    ///
    /// # Errors
    /// [`StorageError::Input`] for a path that is not a regular file
    /// (a directory, a FIFO), a header that does not parse, lies (offsets
    /// past the end of the file, overlapping or with gaps, sizes that do
    /// not match the shape) or claims more than the format allows, an
    /// index that is not JSON with a `weight_map`, names a file outside its
    /// folder or a tensor its file does not hold.
    pub fn open(path: impl AsRef<Path>) -> Result<Checkpoint> {
        let path = path.as_ref();
        if path.extension().is_some_and(|e| e == "json") {
            Self::open_index(path)
        } else {
            Self::open_file(path)
        }
    }

    fn open_file(path: &Path) -> Result<Checkpoint> {
        let src = Source::open(path)?;
        let tensors = read_header(&src, 0)?;
        Ok(Self::new(path, vec![src], tensors))
    }

    fn open_index(path: &Path) -> Result<Checkpoint> {
        let src = Source::open(path)?;
        let mut text = Vec::new();
        src.buffered()
            .take(MAX_INDEX_BYTES + 1)
            .read_to_end(&mut text)
            .map_err(|e| StorageError::input_from(path, "cannot be read", "check the file", e))?;
        if text.len() as u64 > MAX_INDEX_BYTES {
            return Err(StorageError::input(
                path,
                format!("is over {MAX_INDEX_BYTES} bytes, too large for a safetensors index"),
                "pass a model.safetensors.index.json",
            ));
        }
        let map = parse_index(&text, path)?;
        let folder = path.parent().unwrap_or(Path::new("."));
        let mut files: Vec<&String> = map.values().collect();
        files.sort();
        files.dedup();
        let mut sources = Vec::with_capacity(files.len());
        let mut tensors = Vec::new();
        for (i, f) in files.iter().enumerate() {
            let src = Source::open(folder.join(f))?;
            let wanted: Vec<TensorEntry> = read_header(&src, i)?
                .into_iter()
                .filter(|t| map.get(&t.name) == Some(f))
                .collect();
            tensors.extend(wanted);
            sources.push(src);
        }
        for (name, f) in &map {
            if !tensors.iter().any(|t| &t.name == name) {
                return Err(StorageError::input(
                    path,
                    format!("names tensor {name:?} in {f}, which has no tensor of that name"),
                    "regenerate the index, or check that every shard file is the one it was written with",
                ));
            }
        }
        Ok(Self::new(path, sources, tensors))
    }

    fn new(path: &Path, sources: Vec<Source>, mut tensors: Vec<TensorEntry>) -> Checkpoint {
        tensors.sort_by(|a, b| a.name.cmp(&b.name));
        let by_name = tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Checkpoint {
            path: path.to_path_buf(),
            sources,
            tensors,
            by_name,
        }
    }

    /// The path it was opened from (the file, or the index).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its files (one, or the index's shards in name order).
    pub fn sources(&self) -> &[Source] {
        &self.sources
    }

    /// Its tensors, sorted by name.
    pub fn tensors(&self) -> &[TensorEntry] {
        &self.tensors
    }

    /// The index in [`tensors`](Self::tensors) of the tensor called `name`.
    pub fn find(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// Bytes of the tensors at `selection`.
    pub fn bytes(&self, selection: &[usize]) -> u64 {
        selection
            .iter()
            .filter_map(|&i| self.tensors.get(i))
            .map(|t| t.len as u64)
            .sum()
    }

    /// The tensors to load, as indexes into [`tensors`](Self::tensors) in
    /// file order: those called `names` (every tensor when `None`), and of
    /// them the share of `shard` (see [`Shard`]).
    ///
    /// # Errors
    /// [`StorageError::Input`] naming a tensor the checkpoint does not
    /// hold.
    pub fn select(&self, names: Option<&[&str]>, shard: Option<Shard>) -> Result<Vec<usize>> {
        let mut sel: Vec<usize> = match names {
            None => (0..self.tensors.len()).collect(),
            Some(names) => {
                let mut v = Vec::with_capacity(names.len());
                for n in names {
                    let i = self.find(n).ok_or_else(|| self.missing(n))?;
                    v.push(i);
                }
                v.sort_unstable();
                v.dedup();
                v
            }
        };
        sel.sort_by_key(|&i| (self.tensors[i].source, self.tensors[i].offset));
        if let Some(s) = shard {
            let sizes: Vec<u64> = sel.iter().map(|&i| self.tensors[i].len as u64).collect();
            let ranks = shard_ranks(&sizes, s.world);
            sel = sel
                .into_iter()
                .zip(ranks)
                .filter(|&(_, r)| r == s.rank)
                .map(|(i, _)| i)
                .collect();
        }
        Ok(sel)
    }

    /// The shares of every rank of `world` (names, in file order) of the
    /// tensors called `names` (every tensor when `None`).
    ///
    /// # Errors
    /// As [`select`](Self::select).
    pub fn shards(&self, names: Option<&[&str]>, world: usize) -> Result<Vec<Vec<usize>>> {
        let all = self.select(names, None)?;
        let sizes: Vec<u64> = all.iter().map(|&i| self.tensors[i].len as u64).collect();
        let mut out = vec![Vec::new(); world.max(1)];
        for (i, r) in all.into_iter().zip(shard_ranks(&sizes, world)) {
            out[r].push(i);
        }
        Ok(out)
    }

    fn missing(&self, name: &str) -> StorageError {
        let some: Vec<&str> = self
            .tensors
            .iter()
            .take(3)
            .map(|t| t.name.as_str())
            .collect();
        StorageError::input(
            &self.path,
            format!(
                "holds no tensor called {name:?} ({} tensors, such as {})",
                self.tensors.len(),
                some.join(", ")
            ),
            "pass names the checkpoint holds",
        )
    }

    fn check_selection(&self, selection: &[usize]) -> Result<()> {
        match selection.iter().find(|&&i| i >= self.tensors.len()) {
            Some(i) => Err(StorageError::request(
                format!(
                    "tensor index {i} is out of range ({} tensors)",
                    self.tensors.len()
                ),
                "pass indexes from Checkpoint::select",
            )),
            None => Ok(()),
        }
    }

    /// Loads the tensors at `selection` into one new allocation on CUDA
    /// device `gpu`, each at a multiple of [`DEVICE_ALIGN`] bytes.
    ///
    /// # Errors
    /// As [`read_ranges_to_device`], and
    /// [`StorageError::Cuda`] when the GPU's memory is short. Nothing stays
    /// allocated after an error.
    pub fn load_to_device(
        &self,
        rt: &Runtime,
        gpu: CudaOrdinal,
        selection: &[usize],
        opts: &ReadOptions,
    ) -> Result<DeviceTensors> {
        self.check_selection(selection)?;
        let mut placed = Vec::with_capacity(selection.len());
        let mut size = 0usize;
        for &i in selection {
            placed.push((i, size));
            size += self.tensors[i].len.div_ceil(DEVICE_ALIGN) * DEVICE_ALIGN;
        }
        let mem = DeviceMemory::new(gpu, size)?;
        let ranges: Vec<DeviceRange> = placed
            .iter()
            .map(|&(i, off)| {
                let t = &self.tensors[i];
                DeviceRange {
                    source: t.source,
                    offset: t.offset,
                    len: t.len,
                    dst: mem.ptr() + off as u64,
                }
            })
            .collect();
        let report = read_ranges_to_device(rt, &self.sources, &ranges, gpu, opts)?;
        Ok(DeviceTensors {
            mem,
            placed,
            report,
        })
    }

    /// Loads the tensors at `selection` into pinned host memory from `rt`'s
    /// arena on `target`'s node (a GPU's node for [`Target::Gpu`]), one
    /// buffer per tensor, read straight into place by threads on that node.
    ///
    /// # Errors
    /// As [`read_ranges_to_host`], and
    /// [`StorageError::Runtime`] when the node's budget is short. Nothing
    /// stays allocated after an error.
    pub fn load_to_host(
        &self,
        rt: &Runtime,
        target: Target,
        selection: &[usize],
        opts: &ReadOptions,
    ) -> Result<HostTensors> {
        self.check_selection(selection)?;
        let node = super::place(rt, target)?.node;
        let mut bufs = Vec::with_capacity(selection.len());
        for &i in selection {
            let t = &self.tensors[i];
            // The tensor's first byte sits where the file's does modulo
            // the alignment, so its whole blocks can be read in place.
            let a = self.sources[t.source].alignment();
            let pad = (t.offset % a) as usize;
            let buf = rt.alloc(Target::HostNode(node), (pad + t.len).max(1))?;
            bufs.push(HostTensor {
                entry: i,
                buf,
                offset: pad,
                len: t.len,
            });
        }
        let ranges: Vec<HostRange<'_>> = bufs
            .iter_mut()
            .map(|h| {
                let t = &self.tensors[h.entry];
                HostRange {
                    source: t.source,
                    offset: t.offset,
                    dst: &mut h.buf[h.offset..h.offset + h.len],
                }
            })
            .collect();
        let report = read_ranges_to_host(rt, &self.sources, ranges, target, opts)?;
        Ok(HostTensors {
            tensors: bufs,
            report,
        })
    }
}

/// Tensors loaded into one device allocation.
#[derive(Debug)]
pub struct DeviceTensors {
    mem: DeviceMemory,
    placed: Vec<(usize, usize)>,
    report: ReadReport,
}

impl DeviceTensors {
    /// The allocation holding them.
    pub fn memory(&self) -> &DeviceMemory {
        &self.mem
    }

    /// Each tensor's index in [`Checkpoint::tensors`] and device address,
    /// in file order.
    pub fn iter(&self) -> impl Iterator<Item = (usize, CUdeviceptr)> + '_ {
        self.placed
            .iter()
            .map(|&(i, off)| (i, self.mem.ptr() + off as u64))
    }

    /// Byte offset of tensor `entry` in the allocation, if loaded.
    pub fn offset_of(&self, entry: usize) -> Option<usize> {
        self.placed.iter().find(|p| p.0 == entry).map(|p| p.1)
    }

    /// What the read did.
    pub fn report(&self) -> &ReadReport {
        &self.report
    }
}

/// One tensor in pinned host memory.
#[derive(Debug)]
#[non_exhaustive]
pub struct HostTensor {
    /// Its index in [`Checkpoint::tensors`].
    pub entry: usize,
    /// The buffer holding it (at least one byte).
    pub buf: PinnedBuf,
    /// Where its bytes start in `buf`.
    pub offset: usize,
    /// Its bytes.
    pub len: usize,
}

impl HostTensor {
    /// Its bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.buf[self.offset..self.offset + self.len]
    }
}

/// Tensors loaded into pinned host memory.
#[derive(Debug)]
#[non_exhaustive]
pub struct HostTensors {
    /// The tensors, in file order.
    pub tensors: Vec<HostTensor>,
    /// What the read did.
    pub report: ReadReport,
}

/// Reads and checks the header of `src` (shard number `index`): its
/// tensors with their offsets in the file.
fn read_header(src: &Source, index: usize) -> Result<Vec<TensorEntry>> {
    let path = src.path();
    let len = src.len();
    if len < 8 {
        return Err(StorageError::input(
            path,
            format!("is {len} bytes long, shorter than a safetensors header's 8-byte length"),
            "pass a whole safetensors file (was it truncated?)",
        ));
    }
    let mut n8 = [0u8; 8];
    super::io::read_exact_at(src, 0, &mut n8, 8, super::IoMode::Buffered, None)?;
    let n = check_header_len(u64::from_le_bytes(n8), len, path)?;
    let mut header = vec![0u8; n];
    super::io::read_exact_at(src, 8, &mut header, n, super::IoMode::Buffered, None)?;
    parse_header(&header, len, path)?
        .into_iter()
        .map(|mut t| {
            t.source = index;
            Ok(t)
        })
        .collect()
}

/// Checks a header length read from a file of `file_len` bytes, before
/// anything is allocated for it.
fn check_header_len(n: u64, file_len: u64, path: &Path) -> Result<usize> {
    if n > MAX_HEADER_BYTES {
        return Err(StorageError::input(
            path,
            format!("claims a header of {n} bytes, over the format's {MAX_HEADER_BYTES}-byte limit (not a safetensors file, or a damaged one)"),
            "pass a safetensors file",
        ));
    }
    if 8 + n > file_len {
        return Err(StorageError::input(
            path,
            format!(
                "claims a header of {n} bytes, and the file is {file_len} bytes long (truncated?)"
            ),
            "pass a whole safetensors file",
        ));
    }
    Ok(n as usize)
}

/// The tensors of header `header` (the JSON after the 8-byte length) of a
/// file of `file_len` bytes, parsed and checked by the `safetensors`
/// crate, with their offsets in the file; `source` is 0.
fn parse_header(header: &[u8], file_len: u64, path: &Path) -> Result<Vec<TensorEntry>> {
    let meta: Metadata = serde_json::from_slice(header).map_err(|e| {
        StorageError::input_from(
            path,
            "has a header that is not a valid safetensors header",
            "pass a safetensors file written by a safetensors library",
            e,
        )
    })?;
    let start = 8 + header.len() as u64;
    let end = start + meta.data_len() as u64;
    if end != file_len {
        let problem = if end > file_len {
            format!("has tensors up to byte {end}, past the end of the file ({file_len} bytes): offsets past the end, or a truncated file")
        } else {
            format!(
                "has {} bytes after the last tensor (the header's data ends at byte {end})",
                file_len - end
            )
        };
        return Err(StorageError::input(
            path,
            problem,
            "pass a whole, unmodified safetensors file",
        ));
    }
    let mut out = Vec::new();
    for name in meta.offset_keys() {
        let info = meta.info(&name).expect("offset_keys names known tensors");
        let (b, e) = info.data_offsets;
        out.push(TensorEntry {
            dtype: info.dtype,
            shape: info.shape.clone(),
            source: 0,
            offset: start + b as u64,
            len: e - b,
            name,
        });
    }
    Ok(out)
}

/// The `weight_map` of an index (tensor name to shard file), each file a
/// relative path inside the index's folder.
fn parse_index(text: &[u8], path: &Path) -> Result<BTreeMap<String, String>> {
    #[derive(serde::Deserialize)]
    struct Index {
        weight_map: BTreeMap<String, String>,
    }
    let index: Index = serde_json::from_slice(text).map_err(|e| {
        StorageError::input_from(
            path,
            "is not a safetensors index (JSON with a \"weight_map\" of tensor names to files)",
            "pass a model.safetensors.index.json, or a .safetensors file",
            e,
        )
    })?;
    let mut files = std::collections::BTreeSet::new();
    for f in index.weight_map.values() {
        let p = Path::new(f);
        let plain = !f.is_empty() && p.components().all(|c| matches!(c, Component::Normal(_)));
        if !plain {
            return Err(StorageError::input(
                path,
                format!(
                    "names the file {f:?}, which is not a relative path inside the index's folder"
                ),
                "an index names its shard files relative to its own folder, without `..`",
            ));
        }
        files.insert(f);
        if files.len() > MAX_INDEX_FILES {
            return Err(StorageError::input(
                path,
                format!("names more than {MAX_INDEX_FILES} files"),
                "pass an index of fewer shards",
            ));
        }
    }
    Ok(index.weight_map)
}

/// The header and index parsers on bytes, for the fuzz targets.
#[doc(hidden)]
pub mod fuzzing {
    use super::*;

    /// Parses `bytes` as a whole safetensors file's start (length,
    /// header) of a file of `bytes.len()` bytes; returns the tensors.
    ///
    /// # Errors
    /// As [`Checkpoint::open`].
    pub fn parse_file(bytes: &[u8]) -> Result<Vec<TensorEntry>> {
        let path = Path::new("fuzz.safetensors");
        let len = bytes.len() as u64;
        let n8: [u8; 8] = bytes
            .get(..8)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| StorageError::input(path, "too short", "-"))?;
        let n = check_header_len(u64::from_le_bytes(n8), len, path)?;
        parse_header(&bytes[8..8 + n], len, path)
    }

    /// Parses `bytes` as an index; returns how many tensors it maps.
    ///
    /// # Errors
    /// As [`Checkpoint::open`].
    pub fn parse_index(bytes: &[u8]) -> Result<usize> {
        super::parse_index(bytes, Path::new("fuzz.index.json")).map(|m| m.len())
    }

    /// The shard rule over `sizes`.
    pub fn shard_ranks(sizes: &[u64], world: usize) -> Vec<usize> {
        super::shard_ranks(sizes, world)
    }
}
