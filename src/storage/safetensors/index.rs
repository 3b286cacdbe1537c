//! Indexes (`model.safetensors.index.json`): the `weight_map` from tensor
//! names to shard files, read in one pass (a name given twice, a file that
//! is not a string: refused, naming the tensor), and each shard file found
//! inside the index's folder before anything opens it.

use std::collections::btree_map::Entry;
use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::path::{Component, Path, PathBuf};

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};

use super::header::{clip, quoted};
use crate::storage::{Source, StorageError};

type Result<T, E = StorageError> = std::result::Result<T, E>;

/// Largest index file read.
pub const MAX_INDEX_BYTES: u64 = 64 << 20;
/// Most shard files an index may name.
pub const MAX_INDEX_FILES: usize = 65_536;

/// The `weight_map` of the index at `path` (tensor name to shard file),
/// each file a relative path inside the index's folder.
///
/// # Errors
/// [`StorageError::Input`] for an index that cannot be read, is too
/// large, is not JSON of that form, or names a file outside its folder.
pub(super) fn read(src: &Source) -> Result<BTreeMap<String, String>> {
    let path = src.path();
    if src.len() > MAX_INDEX_BYTES {
        return Err(too_large(path));
    }
    let mut text = Vec::new();
    src.buffered()
        .take(MAX_INDEX_BYTES + 1)
        .read_to_end(&mut text)
        .map_err(|e| StorageError::input_from(path, "cannot be read", "check the file", e))?;
    if text.len() as u64 > MAX_INDEX_BYTES {
        return Err(too_large(path));
    }
    parse(&text, path)
}

fn too_large(path: &Path) -> StorageError {
    StorageError::input(
        path,
        format!("is over {MAX_INDEX_BYTES} bytes, too large for a safetensors index"),
        "pass a model.safetensors.index.json",
    )
}

/// The `weight_map` of index text `text`, each file checked to be a plain
/// relative path.
pub(super) fn parse(text: &[u8], path: &Path) -> Result<BTreeMap<String, String>> {
    let bad = |problem: String| {
        StorageError::input(
            path,
            problem,
            "pass a model.safetensors.index.json (a JSON object whose \"weight_map\" maps each tensor name to its shard file), or a .safetensors file",
        )
    };
    let text = std::str::from_utf8(text).map_err(|e| {
        bad(format!(
            "is not a safetensors index: not UTF-8 text (a bad byte at byte {})",
            e.valid_up_to()
        ))
    })?;
    let mut de = serde_json::Deserializer::from_str(text);
    let map = IndexSeed
        .deserialize(&mut de)
        .and_then(|v| de.end().map(|()| v))
        .map_err(|e| {
            bad(format!(
                "is not a safetensors index: {}",
                clip(&e.to_string())
            ))
        })?
        .ok_or_else(|| bad("is not a safetensors index: it has no \"weight_map\"".into()))?;
    let mut files = std::collections::BTreeSet::new();
    for f in map.values() {
        if !files.contains(f.as_str()) {
            check_name(f, path)?;
            files.insert(f.as_str());
        }
        if files.len() > MAX_INDEX_FILES {
            return Err(bad(format!("names more than {MAX_INDEX_FILES} files")));
        }
    }
    Ok(map)
}

/// A shard's name must be a plain relative path: no `..`, not absolute,
/// not empty.
fn check_name(f: &str, path: &Path) -> Result<()> {
    let p = Path::new(f);
    let plain = !f.is_empty()
        && !f.contains('\0')
        && p.components().all(|c| matches!(c, Component::Normal(_)));
    if plain {
        return Ok(());
    }
    Err(StorageError::input(
        path,
        format!(
            "names the file {}, which is not a relative path inside the index's folder",
            quoted(f)
        ),
        "an index names its shard files relative to its own folder, without `..`",
    ))
}

/// The shard file `name` of the index at `index` (whose folder is
/// `folder`), found inside that folder: the path resolved (symbolic links
/// followed) must lie in the folder, or, for the Hugging Face cache's
/// layout (`.../snapshots/REV/` whose files link to `.../blobs/HASH`), in
/// the `blobs` folder beside `snapshots`. Nothing is opened.
///
/// # Errors
/// [`StorageError::Input`] naming the index and the file: missing, a link
/// loop, or a path leading out of the folder.
pub(super) fn shard_path(index: &Path, folder: &Path, name: &str) -> Result<(PathBuf, PathBuf)> {
    let p = folder.join(name);
    let fail = |problem: String, fix: &str| StorageError::input(index, problem, fix);
    let real =
        std::fs::canonicalize(&p).map_err(|e| {
            let why = match e.raw_os_error() {
                Some(libc::ENOENT) => "which does not exist".to_string(),
                Some(libc::ELOOP) => "a loop of symbolic links".to_string(),
                Some(libc::EACCES) => "which cannot be reached (permission denied)".to_string(),
                Some(libc::ENOTDIR) => "which has a part that is not a directory".to_string(),
                _ => format!("which cannot be found ({e})"),
            };
            fail(
            format!("names the shard file {} ({}), {why}", quoted(name), p.display()),
            "put every shard file the index names beside it (or pass the .safetensors file itself)",
        )
        })?;
    let root = std::fs::canonicalize(folder).map_err(|e| {
        fail(
            format!("is in a folder that cannot be resolved ({e})"),
            "check the path",
        )
    })?;
    if real.starts_with(&root) || in_hub_blobs(&root, &real) {
        return Ok((p, real));
    }
    Err(fail(
        format!(
            "names the shard file {}, which leads out of the index's folder (to {})",
            quoted(name),
            real.display()
        ),
        "keep the shard files in the index's folder (symbolic links may point only inside it, or into a Hugging Face cache's blobs/); an index from elsewhere may point at any file",
    ))
}

/// Whether `real` is a blob of the Hugging Face cache whose snapshot
/// folder is `root` (`<repo>/snapshots/<rev>` and `<repo>/blobs/<hash>`).
fn in_hub_blobs(root: &Path, real: &Path) -> bool {
    let Some(snapshots) = root.parent() else {
        return false;
    };
    let Some(repo) = snapshots.parent() else {
        return false;
    };
    snapshots.file_name().is_some_and(|n| n == "snapshots")
        && real.parent() == Some(repo.join("blobs").as_path())
}

/// The whole index: `weight_map`, others ignored; `None` without one.
struct IndexSeed;

impl<'de> DeserializeSeed<'de> for IndexSeed {
    type Value = Option<BTreeMap<String, String>>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for IndexSeed {
    type Value = Option<BTreeMap<String, String>>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object with a \"weight_map\"")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = None;
        while let Some(k) = map.next_key::<String>()? {
            if k != "weight_map" {
                map.next_value::<IgnoredAny>()?;
            } else if out.replace(map.next_value_seed(WeightMap)?).is_some() {
                return Err(de::Error::custom("\"weight_map\" is given twice"));
            }
        }
        Ok(out)
    }
}

/// `weight_map`: tensor names to file names, each name once.
struct WeightMap;

impl<'de> DeserializeSeed<'de> for WeightMap {
    type Value = BTreeMap<String, String>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for WeightMap {
    type Value = BTreeMap<String, String>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"weight_map\" as an object of tensor names to file names")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = BTreeMap::new();
        while let Some(name) = map.next_key::<String>()? {
            let file = map.next_value_seed(FileName { name: &name })?;
            match out.entry(name) {
                Entry::Vacant(v) => {
                    v.insert(file);
                }
                Entry::Occupied(o) => {
                    return Err(de::Error::custom(format!(
                        "\"weight_map\" names tensor {} twice ({} and {})",
                        quoted(o.key()),
                        quoted(o.get()),
                        quoted(&file)
                    )))
                }
            }
        }
        Ok(out)
    }
}

/// A shard file's name: a string.
struct FileName<'a> {
    name: &'a str,
}

impl<'de> DeserializeSeed<'de> for FileName<'_> {
    type Value = String;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_string(self)
    }
}

impl<'de> Visitor<'de> for FileName<'_> {
    type Value = String;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the file of tensor {} as a string", quoted(self.name))
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<String, E> {
        Ok(s.to_string())
    }
    fn visit_string<E: de::Error>(self, s: String) -> Result<String, E> {
        Ok(s)
    }
}
