//! Sets of CPU (or NUMA node) numbers and the Linux "cpulist" text format.
//!
//! The kernel prints CPU sets as lists of ranges (`0-3,8-11`), optionally with a
//! stride (`0-31:2/4`: from 0 to 31, the first 2 of every group of 4). numapin
//! reads and writes that format everywhere a set crosses a boundary (sysfs,
//! `/proc/self/status`, the JSON schema, the command line), and also reads the
//! hexadecimal mask format (`00000000,00ffffff`) that NCCL topology files and
//! sysfs `cpumap` files use.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// How many CPUs numapin handles: CPU numbers run from 0 to `MAX_CPUS - 1`.
/// 8,192 is the most any Linux kernel supports (x86 `MAXSMP`, `NR_CPUS`).
pub const MAX_CPUS: u32 = 8192;

/// The largest CPU (or node) number accepted from text, [`MAX_CPUS`]` - 1`.
/// The bound is checked before anything is allocated, so hostile input
/// (`"0-4000000000"`, a mask of a million bits) costs nothing.
pub const MAX_CPU: u32 = MAX_CPUS - 1;

/// A set of CPU (or NUMA node) numbers, kept sorted and without duplicates.
///
/// Displayed and serialized as a Linux cpulist string (`"0-3,8-11"`; the
/// empty set is `""`).
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CpuList(Vec<u32>);

/// Why a cpulist or CPU mask string could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CpuListError {
    /// An element is not a number, a range or a strided range.
    #[error("`{element}` is not a CPU number or range (expected a list like `0-3,8-11`)")]
    BadElement {
        /// The offending comma-separated element.
        element: String,
    },
    /// A range runs backwards.
    #[error("range `{element}` runs backwards")]
    Backwards {
        /// The offending element.
        element: String,
    },
    /// A number exceeds [`MAX_CPU`].
    #[error("CPU number {value} in `{element}` exceeds the supported maximum {max}")]
    TooLarge {
        /// The offending element.
        element: String,
        /// The number that was read.
        value: u64,
        /// The maximum accepted.
        max: u32,
    },
    /// A hexadecimal mask holds a non-hex digit or an over-long word.
    #[error("`{text}` is not a hexadecimal CPU mask (expected comma-separated 32-bit words like `00000000,00ffffff`)")]
    BadMask {
        /// The offending text.
        text: String,
    },
}

impl CpuList {
    /// The empty set.
    pub fn new() -> Self {
        Self(Vec::new())
    }

    /// A set from any numbers (sorted and deduplicated here).
    pub fn from_iter_unsorted(items: impl IntoIterator<Item = u32>) -> Self {
        let mut v: Vec<u32> = items.into_iter().collect();
        v.sort_unstable();
        v.dedup();
        Self(v)
    }

    /// The range `first..=last` (empty when `last < first`).
    pub fn range(first: u32, last: u32) -> Self {
        Self((first..=last).collect())
    }

    /// Parses a Linux cpulist (`0-3,8-11`, `0-31:2/4`, whitespace and a trailing
    /// newline tolerated, empty string = empty set).
    ///
    /// # Errors
    ///
    /// [`CpuListError::BadElement`] for an element that is not a number or
    /// range, [`CpuListError::Backwards`] for a range that runs backwards,
    /// [`CpuListError::TooLarge`] for a number past [`MAX_CPU`].
    pub fn parse(text: &str) -> Result<Self, CpuListError> {
        let mut out = Vec::new();
        for e in elements(text) {
            let Element {
                first,
                last,
                used,
                group,
            } = e?;
            if used == group {
                out.extend(first..=last);
                continue;
            }
            let mut base = first;
            while base <= last {
                out.extend(base..base.saturating_add(used).min(last.saturating_add(1)));
                match base.checked_add(group) {
                    Some(b) => base = b,
                    None => break,
                }
            }
        }
        Ok(Self::from_iter_unsorted(out))
    }

    /// How many numbers `text` lists, counting repeats, without building the
    /// set: what [`CpuList::parse`] would allocate at most. The same errors
    /// as `parse`.
    ///
    /// # Errors
    ///
    /// As [`CpuList::parse`].
    pub fn parse_len(text: &str) -> Result<u64, CpuListError> {
        let mut n = 0u64;
        for e in elements(text) {
            let e = e?;
            let span = u64::from(e.last - e.first) + 1;
            let (full, rest) = (span / u64::from(e.group), span % u64::from(e.group));
            n += full * u64::from(e.used) + rest.min(u64::from(e.used));
        }
        Ok(n)
    }

    /// Parses a hexadecimal CPU mask: comma-separated 32-bit words, most
    /// significant first (`00000000,00ffffff`), as in sysfs `cpumap` and NCCL
    /// topology files. An optional `0x` prefix is accepted.
    ///
    /// # Errors
    ///
    /// [`CpuListError::BadMask`] for a word that is not at most eight
    /// hexadecimal digits, [`CpuListError::TooLarge`] for a bit past
    /// [`MAX_CPU`].
    pub fn parse_mask(text: &str) -> Result<Self, CpuListError> {
        let bad = || CpuListError::BadMask { text: clip(text) };
        let t = text.trim();
        let t = t
            .strip_prefix("0x")
            .or_else(|| t.strip_prefix("0X"))
            .unwrap_or(t);
        if t.is_empty() {
            return Err(bad());
        }
        let mut out = Vec::new();
        for (i, w) in t.rsplit(',').enumerate() {
            if w.is_empty() || w.len() > 8 || !w.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(bad());
            }
            let v = u32::from_str_radix(w, 16).map_err(|_| bad())?;
            for bit in 0..32 {
                if v & (1 << bit) != 0 {
                    let cpu = i as u64 * 32 + bit;
                    match u32::try_from(cpu) {
                        Ok(c) if c <= MAX_CPU => out.push(c),
                        _ => {
                            return Err(CpuListError::TooLarge {
                                element: clip(text),
                                value: cpu,
                                max: MAX_CPU,
                            })
                        }
                    }
                }
            }
        }
        Ok(Self::from_iter_unsorted(out))
    }

    /// The numbers, ascending.
    pub fn as_slice(&self) -> &[u32] {
        &self.0
    }

    /// Iterates over the numbers, ascending.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().copied()
    }

    /// How many numbers the set holds.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `cpu` is in the set.
    pub fn contains(&self, cpu: u32) -> bool {
        self.0.binary_search(&cpu).is_ok()
    }

    /// The smallest number, if any.
    pub fn first(&self) -> Option<u32> {
        self.0.first().copied()
    }

    /// The numbers in both sets.
    pub fn intersection(&self, other: &Self) -> Self {
        let (a, b) = (&self.0, &other.0);
        let (mut i, mut j, mut out) = (0, 0, Vec::new());
        while i < a.len() && j < b.len() {
            match a[i].cmp(&b[j]) {
                std::cmp::Ordering::Less => i += 1,
                std::cmp::Ordering::Greater => j += 1,
                std::cmp::Ordering::Equal => {
                    out.push(a[i]);
                    i += 1;
                    j += 1;
                }
            }
        }
        Self(out)
    }

    /// The numbers in either set.
    pub fn union(&self, other: &Self) -> Self {
        let (a, b) = (&self.0, &other.0);
        let (mut i, mut j) = (0, 0);
        let mut out = Vec::with_capacity(a.len() + b.len());
        while i < a.len() && j < b.len() {
            match a[i].cmp(&b[j]) {
                std::cmp::Ordering::Less => {
                    out.push(a[i]);
                    i += 1;
                }
                std::cmp::Ordering::Greater => {
                    out.push(b[j]);
                    j += 1;
                }
                std::cmp::Ordering::Equal => {
                    out.push(a[i]);
                    i += 1;
                    j += 1;
                }
            }
        }
        out.extend_from_slice(&a[i..]);
        out.extend_from_slice(&b[j..]);
        Self(out)
    }

    /// The numbers of `self` that are not in `other`.
    pub fn difference(&self, other: &Self) -> Self {
        let (a, b) = (&self.0, &other.0);
        let (mut i, mut j, mut out) = (0, 0, Vec::new());
        while i < a.len() {
            if j >= b.len() || a[i] < b[j] {
                out.push(a[i]);
                i += 1;
            } else if a[i] > b[j] {
                j += 1;
            } else {
                i += 1;
                j += 1;
            }
        }
        Self(out)
    }

    /// Whether every number of `self` is in `other`.
    pub fn is_subset(&self, other: &Self) -> bool {
        self.len() <= other.len() && self.difference(other).is_empty()
    }

    /// Whether the two sets share no number.
    pub fn is_disjoint(&self, other: &Self) -> bool {
        self.intersection(other).is_empty()
    }

    /// The Linux cpulist text (`0-3,8-11`).
    pub fn to_cpulist(&self) -> String {
        let mut s = String::new();
        let mut i = 0;
        while i < self.0.len() {
            let start = self.0[i];
            let mut end = start;
            while i + 1 < self.0.len() && self.0[i + 1] == end + 1 {
                i += 1;
                end = self.0[i];
            }
            if !s.is_empty() {
                s.push(',');
            }
            if start == end {
                s.push_str(&start.to_string());
            } else {
                s.push_str(&format!("{start}-{end}"));
            }
            i += 1;
        }
        s
    }
}

/// `s` cut to 80 characters for a message (hostile text can be megabytes).
fn clip(s: &str) -> String {
    match s.char_indices().nth(80) {
        Some((i, _)) => format!("{}... ({} bytes)", &s[..i], s.len()),
        None => s.to_string(),
    }
}

/// One comma-separated element of a cpulist: `first-last:used/group`
/// (`used == group` for a plain range or number).
struct Element {
    first: u32,
    last: u32,
    used: u32,
    group: u32,
}

/// The elements of a cpulist, each checked against [`MAX_CPU`].
fn elements(text: &str) -> impl Iterator<Item = Result<Element, CpuListError>> + '_ {
    let text = text.trim();
    text.split(',')
        .filter(move |_| !text.is_empty())
        .map(|element| {
            let element = element.trim();
            let bad = || CpuListError::BadElement {
                element: clip(element),
            };
            if element.is_empty() {
                return Err(bad());
            }
            let (range, stride) = match element.split_once(':') {
                Some((r, s)) => (r, Some(s)),
                None => (element, None),
            };
            let num = |s: &str| -> Result<u32, CpuListError> {
                let s = s.trim();
                if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(bad());
                }
                let v: u64 = s.parse().unwrap_or(u64::MAX);
                u32::try_from(v)
                    .ok()
                    .filter(|&c| c <= MAX_CPU)
                    .ok_or_else(|| CpuListError::TooLarge {
                        element: clip(element),
                        value: v,
                        max: MAX_CPU,
                    })
            };
            let (first, last) = match range.split_once('-') {
                Some((a, b)) => (num(a)?, num(b)?),
                None => {
                    if stride.is_some() {
                        return Err(bad());
                    }
                    let v = num(range)?;
                    (v, v)
                }
            };
            if last < first {
                return Err(CpuListError::Backwards {
                    element: clip(element),
                });
            }
            let (used, group) = match stride {
                None => (1, 1),
                Some(s) => {
                    let (used, group) = s.split_once('/').ok_or_else(bad)?;
                    let (used, group) = (num(used)?, num(group)?);
                    if used == 0 || group == 0 || used > group {
                        return Err(bad());
                    }
                    (used, group)
                }
            };
            Ok(Element {
                first,
                last,
                used,
                group,
            })
        })
}

impl FromIterator<u32> for CpuList {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        Self::from_iter_unsorted(iter)
    }
}

impl FromStr for CpuList {
    type Err = CpuListError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for CpuList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_cpulist())
    }
}

impl fmt::Debug for CpuList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CpuList({:?})", self.to_cpulist())
    }
}

impl Serialize for CpuList {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_cpulist())
    }
}

thread_local! {
    /// `(limit, left)` while [`with_budget`] runs on this thread.
    static BUDGET: std::cell::Cell<Option<(u64, u64)>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with a budget on the CPU numbers that the `CpuList`s it
/// deserializes (on this thread) may list together, so that a small file
/// whose lists claim millions of CPUs fails before they are built.
pub(crate) fn with_budget<T>(limit: u64, f: impl FnOnce() -> T) -> T {
    let prev = BUDGET.with(|b| b.replace(Some((limit, limit))));
    let r = f();
    BUDGET.with(|b| b.set(prev));
    r
}

impl<'de> Deserialize<'de> for CpuList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let s = String::deserialize(d)?;
        if let Some((limit, left)) = BUDGET.with(std::cell::Cell::get) {
            let n = Self::parse_len(&s).map_err(D::Error::custom)?;
            if n > left {
                return Err(D::Error::custom(format!(
                    "the CPU lists name more than {limit} CPU numbers in all, the limit for one description"
                )));
            }
            BUDGET.with(|b| b.set(Some((limit, left - n))));
        }
        Self::parse(&s).map_err(D::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_kernel_forms() {
        assert_eq!(CpuList::parse("0-3,8-11").unwrap().len(), 8);
        assert_eq!(CpuList::parse("5\n").unwrap().as_slice(), &[5]);
        assert!(CpuList::parse("").unwrap().is_empty());
        assert_eq!(
            CpuList::parse("0-15:2/4").unwrap().to_cpulist(),
            "0-1,4-5,8-9,12-13"
        );
        assert_eq!(CpuList::parse("3,1,2").unwrap().to_cpulist(), "1-3");
    }

    #[test]
    fn rejects_bad_text() {
        for bad in [
            "a",
            "1-",
            "-1",
            "3-1",
            "1,,2",
            "0-4000000000",
            "1:2/4",
            "0-7:0/4",
            "0-7:5/4",
            "99999999999999999999",
        ] {
            assert!(CpuList::parse(bad).is_err(), "{bad:?} should fail");
        }
    }

    #[test]
    fn limits_are_checked_before_expanding() {
        let e = CpuList::parse("0-1048575").unwrap_err();
        assert!(e.to_string().contains("8191"), "{e}");
        assert!(CpuList::parse("8-1048575:1/1").is_err());
        assert_eq!(CpuList::parse("0-8191").unwrap().len(), 8192);
        assert_eq!(CpuList::parse_len("0-15:2/4,3,3").unwrap(), 10);
        assert_eq!(CpuList::parse_len("0-8191").unwrap(), 8192);
        let mask = format!("{}ffffffff", "ffffffff,".repeat(40_000));
        let e = CpuList::parse_mask(&mask).unwrap_err();
        assert!(e.to_string().contains("8191"), "{e}");
        assert!(e.to_string().len() < 400, "the message quotes a short part");
        assert_eq!(
            CpuList::parse_mask(&format!("{}1", "0,".repeat(1000)))
                .unwrap()
                .to_cpulist(),
            "0"
        );
    }

    #[test]
    fn deserializing_under_a_budget_refuses_claims() {
        let many = format!("[{}]", vec!["\"0-8191\""; 100].join(","));
        let e = with_budget(10_000, || serde_json::from_str::<Vec<CpuList>>(&many)).unwrap_err();
        assert!(e.to_string().contains("10000"), "{e}");
        let ok = with_budget(10_000, || {
            serde_json::from_str::<Vec<CpuList>>("[\"0-3\",\"4-7\"]")
        });
        assert_eq!(ok.unwrap().len(), 2);
        assert_eq!(
            serde_json::from_str::<Vec<CpuList>>(&many).unwrap().len(),
            100
        );
    }

    #[test]
    fn parses_masks() {
        assert_eq!(
            CpuList::parse_mask("00000000,00ffffff")
                .unwrap()
                .to_cpulist(),
            "0-23"
        );
        assert_eq!(
            CpuList::parse_mask("000000ff,ffff0000,00000000")
                .unwrap()
                .to_cpulist(),
            "48-71"
        );
        assert_eq!(CpuList::parse_mask("0x3").unwrap().to_cpulist(), "0-1");
        assert!(CpuList::parse_mask("zz").is_err());
        assert!(CpuList::parse_mask("").is_err());
        assert!(CpuList::parse_mask("123456789").is_err());
    }

    #[test]
    fn set_operations() {
        let a = CpuList::parse("0-7").unwrap();
        let b = CpuList::parse("4-11").unwrap();
        assert_eq!(a.intersection(&b).to_cpulist(), "4-7");
        assert_eq!(a.union(&b).to_cpulist(), "0-11");
        assert_eq!(a.difference(&b).to_cpulist(), "0-3");
        assert!(!a.is_disjoint(&b));
        assert!(CpuList::parse("4-5").unwrap().is_subset(&a));
    }

    proptest! {
        #[test]
        fn roundtrip(v in proptest::collection::vec(0u32..5000, 0..200)) {
            let set = CpuList::from_iter_unsorted(v.clone());
            let text = set.to_cpulist();
            let back = CpuList::parse(&text).unwrap();
            prop_assert_eq!(&back, &set);
            let mut expect = v; expect.sort_unstable(); expect.dedup();
            prop_assert_eq!(back.as_slice(), &expect[..]);
        }

        #[test]
        fn never_panics(s in "\\PC{0,40}") {
            let _ = CpuList::parse(&s);
            let _ = CpuList::parse_mask(&s);
        }

        #[test]
        fn never_panics_on_near_valid(s in "[0-9,:/ -]{0,30}") {
            if let Ok(set) = CpuList::parse(&s) {
                prop_assert!(set.iter().all(|c| c <= MAX_CPU));
                prop_assert!(CpuList::parse_len(&s).unwrap() >= set.len() as u64);
            }
        }

        #[test]
        fn set_operations_match_a_model(a in proptest::collection::btree_set(0u32..200, 0..60), b in proptest::collection::btree_set(0u32..200, 0..60)) {
            let (x, y) = (CpuList::from_iter_unsorted(a.clone()), CpuList::from_iter_unsorted(b.clone()));
            let v = |s: std::collections::BTreeSet<u32>| CpuList::from_iter_unsorted(s);
            prop_assert_eq!(x.union(&y), v(a.union(&b).copied().collect()));
            prop_assert_eq!(x.intersection(&y), v(a.intersection(&b).copied().collect()));
            prop_assert_eq!(x.difference(&y), v(a.difference(&b).copied().collect()));
            prop_assert_eq!(x.is_subset(&y), a.is_subset(&b));
            prop_assert_eq!(x.is_disjoint(&y), a.is_disjoint(&b));
        }
    }
}
