//! safetensors headers read and checked: the 8-byte length, the JSON
//! object, every tensor's entry, and how the tensors tile the data. Every
//! problem is an input error naming the file, and the tensor when it is
//! one tensor's.
//!
//! The rules are those of the `safetensors` crate 0.8 (the format's own
//! implementation, which its Python package uses too), so that what it
//! refuses is refused here; numapin is stricter where the crate would give
//! something other than the file says or something torch cannot hold: a
//! name given twice (the crate keeps the last), a dtype written as
//! `{"F32": null}`, more than [`MAX_DIMS`] dimensions, a dimension over
//! `2^63 - 1`. The JSON is read in one pass without building a tree:
//! memory follows the number of tensors, not what a hostile header makes
//! of its 100 MB.

use std::collections::HashSet;
use std::fmt;
use std::path::Path;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::{Dtype, TensorEntry};
use crate::storage::{IoMode, Source, StorageError};

type Result<T, E = StorageError> = std::result::Result<T, E>;

/// Largest header a file may have: the format's own limit (the
/// `safetensors` crate refuses larger ones), checked before it is read.
pub const MAX_HEADER_BYTES: u64 = 100_000_000;
/// Most dimensions a tensor may have (NumPy's limit, which every tensor
/// numapin hands out can be viewed through).
pub const MAX_DIMS: usize = 64;
/// Largest dimension (torch's and NumPy's sizes are signed 64-bit).
pub const MAX_DIM: u64 = i64::MAX as u64;
/// Longest a tensor name is quoted in a message.
const NAME_IN_MESSAGE: usize = 120;
/// Longest a parser's message is kept (a hostile header's strings are
/// quoted by the parser).
const MESSAGE: usize = 600;

const FIX: &str =
    "pass a safetensors file as a safetensors library wrote it (this one is damaged, or not one)";

/// Reads and checks the header of `src`: its tensors, in file order, with
/// their offsets in the file and `source` set to `index`.
pub(super) fn read(src: &Source, index: usize) -> Result<Vec<TensorEntry>> {
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
    crate::storage::io::read_exact_at(src, 0, &mut n8, 8, IoMode::Buffered, None)?;
    let n = check_len(u64::from_le_bytes(n8), len, path)?;
    let mut header = vec![0u8; n];
    crate::storage::io::read_exact_at(src, 8, &mut header, n, IoMode::Buffered, None)?;
    let mut tensors = parse(&header, len, path)?;
    for t in &mut tensors {
        t.source = index;
    }
    Ok(tensors)
}

/// Checks a header length read from a file of `file_len` bytes, before
/// anything is allocated for it.
pub(super) fn check_len(n: u64, file_len: u64, path: &Path) -> Result<usize> {
    if n == 0 {
        return Err(StorageError::input(
            path,
            "has a header length of 0 (a safetensors header is a JSON object of at least 2 bytes)",
            FIX,
        ));
    }
    if n > MAX_HEADER_BYTES {
        return Err(StorageError::input(
            path,
            format!("claims a header of {n} bytes, over the format's {MAX_HEADER_BYTES}-byte limit (not a safetensors file, or a damaged one)"),
            FIX,
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
    Ok(crate::num::usize_from(n))
}

/// The tensors of `header` (the bytes after the 8-byte length) of a file
/// of `file_len` bytes, checked, in file order, with their offsets in the
/// file; `source` is 0.
pub(super) fn parse(header: &[u8], file_len: u64, path: &Path) -> Result<Vec<TensorEntry>> {
    let text = std::str::from_utf8(header).map_err(|e| {
        StorageError::input(
            path,
            format!(
                "has a header that is not UTF-8 text (a bad byte at byte {} of the header)",
                e.valid_up_to()
            ),
            FIX,
        )
    })?;
    let mut de = serde_json::Deserializer::from_str(text);
    let entries = HeaderSeed
        .deserialize(&mut de)
        .and_then(|v| de.end().map(|()| v))
        .map_err(|e| {
            StorageError::input(
                path,
                format!("has a bad safetensors header: {}", clip(&e.to_string())),
                FIX,
            )
        })?;
    check_names(&entries, path)?;
    let start = 8 + header.len() as u64;
    let end = start.saturating_add(tile(&entries, path)?);
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
    let mut out: Vec<TensorEntry> = entries
        .into_iter()
        .map(|e| TensorEntry {
            dtype: e.dtype,
            shape: e.shape,
            source: 0,
            offset: start + e.begin,
            len: crate::num::usize_from(e.end - e.begin),
            name: e.name,
        })
        .collect();
    out.sort_by_key(|t| (t.offset, t.len));
    Ok(out)
}

/// `"name"`, shortened to [`NAME_IN_MESSAGE`] characters.
pub(super) fn quoted(name: &str) -> String {
    match name.char_indices().nth(NAME_IN_MESSAGE) {
        Some((i, _)) => format!("{:?}...", &name[..i]),
        None => format!("{name:?}"),
    }
}

pub(super) fn clip(s: &str) -> String {
    match s.char_indices().nth(MESSAGE) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_string(),
    }
}

/// No name twice (the crate would keep the last entry of a name).
fn check_names(entries: &[Entry], path: &Path) -> Result<()> {
    let mut seen = HashSet::with_capacity(entries.len());
    for e in entries {
        if !seen.insert(e.name.as_str()) {
            return Err(StorageError::input(
                path,
                format!(
                    "has a bad safetensors header: it names tensor {} twice",
                    quoted(&e.name)
                ),
                FIX,
            ));
        }
    }
    Ok(())
}

/// The tensors must cover the data from its first byte, each starting
/// where the one before it (by offsets) ends, as the crate requires;
/// returns the data's length.
fn tile(entries: &[Entry], path: &Path) -> Result<u64> {
    let mut order: Vec<&Entry> = entries.iter().collect();
    order.sort_by_key(|e| (e.begin, e.end));
    let mut end = 0u64;
    let mut before: Option<&Entry> = None;
    for e in order {
        if e.begin != end {
            let problem = match before {
                None => format!(
                    "has a bad safetensors header: its first tensor, tensor {}, starts at byte {} of the data, not 0",
                    quoted(&e.name),
                    e.begin
                ),
                Some(b) if e.begin > end => format!(
                    "has a bad safetensors header: tensor {} starts at byte {} of the data, and tensor {} before it ends at byte {end} (a gap)",
                    quoted(&e.name),
                    e.begin,
                    quoted(&b.name)
                ),
                Some(b) => format!(
                    "has a bad safetensors header: tensor {} (data bytes {}..{}) overlaps tensor {} (bytes {}..{end})",
                    quoted(&e.name),
                    e.begin,
                    e.end,
                    quoted(&b.name),
                    b.begin
                ),
            };
            return Err(StorageError::input(path, problem, FIX));
        }
        end = e.end;
        before = Some(e);
    }
    Ok(end)
}

/// One tensor's entry, checked on its own.
struct Entry {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    begin: u64,
    end: u64,
}

/// The header: a JSON object of tensors and `__metadata__`.
struct HeaderSeed;

impl<'de> DeserializeSeed<'de> for HeaderSeed {
    type Value = Vec<Entry>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Vec<Entry>, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for HeaderSeed {
    type Value = Vec<Entry>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object of tensors")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Vec<Entry>, A::Error> {
        let mut out = Vec::new();
        let mut metadata = false;
        while let Some(name) = map.next_key::<String>()? {
            if name == "__metadata__" {
                if std::mem::replace(&mut metadata, true) {
                    return Err(de::Error::custom("\"__metadata__\" is given twice"));
                }
                map.next_value_seed(Metadata)?;
                continue;
            }
            let e = map.next_value_seed(InfoSeed { name: &name })?;
            out.push(Entry {
                name,
                dtype: e.0,
                shape: e.1,
                begin: e.2,
                end: e.3,
            });
        }
        Ok(out)
    }
}

/// Any JSON value, not kept, read as the crate reads it (its nesting
/// within the parser's depth limit, which a skip without recursion would
/// not have).
struct Skip;

impl<'de> serde::Deserialize<'de> for Skip {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Skip, D::Error> {
        d.deserialize_any(Skip)
    }
}

impl<'de> Visitor<'de> for Skip {
    type Value = Skip;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Skip, A::Error> {
        while seq.next_element::<Skip>()?.is_some() {}
        Ok(Skip)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Skip, A::Error> {
        while map.next_entry::<Skip, Skip>()?.is_some() {}
        Ok(Skip)
    }
}

/// `__metadata__`: null, or an object of strings.
struct Metadata;

impl<'de> DeserializeSeed<'de> for Metadata {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for Metadata {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"__metadata__\" as an object of strings")
    }
    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while map.next_key::<IgnoredAny>()?.is_some() {
            map.next_value_seed(Text("\"__metadata__\" values as strings"))?;
        }
        Ok(())
    }
}

/// A string, not kept.
struct Text(&'static str);

impl<'de> DeserializeSeed<'de> for Text {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Text {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
}

/// One tensor's entry: `dtype`, `shape`, `data_offsets` (other fields are
/// ignored, as the crate ignores them).
struct InfoSeed<'a> {
    name: &'a str,
}

impl<'de> DeserializeSeed<'de> for InfoSeed<'_> {
    type Value = (Dtype, Vec<usize>, u64, u64);
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for InfoSeed<'_> {
    type Value = (Dtype, Vec<usize>, u64, u64);
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tensor {} as an object with \"dtype\", \"shape\" and \"data_offsets\"",
            quoted(self.name)
        )
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let name = self.name;
        let (mut dtype, mut shape, mut offsets) = (None, None, None);
        while let Some(k) = map.next_key::<String>()? {
            let twice = match k.as_str() {
                "dtype" => dtype
                    .replace(map.next_value_seed(DtypeSeed { name })?)
                    .is_some(),
                "shape" => shape
                    .replace(map.next_value_seed(Ints {
                        name,
                        field: "shape",
                        most: MAX_DIMS,
                        max: MAX_DIM,
                    })?)
                    .is_some(),
                "data_offsets" => offsets
                    .replace(map.next_value_seed(Ints {
                        name,
                        field: "data_offsets",
                        most: 2,
                        max: u64::MAX,
                    })?)
                    .is_some(),
                _ => map.next_value::<Skip>().map(|_| false)?,
            };
            if twice {
                return Err(de::Error::custom(format!(
                    "tensor {} gives {k:?} twice",
                    quoted(name)
                )));
            }
        }
        let missing =
            |field: &str| de::Error::custom(format!("tensor {} has no {field:?}", quoted(name)));
        let dtype = dtype.ok_or_else(|| missing("dtype"))?;
        let shape = shape.ok_or_else(|| missing("shape"))?;
        let offsets = offsets.ok_or_else(|| missing("data_offsets"))?;
        check_info(name, dtype, &shape, &offsets).map_err(de::Error::custom)?;
        let shape = shape.into_iter().map(crate::num::usize_from).collect();
        Ok((dtype, shape, offsets[0], offsets[1]))
    }
}

/// The entry's size against its offsets, by the crate's arithmetic (the
/// element count multiplied dimension by dimension, overflow refused even
/// where a later dimension is 0).
fn check_info(name: &str, dtype: Dtype, shape: &[u64], offsets: &[u64]) -> Result<(), String> {
    let &[begin, end] = offsets else {
        return Err(format!(
            "tensor {}: data_offsets has {} entries, not 2 ([begin, end])",
            quoted(name),
            offsets.len()
        ));
    };
    let overflow = || {
        format!(
            "tensor {}: {dtype} {shape:?} has more bytes than a 64-bit size holds",
            quoted(name)
        )
    };
    let elements = shape
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .ok_or_else(overflow)?;
    let bits = elements
        .checked_mul(dtype.bitsize() as u64)
        .ok_or_else(overflow)?;
    if bits % 8 != 0 {
        return Err(format!(
            "tensor {}: {elements} elements of {dtype} ({} bits each) are not a whole number of bytes",
            quoted(name),
            dtype.bitsize()
        ));
    }
    if end < begin {
        return Err(format!(
            "tensor {}: data_offsets [{begin}, {end}] end before they begin",
            quoted(name)
        ));
    }
    if end - begin != bits / 8 {
        return Err(format!(
            "tensor {}: data_offsets [{begin}, {end}] hold {} bytes, and {dtype} {shape:?} is {} bytes",
            quoted(name),
            end - begin,
            bits / 8
        ));
    }
    Ok(())
}

/// A dtype: one of the crate's names, as a string.
struct DtypeSeed<'a> {
    name: &'a str,
}

impl<'de> DeserializeSeed<'de> for DtypeSeed<'_> {
    type Value = Dtype;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Dtype, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for DtypeSeed<'_> {
    type Value = Dtype;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tensor {}'s dtype as a string", quoted(self.name))
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Dtype, E> {
        let d: Result<Dtype, de::value::Error> =
            serde::Deserialize::deserialize(de::value::StrDeserializer::new(s));
        d.map_err(|_| {
            E::custom(format!(
                "tensor {} has dtype {}, which is not a safetensors dtype ({})",
                quoted(self.name),
                quoted(s),
                super::DTYPE_NAMES.join(", ")
            ))
        })
    }
}

/// A JSON array of at most `most` whole numbers, each at most `max`.
struct Ints<'a> {
    name: &'a str,
    field: &'static str,
    most: usize,
    max: u64,
}

impl<'de> DeserializeSeed<'de> for Ints<'_> {
    type Value = Vec<u64>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Vec<u64>, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Ints<'_> {
    type Value = Vec<u64>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tensor {}'s {} as an array of whole numbers",
            quoted(self.name),
            self.field
        )
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u64>, A::Error> {
        let mut v = Vec::new();
        while let Some(n) = seq.next_element_seed(Int { of: &self })? {
            if v.len() == self.most {
                let problem = if self.field == "shape" {
                    format!("more than {MAX_DIMS} dimensions (numapin's limit, NumPy's)")
                } else {
                    format!("more than {} entries", self.most)
                };
                return Err(de::Error::custom(format!(
                    "tensor {}'s {} has {problem}",
                    quoted(self.name),
                    self.field
                )));
            }
            v.push(n);
        }
        Ok(v)
    }
}

/// One whole number of an [`Ints`].
struct Int<'a, 'b> {
    of: &'a Ints<'b>,
}

impl<'de> DeserializeSeed<'de> for Int<'_, '_> {
    type Value = u64;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<u64, D::Error> {
        d.deserialize_u64(self)
    }
}

impl<'de> Visitor<'de> for Int<'_, '_> {
    type Value = u64;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tensor {}'s {} entries as whole numbers from 0 to {}",
            quoted(self.of.name),
            self.of.field,
            self.of.max
        )
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
        if v > self.of.max {
            return Err(E::custom(format!(
                "tensor {}'s {} has {v}, over {} (torch's largest size)",
                quoted(self.of.name),
                self.of.field,
                self.of.max
            )));
        }
        Ok(v)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
        match u64::try_from(v) {
            Ok(v) => self.visit_u64(v),
            Err(_) => Err(E::invalid_value(de::Unexpected::Signed(v), &self)),
        }
    }
}
