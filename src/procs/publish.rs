//! Reading what numapin publishes about its arenas in a process.
//!
//! A process that uses numapin keeps a memfd named `numapin-stats` open
//! (its `/proc/<pid>/fd/<n>` link reads `/memfd:numapin-stats (deleted)`):
//! 64 KiB, gone with the process. Layout, all little-endian:
//!
//! | bytes | what |
//! | --- | --- |
//! | 0..8 | magic `0x6e756d6170737431` (`numapst1`) |
//! | 8..12 | a seqlock counter, odd while the writer is at work |
//! | 12..16 | `N`, the length of the JSON after it |
//! | 16..16+N | UTF-8 JSON: `{"version":1,"pid":P,"runtimes":[{"nodes":[NodeStats...]}]}` |
//!
//! A reader reads the counter, the data and the counter again, and tries
//! again while the counter is odd or changed. Anything missing, garbled or
//! too long is "not published", with the reason ([`Publication::Unusable`]).

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::runtime::NodeStats;

/// The magic at the start of the stats memfd (`numapst1` read as a
/// little-endian `u64`): the writer's own constant.
pub const STATS_MAGIC: u64 = crate::arena::publish::MAGIC;

/// The size of the stats memfd (the writer's).
pub const STATS_FILE_BYTES: usize = crate::arena::publish::FILE_BYTES;

/// The version of the JSON this reader understands.
pub const STATS_VERSION: u32 = 1;

/// How many times a reader retries a publication being written.
const TRIES: u32 = 1000;

/// What a process published.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Published {
    /// [`STATS_VERSION`].
    pub version: u32,
    /// The process that wrote it.
    pub pid: u32,
    /// One entry per numapin runtime in the process (a Rust program and
    /// the Python package in one process have one each).
    pub runtimes: Vec<PublishedRuntime>,
    /// Set by the writer when every runtime's stats did not fit in the
    /// file: `runtimes` is then empty.
    #[serde(default)]
    pub truncated: bool,
}

/// One runtime's arenas.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishedRuntime {
    /// Each node's counters ([`crate::Runtime::stats`]).
    pub nodes: Vec<NodeStats>,
}

/// numapin's arenas in a process, as far as they could be read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Publication {
    /// No `numapin-stats` memfd open: numapin is not in use there (or is a
    /// version that does not publish), or the descriptors could not be read.
    NotFound,
    /// Read and understood.
    Read(Published),
    /// The memfd is there, but what it holds cannot be used: why.
    Unusable(String),
}

impl Publication {
    /// The publication, when one was read.
    pub fn published(&self) -> Option<&Published> {
        match self {
            Publication::Read(p) => Some(p),
            _ => None,
        }
    }
}

/// Bytes numapin holds on one node in a process, summed over its runtimes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ArenaBytes {
    /// Regions (own and shared).
    pub regions: u64,
    /// Bytes of regions, own ([`NodeStats::bytes_reserved`]) and shared
    /// ([`NodeStats::bytes_shared`]): pinned (locked, registered with CUDA,
    /// or hugetlb pages).
    pub pinned: u64,
    /// Bytes in buffers handed out.
    pub in_use: u64,
    /// 4 KiB pages of the regions found off the node.
    pub pages_off_node: u64,
}

impl Published {
    /// Parses the JSON of a publication made by process `pid`.
    ///
    /// # Errors
    ///
    /// A sentence saying why it cannot be used: not UTF-8 JSON of the
    /// expected shape, another version, or written by another process (a
    /// descriptor inherited across `fork`: its numbers are not this
    /// process's).
    pub fn parse(json: &[u8], pid: u32) -> Result<Self, String> {
        #[derive(Deserialize)]
        struct Head {
            version: u32,
        }
        let head: Head = serde_json::from_slice(json)
            .map_err(|e| format!("not a numapin stats document ({e})"))?;
        if head.version != STATS_VERSION {
            return Err(format!(
                "version {} (this numapin reads version {STATS_VERSION})",
                head.version
            ));
        }
        let p: Published = serde_json::from_slice(json)
            .map_err(|e| format!("not a numapin stats document ({e})"))?;
        if p.pid != pid {
            return Err(format!(
                "written by pid {}, not by this process (a descriptor inherited across fork)",
                p.pid
            ));
        }
        Ok(p)
    }

    /// The whole memfd's bytes (header and JSON, as a test or a fuzzer has
    /// them) to a publication of process `pid`.
    ///
    /// # Errors
    ///
    /// As [`Published::parse`], and for a header that is too short, has
    /// another magic, an odd counter (being written) or a length past the
    /// file.
    pub fn from_image(image: &[u8], pid: u32) -> Result<Self, String> {
        let head = image
            .get(..16)
            .ok_or_else(|| format!("{} bytes, shorter than the header", image.len()))?;
        let word = |r: std::ops::Range<usize>| {
            let mut b = [0u8; 8];
            b[..r.len()].copy_from_slice(&head[r]);
            u64::from_le_bytes(b)
        };
        if word(0..8) != STATS_MAGIC {
            return Err(format!(
                "magic {:#018x}, not {STATS_MAGIC:#018x}",
                word(0..8)
            ));
        }
        if word(8..12) % 2 == 1 {
            return Err("being written (odd counter)".into());
        }
        let len = crate::num::usize_from(word(12..16));
        let data = image
            .get(16..16 + len.min(STATS_FILE_BYTES))
            .filter(|_| len <= STATS_FILE_BYTES - 16)
            .ok_or_else(|| format!("a length of {len} bytes, past the end of the file"))?;
        Self::parse(data, pid)
    }

    /// What numapin holds per node, over every runtime.
    pub fn per_node(&self) -> BTreeMap<u32, ArenaBytes> {
        let mut out: BTreeMap<u32, ArenaBytes> = BTreeMap::new();
        for s in self.runtimes.iter().flat_map(|r| &r.nodes) {
            let e = out.entry(s.node).or_default();
            e.regions = e.regions.saturating_add(s.regions + s.shared_regions);
            e.pinned = e
                .pinned
                .saturating_add(s.bytes_reserved.saturating_add(s.bytes_shared));
            e.in_use = e.in_use.saturating_add(s.bytes_in_use);
            e.pages_off_node = e.pages_off_node.saturating_add(s.pages_off_node);
        }
        out
    }
}

/// Reads the publication behind `path` (a `/proc/<pid>/fd/<n>` link).
pub(crate) fn read(path: &Path, pid: u32) -> Publication {
    match crate::platform::procfs::read_seqlocked(path, STATS_MAGIC, STATS_FILE_BYTES - 16, TRIES) {
        Ok(data) => match Published::parse(&data, pid) {
            Ok(p) => Publication::Read(p),
            Err(why) => Publication::Unusable(why),
        },
        Err(e) => Publication::Unusable(format!("{}: {e}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    pub(crate) fn image(seq: u32, json: &str) -> Vec<u8> {
        let mut v = STATS_MAGIC.to_le_bytes().to_vec();
        v.extend(seq.to_le_bytes());
        v.extend(u32::try_from(json.len()).unwrap().to_le_bytes());
        v.extend(json.as_bytes());
        v.resize(STATS_FILE_BYTES, 0);
        v
    }

    const DOC: &str = r#"{"version":1,"pid":42,"runtimes":[{"nodes":[
        {"node":1,"regions":2,"bytes_reserved":536870912,"bytes_in_use":1048576,"bytes_shared":0,"shared_regions":0,"registration":"registered","some_future_field":7}
    ]},{"nodes":[{"node":1,"regions":1,"bytes_reserved":268435456,"pages_off_node":3}]}]}"#;

    #[test]
    fn a_publication_with_two_runtimes_sums_per_node() {
        let p = Published::from_image(&image(4, DOC), 42).unwrap();
        assert_eq!(p.runtimes.len(), 2);
        assert_eq!(p.runtimes[0].nodes[0].registration, "registered");
        let n = p.per_node();
        assert_eq!(
            n[&1],
            ArenaBytes {
                regions: 3,
                pinned: 768 << 20,
                in_use: 1 << 20,
                pages_off_node: 3
            }
        );
    }

    #[test]
    fn garbled_or_foreign_publications_say_why() {
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (vec![1, 2, 3], "shorter than the header"),
            (image(3, DOC), "being written"),
            (image(2, "{"), "not a numapin stats document"),
            (image(2, r#"{"version":2,"pid":42}"#), "version 2"),
            (image(2, &DOC.replace("42", "43")), "written by pid 43"),
            (image(2, "\u{0}\u{1}"), "not a numapin stats document"),
            (
                {
                    let mut v = image(2, DOC);
                    v[..8].copy_from_slice(&1u64.to_le_bytes());
                    v
                },
                "magic",
            ),
            (
                {
                    let mut v = image(2, DOC);
                    v[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
                    v
                },
                "past the end",
            ),
        ];
        for (img, want) in cases {
            let e = Published::from_image(&img, 42).unwrap_err();
            assert!(e.contains(want), "{want}: {e}");
        }
    }

    proptest! {
        #[test]
        fn any_bytes_are_an_answer_not_a_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = Published::from_image(&bytes, 1);
            let _ = Published::parse(&bytes, 1);
        }
    }
}
