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
//! Headers are read and checked by rules that are those of
//! the `safetensors` crate (the format's own implementation): the tensors
//! tile the data section without gaps or overlaps, each one's size matches
//! its dtype and shape, nothing overflows, and the data ends exactly at
//! the file's end (as `safetensors.torch.load_file` requires); numapin is
//! stricter where the crate would hand out something other than what the
//! file says (a name given twice). Every error names the file, and the
//! tensor when it is one tensor's. No file stays open between
//! [`Checkpoint::open`] and a load, and a load holds at most
//! [`MAX_OPEN_FILES`] of them open at once; each is checked to be the
//! file whose header was read.

mod header;
mod index;
mod save;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use crate::gpu::{CUdeviceptr, CudaOrdinal};
use crate::platform::file::Identity;
use crate::runtime::{PinnedBuf, Runtime, Target};

use super::{
    read_ranges_to_device, read_ranges_to_host, DeviceMemory, DeviceRange, HostRange, ReadOptions,
    ReadReport, Source, SourceRange, StorageError,
};

pub use self::header::{MAX_DIM, MAX_DIMS, MAX_HEADER_BYTES};
pub use self::index::{MAX_INDEX_BYTES, MAX_INDEX_FILES};
pub use ::safetensors::Dtype;
pub use save::{
    header, index_json, save, save_on, shard_name, shard_plan, SaveOptions, SaveTensor,
};

type Result<T, E = StorageError> = std::result::Result<T, E>;

/// Device placement of each tensor in [`Checkpoint::load_to_device`]'s one
/// allocation (as `cudaMalloc` aligns allocations).
pub const DEVICE_ALIGN: usize = 256;
/// Most files of a checkpoint a load holds open at once (two descriptors
/// each: buffered and `O_DIRECT`); an index of more shards is read in
/// turns of this many files.
pub const MAX_OPEN_FILES: usize = 16;
/// Largest world size of a [`Shard`] (ranks sharing a checkpoint).
pub const MAX_WORLD: usize = 1 << 20;

/// Every dtype name of the safetensors format (version 0.8), in the
/// crate's order.
pub const DTYPE_NAMES: &[&str] = &[
    "BOOL",
    "F4",
    "F6_E2M3",
    "F6_E3M2",
    "U8",
    "I8",
    "F8_E5M2",
    "F8_E4M3",
    "F8_E8M0",
    "F8_E4M3FNUZ",
    "F8_E5M2FNUZ",
    "I16",
    "U16",
    "F16",
    "BF16",
    "I32",
    "U32",
    "F32",
    "C64",
    "F64",
    "I64",
    "U64",
];

/// One tensor of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TensorEntry {
    /// Its name.
    pub name: String,
    /// Its element type.
    pub dtype: Dtype,
    /// Its shape (row-major, little-endian elements), as the file gives
    /// it: elements, also for the sub-byte dtypes (`F4` packs two in a
    /// byte).
    pub shape: Vec<usize>,
    /// The file it is in (index into [`Checkpoint::files`]).
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
    /// [`StorageError::Request`] unless `rank < world <= MAX_WORLD`.
    pub fn new(rank: usize, world: usize) -> Result<Shard> {
        check_world(world)?;
        if rank >= world {
            return Err(StorageError::request(
                format!("shard rank {rank} of {world}: the rank must be below the world size"),
                "pass a rank from 0 to world - 1 (LOCAL_RANK and LOCAL_WORLD_SIZE under torchrun)",
            ));
        }
        Ok(Shard { rank, world })
    }
}

fn check_world(world: usize) -> Result<()> {
    if world == 0 || world > MAX_WORLD {
        return Err(StorageError::request(
            format!("a world size of {world}: it must be from 1 to {MAX_WORLD}"),
            "pass the number of ranks that share the checkpoint (LOCAL_WORLD_SIZE under torchrun)",
        ));
    }
    Ok(())
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
                (i as u128 * world as u128 / n.max(1) as u128) as usize
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

/// A file of a checkpoint, as it was when its header was read (it is
/// opened again, and checked to be the same, when tensors are loaded).
#[derive(Debug, Clone)]
pub struct CheckpointFile {
    path: PathBuf,
    identity: Identity,
    /// Its `O_DIRECT` alignment.
    align: u64,
}

impl CheckpointFile {
    /// Its path (the index's folder joined with the name the index gives).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        self.identity.len
    }

    /// Whether it is empty (a checkpoint's files never are).
    pub fn is_empty(&self) -> bool {
        self.identity.len == 0
    }

    /// Opens it again, checked to be the file whose header was read.
    fn reopen(&self) -> Result<Source> {
        let src = Source::open(&self.path)?;
        let now = src.identity();
        let was = self.identity;
        let why = if (now.dev, now.ino) != (was.dev, was.ino) {
            "it was replaced by another file"
        } else if now.len != was.len {
            "its length changed"
        } else if now.mtime != was.mtime {
            "it was written to"
        } else {
            return Ok(src);
        };
        Err(StorageError::input(
            &self.path,
            format!("changed since its header was read: {why}"),
            "do not write a checkpoint while it is loaded; open it again once it is written",
        ))
    }
}

/// A safetensors checkpoint, opened and checked: its files and tensors.
#[derive(Debug)]
pub struct Checkpoint {
    path: PathBuf,
    files: Vec<CheckpointFile>,
    /// Sorted by name.
    tensors: Vec<TensorEntry>,
    by_name: HashMap<String, usize>,
}

impl Checkpoint {
    /// Opens a `.safetensors` file, or an index (`*.json`, as
    /// `model.safetensors.index.json`) and every shard file it names
    /// (relative to the index's folder), and checks every header. Files
    /// are opened one at a time and closed again.
    ///
    /// # Errors
    /// [`StorageError::Input`] naming the file (and the tensor) for a
    /// path that is not a regular file (a directory, a FIFO, a device), a
    /// header that does not parse, lies (offsets past the end of the file,
    /// overlapping or with gaps, sizes that do not match the shape, a name
    /// given twice) or claims more than the format allows; an index that
    /// is not a JSON object with a `weight_map`, names a tensor twice, a
    /// file outside its folder (`..`, an absolute path, a symbolic link
    /// leading out), a file that does not exist, or a tensor its file
    /// does not hold or that another of its files holds too.
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
        let tensors = header::read(&src, 0)?;
        let file = CheckpointFile {
            path: path.to_path_buf(),
            identity: src.identity(),
            align: src.alignment(),
        };
        Ok(Self::new(path, vec![file], tensors))
    }

    fn open_index(path: &Path) -> Result<Checkpoint> {
        let map = index::read(&Source::open(path)?)?;
        let folder = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let mut names: Vec<&String> = map.values().collect();
        names.sort();
        names.dedup();
        let mut files = Vec::with_capacity(names.len());
        let mut tensors = Vec::with_capacity(map.len());
        for (i, &f) in names.iter().enumerate() {
            let src = open_shard(path, folder, f)?;
            for t in header::read(&src, i)? {
                match map.get(&t.name) {
                    Some(g) if g == f => tensors.push(t),
                    Some(g) => return Err(in_two(path, &t.name, g, f)),
                    // Not in the map: not loaded.
                    None => {}
                }
            }
            files.push(CheckpointFile {
                path: src.path().to_path_buf(),
                identity: src.identity(),
                align: src.alignment(),
            });
        }
        if tensors.len() != map.len() {
            let held: HashSet<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
            if let Some((name, f)) = map.iter().find(|(n, _)| !held.contains(n.as_str())) {
                return Err(StorageError::input(
                    path,
                    format!(
                        "names tensor {} in {}, which has no tensor of that name",
                        header::quoted(name),
                        header::quoted(f)
                    ),
                    "regenerate the index, or check that every shard file is the one it was written with",
                ));
            }
        }
        Ok(Self::new(path, files, tensors))
    }
}

/// Opens shard file `name` of the index at `index` (in `folder`), found
/// inside the folder first and checked after the open to be the file
/// that was found there.
fn open_shard(index: &Path, folder: &Path, name: &str) -> Result<Source> {
    let (p, real) = index::shard_path(index, folder, name)?;
    let src = Source::open(&p)?;
    let id = src.identity();
    let same = std::fs::metadata(&real).is_ok_and(|m| {
        use std::os::unix::fs::MetadataExt;
        (m.dev(), m.ino()) == (id.dev, id.ino)
    });
    if !same {
        return Err(StorageError::input(
            index,
            format!(
                "names the shard file {}, which changed while it was opened",
                header::quoted(name)
            ),
            "do not change the checkpoint's folder while it is opened",
        ));
    }
    Ok(src)
}

fn in_two(index: &Path, name: &str, mapped: &str, also: &str) -> StorageError {
    StorageError::input(
        index,
        format!(
            "maps tensor {} to {}, and {} holds a tensor of that name too",
            header::quoted(name),
            header::quoted(mapped),
            header::quoted(also)
        ),
        "regenerate the index, or remove the stray copy: a tensor must be in one shard file",
    )
}

impl Checkpoint {
    fn new(path: &Path, files: Vec<CheckpointFile>, mut tensors: Vec<TensorEntry>) -> Checkpoint {
        tensors.sort_by(|a, b| a.name.cmp(&b.name));
        let by_name = tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Checkpoint {
            path: path.to_path_buf(),
            files,
            tensors,
            by_name,
        }
    }

    /// The path it was opened from (the file, or the index).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its files (one, or the index's shards in name order), as they were
    /// when their headers were read.
    pub fn files(&self) -> &[CheckpointFile] {
        &self.files
    }

    /// Its tensors, sorted by name.
    pub fn tensors(&self) -> &[TensorEntry] {
        &self.tensors
    }

    /// The index in [`tensors`](Self::tensors) of the tensor called `name`.
    pub fn find(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// The file holding tensor `entry` (an index into
    /// [`tensors`](Self::tensors)).
    pub fn file_of(&self, entry: usize) -> Option<&Path> {
        let t = self.tensors.get(entry)?;
        self.files.get(t.source).map(CheckpointFile::path)
    }

    /// Bytes of the tensors at `selection`.
    pub fn bytes(&self, selection: &[usize]) -> u64 {
        selection
            .iter()
            .filter_map(|&i| self.tensors.get(i))
            .fold(0u64, |a, t| a.saturating_add(t.len as u64))
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
                let mut v = Vec::with_capacity(names.len().min(self.tensors.len()));
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
            let s = Shard::new(s.rank, s.world)?;
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
    /// As [`select`](Self::select), and [`StorageError::Request`] for a
    /// world size of 0 or over [`MAX_WORLD`].
    pub fn shards(&self, names: Option<&[&str]>, world: usize) -> Result<Vec<Vec<usize>>> {
        check_world(world)?;
        let all = self.select(names, None)?;
        let sizes: Vec<u64> = all.iter().map(|&i| self.tensors[i].len as u64).collect();
        let mut out = vec![Vec::new(); world];
        for (i, r) in all.into_iter().zip(shard_ranks(&sizes, world)) {
            out[r].push(i);
        }
        Ok(out)
    }

    fn missing(&self, name: &str) -> StorageError {
        let some: Vec<String> = self
            .tensors
            .iter()
            .take(3)
            .map(|t| header::quoted(&t.name))
            .collect();
        StorageError::input(
            &self.path,
            format!(
                "holds no tensor called {} ({} tensors, such as {})",
                header::quoted(name),
                self.tensors.len(),
                some.join(", ")
            ),
            "pass names the checkpoint holds",
        )
    }

    fn check_selection(&self, selection: &[usize], opts: &ReadOptions) -> Result<()> {
        super::check_options(opts)?;
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

    /// The files of `selection`, in turns of at most [`MAX_OPEN_FILES`]
    /// (file indexes, ascending).
    fn turns(&self, selection: &[usize]) -> Vec<Vec<usize>> {
        let mut used: Vec<usize> = selection.iter().map(|&i| self.tensors[i].source).collect();
        used.sort_unstable();
        used.dedup();
        used.chunks(MAX_OPEN_FILES).map(<[usize]>::to_vec).collect()
    }

    /// Opens the files of one turn, each checked to be the file whose
    /// header was read.
    fn open_turn(&self, turn: &[usize]) -> Result<Vec<Source>> {
        turn.iter().map(|&f| self.files[f].reopen()).collect()
    }

    /// After a turn's reads: a file written to (or shortened) meanwhile
    /// gave bytes that may be neither the old nor the new ones.
    fn check_unchanged(sources: &[Source]) -> Result<()> {
        for s in sources {
            if let Some(why) = s.changed() {
                return Err(StorageError::input(
                    s.path(),
                    format!("changed while it was read: {why}"),
                    "do not write a checkpoint while it is loaded; load it again once it is written",
                ));
            }
        }
        Ok(())
    }

    /// Loads the tensors at `selection` into one new allocation on CUDA
    /// device `gpu`, each at a multiple of [`DEVICE_ALIGN`] bytes.
    ///
    /// # Errors
    /// As [`read_ranges_to_device`], and
    /// [`StorageError::Cuda`] when the GPU's memory is short. The options
    /// are checked before anything is allocated; nothing stays allocated
    /// after an error.
    pub fn load_to_device(
        &self,
        rt: &Runtime,
        gpu: CudaOrdinal,
        selection: &[usize],
        opts: &ReadOptions,
    ) -> Result<DeviceTensors> {
        self.check_selection(selection, opts)?;
        let mut placed = Vec::with_capacity(selection.len());
        let mut size = 0usize;
        for &i in selection {
            placed.push((i, size));
            size = self.tensors[i]
                .len
                .div_ceil(DEVICE_ALIGN)
                .checked_mul(DEVICE_ALIGN)
                .and_then(|n| size.checked_add(n))
                .ok_or_else(|| {
                    StorageError::request(
                        "the selected tensors hold more bytes than a 64-bit size",
                        "load fewer tensors at once",
                    )
                })?;
        }
        let mem = DeviceMemory::new(gpu, size)?;
        let dsts: Vec<CUdeviceptr> = placed
            .iter()
            .map(|&(_, off)| mem.ptr() + off as u64)
            .collect();
        let report = self.load_to_device_with(selection, &dsts, opts, |sources, ranges| {
            read_ranges_to_device(rt, sources, ranges, gpu, opts)
        })?;
        Ok(DeviceTensors {
            mem,
            placed,
            report,
        })
    }

    /// Loads the tensors at `selection` into device memory at `dsts` (one
    /// address each, with room for the tensor's bytes) with `read`, a turn
    /// of at most [`MAX_OPEN_FILES`] files at a time: `read` gets the
    /// turn's files (opened, and checked to be those whose headers were
    /// read) and the ranges of the selected tensors in them, and reads them
    /// ([`read_ranges_to_device`], or
    /// [`read_ranges_to_device_on`](super::read_ranges_to_device_on) to
    /// order the copies after a stream's work). Returns what the reads
    /// did, together.
    ///
    /// # Errors
    /// [`StorageError::Request`] for bad options, an index out of range or
    /// a `dsts` of another length than `selection` (before anything is
    /// opened); [`StorageError::Input`] for a file that changed since its
    /// header was read (before it is read) or while it was read; what
    /// `read` returns.
    pub fn load_to_device_with(
        &self,
        selection: &[usize],
        dsts: &[CUdeviceptr],
        opts: &ReadOptions,
        mut read: impl FnMut(&[Source], &[DeviceRange]) -> Result<ReadReport>,
    ) -> Result<ReadReport> {
        self.check_selection(selection, opts)?;
        if dsts.len() != selection.len() {
            return Err(StorageError::request(
                format!(
                    "{} tensors and {} destinations",
                    selection.len(),
                    dsts.len()
                ),
                "pass one device address per tensor",
            ));
        }
        self.each_turn(selection, |sources, parts| {
            let ranges: Vec<DeviceRange> = parts
                .iter()
                .map(|&(k, r)| DeviceRange {
                    source: r.source,
                    offset: r.offset,
                    len: r.len,
                    dst: dsts[k],
                })
                .collect();
            read(sources, &ranges)
        })
    }

    /// [`load_to_device_with`](Self::load_to_device_with) with each
    /// tensor's destination made while the turn's reads run: `read` gets
    /// the turn's files, the ranges of the selected tensors in them and
    /// each range's position in `selection`, and reads them with
    /// [`read_ranges_to_device_as_made`](super::read_ranges_to_device_as_made),
    /// whose `dest(i)` makes the destination of the tensor at that
    /// position.
    ///
    /// # Errors
    /// As [`load_to_device_with`](Self::load_to_device_with) (but for
    /// `dsts`).
    pub fn load_to_device_as_made<E: From<StorageError>>(
        &self,
        selection: &[usize],
        opts: &ReadOptions,
        mut read: impl FnMut(&[Source], &[SourceRange], &[usize]) -> std::result::Result<ReadReport, E>,
    ) -> std::result::Result<ReadReport, E> {
        self.check_selection(selection, opts)?;
        self.each_turn(selection, |sources, parts| {
            let (at, ranges): (Vec<usize>, Vec<SourceRange>) = parts.iter().copied().unzip();
            read(sources, &ranges, &at)
        })
    }

    /// Runs `read` for each turn of files of `selection`, with the turn's
    /// files (opened, checked to be those whose headers were read) and the
    /// selected tensors in them (their positions in `selection`, their
    /// ranges in those files), checking each file unchanged after it.
    fn each_turn<E: From<StorageError>>(
        &self,
        selection: &[usize],
        mut read: impl FnMut(&[Source], &[(usize, SourceRange)]) -> std::result::Result<ReadReport, E>,
    ) -> std::result::Result<ReadReport, E> {
        let mut report = ReadReport::default();
        for turn in self.turns(selection) {
            let sources = self.open_turn(&turn)?;
            let parts: Vec<(usize, SourceRange)> = selection
                .iter()
                .enumerate()
                .filter_map(|(k, &i)| {
                    let t = &self.tensors[i];
                    let source = turn.binary_search(&t.source).ok()?;
                    Some((
                        k,
                        SourceRange {
                            source,
                            offset: t.offset,
                            len: t.len,
                        },
                    ))
                })
                .collect();
            let r = read(&sources, &parts)?;
            Self::check_unchanged(&sources)?;
            merge(&mut report, r);
        }
        Ok(report)
    }

    /// Loads the tensors at `selection` into pinned host memory from `rt`'s
    /// arena on `target`'s node (a GPU's node for [`Target::Gpu`]), one
    /// buffer per tensor, read straight into place by threads on that node.
    ///
    /// # Errors
    /// As [`read_ranges_to_host`], and
    /// [`StorageError::TensorMemory`] (naming the file and the tensor) when
    /// the node's budget is short. The
    /// options are checked before anything is allocated; nothing stays
    /// allocated after an error.
    ///
    /// # Examples
    ///
    /// ```
    /// use numapin::runtime::{Runtime, RuntimeConfig, Target};
    /// use numapin::storage::safetensors::{save, Checkpoint, Dtype, SaveOptions, SaveTensor};
    /// use numapin::storage::write::Data;
    /// use numapin::storage::ReadOptions;
    /// use numapin::topology::{CudaMode, ProbeOptions, Topology};
    ///
    /// let topo = Topology::probe(&ProbeOptions::from_process().with_cuda(CudaMode::Off))?;
    /// let rt = Runtime::new(topo, RuntimeConfig::default().with_region_bytes(2 << 20))?;
    /// let dir = tempfile::tempdir()?;
    /// let path = dir.path().join("model.safetensors");
    /// let w: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0].iter().flat_map(|x| x.to_le_bytes()).collect();
    /// let b = [7u8, 8];
    /// let tensors = [
    ///     SaveTensor::new("w", Dtype::F32, vec![2, 2], Data::Host(&w)),
    ///     SaveTensor::new("b", Dtype::U8, vec![2], Data::Host(&b)),
    /// ];
    /// save(&rt, &path, &tensors, Target::Host, &SaveOptions::default())?;
    ///
    /// let ck = Checkpoint::open(&path)?;
    /// let all = ck.select(None, None)?;
    /// // Pinned buffers on this thread's node (Target::Gpu(..): a GPU's node).
    /// let node = Target::HostNode(rt.calling_thread_node());
    /// let loaded = ck.load_to_host(&rt, node, &all, &ReadOptions::default())?;
    /// for t in &loaded.tensors {
    ///     let entry = &ck.tensors()[t.entry];
    ///     let want: &[u8] = if entry.name == "w" { &w } else { &b };
    ///     assert_eq!(t.bytes(), want, "{}", entry.name);
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn load_to_host(
        &self,
        rt: &Runtime,
        target: Target,
        selection: &[usize],
        opts: &ReadOptions,
    ) -> Result<HostTensors> {
        self.check_selection(selection, opts)?;
        let node = super::place(rt, target)?.node;
        let mut bufs = Vec::with_capacity(selection.len());
        for &i in selection {
            let t = &self.tensors[i];
            // The tensor's first byte sits where the file's does modulo
            // the alignment, so its whole blocks can be read in place.
            let pad = crate::num::usize_from(t.offset % self.files[t.source].align);
            let buf = rt
                .alloc(Target::HostNode(node), (pad + t.len).max(1))
                .map_err(|source| StorageError::TensorMemory {
                    path: self.files[t.source].path.clone(),
                    tensor: header::quoted(&t.name),
                    len: t.len,
                    source: Box::new(source),
                })?;
            bufs.push(HostTensor {
                entry: i,
                buf,
                offset: pad,
                len: t.len,
            });
        }
        let mut report = ReadReport {
            node,
            ..ReadReport::default()
        };
        for turn in self.turns(selection) {
            let sources = self.open_turn(&turn)?;
            let ranges: Vec<HostRange<'_>> = bufs
                .iter_mut()
                .filter_map(|h| {
                    let t = &self.tensors[h.entry];
                    let source = turn.binary_search(&t.source).ok()?;
                    Some(HostRange {
                        source,
                        offset: t.offset,
                        dst: &mut h.buf[h.offset..h.offset + h.len],
                    })
                })
                .collect();
            let r = read_ranges_to_host(rt, &sources, ranges, target, opts)?;
            Self::check_unchanged(&sources)?;
            merge(&mut report, r);
        }
        Ok(HostTensors {
            tensors: bufs,
            report,
        })
    }
}

/// Adds the report of one turn of files to the load's.
fn merge(into: &mut ReadReport, r: ReadReport) {
    into.bytes += r.bytes;
    into.seconds += r.seconds;
    into.threads = into.threads.max(r.threads);
    into.node = r.node;
    into.cached_bytes += r.cached_bytes;
    into.direct_bytes += r.direct_bytes;
    into.buffered_bytes += r.buffered_bytes;
    into.staging_bytes = into.staging_bytes.max(r.staging_bytes);
    into.chunk_bytes = into.chunk_bytes.max(r.chunk_bytes);
    for w in r.warnings {
        // One sentence per drive: later turns name other files on the
        // drives already said.
        let drive = w.split_once(" is on ").map(|x| x.1);
        let said = into
            .warnings
            .iter()
            .any(|o| o == &w || (drive.is_some() && o.split_once(" is on ").map(|x| x.1) == drive));
        if !said {
            into.warnings.push(w);
        }
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

/// The header and index parsers on bytes, for the fuzz targets.
#[doc(hidden)]
pub mod fuzzing {
    use super::*;

    /// Parses `bytes` as a whole safetensors file's start (length,
    /// header) of a file of `bytes.len()` bytes; returns the tensors in
    /// file order.
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
        let n = header::check_len(u64::from_le_bytes(n8), len, path)?;
        header::parse(&bytes[8..8 + n], len, path)
    }

    /// Parses `bytes` as an index; returns its map of tensor names to
    /// files.
    ///
    /// # Errors
    /// As [`Checkpoint::open`].
    pub fn parse_index(bytes: &[u8]) -> Result<BTreeMap<String, String>> {
        index::parse(bytes, Path::new("fuzz.index.json"))
    }

    /// The shard rule over `sizes`.
    pub fn shard_ranks(sizes: &[u64], world: usize) -> Vec<usize> {
        super::shard_ranks(sizes, world)
    }
}
