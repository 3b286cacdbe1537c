//! Command-line values the storage examples share (included with
//! `#[path]`: not an example of its own).

/// A size: bytes, or with a `K`, `M` or `G` suffix (powers of 1024).
pub(crate) fn size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (n, m) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 1 << 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    n.parse::<u64>()
        .map_err(|e| format!("{s}: {e}"))?
        .checked_mul(m)
        .ok_or(format!("{s}: too large"))
}

/// A comma-separated list of values that `f` reads.
pub(crate) fn list<T>(s: &str, f: impl Fn(&str) -> Result<T, String>) -> Result<Vec<T>, String> {
    s.split(',').map(|x| f(x.trim())).collect()
}
