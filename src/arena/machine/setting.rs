//! [`MachineBudget`]: how much every numapin process of a user may pin on
//! a node together, and its strict parser (the `NUMAPIN_MACHINE_BUDGET`
//! variable and Python's `configure(machine_budget=...)`).

use std::fmt;
use std::str::FromStr;

use super::super::DEFAULT_BUDGET_FRACTION;

/// The environment variable that sets the machine budget when the
/// configuration does not ([`MachineBudget`]'s `FromStr` forms).
pub const MACHINE_BUDGET_VAR: &str = "NUMAPIN_MACHINE_BUDGET";

/// The environment variable naming the folder of the machine budget's
/// state file (default `/dev/shm`).
pub const MACHINE_BUDGET_DIR_VAR: &str = "NUMAPIN_MACHINE_BUDGET_DIR";

/// A budget of pinned bytes per NUMA node over every numapin runtime of
/// this user on the machine (every process, every runtime in it, and each
/// shared region once, charged to the process that made it). See
/// `docs/arena.md`, Machine budget.
///
/// Written (`FromStr`, `Display`) as `auto`, `off`, a fraction of each
/// node's memory in (0, 1] (`0.5`), or bytes per node with a unit (`64GiB`,
/// `512 MiB`, `1.5TiB`, `4096B`; units `B`, `KiB`, `MiB`, `GiB`, `TiB`,
/// any case).
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum MachineBudget {
    /// The default: [`DEFAULT_BUDGET_FRACTION`] of each node's memory, or
    /// the runtime's own budget on the node when that is larger. One
    /// process alone is limited exactly as without a machine budget; many
    /// share what one would have had.
    Auto,
    /// No machine budget: each runtime counts only its own pins.
    Off,
    /// This fraction of each node's memory, in (0, 1].
    Fraction(f64),
    /// These many bytes on each node.
    Bytes(u64),
}

impl MachineBudget {
    /// The limit on a node of `node_memory` bytes for a runtime whose own
    /// budget there is `own_budget`; `None` when off.
    pub fn limit_for(self, node_memory: u64, own_budget: u64) -> Option<u64> {
        let share = |f: f64| crate::num::share(node_memory, f);
        match self {
            MachineBudget::Auto => Some(share(DEFAULT_BUDGET_FRACTION).max(own_budget)),
            MachineBudget::Off => None,
            MachineBudget::Fraction(f) => Some(share(f)),
            MachineBudget::Bytes(b) => Some(b),
        }
    }
}

impl fmt::Display for MachineBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MachineBudget::Auto => f.write_str("auto"),
            MachineBudget::Off => f.write_str("off"),
            MachineBudget::Fraction(x) => write!(f, "{x}"),
            MachineBudget::Bytes(b) => write!(f, "{b}B"),
        }
    }
}

/// A machine budget that could not be read: the text and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a machine budget: {problem}")]
pub struct ParseMachineBudgetError {
    /// The text given.
    pub text: String,
    /// What is wrong with it.
    pub problem: String,
}

impl ParseMachineBudgetError {
    /// What to write instead.
    pub const FIX: &'static str = "write a fraction of each node's memory such as 0.5, bytes per node with a unit such as 64GiB or 512MiB (B, KiB, MiB, GiB, TiB), `auto` (the default) or `off`";
}

const UNITS: [(&str, u64); 5] = [
    ("tib", 1 << 40),
    ("gib", 1 << 30),
    ("mib", 1 << 20),
    ("kib", 1 << 10),
    ("b", 1),
];

/// A plain decimal number: digits, at most one point, no sign or
/// exponent (`1e3`, `inf`, `-1`, `+1` are refused).
fn decimal(s: &str) -> Option<f64> {
    let ok = !s.is_empty()
        && s.len() <= 40
        && s.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        && s.bytes().filter(|&b| b == b'.').count() <= 1
        && s.bytes().any(|b| b.is_ascii_digit());
    ok.then(|| s.parse().ok()).flatten()
}

impl FromStr for MachineBudget {
    type Err = ParseMachineBudgetError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |problem: &str| ParseMachineBudgetError {
            text: s.chars().take(80).collect(),
            problem: problem.into(),
        };
        let t = s.trim();
        let lower = t.to_ascii_lowercase();
        match lower.as_str() {
            "" => return Err(err("empty")),
            "auto" => return Ok(MachineBudget::Auto),
            "off" => return Ok(MachineBudget::Off),
            _ => {}
        }
        if !lower.bytes().any(|b| b.is_ascii_digit()) && !UNITS.iter().any(|(u, _)| lower == *u) {
            return Err(err("neither a number nor `auto` or `off`"));
        }
        if ["kb", "mb", "gb", "tb", "pb"]
            .iter()
            .any(|u| lower.ends_with(u))
        {
            return Err(err(
                "an unknown unit: decimal units such as GB are not taken (B, KiB, MiB, GiB, TiB)",
            ));
        }
        if let Some((unit, scale)) = UNITS.iter().find(|(u, _)| lower.ends_with(u)) {
            let number = lower[..lower.len() - unit.len()].trim_end();
            let v = decimal(number).ok_or_else(|| err("not a number before the unit"))?;
            // Whole numbers exactly; others through f64 (saturating).
            let bytes = match number.parse::<u64>() {
                Ok(n) => n.saturating_mul(*scale),
                Err(_) => crate::num::share(*scale, v),
            };
            if bytes == 0 || bytes > u64::MAX / 2 {
                return Err(err("bytes out of range (at least 1 byte)"));
            }
            return Ok(MachineBudget::Bytes(bytes));
        }
        if lower.ends_with(|c: char| c.is_ascii_alphabetic()) {
            return Err(err(
                "an unknown unit (B, KiB, MiB, GiB, TiB; decimal units such as GB are not taken)",
            ));
        }
        let v = decimal(&lower).ok_or_else(|| err("neither a number nor `auto` or `off`"))?;
        if !(v > 0.0 && v <= 1.0) {
            return Err(err(
                "a number without a unit is a fraction of the node's memory, in (0, 1]; bytes need a unit (64GiB)",
            ));
        }
        Ok(MachineBudget::Fraction(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn every_written_form_reads() {
        let ok = [
            ("auto", MachineBudget::Auto),
            (" OFF ", MachineBudget::Off),
            ("0.5", MachineBudget::Fraction(0.5)),
            ("1", MachineBudget::Fraction(1.0)),
            (".25", MachineBudget::Fraction(0.25)),
            ("64GiB", MachineBudget::Bytes(64 << 30)),
            ("512 MiB", MachineBudget::Bytes(512 << 20)),
            ("1.5tib", MachineBudget::Bytes(3 << 39)),
            ("4096B", MachineBudget::Bytes(4096)),
            ("8kib", MachineBudget::Bytes(8192)),
        ];
        for (text, want) in ok {
            assert_eq!(text.parse::<MachineBudget>(), Ok(want), "{text}");
        }
    }

    #[test]
    fn garbage_is_refused_with_the_reason() {
        let bad = [
            ("", "empty"),
            ("lots", "neither"),
            ("2", "fraction"),
            ("0", "fraction"),
            ("-0.5", "neither"),
            ("1e3", "neither"),
            ("64GB", "unknown unit"),
            ("64 gigs", "unknown unit"),
            ("GiB", "not a number"),
            ("1.2.3GiB", "not a number"),
            ("0B", "out of range"),
            ("99999999999TiB", "out of range"),
            ("nan", "neither"),
            ("inf", "neither"),
            ("0.5%", "neither"),
        ];
        for (text, why) in bad {
            let e = text.parse::<MachineBudget>().expect_err(text);
            assert!(e.problem.contains(why), "{text}: {}", e.problem);
        }
    }

    #[test]
    fn auto_never_limits_one_process_below_its_own_budget() {
        let node = 100 << 30;
        assert_eq!(
            MachineBudget::Auto.limit_for(node, 10 << 30),
            Some(50 << 30)
        );
        assert_eq!(
            MachineBudget::Auto.limit_for(node, 80 << 30),
            Some(80 << 30)
        );
        assert_eq!(
            MachineBudget::Fraction(0.25).limit_for(node, 80 << 30),
            Some(25 << 30)
        );
        assert_eq!(MachineBudget::Bytes(7).limit_for(node, 80 << 30), Some(7));
        assert_eq!(MachineBudget::Off.limit_for(node, 80 << 30), None);
    }

    proptest! {
        #[test]
        fn any_text_parses_or_fails_cleanly_and_values_round_trip(s in "\\PC{0,24}") {
            if let Ok(v) = s.parse::<MachineBudget>() {
                prop_assert_eq!(v.to_string().parse::<MachineBudget>(), Ok(v));
            }
        }
    }
}
