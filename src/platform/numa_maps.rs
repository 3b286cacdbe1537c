//! Where the pages of an address range are, from `/proc/self/numa_maps`:
//! the arena's placement check when `move_pages` is refused (Docker's
//! default seccomp profile refuses it even with CAP_SYS_NICE). A pure
//! parser ([`placement`]) and the reader of this process's files
//! ([`read_self`]); measured at about 0.3 ms per GiB of a region with
//! transparent huge pages, against 32-50 ms for `move_pages`.
//!
//! # What the kernel prints
//!
//! One line per VMA: its start address (hex), its memory policy, then
//! `key=value` tokens, among them `N<node>=<pages>` for every node holding
//! pages of the VMA and `kernelpagesize_kB=<kB>`:
//!
//! ```text
//! 7f5c2a000000 bind:0 anon=16384 dirty=16384 active=0 N0=16384 kernelpagesize_kB=4
//! 7f5c2c000000 default
//! ```
//!
//! * Counts are in units of `kernelpagesize_kB`: 4 KiB pages for ordinary
//!   memory, *including* transparent huge pages (a PMD-mapped THP counts
//!   512), and huge pages for hugetlbfs VMAs (`huge`, `kernelpagesize_kB=2048`
//!   or `1048576`). Bytes are `count * kB * 1024`.
//! * Only present pages are counted, and a VMA with none present prints
//!   neither `N…=` nor `kernelpagesize_kB=`: pages not present are the
//!   VMA's size minus the counted bytes (`move_pages` says `-ENOENT` for
//!   them).
//! * A line has the VMA's start but not its end, which comes from
//!   `/proc/self/maps` (same VMAs, same order).
//! * File names are escaped for space, tab, newline and `=`, so splitting
//!   on whitespace and reading `key=value` is safe; the policy may hold a
//!   space (`prefer (many):0-1`) or an `=` (`bind=static:0-1`), and is
//!   skipped. Paths need not be UTF-8, so the input is bytes.
//!
//! # Exactness
//!
//! Counts are per VMA. A range that is a union of whole VMAs (the region's
//! own mapping, however `mlock`, `madvise` or `mbind` split it: splits only
//! make more VMAs inside it) gets exact per-node byte counts, equal to what
//! `move_pages` reports page by page. A VMA that also extends beyond the
//! range (the kernel merges adjacent anonymous mappings with equal flags and
//! policy, e.g. two regions made one after the other) cannot be apportioned
//! from its totals; for it the result holds the tight interval of what can
//! be in the range: with `c` bytes of a category (a node, or not present)
//! in the VMA and `o` bytes of the VMA outside the range, the range holds
//! between `c - o` (at least 0) and `min(c, inside)`. Both ends are
//! reachable, so the interval is as tight as the data allows, and a VMA
//! entirely on one node still gives an exact answer. Callers that need
//! exactness bracket their mapping with `PROT_NONE` guard pages, which
//! cannot merge with it (the arena's regions do).
//!
//! Every function here takes arbitrary bytes and never panics (checked
//! arithmetic, no indexing by untrusted values); see the property tests and
//! `fuzz/fuzz_targets/numa_maps.rs`.
//!
//! [`line_policy`] reads the memory policy a line shows, which for a VMA
//! without a policy of its own is the task's: the doctor reads the
//! process's policy that way when `get_mempolicy` is refused.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::ops::Range;

/// One parsed `numa_maps` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NumaMapsLine {
    /// The VMA's start address.
    pub start: u64,
    /// `kernelpagesize_kB` in bytes (`None` when no page is present, and
    /// the kernel then does not print it).
    pub page_bytes: Option<u64>,
    /// `(node, pages)` from the `N<node>=<pages>` tokens, in line order.
    pub nodes: Vec<(u32, u64)>,
    /// Whether the `huge` token (a hugetlbfs VMA) is present.
    pub hugetlb: bool,
}

impl NumaMapsLine {
    /// Bytes present on each node, `(node, bytes)`; `None` on overflow or
    /// when counts come without a page size.
    pub(crate) fn node_bytes(&self) -> Option<Vec<(u32, u64)>> {
        if self.nodes.is_empty() {
            return Some(Vec::new());
        }
        let ps = self.page_bytes?;
        self.nodes
            .iter()
            .map(|&(n, p)| p.checked_mul(ps).map(|b| (n, b)))
            .collect()
    }
}

/// Why a line could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LineError {
    /// No hexadecimal start address (`numa_maps`) or `start-end` (`maps`).
    BadAddress,
    /// A value that should be a number is not, or is too large.
    BadNumber(String),
    /// A key appears twice.
    Duplicate(String),
    /// `maps`: the end is not after the start.
    EmptyVma,
}

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LineError::BadAddress => write!(f, "no address at the start of the line"),
            LineError::BadNumber(t) => write!(f, "`{t}` is not a number in range"),
            LineError::Duplicate(k) => write!(f, "`{k}` appears twice"),
            LineError::EmptyVma => write!(f, "the VMA's end is not after its start"),
        }
    }
}

fn tokens(line: &[u8]) -> impl Iterator<Item = &[u8]> {
    line.split(|b| b.is_ascii_whitespace())
        .filter(|t| !t.is_empty())
}

fn shown(t: &[u8]) -> String {
    let s = String::from_utf8_lossy(t);
    s.chars().take(64).collect()
}

fn hex(t: &[u8]) -> Option<u64> {
    if t.is_empty() || t.len() > 16 {
        return None;
    }
    u64::from_str_radix(std::str::from_utf8(t).ok()?, 16).ok()
}

fn dec<T: std::str::FromStr>(t: &[u8]) -> Option<T> {
    if t.is_empty() || !t.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(t).ok()?.parse().ok()
}

/// The start address of a `numa_maps` line (its first token).
pub(crate) fn line_start(line: &[u8]) -> Option<u64> {
    tokens(line).next().and_then(hex)
}

/// The memory policy a `numa_maps` line shows (`default`, `bind:1`,
/// `prefer (many):0-1`, `interleave=static:0-3`, `weighted interleave:0-1`),
/// or `None` for a line without one. For a VMA without a policy of its own
/// the kernel prints the task's policy.
pub(crate) fn line_policy(line: &[u8]) -> Option<String> {
    let mut it = tokens(line);
    it.next().and_then(hex)?;
    let first = it.next()?;
    let text = |t: &[u8]| String::from_utf8_lossy(t).into_owned();
    // The two policies the kernel prints with a space in them.
    Some(match (first, it.next()) {
        (b"prefer", Some(next)) if next.starts_with(b"(many)") => {
            format!("prefer {}", text(next))
        }
        (b"weighted", Some(next)) if next.starts_with(b"interleave") => {
            format!("weighted {}", text(next))
        }
        _ => text(first),
    })
}

/// The policy of this process's main thread as `/proc/self/numa_maps`
/// shows it: the policy printed on the `stack` line (the main thread's
/// stack has no policy of its own, so the task's is printed), else on the
/// `heap` line.
pub(crate) fn task_policy(numa_maps: &[u8]) -> Option<String> {
    let find = |word: &[u8]| {
        numa_maps
            .split(|&b| b == b'\n')
            .find(|l| tokens(l).any(|t| t == word))
            .and_then(line_policy)
    };
    find(b"stack").or_else(|| find(b"heap"))
}

/// Parses one `numa_maps` line (without its newline).
pub(crate) fn parse_line(line: &[u8]) -> Result<NumaMapsLine, LineError> {
    let mut it = tokens(line);
    let start = it.next().and_then(hex).ok_or(LineError::BadAddress)?;
    let mut out = NumaMapsLine {
        start,
        page_bytes: None,
        nodes: Vec::new(),
        hugetlb: false,
    };
    for t in it {
        if t == b"huge" {
            out.hugetlb = true;
            continue;
        }
        let Some(eq) = t.iter().position(|&b| b == b'=') else {
            continue;
        };
        let (k, v) = (&t[..eq], &t[eq + 1..]);
        if k == b"kernelpagesize_kB" {
            if out.page_bytes.is_some() {
                return Err(LineError::Duplicate(shown(k)));
            }
            let kb: u64 = dec(v).ok_or_else(|| LineError::BadNumber(shown(t)))?;
            let b = kb
                .checked_mul(1024)
                .filter(|&b| b > 0)
                .ok_or_else(|| LineError::BadNumber(shown(t)))?;
            out.page_bytes = Some(b);
        } else if k.len() > 1 && k[0] == b'N' && k[1..].iter().all(u8::is_ascii_digit) {
            let node: u32 = dec(&k[1..]).ok_or_else(|| LineError::BadNumber(shown(t)))?;
            let pages: u64 = dec(v).ok_or_else(|| LineError::BadNumber(shown(t)))?;
            if out.nodes.iter().any(|&(n, _)| n == node) {
                return Err(LineError::Duplicate(shown(k)));
            }
            out.nodes.push((node, pages));
        }
        // Anything else (policy, anon=, dirty=, file=, heap, stack...) is
        // not needed.
    }
    Ok(out)
}

/// A VMA from `/proc/self/maps`: `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Vma {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
}

/// Parses the `start-end` of one `/proc/self/maps` line.
pub(crate) fn parse_maps_line(line: &[u8]) -> Result<Vma, LineError> {
    let first = tokens(line).next().ok_or(LineError::BadAddress)?;
    let dash = first
        .iter()
        .position(|&b| b == b'-')
        .ok_or(LineError::BadAddress)?;
    let start = hex(&first[..dash]).ok_or(LineError::BadAddress)?;
    let end = hex(&first[dash + 1..]).ok_or(LineError::BadAddress)?;
    if end <= start {
        return Err(LineError::EmptyVma);
    }
    Ok(Vma { start, end })
}

/// `[min, max]` bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Bounds {
    /// At least this many bytes.
    pub min: u64,
    /// At most this many bytes.
    pub max: u64,
}

impl Bounds {
    #[cfg(any(test, feature = "internals"))]
    /// Whether the value is known exactly.
    pub(crate) fn is_exact(&self) -> bool {
        self.min == self.max
    }

    fn add(&mut self, o: Bounds) {
        self.min = self.min.saturating_add(o.min);
        self.max = self.max.saturating_add(o.max);
    }
}

/// Where a range's bytes are.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RangePlacement {
    /// The range asked about.
    pub start: u64,
    /// Its end (exclusive).
    pub end: u64,
    /// Bytes present on each node (nodes with a possible nonzero count).
    pub nodes: BTreeMap<u32, Bounds>,
    /// Bytes not present (never touched, or swapped out).
    pub not_present: Bounds,
    /// VMAs overlapping the range.
    pub vmas: u32,
    /// Of those, VMAs that extend beyond it (the source of any inexactness).
    pub straddling: u32,
}

#[cfg(test)]
/// Whether every byte of a range is on one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AllOn {
    /// Proven: every byte is present on the node.
    Yes,
    /// Proven: some byte is elsewhere or not present.
    No,
    /// The counts of a straddling VMA allow both.
    Unknown,
}

impl RangePlacement {
    /// Whether every count is exact.
    #[cfg(any(test, feature = "internals"))]
    pub(crate) fn is_exact(&self) -> bool {
        self.not_present.is_exact() && self.nodes.values().all(Bounds::is_exact)
    }

    #[cfg(test)]
    /// Bytes present on `node`.
    pub(crate) fn on(&self, node: u32) -> Bounds {
        self.nodes.get(&node).copied().unwrap_or_default()
    }

    #[cfg(test)]
    /// Whether all of the range is present on `node`.
    pub(crate) fn all_on(&self, node: u32) -> AllOn {
        let len = self.end - self.start;
        let b = self.on(node);
        if b.min == len {
            AllOn::Yes
        } else if b.max < len {
            AllOn::No
        } else {
            AllOn::Unknown
        }
    }

    #[cfg(any(test, feature = "internals"))]
    /// Exact bytes per node (`None` unless [`Self::is_exact`]), nodes with
    /// zero bytes left out.
    pub(crate) fn exact_nodes(&self) -> Option<BTreeMap<u32, u64>> {
        self.is_exact().then(|| {
            self.nodes
                .iter()
                .filter(|(_, b)| b.min > 0)
                .map(|(&n, b)| (n, b.min))
                .collect()
        })
    }
}

/// Why a range's placement could not be computed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PlacementError {
    /// The range is empty or runs backwards.
    EmptyRange,
    /// A `numa_maps` line about the range could not be read (1-based).
    NumaMaps {
        /// The line number.
        line: usize,
        /// What is wrong with it.
        error: LineError,
    },
    /// A `maps` line could not be read (1-based).
    Maps {
        /// The line number.
        line: usize,
        /// What is wrong with it.
        error: LineError,
    },
    /// Part of the range is not mapped, from this address.
    Hole {
        /// The first address not mapped.
        at: u64,
    },
    /// The two files disagree about a VMA overlapping the range (they were
    /// read at different moments while mappings changed: read again).
    Inconsistent {
        /// The VMA's start address.
        vma_start: u64,
        /// How they disagree.
        why: &'static str,
    },
}

impl fmt::Display for PlacementError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlacementError::EmptyRange => write!(f, "empty address range"),
            PlacementError::NumaMaps { line, error } => write!(f, "numa_maps line {line}: {error}"),
            PlacementError::Maps { line, error } => write!(f, "maps line {line}: {error}"),
            PlacementError::Hole { at } => write!(f, "address {at:#x} of the range is not mapped"),
            PlacementError::Inconsistent { vma_start, why } => {
                write!(
                    f,
                    "maps and numa_maps disagree about the VMA at {vma_start:#x}: {why}"
                )
            }
        }
    }
}

impl std::error::Error for PlacementError {}

fn lines(text: &[u8]) -> impl Iterator<Item = (usize, &[u8])> {
    text.split(|&b| b == b'\n')
        .enumerate()
        .map(|(i, l)| (i + 1, l))
        .filter(|(_, l)| !l.iter().all(u8::is_ascii_whitespace))
}

/// The VMAs of `maps` that overlap `range`, in address order.
pub(crate) fn overlapping_vmas(
    maps: &[u8],
    range: &Range<u64>,
) -> Result<Vec<Vma>, PlacementError> {
    let mut out = Vec::new();
    for (n, l) in lines(maps) {
        let v = parse_maps_line(l).map_err(|error| PlacementError::Maps { line: n, error })?;
        if v.start < range.end && v.end > range.start {
            out.push(v);
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// Where the bytes of `range` are, from the contents of
/// `/proc/self/numa_maps` and `/proc/self/maps` (see the module docs for
/// exactness). Lines about other VMAs are only looked at for their start
/// address, so a line this parser does not understand elsewhere in the
/// file does no harm.
pub(crate) fn placement(
    numa_maps: &[u8],
    maps: &[u8],
    range: Range<u64>,
) -> Result<RangePlacement, PlacementError> {
    if range.end <= range.start {
        return Err(PlacementError::EmptyRange);
    }
    let vmas = overlapping_vmas(maps, &range)?;
    // Coverage: the VMAs must tile the range without a gap or overlap.
    let mut cursor = range.start;
    for (i, v) in vmas.iter().enumerate() {
        if v.start > cursor {
            return Err(PlacementError::Hole { at: cursor });
        }
        if i > 0 && v.start < cursor {
            return Err(PlacementError::Inconsistent {
                vma_start: v.start,
                why: "maps lists overlapping VMAs",
            });
        }
        cursor = v.end;
    }
    if cursor < range.end {
        return Err(PlacementError::Hole { at: cursor });
    }
    let mut wanted: HashMap<u64, Option<(usize, &[u8])>> =
        vmas.iter().map(|v| (v.start, None)).collect();
    for (n, l) in lines(numa_maps) {
        let start = line_start(l).ok_or(PlacementError::NumaMaps {
            line: n,
            error: LineError::BadAddress,
        })?;
        if let Some(slot) = wanted.get_mut(&start) {
            if slot.is_some() {
                return Err(PlacementError::Inconsistent {
                    vma_start: start,
                    why: "two numa_maps lines",
                });
            }
            *slot = Some((n, l));
        } else {
            // A line starting inside one of our VMAs means numa_maps saw it
            // split where maps did not.
            let i = vmas.partition_point(|v| v.start <= start);
            if i > 0 && start < vmas[i - 1].end {
                return Err(PlacementError::Inconsistent {
                    vma_start: vmas[i - 1].start,
                    why: "numa_maps has a VMA boundary inside it that maps does not",
                });
            }
        }
    }
    let mut out = RangePlacement {
        start: range.start,
        end: range.end,
        ..Default::default()
    };
    for v in &vmas {
        let Some(Some((n, l))) = wanted.get(&v.start).copied() else {
            return Err(PlacementError::Inconsistent {
                vma_start: v.start,
                why: "no numa_maps line",
            });
        };
        let parsed = parse_line(l).map_err(|error| PlacementError::NumaMaps { line: n, error })?;
        let node_bytes = parsed.node_bytes().ok_or(PlacementError::NumaMaps {
            line: n,
            error: LineError::BadNumber("page counts without a page size, or too large".into()),
        })?;
        let vma_len = v.end - v.start;
        let present = node_bytes
            .iter()
            .try_fold(0u64, |a, &(_, b)| a.checked_add(b));
        let Some(present) = present.filter(|&p| p <= vma_len) else {
            return Err(PlacementError::Inconsistent {
                vma_start: v.start,
                why: "more pages counted than the VMA holds",
            });
        };
        let inside = v.end.min(range.end) - v.start.max(range.start);
        let outside = vma_len - inside;
        out.vmas += 1;
        out.straddling += u32::from(outside > 0);
        let bound = |c: u64| Bounds {
            min: c.saturating_sub(outside),
            max: c.min(inside),
        };
        for (node, b) in node_bytes {
            out.nodes.entry(node).or_default().add(bound(b));
        }
        out.not_present.add(bound(vma_len - present));
    }
    Ok(out)
}

/// What a whole `/proc/<pid>/numa_maps` holds, summed line by line
/// ([`Totals::add_line`]): present bytes per node, split into the
/// process's own data (anonymous memory, heap, stack, memfd and shared
/// memory files, hugetlb) and pages of files on disk (libraries, mapped
/// files: page cache that any process may have read in first), and the
/// task's memory policy as the `stack` (else `heap`) line shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Totals {
    /// Data bytes per node.
    pub data: BTreeMap<u32, u64>,
    /// File bytes per node.
    pub file: BTreeMap<u32, u64>,
    /// The task's policy (`default`, `bind:1`, ...), when a line shows it.
    pub policy: Option<String>,
    /// Lines read.
    pub vmas: u64,
    /// Lines that could not be read (counted, not fatal: the kernel's format
    /// may grow).
    pub bad_lines: u64,
    /// Node numbers at or above the limit given to [`Totals::add_line`]
    /// (their bytes are not counted).
    pub bad_nodes: u64,
    policy_from_stack: bool,
}

/// Whether a line's VMA is the process's own data rather than a file on
/// disk: no `file=`, or a memfd, `/dev/shm` or `SYSV` shared memory file, a
/// device's memory mapped in (`/dev/...`: a driver's allocation, such as
/// CUDA's pinned host memory), or hugetlb pages.
fn is_data(line: &[u8]) -> bool {
    let mut file = None;
    let mut huge = false;
    for t in tokens(line) {
        if let Some(f) = t.strip_prefix(b"file=") {
            file = Some(f);
        } else if t == b"huge" {
            huge = true;
        }
    }
    match file {
        None => true,
        Some(f) => {
            huge || f.starts_with(b"/memfd:") || f.starts_with(b"/dev/") || f.starts_with(b"/SYSV")
        }
    }
}

impl Totals {
    /// Adds one line (without its newline); node numbers at or above
    /// `max_nodes` are counted in [`bad_nodes`](Self::bad_nodes) instead.
    pub(crate) fn add_line(&mut self, line: &[u8], max_nodes: u32) {
        if line.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        self.vmas += 1;
        let Some(bytes) = parse_line(line).ok().and_then(|l| l.node_bytes()) else {
            self.bad_lines += 1;
            return;
        };
        let into = if is_data(line) {
            &mut self.data
        } else {
            &mut self.file
        };
        for (node, b) in bytes {
            if node >= max_nodes {
                self.bad_nodes += 1;
                continue;
            }
            let e = into.entry(node).or_insert(0);
            *e = e.saturating_add(b);
        }
        if !self.policy_from_stack {
            let stack = tokens(line).any(|t| t == b"stack");
            if stack || (self.policy.is_none() && tokens(line).any(|t| t == b"heap")) {
                self.policy = line_policy(line);
                self.policy_from_stack = stack;
            }
        }
    }
}

/// The shortest line `numa_maps` can print (`0 local` and a newline): a
/// read asking for `8 * n` bytes makes the kernel generate at most `n` more
/// lines.
const MIN_LINE: usize = 8;

/// Reads the first `lines` lines of a `/proc` file (or all of it, if
/// shorter). `/proc/PID/numa_maps` is generated as it is read, a line per
/// VMA, and printing a line walks that VMA's page tables (a cost that grows
/// with the pages mapped); the kernel generates lines until the read's
/// count is reached, so each read asks for at most [`MIN_LINE`] bytes per
/// line still missing, and no VMA after the last one needed is walked.
pub(crate) fn read_lines(path: &std::path::Path, lines: usize) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut out = Vec::new();
    let mut seen = 0;
    let mut scanned = 0;
    let mut buf = vec![0u8; 64 << 10];
    while seen < lines {
        let want = ((lines - seen).saturating_mul(MIN_LINE)).min(buf.len());
        let n = match f.read(&mut buf[..want]) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
        seen += out[scanned..].iter().filter(|&&b| b == b'\n').count();
        scanned = out.len();
    }
    Ok(out)
}

/// [`placement`] for this process, reading `maps`, then the lines of
/// `numa_maps` up to the range's last VMA ([`read_lines`]: VMAs above the
/// range are not walked), then `maps` again, and retrying (up to `tries`
/// times) while the VMAs over the range change between the reads or the
/// files disagree.
pub(crate) fn read_self(range: Range<u64>, tries: u32) -> std::io::Result<RangePlacement> {
    let maps_path = std::path::Path::new("/proc/self/maps");
    let numa_path = std::path::Path::new("/proc/self/numa_maps");
    let mut last = None;
    for _ in 0..tries.max(1) {
        let before = std::fs::read(maps_path)?;
        let needed = lines(&before)
            .filter(|(_, l)| parse_maps_line(l).is_ok_and(|v| v.start < range.end))
            .count();
        let numa = read_lines(numa_path, needed)?;
        let after = std::fs::read(maps_path)?;
        let same = overlapping_vmas(&before, &range).ok() == overlapping_vmas(&after, &range).ok();
        match placement(&numa, &after, range.clone()) {
            Ok(p) if same => return Ok(p),
            Ok(_) => {
                last = Some(PlacementError::Inconsistent {
                    vma_start: range.start,
                    why: "VMAs changed while reading",
                })
            }
            Err(e @ PlacementError::Inconsistent { .. }) => last = Some(e),
            Err(e) => return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, e)),
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        last.expect("at least one try"),
    ))
}

#[cfg(test)]
mod tests;

/// The fuzz target's body (see `fuzz/fuzz_targets/numa_maps.rs`): two
/// little-endian address words, then `numa_maps` text, a `0xff` byte and
/// `maps` text. Never panics on the parsers' account; panics when what
/// comes back is inconsistent (bounds out of order, minimums that do not
/// fit in the range, maximums that do not cover it).
#[cfg(feature = "internals")]
pub(crate) fn fuzz_one(data: &[u8]) {
    if data.len() < 16 {
        return;
    }
    let word = |at: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&data[at..at + 8]);
        u64::from_le_bytes(w)
    };
    let (start, end) = (word(0), word(8));
    let rest = &data[16..];
    // The first 0xff byte splits numa_maps from maps.
    let (numa, maps) = match rest.iter().position(|&b| b == 0xff) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &b""[..]),
    };
    let _ = task_policy(numa);
    for l in numa.split(|&b| b == b'\n') {
        let _ = line_policy(l);
    }
    if let Ok(p) = placement(numa, maps, start..end) {
        let len = end - start;
        let (mut min, mut max) = (p.not_present.min, p.not_present.max);
        assert!(p.not_present.min <= p.not_present.max);
        for b in p.nodes.values() {
            assert!(b.min <= b.max && b.max <= len);
            min += b.min;
            max = max.saturating_add(b.max);
        }
        assert!(min <= len && max >= len);
    }
}
