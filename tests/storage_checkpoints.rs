//! Checkpoints from strangers: safetensors headers that lie, compared case
//! by case with the `safetensors` crate's own verdict (numapin agrees, or
//! refuses where the crate would hand out something other than the file
//! says; it never loads what the crate refuses), indexes that point
//! outside their folder or at missing, doubled or absent tensors, files
//! that are odd or change before they load, sizes and ranks from the
//! caller, and the cost of large indexes (linear in tensors, open files
//! bounded whatever the number of shards). Every refusal is an input
//! error naming the file (and the tensor), and leaves nothing lent.
// Test data: counts, sizes, indices and byte patterns far inside every type's range.
#![allow(clippy::cast_possible_truncation)]
#![allow(clippy::unwrap_used)] // tests fail loudly

mod common;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use numapin::storage::safetensors::{Checkpoint, Shard, MAX_WORLD};
use numapin::storage::{ReadOptions, StorageError};
use numapin::{ErrorKind, Runtime};

use common::storage::{assert_no_leak, node};

fn runtime() -> Runtime {
    common::storage::runtime_with(16 << 20)
}

/// A file: the 8-byte length of `header`, `header`, `data`.
fn file(header: &[u8], data: &[u8]) -> Vec<u8> {
    let mut f = (header.len() as u64).to_le_bytes().to_vec();
    f.extend_from_slice(header);
    f.extend_from_slice(data);
    f
}

/// One tensor's entry.
fn entry(name: &str, dtype: &str, shape: &str, b: u64, e: u64) -> String {
    format!(r#""{name}":{{"dtype":"{dtype}","shape":{shape},"data_offsets":[{b},{e}]}}"#)
}

/// `{"x": F32 [2] at 0..8, "y": <y>}` and 12 or `data` bytes.
fn xy(y: &str) -> String {
    format!("{{{},{y}}}", entry("x", "F32", "[2]", 0, 8))
}

/// What a case should get: loaded by both; refused by both; refused by
/// numapin only (the crate would hand out something other than the file
/// says, or something torch cannot hold).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    Both,
    Neither,
    Stricter,
}

struct Case {
    name: &'static str,
    bytes: Vec<u8>,
    want: Want,
    /// A tensor the refusal must name.
    tensor: Option<&'static str>,
}

/// A case of header `header` (of tensor `tensor` when named) and `data`
/// bytes of data.
fn h(
    name: &'static str,
    header: &str,
    data: usize,
    want: Want,
    tensor: Option<&'static str>,
) -> Case {
    Case {
        name,
        bytes: file(header.as_bytes(), &vec![7u8; data]),
        want,
        tensor,
    }
}

/// A case about tensor `y` of [`xy`]: its entry `y`.
fn y(name: &'static str, y: &str, data: usize, want: Want) -> Case {
    h(name, &xy(y), data, want, Some("y"))
}

/// Tensor `y`, U8 with `shape` at data bytes `b..e`.
fn y_u8(shape: &str, b: u64, e: u64) -> String {
    entry("y", "U8", shape, b, e)
}

/// A case of raw file bytes.
fn raw(name: &'static str, bytes: Vec<u8>, want: Want) -> Case {
    Case {
        name,
        bytes,
        want,
        tensor: None,
    }
}

/// The tensors of `xy` with `y` a well-formed U8 [4].
fn good() -> String {
    xy(&y_u8("[4]", 8, 12))
}

/// The 8-byte length; JSON that is not an object of tensors.
#[rustfmt::skip]
fn length_and_json_cases() -> Vec<Case> {
    use Want::*;
    let len = |n: u64| [&n.to_le_bytes()[..], b"{}"].concat();
    let good = good();
    vec![
        h("good", &good, 12, Both, None),
        raw("len_zero", len(0), Neither),
        raw("len_past_file", len(100), Neither),
        raw("len_max", len(u64::MAX), Neither),
        raw("len_2_63", len(1 << 63), Neither),
        raw("len_over_limit", len(100_000_001), Neither),
        raw("short", vec![1, 0, 0], Neither),
        raw("empty", Vec::new(), Neither),
        h("not_json", "{\"x\": [", 0, Neither, None),
        raw("not_utf8", file(b"{\"\xff\": 1}", b""), Neither),
        raw("bom", file(&[b"\xef\xbb\xbf", good.as_bytes()].concat(), &[7; 12]), Neither),
        h("array", "[1, 2]", 0, Neither, None),
        h("string", "\"x\"", 0, Neither, None),
        h("null", "null", 0, Neither, None),
        h("number", "5", 0, Neither, None),
        h("empty_object", "{}", 0, Both, None),
        h("trailing_chars", &format!("{good}x"), 12, Neither, None),
        h("trailing_nul", &format!("{good}\0"), 12, Neither, None),
        h("padded", &format!("  {good}  \n\t"), 12, Both, None),
        h("lone_surrogate", &xy(&entry("\\ud800", "U8", "[4]", 8, 12)), 12, Neither, None),
        h("escaped_name", &xy(&entry("\\u0079", "U8", "[4]", 8, 12)), 12, Both, None),
        h("empty_name", &xy(&entry("", "U8", "[4]", 8, 12)), 12, Both, None),
        // Nesting where anything goes, up to the parser's depth and past.
        h("nesting_125", &xy(&nested(125)), 12, Both, None),
        h("nesting_126", &xy(&nested(126)), 12, Neither, None),
        h("nesting_100000", &xy(&nested(100_000)), 12, Neither, None),
        h("trailing_bytes", &good, 13, Neither, None),
    ]
}

/// Names given twice, fields missing, doubled or unknown, dtypes.
#[rustfmt::skip]
fn name_field_dtype_cases() -> Vec<Case> {
    use Want::*;
    let twice = |a: &str, b: &str| format!("{{{a},{b}}}");
    vec![
        // The crate keeps the last entry of a name.
        h("dup_same", &twice(&entry("x", "U8", "[4]", 0, 4), &entry("x", "U8", "[4]", 0, 4)), 4, Stricter, Some("x")),
        h("dup_other", &twice(&entry("x", "U8", "[2]", 0, 2), &entry("x", "U8", "[4]", 0, 4)), 4, Stricter, Some("x")),
        y("no_dtype", r#""y":{"shape":[4],"data_offsets":[8,12]}"#, 12, Neither),
        y("no_shape", r#""y":{"dtype":"U8","data_offsets":[8,12]}"#, 12, Neither),
        y("no_offsets", r#""y":{"dtype":"U8","shape":[4]}"#, 12, Neither),
        y("dtype_twice", r#""y":{"dtype":"U8","dtype":"U8","shape":[4],"data_offsets":[8,12]}"#, 12, Neither),
        h("unknown_field", &xy(r#""y":{"dtype":"U8","shape":[4],"data_offsets":[8,12],"extra":[1,{"a":null}]}"#), 12, Both, None),
        y("entry_not_object", r#""y":[1,2]"#, 12, Neither),
        y("dtype_unknown", &entry("y", "F128", "[4]", 8, 12), 12, Neither),
        y("dtype_lowercase", &entry("y", "u8", "[4]", 8, 12), 12, Neither),
        y("dtype_number", r#""y":{"dtype":8,"shape":[4],"data_offsets":[8,12]}"#, 12, Neither),
        // serde's enum form, which the crate takes for a dtype.
        y("dtype_as_map", r#""y":{"dtype":{"U8":null},"shape":[4],"data_offsets":[8,12]}"#, 12, Stricter),
        h("f4", &xy(&entry("y", "F4", "[2,4]", 8, 12)), 12, Both, None),
        y("f4_half_byte", &entry("y", "F4", "[3]", 8, 10), 10, Neither),
        h("f6", &xy(&entry("y", "F6_E2M3", "[4]", 8, 11)), 11, Both, None),
        h("f8_e8m0", &xy(&entry("y", "F8_E8M0", "[4]", 8, 12)), 12, Both, None),
    ]
}

/// Shapes: negative, fractional, huge, overflowing, too many dimensions.
#[rustfmt::skip]
fn shape_cases() -> Vec<Case> {
    use Want::*;
    vec![
        y("shape_negative", &y_u8("[-4]", 8, 12), 12, Neither),
        y("shape_minus_zero", &y_u8("[-0]", 8, 8), 8, Neither),
        y("shape_fraction", &y_u8("[1.5]", 8, 12), 12, Neither),
        y("shape_float_int", &y_u8("[4.0]", 8, 12), 12, Neither),
        y("shape_exponent", &y_u8("[1e30]", 8, 12), 12, Neither),
        y("shape_2_64", &y_u8("[18446744073709551616]", 8, 12), 12, Neither),
        y("shape_string", &y_u8("[\"4\"]", 8, 12), 12, Neither),
        y("shape_null", &y_u8("null", 8, 12), 12, Neither),
        y("shape_nested", &y_u8("[[4]]", 8, 12), 12, Neither),
        y("shape_product_overflow", &y_u8("[4294967296,4294967296,2]", 8, 12), 12, Neither),
        y("shape_overflow_then_zero", &y_u8("[1099511627776,1099511627776,0]", 8, 8), 8, Neither),
        y("shape_bits_overflow", &entry("y", "F64", "[4611686018427387904]", 8, 12), 12, Neither),
        // Sizes torch cannot hold (the crate's loaders fail in torch).
        y("shape_dim_2_63", &y_u8("[9223372036854775808,0]", 8, 8), 8, Stricter),
        y("shape_dim_u64_max", &y_u8("[18446744073709551615,0]", 8, 8), 8, Stricter),
        h("shape_dim_2_62", &xy(&y_u8("[4611686018427387904,0]", 8, 8)), 8, Both, None),
        h("shape_64_dims", &xy(&y_u8(&format!("[{}4]", "1,".repeat(63)), 8, 12)), 12, Both, None),
        y("shape_65_dims", &y_u8(&format!("[{}4]", "1,".repeat(64)), 8, 12), 12, Stricter),
        h("scalar", &xy(&entry("y", "F32", "[]", 8, 12)), 12, Both, None),
    ]
}

/// data_offsets: reversed, outside the data, overlapping, gaps, not
/// matching dtype x shape, not a pair; `__metadata__`.
#[rustfmt::skip]
fn offset_and_metadata_cases() -> Vec<Case> {
    use Want::*;
    let good = good();
    let meta = |m: &str| format!("{{\"__metadata__\":{m},{}}}", &good[1..good.len() - 1]);
    vec![
        y("offsets_reversed", &y_u8("[4]", 12, 8), 12, Neither),
        h("offsets_past_end", &good, 10, Neither, None),
        h("offsets_to_2_64", &to_2_64(), 4, Neither, None),
        y("offsets_overlap", &y_u8("[8]", 4, 12), 12, Neither),
        y("offsets_gap", &y_u8("[4]", 12, 16), 16, Neither),
        h("offsets_not_first", &format!("{{{}}}", entry("x", "U8", "[4]", 4, 8)), 8, Neither, Some("x")),
        y("offsets_size", &y_u8("[4]", 8, 13), 13, Neither),
        y("offsets_three", r#""y":{"dtype":"U8","shape":[4],"data_offsets":[8,12,12]}"#, 12, Neither),
        y("offsets_one", r#""y":{"dtype":"U8","shape":[0],"data_offsets":[8]}"#, 8, Neither),
        y("offsets_negative", r#""y":{"dtype":"U8","shape":[4],"data_offsets":[8,-12]}"#, 12, Neither),
        h("empty_in_middle", &format!("{{{},{}}}", entry("x", "U8", "[2]", 0, 2), entry("e", "U8", "[0]", 1, 1)), 2, Neither, Some("e")),
        h("empty_at_end", &xy(&entry("e", "U8", "[0]", 8, 8)), 8, Both, None),
        h("empties_at_start", &format!("{{{},{},{}}}", entry("a", "U8", "[0]", 0, 0), entry("b", "U8", "[0,3]", 0, 0), entry("c", "U8", "[1]", 0, 1)), 1, Both, None),
        h("meta", &meta("{\"format\":\"pt\"}"), 12, Both, None),
        h("meta_null", &meta("null"), 12, Both, None),
        h("meta_number_value", &meta("{\"a\":1}"), 12, Neither, None),
        h("meta_array", &meta("[]"), 12, Neither, None),
        h("meta_twice", &meta("{},\"__metadata__\":{}"), 12, Neither, None),
    ]
}

/// Headers that lie, one class of the format at a time, and a header of
/// 100,000 tensors.
fn header_cases() -> Vec<Case> {
    let mut many = String::from("{");
    for i in 0..100_000u64 {
        if i > 0 {
            many.push(',');
        }
        many.push_str(&entry(&format!("t{i}"), "U8", "[1]", i, i + 1));
    }
    many.push('}');
    let mut v = length_and_json_cases();
    v.extend(name_field_dtype_cases());
    v.extend(shape_cases());
    v.extend(offset_and_metadata_cases());
    v.push(h("many", &many, 100_000, Want::Both, None));
    v
}

/// Tensors that tile data offsets up to 2^64 - 1 (each as large as its
/// size in bits allows): the file's end is past 2^64.
fn to_2_64() -> String {
    let big = (1u64 << 61) - 1;
    let mut parts: Vec<String> = (0..8u64)
        .map(|i| {
            entry(
                &format!("t{i}"),
                "U8",
                &format!("[{big}]"),
                i * big,
                (i + 1) * big,
            )
        })
        .collect();
    parts.push(entry("t8", "U8", "[7]", 8 * big, u64::MAX));
    format!("{{{}}}", parts.join(","))
}

/// Tensor `y` with an unknown field nested `depth` arrays deep.
fn nested(depth: usize) -> String {
    format!(
        r#""y":{{"dtype":"U8","shape":[4],"data_offsets":[8,12],"z":{}{}}}"#,
        "[".repeat(depth),
        "]".repeat(depth)
    )
}

/// What the crate reads: name to (dtype, shape, bytes).
type Tensors = BTreeMap<String, (String, Vec<usize>, Vec<u8>)>;

fn crate_reads(bytes: &[u8]) -> Result<Tensors, String> {
    // The crate's own sums overflow (a panic in a debug build) on offsets
    // near 2^64: a refusal too.
    let st = std::panic::catch_unwind(|| safetensors::SafeTensors::deserialize(bytes))
        .map_err(|_| "the crate panicked".to_string())?
        .map_err(|e| e.to_string())?;
    Ok(st
        .tensors()
        .into_iter()
        .map(|(n, t)| {
            (
                n,
                (t.dtype().to_string(), t.shape().to_vec(), t.data().to_vec()),
            )
        })
        .collect())
}

fn numapin_reads(rt: &Runtime, p: &Path) -> Result<Tensors, StorageError> {
    let ck = Checkpoint::open(p)?;
    let all = ck.select(None, None)?;
    if all.len() > 1000 {
        // Large headers are about the header: their bytes are the
        // crate's, unread (100,000 buffers take a while in a debug build).
        let bytes = std::fs::read(p).unwrap();
        return Ok(ck
            .tensors()
            .iter()
            .map(|e| {
                let b = &bytes[e.offset as usize..e.offset as usize + e.len];
                (
                    e.name.clone(),
                    (e.dtype.to_string(), e.shape.clone(), b.to_vec()),
                )
            })
            .collect());
    }
    let h = ck.load_to_host(rt, node(rt), &all, &ReadOptions::default())?;
    Ok(h.tensors
        .iter()
        .map(|t| {
            let e = &ck.tensors()[t.entry];
            (
                e.name.clone(),
                (e.dtype.to_string(), e.shape.clone(), t.bytes().to_vec()),
            )
        })
        .collect())
}

#[test]
fn headers_that_lie_are_refused_as_the_safetensors_crate_refuses_them_or_more_strictly() {
    let rt = runtime();
    let d = tempfile::tempdir().unwrap();
    let mut table = String::new();
    for c in header_cases() {
        let p = d.path().join(format!("{}.safetensors", c.name));
        std::fs::write(&p, &c.bytes).unwrap();
        let theirs = crate_reads(&c.bytes);
        let ours = numapin_reads(&rt, &p);
        let got = match (&ours, &theirs) {
            (Ok(a), Ok(b)) => {
                assert_eq!(
                    a, b,
                    "{}: numapin and the crate read different tensors",
                    c.name
                );
                Want::Both
            }
            (Ok(_), Err(e)) => panic!("{}: numapin loads what the crate refuses ({e})", c.name),
            (Err(_), Ok(_)) => Want::Stricter,
            (Err(_), Err(_)) => Want::Neither,
        };
        writeln!(
            table,
            "{:26} numapin {:5} crate {:5} {}",
            c.name,
            ours.is_ok(),
            theirs.is_ok(),
            ours.as_ref()
                .err()
                .map(ToString::to_string)
                .unwrap_or_default()
        )
        .unwrap();
        eprint!(
            "{}",
            table.lines().last().unwrap_or_default().to_string() + "\n"
        );
        assert_eq!(
            got,
            c.want,
            "{}: {:?} / {:?}",
            c.name,
            ours.as_ref().err(),
            theirs.as_ref().err()
        );
        if let Err(e) = ours {
            let text = e.to_string();
            assert_eq!(e.kind(), ErrorKind::Input, "{}: {e}", c.name);
            assert!(e.fix().is_some(), "{}: no fix", c.name);
            assert!(
                text.contains(&format!("{}.safetensors", c.name)),
                "{}: the file is not named: {text}",
                c.name
            );
            if let Some(t) = c.tensor {
                assert!(
                    text.contains(&format!("tensor {t:?}")),
                    "{}: tensor {t} is not named: {text}",
                    c.name
                );
            }
            assert!(
                text.len() < 2000,
                "{}: a message of {} bytes",
                c.name,
                text.len()
            );
        }
    }
    eprintln!("{table}");
    assert_no_leak(&rt);
}

#[test]
fn a_header_of_the_formats_largest_size_is_read_and_one_byte_more_is_not() {
    let d = tempfile::tempdir().unwrap();
    // Sparse: 100 MB of header that reads as zeros, which is not JSON.
    let p = d.path().join("huge.safetensors");
    let f = std::fs::File::create(&p).unwrap();
    std::io::Write::write_all(&mut &f, &100_000_000u64.to_le_bytes()).unwrap();
    f.set_len(8 + 100_000_000).unwrap();
    let e = Checkpoint::open(&p).unwrap_err();
    assert!(e.to_string().contains("bad safetensors header"), "{e}");
    // One byte over the limit: refused before anything is read or
    // allocated.
    std::fs::write(
        &p,
        [&100_000_001u64.to_le_bytes()[..], &[b' '; 16]].concat(),
    )
    .unwrap();
    let e = Checkpoint::open(&p).unwrap_err();
    assert!(e.to_string().contains("limit"), "{e}");
}

/// Writes shard `name` holding tensors `names` (U8, one byte each).
fn shard(dir: &Path, name: &str, names: &[&str]) -> PathBuf {
    let mut h = String::from("{");
    for (i, n) in names.iter().enumerate() {
        if i > 0 {
            h.push(',');
        }
        h.push_str(&entry(n, "U8", "[1]", i as u64, i as u64 + 1));
    }
    h.push('}');
    let data: Vec<u8> = (0..names.len()).map(|i| i as u8).collect();
    let p = dir.join(name);
    std::fs::write(&p, file(h.as_bytes(), &data)).unwrap();
    p
}

/// An index's `weight_map`: tensor name, file.
type Map<'a> = &'a [(&'a str, &'a str)];

fn index_of(dir: &Path, name: &str, map: Map<'_>) -> PathBuf {
    let m: serde_json::Map<String, serde_json::Value> = map
        .iter()
        .map(|(k, v)| {
            (
                (*k).to_string(),
                serde_json::Value::String((*v).to_string()),
            )
        })
        .collect();
    let p = dir.join(name);
    std::fs::write(
        &p,
        serde_json::json!({"metadata": {}, "weight_map": m}).to_string(),
    )
    .unwrap();
    p
}

fn refused(p: &Path, what: &str) -> String {
    let e = Checkpoint::open(p).expect_err(what);
    assert_eq!(e.kind(), ErrorKind::Input, "{what}: {e}");
    assert!(e.fix().is_some(), "{what}: no fix");
    let text = numapin::error::with_causes(&e);
    let file = p.file_name().unwrap().to_string_lossy().into_owned();
    assert!(text.contains(&file), "{what}: {file} is not named: {text}");
    text
}

#[test]
fn indexes_that_point_outside_their_folder_or_at_missing_or_doubled_tensors_are_refused() {
    let top = tempfile::tempdir().unwrap();
    let d = top.path().join("ck");
    std::fs::create_dir(&d).unwrap();
    shard(&d, "a.safetensors", &["w1", "w2"]);
    shard(&d, "b.safetensors", &["w3", "w2"]);
    shard(top.path(), "outside.safetensors", &["w1"]);
    let ok = index_of(
        &d,
        "ok.json",
        &[("w1", "a.safetensors"), ("w3", "b.safetensors")],
    );
    // Only what the map names is loaded; b's w2 is not named: not loaded.
    let ck = Checkpoint::open(&ok).unwrap();
    let names: Vec<&str> = ck.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["w1", "w3"]);
    let cases: &[(&str, Map<'_>, &str)] = &[
        ("missing.json", &[("w1", "c.safetensors")], "does not exist"),
        (
            "up.json",
            &[("w1", "../outside.safetensors")],
            "relative path",
        ),
        ("abs.json", &[("w1", "/etc/passwd")], "relative path"),
        ("empty_name.json", &[("w1", "")], "relative path"),
        ("dot.json", &[("w1", "./a.safetensors/..")], "relative path"),
        ("absent.json", &[("w9", "a.safetensors")], "\"w9\""),
        (
            "in_two.json",
            &[("w2", "a.safetensors"), ("w3", "b.safetensors")],
            "\"w2\"",
        ),
    ];
    for &(name, map, says) in cases {
        let text = refused(&index_of(&d, name, map), name);
        assert!(text.contains(says), "{name}: {text}");
    }
    // Symbolic links: out of the folder (refused, never opened), inside
    // it (followed), in a loop, dangling.
    std::os::unix::fs::symlink(
        top.path().join("outside.safetensors"),
        d.join("out.safetensors"),
    )
    .unwrap();
    std::os::unix::fs::symlink("a.safetensors", d.join("in.safetensors")).unwrap();
    std::os::unix::fs::symlink("loop2.safetensors", d.join("loop1.safetensors")).unwrap();
    std::os::unix::fs::symlink("loop1.safetensors", d.join("loop2.safetensors")).unwrap();
    std::os::unix::fs::symlink("nowhere.safetensors", d.join("dangling.safetensors")).unwrap();
    let text = refused(
        &index_of(&d, "link_out.json", &[("w1", "out.safetensors")]),
        "link out",
    );
    assert!(text.contains("leads out of the index's folder"), "{text}");
    assert!(Checkpoint::open(index_of(&d, "link_in.json", &[("w1", "in.safetensors")])).is_ok());
    let text = refused(
        &index_of(&d, "loop.json", &[("w1", "loop1.safetensors")]),
        "loop",
    );
    assert!(text.contains("loop"), "{text}");
    refused(
        &index_of(&d, "dangling.json", &[("w1", "dangling.safetensors")]),
        "dangling",
    );
}

#[test]
fn malformed_huge_or_deep_indexes_are_refused_or_read_without_recursion() {
    let top = tempfile::tempdir().unwrap();
    let d = top.path();
    shard(d, "a.safetensors", &["w1"]);
    let raw: &[(&str, &str, &str)] = &[
        (
            "not_json.json",
            "{\"weight_map\": ",
            "not a safetensors index",
        ),
        ("array.json", "[1]", "not a safetensors index"),
        ("no_map.json", "{\"metadata\": {}}", "no \"weight_map\""),
        (
            "map_array.json",
            "{\"weight_map\": []}",
            "not a safetensors index",
        ),
        (
            "file_number.json",
            "{\"weight_map\": {\"w1\": 3}}",
            "\"w1\"",
        ),
        (
            "dup.json",
            "{\"weight_map\": {\"w1\": \"a.safetensors\", \"w1\": \"b.safetensors\"}}",
            "twice",
        ),
        (
            "map_twice.json",
            "{\"weight_map\": {}, \"weight_map\": {}}",
            "twice",
        ),
    ];
    for &(name, text, says) in raw {
        let p = d.join(name);
        std::fs::write(&p, text).unwrap();
        let got = refused(&p, name);
        assert!(got.contains(says), "{name}: {got}");
    }
    // Deep nesting where anything goes is skipped without recursion.
    let p = d.join("deep.json");
    let deep = format!(
        "{{\"x\": {}{}, \"weight_map\": {{}}}}",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    std::fs::write(&p, deep).unwrap();
    assert!(Checkpoint::open(&p).unwrap().tensors().is_empty());
    // Huge: refused by its length, before it is read (sparse).
    let p = d.join("huge.json");
    std::fs::File::create(&p)
        .unwrap()
        .set_len((64 << 20) + 1)
        .unwrap();
    assert!(refused(&p, "huge").contains("too large"));
    // An empty map is an empty checkpoint.
    assert!(Checkpoint::open(index_of(d, "none.json", &[]))
        .unwrap()
        .tensors()
        .is_empty());
}

#[test]
fn the_hugging_face_cache_layout_of_links_into_blobs_loads() {
    let top = tempfile::tempdir().unwrap();
    let repo = top.path().join("models--org--m");
    let snap = repo.join("snapshots").join("0123abcd");
    let blobs = repo.join("blobs");
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(&blobs).unwrap();
    shard(&blobs, "f00d", &["w1", "w2"]);
    std::os::unix::fs::symlink(
        "../../blobs/f00d",
        snap.join("model-00001-of-00001.safetensors"),
    )
    .unwrap();
    index_of(
        &blobs,
        "beef",
        &[
            ("w1", "model-00001-of-00001.safetensors"),
            ("w2", "model-00001-of-00001.safetensors"),
        ],
    );
    std::os::unix::fs::symlink(
        "../../blobs/beef",
        snap.join("model.safetensors.index.json"),
    )
    .unwrap();
    let ck = Checkpoint::open(snap.join("model.safetensors.index.json")).unwrap();
    assert_eq!(ck.tensors().len(), 2);
    // A link from the snapshot to elsewhere is still refused.
    shard(top.path(), "other.safetensors", &["w1"]);
    std::os::unix::fs::symlink(
        top.path().join("other.safetensors"),
        snap.join("other.safetensors"),
    )
    .unwrap();
    refused(
        &index_of(&snap, "x.json", &[("w1", "other.safetensors")]),
        "out of the cache",
    );
}

#[test]
fn odd_files_are_refused_without_waiting_or_reading() {
    let d = tempfile::tempdir().unwrap();
    let fifo = d.path().join("fifo.safetensors");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    std::os::unix::fs::symlink("l2.safetensors", d.path().join("l1.safetensors")).unwrap();
    std::os::unix::fs::symlink("l1.safetensors", d.path().join("l2.safetensors")).unwrap();
    let cases: &[(PathBuf, &str)] = &[
        (fifo, "FIFO"),
        (d.path().to_path_buf(), "directory"),
        (PathBuf::from("/dev/zero"), "character device"),
        (PathBuf::from("/dev/null"), "character device"),
        (PathBuf::from("/proc/self/status"), "shorter than"),
        (PathBuf::from("/proc/self/mem"), "shorter than"),
        (d.path().join("l1.safetensors"), "symbolic links"),
        (d.path().join("none.safetensors"), "does not exist"),
        (PathBuf::from("/dev/zero/x"), "not a directory"),
    ];
    for (p, says) in cases {
        let e = Checkpoint::open(p).expect_err(says);
        assert_eq!(e.kind(), ErrorKind::Input, "{e}");
        assert!(e.to_string().contains(&*p.to_string_lossy()), "{e}");
        assert!(e.to_string().contains(says), "{says}: {e}");
    }
}

#[test]
fn a_sparse_file_claiming_terabytes_is_refused_by_the_budget_before_it_is_read() {
    let rt = runtime();
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("tb.safetensors");
    let tb: u64 = 1 << 40;
    let h = format!("{{{}}}", entry("w", "U8", &format!("[{tb}]"), 0, tb));
    std::fs::write(&p, file(h.as_bytes(), b"")).unwrap();
    if std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(8 + h.len() as u64 + tb)
        .is_err()
    {
        eprintln!("skipped: this filesystem holds no sparse terabyte");
        return;
    }
    // The header is true to the file: it opens.
    let ck = Checkpoint::open(&p).unwrap();
    let all = ck.select(None, None).unwrap();
    assert_eq!(ck.bytes(&all), tb);
    let e = ck
        .load_to_host(&rt, node(&rt), &all, &ReadOptions::default())
        .unwrap_err();
    assert!(matches!(e, StorageError::TensorMemory { .. }), "{e}");
    assert_eq!(e.kind(), ErrorKind::Budget, "{e}");
    let text = numapin::error::with_causes(&e);
    assert!(
        text.contains("tb.safetensors") && text.contains("\"w\""),
        "{text}"
    );
    assert_no_leak(&rt);
}

#[test]
fn files_replaced_rewritten_or_cut_after_opening_are_refused_when_they_load() {
    let rt = runtime();
    let d = tempfile::tempdir().unwrap();
    let h = xy(&entry("y", "U8", "[4]", 8, 12));
    let body = file(h.as_bytes(), &[1; 12]);
    let p = d.path().join("m.safetensors");
    let load = |ck: &Checkpoint| {
        let all = ck.select(None, None).unwrap();
        ck.load_to_host(&rt, node(&rt), &all, &ReadOptions::default())
            .map(|_| ())
    };
    // Replaced (renamed over): another inode.
    std::fs::write(&p, &body).unwrap();
    let ck = Checkpoint::open(&p).unwrap();
    let q = d.path().join("new");
    std::fs::write(&q, &body).unwrap();
    std::fs::rename(&q, &p).unwrap();
    let e = load(&ck).unwrap_err();
    assert!(e.to_string().contains("replaced"), "{e}");
    // Written in place (same length, new time).
    let ck = Checkpoint::open(&p).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    std::os::unix::fs::FileExt::write_at(&f, &[9], body.len() as u64 - 1).unwrap();
    f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(5))
        .unwrap();
    let e = load(&ck).unwrap_err();
    assert!(e.to_string().contains("written"), "{e}");
    // Cut.
    let ck = Checkpoint::open(&p).unwrap();
    f.set_len(10).unwrap();
    let e = load(&ck).unwrap_err();
    assert!(e.to_string().contains("length"), "{e}");
    // Deleted.
    std::fs::write(&p, &body).unwrap();
    let ck = Checkpoint::open(&p).unwrap();
    std::fs::remove_file(&p).unwrap();
    let e = load(&ck).unwrap_err();
    assert!(e.to_string().contains("does not exist"), "{e}");
    assert!(e.to_string().contains("m.safetensors"), "{e}");
    assert_no_leak(&rt);
}

#[test]
fn world_sizes_ranks_and_read_options_are_checked_before_anything_is_allocated() {
    let rt = runtime();
    let d = tempfile::tempdir().unwrap();
    let p = shard(d.path(), "m.safetensors", &["a", "b", "c"]);
    let ck = Checkpoint::open(&p).unwrap();
    // A world size of 2^32 is refused, not 96 GiB of empty shares.
    for w in [0usize, MAX_WORLD + 1, 1 << 32, usize::MAX] {
        let e = ck.shards(None, w).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Input, "{e}");
        assert!(Shard::new(0, w).is_err());
        let e = ck
            .select(None, Some(Shard { rank: 0, world: w }))
            .unwrap_err();
        assert!(e.to_string().contains("world size"), "{e}");
    }
    assert_eq!(ck.shards(None, MAX_WORLD).unwrap().len(), MAX_WORLD);
    assert!(ck.select(None, Some(Shard { rank: 5, world: 5 })).is_err());
    let all = ck.select(None, None).unwrap();
    let bad = [
        ReadOptions::default().with_threads(1025),
        ReadOptions::default().with_threads(usize::MAX),
        ReadOptions::default().with_readers(numapin::storage::MAX_READERS + 1),
        ReadOptions::default().with_chunk_bytes((1 << 30) + 1),
        ReadOptions::default().with_slots_per_thread(0),
        ReadOptions::default().with_slots_per_thread(65),
    ];
    for o in bad {
        let e = ck.load_to_host(&rt, node(&rt), &all, &o).unwrap_err();
        assert!(matches!(e, StorageError::Request { .. }), "{o:?}: {e}");
    }
    // Nothing was ever lent.
    for s in rt.stats() {
        assert_eq!(s.allocations, 0, "{s:?}");
    }
    let e = ck
        .load_to_host(&rt, node(&rt), &[3], &ReadOptions::default())
        .unwrap_err();
    assert!(e.to_string().contains("out of range"), "{e}");
}

/// An index of `n` tensors in one shard.
fn large_index(d: &Path, n: usize) -> (PathBuf, PathBuf) {
    let names: Vec<String> = (0..n).map(|i| format!("model.layers.{i}.weight")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let s = shard(d, "model-00001-of-00001.safetensors", &refs);
    let map: Vec<(&str, &str)> = refs
        .iter()
        .map(|n| (*n, "model-00001-of-00001.safetensors"))
        .collect();
    (index_of(d, "model.safetensors.index.json", &map), s)
}

#[test]
fn opening_an_index_costs_about_what_its_shard_costs() {
    let d = tempfile::tempdir().unwrap();
    let (idx, s) = large_index(d.path(), 60_000);
    let time = |p: &Path| {
        let t = std::time::Instant::now();
        let ck = Checkpoint::open(p).unwrap();
        assert_eq!(ck.tensors().len(), 60_000);
        t.elapsed().as_secs_f64()
    };
    let (shard_s, index_s) = (time(&s), time(&idx));
    eprintln!("shard {shard_s:.3} s, index {index_s:.3} s");
    // Linear: the index adds its own parse and a lookup per tensor. (A
    // quadratic check of 60,000 names takes 3.6 billion comparisons.)
    assert!(
        index_s < 10.0 * shard_s + 0.5,
        "shard {shard_s} s, index {index_s} s"
    );
}

const FEW_FILES: &str = "open_files_stay_bounded_with_600_shards_child";

#[test]
fn open_files_stay_bounded_whatever_the_number_of_shards() {
    let d = tempfile::tempdir().unwrap();
    let mut map = Vec::new();
    let names: Vec<(String, String)> = (0..600)
        .map(|i| {
            (
                format!("w{i}"),
                format!("model-{i:05}-of-00600.safetensors"),
            )
        })
        .collect();
    for (w, f) in &names {
        shard(d.path(), f, &[w]);
        map.push((w.as_str(), f.as_str()));
    }
    let idx = index_of(d.path(), "model.safetensors.index.json", &map);
    let idx = idx.to_string_lossy().into_owned();
    // 128 descriptors: a few for the process, the rest for the load.
    let Some(out) = common::run_child(FEW_FILES, &[("CK_INDEX", &idx)], || {
        nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, 128, 128)?;
        Ok(())
    }) else {
        return;
    };
    common::assert_child_passed(&out);
}

#[test]
#[ignore = "runs in a child process started by open_files_stay_bounded_whatever_the_number_of_shards"]
fn open_files_stay_bounded_with_600_shards_child() {
    if !common::in_child(FEW_FILES) {
        return;
    }
    let idx = std::env::var("CK_INDEX").unwrap();
    let rt = runtime();
    let ck = Checkpoint::open(&idx).unwrap();
    assert_eq!(ck.files().len(), 600);
    let all = ck.select(None, None).unwrap();
    let h = ck
        .load_to_host(&rt, node(&rt), &all, &ReadOptions::default())
        .unwrap();
    assert_eq!(h.tensors.len(), 600);
    assert!(h.tensors.iter().all(|t| t.bytes() == [0]));
}

const UNREADABLE: &str = "an_unreadable_file_is_an_input_error_child";

#[test]
fn an_unreadable_file_is_an_input_error() {
    if !nix::unistd::geteuid().is_root() {
        common::skip(common::Need::Root, "needs root to run a child as nobody");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        d.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let p = shard(d.path(), "secret.safetensors", &["w"]);
    std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o000)).unwrap();
    let p = p.to_string_lossy().into_owned();
    let Some(out) = common::run_child(UNREADABLE, &[("CK_FILE", &p)], common::as_nobody(1 << 20))
    else {
        return;
    };
    common::assert_child_passed(&out);
}

#[test]
#[ignore = "runs in a child process started by an_unreadable_file_is_an_input_error"]
fn an_unreadable_file_is_an_input_error_child() {
    if !common::in_child(UNREADABLE) {
        return;
    }
    let p = std::env::var("CK_FILE").unwrap();
    let e = Checkpoint::open(&p).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Input, "{e}");
    assert!(
        e.to_string().contains("permission denied") && e.to_string().contains("secret.safetensors"),
        "{e}"
    );
}
