//! The machine budget's state file, byte by byte: a header block, then one
//! block per process record (all little-endian). Pure: encoding, and
//! decoding that refuses anything out of shape.
//!
//! | bytes of the header | what |
//! | --- | --- |
//! | 0..8 | [`MAGIC`] (`numapmb1`) |
//! | 8..12 | [`VERSION`] |
//! | 12..16 | [`BLOCK`] (bytes per block) |
//! | 16..20 | [`MAX_RECORDS`] |
//! | 20..24 | [`ENTRIES`] (entries per record) |
//! | 24..1024 | zero |
//!
//! Record `i` is block `i + 1` (bytes `BLOCK * (i + 1)` ..): all zero when
//! free, otherwise
//!
//! | bytes | what |
//! | --- | --- |
//! | 0..4 | [`RECORD_MAGIC`] (`NPr1`) |
//! | 4..8 | the process id |
//! | 8..24 | its command name (`/proc/<pid>/comm`), NUL-padded |
//! | 24..28 | `n`, entries used (at most [`ENTRIES`]) |
//! | 28..32 | zero |
//! | 32.. | `n` entries of 24 bytes: node (u32), zero (u32), bytes pinned there (u64), the limit the process checks against (u64) |
//!
//! Blocks of 1 KiB never straddle a 4 KiB page, so one `pwrite` of a
//! block is never torn by a signal between pages. Each record's bytes are
//! locked (an OFD write lock) by the process that owns it, for as long as
//! it holds bytes: a record whose lock is free belongs to no live process.

use crate::platform::numa::MAX_NODES;

/// `numapmb1` as a little-endian `u64`: the file's first word.
pub(crate) const MAGIC: u64 = u64::from_le_bytes(*b"numapmb1");
/// The layout's version. Another version's file is refused, never read.
pub(crate) const VERSION: u32 = 1;
/// Bytes of the header and of each record.
pub(crate) const BLOCK: usize = 1024;
/// Records a file holds at most: processes holding machine budget at once.
pub(crate) const MAX_RECORDS: usize = 1024;
/// The largest file: the header and every record.
pub(crate) const MAX_FILE: u64 = (BLOCK * (1 + MAX_RECORDS)) as u64;
/// Entries (nodes) one record holds.
pub(crate) const ENTRIES: usize = 40;
/// `NPr1`: a used record's first word.
pub(crate) const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"NPr1");
/// Bytes of a command name (the kernel's `TASK_COMM_LEN` less the NUL).
const COMM: usize = 16;
const ENTRY_AT: usize = 32;
const ENTRY: usize = 24;

const _: () = assert!(ENTRY_AT + ENTRIES * ENTRY <= BLOCK);
const _: () = assert!(4096 % BLOCK == 0);

/// The layout's sizes as the header holds them: block, records, entries.
#[allow(clippy::cast_possible_truncation)] // each far below 2^32 (asserted below)
const SHAPE: (u32, u32, u32) = (BLOCK as u32, MAX_RECORDS as u32, ENTRIES as u32);
const _: () = assert!(BLOCK < 1 << 32 && MAX_RECORDS < 1 << 32 && ENTRIES < 1 << 32);

/// The byte range of record `i` (its lock's range too).
pub(crate) fn record_range(i: usize) -> (u64, u64) {
    ((BLOCK * (i + 1)) as u64, BLOCK as u64)
}

/// One node's line of a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    /// The node.
    pub(crate) node: u32,
    /// Bytes the process holds pinned there (its regions, and the shared
    /// regions it made).
    pub(crate) bytes: u64,
    /// The machine budget the process checks against there.
    pub(crate) limit: u64,
}

/// One process's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    /// The process.
    pub(crate) pid: u32,
    /// Its command name (up to 15 bytes of printable ASCII; others are
    /// written as `?`).
    pub(crate) command: String,
    /// Its nodes, with bytes held.
    pub(crate) entries: Vec<Entry>,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// The header block of a new file.
pub(crate) fn header() -> [u8; BLOCK] {
    let mut b = [0u8; BLOCK];
    b[0..8].copy_from_slice(&MAGIC.to_le_bytes());
    b[8..12].copy_from_slice(&VERSION.to_le_bytes());
    b[12..16].copy_from_slice(&SHAPE.0.to_le_bytes());
    b[16..20].copy_from_slice(&SHAPE.1.to_le_bytes());
    b[20..24].copy_from_slice(&SHAPE.2.to_le_bytes());
    b
}

/// Checks a file of `len` bytes whose first bytes are `head` (at least
/// [`BLOCK`] of them, zero past the end of the file): `Err` with the
/// problem in words.
pub(crate) fn check_file(head: &[u8], len: u64) -> Result<(), String> {
    if len > MAX_FILE {
        return Err(format!(
            "it is {len} bytes long, more than a state file ever holds ({MAX_FILE})"
        ));
    }
    if len < BLOCK as u64 {
        return Err(format!(
            "it is {len} bytes long, shorter than its header ({BLOCK})"
        ));
    }
    let magic = u64_at(head, 0);
    if magic != MAGIC {
        return Err(format!(
            "it does not start with numapin's mark (found {magic:#018x}): not a numapin machine budget file, or corrupted"
        ));
    }
    let version = u32_at(head, 8);
    if version != VERSION {
        return Err(format!(
            "it was written by another numapin version (layout {version}; this numapin reads layout {VERSION})"
        ));
    }
    let shape = (u32_at(head, 12), u32_at(head, 16), u32_at(head, 20));
    if shape != SHAPE || head[24..BLOCK].iter().any(|&b| b != 0) {
        return Err(format!(
            "its header is corrupted (blocks {}, records {}, entries {}, or stray bytes)",
            shape.0, shape.1, shape.2
        ));
    }
    Ok(())
}

/// The block of `r` (at most [`ENTRIES`] entries are written; callers
/// check first).
pub(crate) fn encode(r: &Record) -> [u8; BLOCK] {
    let mut b = [0u8; BLOCK];
    b[0..4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
    b[4..8].copy_from_slice(&r.pid.to_le_bytes());
    for (k, c) in r.command.bytes().take(COMM - 1).enumerate() {
        b[8 + k] = if c.is_ascii_graphic() || c == b' ' {
            c
        } else {
            b'?'
        };
    }
    let entries = &r.entries[..r.entries.len().min(ENTRIES)];
    b[24..28].copy_from_slice(&crate::num::u32_saturating(entries.len()).to_le_bytes());
    for (k, e) in entries.iter().enumerate() {
        let at = ENTRY_AT + k * ENTRY;
        b[at..at + 4].copy_from_slice(&e.node.to_le_bytes());
        b[at + 8..at + 16].copy_from_slice(&e.bytes.to_le_bytes());
        b[at + 16..at + 24].copy_from_slice(&e.limit.to_le_bytes());
    }
    b
}

/// Decodes a record block (exactly [`BLOCK`] bytes): `None` when free (all
/// zero), `Err` with the problem when it is not a record numapin writes.
pub(crate) fn decode(b: &[u8]) -> Result<Option<Record>, String> {
    if b.len() != BLOCK {
        return Err(format!("a record of {} bytes, not {BLOCK}", b.len()));
    }
    if b.iter().all(|&x| x == 0) {
        return Ok(None);
    }
    if u32_at(b, 0) != RECORD_MAGIC {
        return Err("it does not start with a record's mark".into());
    }
    let pid = u32_at(b, 4);
    if pid == 0 || pid > 1 << 22 {
        return Err(format!("process id {pid} out of range"));
    }
    let name = &b[8..24];
    let end = name.iter().position(|&c| c == 0).unwrap_or(COMM);
    if end >= COMM || name[end..].iter().any(|&c| c != 0) {
        return Err("its command name is not NUL-terminated".into());
    }
    if !name[..end]
        .iter()
        .all(|c| c.is_ascii_graphic() || *c == b' ')
    {
        return Err("its command name is not printable ASCII".into());
    }
    let command = String::from_utf8_lossy(&name[..end]).into_owned();
    let n = u32_at(b, 24) as usize;
    if n > ENTRIES || u32_at(b, 28) != 0 {
        return Err(format!("{n} entries (at most {ENTRIES})"));
    }
    let mut entries: Vec<Entry> = Vec::with_capacity(n);
    for k in 0..n {
        let at = ENTRY_AT + k * ENTRY;
        let e = Entry {
            node: u32_at(b, at),
            bytes: u64_at(b, at + 8),
            limit: u64_at(b, at + 16),
        };
        if e.node >= MAX_NODES || u32_at(b, at + 4) != 0 {
            return Err(format!("entry {k}: node {} out of range", e.node));
        }
        if e.bytes > u64::MAX / MAX_RECORDS as u64 {
            return Err(format!("entry {k}: {} bytes out of range", e.bytes));
        }
        if entries.iter().any(|x| x.node == e.node) {
            return Err(format!("entry {k}: node {} twice", e.node));
        }
        entries.push(e);
    }
    if b[ENTRY_AT + n * ENTRY..].iter().any(|&x| x != 0) {
        return Err("stray bytes after its entries".into());
    }
    Ok(Some(Record {
        pid,
        command,
        entries,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn record() -> Record {
        Record {
            pid: 4242,
            command: "python3".into(),
            entries: vec![
                Entry {
                    node: 0,
                    bytes: 256 << 20,
                    limit: 8 << 30,
                },
                Entry {
                    node: 3,
                    bytes: 2 << 20,
                    limit: 8 << 30,
                },
            ],
        }
    }

    #[test]
    fn records_round_trip_and_free_blocks_are_free() {
        let r = record();
        assert_eq!(decode(&encode(&r)), Ok(Some(r)));
        assert_eq!(decode(&[0u8; BLOCK]), Ok(None));
        let h = header();
        assert_eq!(check_file(&h, BLOCK as u64), Ok(()));
        assert_eq!(check_file(&h, MAX_FILE), Ok(()));
    }

    #[test]
    fn out_of_shape_files_and_records_are_refused() {
        let h = header();
        assert!(check_file(&h, MAX_FILE + 1).is_err_and(|e| e.contains("more than")));
        assert!(check_file(&h, 100).is_err_and(|e| e.contains("shorter")));
        let mut old = h;
        old[8..12].copy_from_slice(&7u32.to_le_bytes());
        assert!(
            check_file(&old, BLOCK as u64).is_err_and(|e| e.contains("another numapin version"))
        );
        let mut junk = h;
        junk[0] ^= 1;
        assert!(check_file(&junk, BLOCK as u64).is_err_and(|e| e.contains("mark")));
        let mut stray = h;
        stray[500] = 1;
        assert!(check_file(&stray, BLOCK as u64).is_err_and(|e| e.contains("corrupted")));

        let good = encode(&record());
        let bad = |f: &dyn Fn(&mut [u8; BLOCK])| {
            let mut b = good;
            f(&mut b);
            decode(&b)
        };
        assert!(bad(&|b| b[0] = b'x').is_err());
        assert!(bad(&|b| b[4..8].copy_from_slice(&0u32.to_le_bytes())).is_err());
        assert!(bad(&|b| b[8..24].fill(b'a')).is_err());
        assert!(bad(&|b| b[24..28].copy_from_slice(&41u32.to_le_bytes())).is_err());
        assert!(bad(&|b| b[32..36].copy_from_slice(&MAX_NODES.to_le_bytes())).is_err());
        assert!(bad(&|b| b[56..60].copy_from_slice(&0u32.to_le_bytes())).is_err()); // node 0 twice
        assert!(bad(&|b| b[40..48].copy_from_slice(&u64::MAX.to_le_bytes())).is_err());
        assert!(bad(&|b| b[BLOCK - 1] = 1).is_err());
        assert!(decode(&good[..100]).is_err());
    }

    proptest! {
        #[test]
        fn decoding_any_block_never_panics_and_accepted_ones_round_trip(
            bytes in proptest::collection::vec(any::<u8>(), BLOCK),
            prefix in any::<bool>(),
        ) {
            let mut b = bytes;
            if prefix {
                // Most random blocks fail the mark: give half of them one.
                b[0..4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
            }
            if let Ok(Some(r)) = decode(&b) {
                prop_assert_eq!(decode(&encode(&r)), Ok(Some(r)));
            }
            let _ = check_file(&b, b.len() as u64);
        }

        #[test]
        fn any_record_numapin_writes_decodes_to_itself(
            pid in 1u32..(1 << 22),
            command in "[a-z0-9._-]{0,15}",
            entries in proptest::collection::btree_map(0u32..MAX_NODES, (0u64..1 << 50, 0u64..1 << 50), 0..=ENTRIES),
        ) {
            let r = Record {
                pid,
                command,
                entries: entries.into_iter().map(|(node, (bytes, limit))| Entry { node, bytes, limit }).collect(),
            };
            prop_assert_eq!(decode(&encode(&r)), Ok(Some(r)));
        }
    }
}
