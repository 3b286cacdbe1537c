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

/// The largest CPU or node number accepted from text (2^20). Linux supports at
/// most 8192 CPUs today; the bound keeps hostile input ("0-4000000000") from
/// allocating gigabytes.
pub const MAX_CPU: u32 = 1 << 20;

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
    pub fn parse(text: &str) -> Result<Self, CpuListError> {
        let text = text.trim();
        let mut out = Vec::new();
        if text.is_empty() {
            return Ok(Self(out));
        }
        for element in text.split(',') {
            let element = element.trim();
            let bad = || CpuListError::BadElement {
                element: element.to_string(),
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
                let v: u64 = s.parse().map_err(|_| CpuListError::TooLarge {
                    element: element.to_string(),
                    value: u64::MAX,
                    max: MAX_CPU,
                })?;
                if v > u64::from(MAX_CPU) {
                    return Err(CpuListError::TooLarge {
                        element: element.to_string(),
                        value: v,
                        max: MAX_CPU,
                    });
                }
                Ok(v as u32)
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
                    element: element.to_string(),
                });
            }
            match stride {
                None => out.extend(first..=last),
                Some(s) => {
                    let (used, group) = s.split_once('/').ok_or_else(bad)?;
                    let (used, group) = (num(used)?, num(group)?);
                    if used == 0 || group == 0 || used > group {
                        return Err(bad());
                    }
                    let mut base = first;
                    while base <= last {
                        for c in base..base.saturating_add(used).min(last.saturating_add(1)) {
                            out.push(c);
                        }
                        match base.checked_add(group) {
                            Some(b) => base = b,
                            None => break,
                        }
                    }
                }
            }
        }
        Ok(Self::from_iter_unsorted(out))
    }

    /// Parses a hexadecimal CPU mask: comma-separated 32-bit words, most
    /// significant first (`00000000,00ffffff`), as in sysfs `cpumap` and NCCL
    /// topology files. An optional `0x` prefix is accepted.
    pub fn parse_mask(text: &str) -> Result<Self, CpuListError> {
        let bad = || CpuListError::BadMask {
            text: text.chars().take(80).collect(),
        };
        let t = text.trim();
        let t = t
            .strip_prefix("0x")
            .or_else(|| t.strip_prefix("0X"))
            .unwrap_or(t);
        if t.is_empty() {
            return Err(bad());
        }
        let words: Vec<&str> = t.split(',').collect();
        if words.len() as u64 * 32 > u64::from(MAX_CPU) + 32 {
            return Err(bad());
        }
        let mut out = Vec::new();
        for (i, w) in words.iter().rev().enumerate() {
            if w.is_empty() || w.len() > 8 || !w.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(bad());
            }
            let v = u32::from_str_radix(w, 16).map_err(|_| bad())?;
            for bit in 0..32 {
                if v & (1 << bit) != 0 {
                    let cpu = i as u64 * 32 + bit;
                    if cpu > u64::from(MAX_CPU) {
                        return Err(bad());
                    }
                    out.push(cpu as u32);
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
        Self(self.iter().filter(|c| other.contains(*c)).collect())
    }

    /// The numbers in either set.
    pub fn union(&self, other: &Self) -> Self {
        Self::from_iter_unsorted(self.iter().chain(other.iter()))
    }

    /// The numbers of `self` that are not in `other`.
    pub fn difference(&self, other: &Self) -> Self {
        Self(self.iter().filter(|c| !other.contains(*c)).collect())
    }

    /// Whether every number of `self` is in `other`.
    pub fn is_subset(&self, other: &Self) -> bool {
        self.iter().all(|c| other.contains(c))
    }

    /// Whether the two sets share no number.
    pub fn is_disjoint(&self, other: &Self) -> bool {
        self.iter().all(|c| !other.contains(c))
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

impl<'de> Deserialize<'de> for CpuList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
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
        for bad in ["a", "1-", "-1", "3-1", "1,,2", "0-4000000000", "1:2/4", "0-7:0/4", "0-7:5/4", "99999999999999999999"] {
            assert!(CpuList::parse(bad).is_err(), "{bad:?} should fail");
        }
    }

    #[test]
    fn parses_masks() {
        assert_eq!(
            CpuList::parse_mask("00000000,00ffffff").unwrap().to_cpulist(),
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
            }
        }
    }
}
