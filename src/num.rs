//! Numeric conversions in one place, each with the reason it keeps every
//! value that matters, so that the rest of the library needs no bare `as`
//! cast (clippy's `cast_*` lints are on for the workspace).
//!
//! Where a value can be out of range the caller uses `try_from` and says
//! what that means; the helpers here are for the conversions that are
//! right as they are:
//!
//! - `u64` to `usize`: numapin builds for 64-bit targets only (Linux on
//!   x86-64 and AArch64, where the GPUs are), asserted below at compile
//!   time, so a length, offset or count read as `u64` always fits;
//! - counts and byte totals to `f64` for rates, ratios and shares of
//!   memory: exact up to 2^53 (8 PiB), the nearest `f64` beyond, which no
//!   rate or share notices;
//! - an `f64` share or count back to `u64`: rounded toward zero and
//!   saturating, as Rust's float-to-integer conversion is;
//! - positions in lists held to a few thousand entries (GPUs, CPUs and
//!   nodes by `topology::limits`, a slot pool's slots by its `MAX_SLOTS`)
//!   as `u32`;
//! - a C `char`, or an `i32` and a `u32`, whose bits are the value (a byte
//!   of a UUID, a status code, a SIMD lane).

use std::ffi::{c_char, c_int};

const _: () = assert!(
    usize::BITS == u64::BITS,
    "numapin builds for 64-bit targets only"
);

/// A `u64` length, offset or count as a `usize`: the same width.
#[allow(clippy::cast_possible_truncation)] // usize is 64 bits wide (asserted above)
pub(crate) const fn usize_from(v: u64) -> usize {
    v as usize
}

/// A count or byte total as an `f64`, for rates, ratios and shares: exact
/// up to 2^53, the nearest `f64` beyond.
#[allow(clippy::cast_precision_loss)] // what a rate or a share needs (module docs)
pub(crate) const fn f64_from(v: u64) -> f64 {
    v as f64
}

/// A `usize` count as an `f64` ([`f64_from`]).
#[cfg(feature = "measure")]
pub(crate) const fn f64_from_usize(v: usize) -> f64 {
    f64_from(v as u64)
}

/// `a / b` as an `f64` (bytes per unit, a fraction of a total); `b == 0`
/// gives infinity or NaN, as `f64` division does.
pub(crate) fn ratio(a: u64, b: u64) -> f64 {
    f64_from(a) / f64_from(b)
}

/// An `f64` share or count as a `u64`, rounded toward zero: negatives and
/// NaN give 0, values past `u64::MAX` give `u64::MAX`.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // saturates, as documented
pub(crate) const fn u64_saturating(v: f64) -> u64 {
    v as u64
}

/// `fraction` of `bytes`, rounded down (a node's budget share of its
/// memory): `share(64 << 30, 0.5) == 32 << 30`.
pub(crate) fn share(bytes: u64, fraction: f64) -> u64 {
    u64_saturating(f64_from(bytes) * fraction)
}

/// A position in, or the length of, a list held to a stated limit (GPUs,
/// CPUs and nodes by `topology::limits`, slots by `MAX_SLOTS`: thousands
/// at most) as a `u32`; past `u32::MAX`, which those limits rule out, it
/// saturates.
pub(crate) fn u32_saturating(v: usize) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// The byte a C `char` holds (signed on x86-64, unsigned on AArch64).
pub(crate) fn c_byte(c: c_char) -> u8 {
    u8::from_ne_bytes(c.to_ne_bytes())
}

/// The `u32` with the bits of an `i32` (a C status code as numapin reports
/// it).
pub(crate) fn u32_bits(c: c_int) -> u32 {
    u32::from_ne_bytes(c.to_ne_bytes())
}

/// The `i32` with the bits of a `u32` (the reverse of [`u32_bits`]).
pub(crate) fn i32_bits(v: u32) -> c_int {
    c_int::from_ne_bytes(v.to_ne_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_keep_the_values_they_promise() {
        assert_eq!(usize_from(u64::MAX), usize::MAX);
        assert_eq!(f64_from(1 << 53), 9_007_199_254_740_992.0);
        assert_eq!(ratio(3 << 29, 1 << 30), 1.5);
        assert_eq!(u64_saturating(-1.0), 0);
        assert_eq!(u64_saturating(f64::NAN), 0);
        assert_eq!(u64_saturating(1e30), u64::MAX);
        assert_eq!(u64_saturating(2.9), 2);
        assert_eq!(share(64 << 30, 0.5), 32 << 30);
        assert_eq!(share(u64::MAX, 2.0), u64::MAX);
        assert_eq!(u32_saturating(7), 7);
        assert_eq!(u32_saturating(usize::MAX), u32::MAX);
        assert_eq!(c_byte(c_char::from_ne_bytes([0xF3])), 0xF3);
        assert_eq!(u32_bits(-1), u32::MAX);
        assert_eq!(i32_bits(u32_bits(-7)), -7);
        assert_eq!(u32_bits(999), 999);
    }
}
