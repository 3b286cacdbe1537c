//! How things are reported to people: errors' [`ErrorKind`], the error
//! parts the domains share ([`SystemError`], [`EnvError`]) and
//! [`with_causes`], and plain-text tables ([`table`]). A leaf module: every
//! domain uses it, and it uses none of them.

mod parts;
pub(crate) mod table;

pub use parts::{BoxError, EnvError, SystemError};
use std::fmt::Write as _;

/// What kind of failure an error is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Something the caller gave cannot be used: a file, an environment
    /// variable, a configuration value, a GPU or node that is not there.
    Input,
    /// A pinned-memory budget is spent (buffers must be freed first, or the
    /// budget raised).
    Budget,
    /// The system refused for want of a permission or a limit: the memlock
    /// limit, a system call blocked by a seccomp profile, a cpuset.
    Permission,
    /// The system, hwloc or the CUDA driver failed.
    System,
}

/// The message of `e` followed by each of its causes (`message: cause:
/// cause`), the way a person reads it in one line.
pub fn with_causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        // A wrapper that repeats its cause's text adds nothing.
        if !text.is_empty() && !s.ends_with(&text) {
            let _ = write!(s, ": {text}");
        }
        cause = c.source();
    }
    s
}

/// Longest value (in characters) an error message quotes whole.
pub(crate) const MAX_QUOTED: usize = 120;

/// `text` as a message shows it: whole when it is short, otherwise its start
/// and its size (`xxxx... (100000 bytes)`), so that a hostile value (an
/// environment variable, a flag) cannot make a message megabytes long.
pub fn shorten(text: &str) -> String {
    match text.char_indices().nth(MAX_QUOTED) {
        Some((i, _)) => format!("{}... ({} bytes)", &text[..i], text.len()),
        None => text.to_string(),
    }
}

/// `text` quoted (Rust string syntax, so control characters are escaped)
/// and shortened as [`shorten`] does.
pub fn quote(text: &str) -> String {
    match text.char_indices().nth(MAX_QUOTED) {
        Some((i, _)) => format!("{:?}... ({} bytes)", &text[..i], text.len()),
        None => format!("{text:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_values_are_shortened() {
        let long = "x".repeat(100_000);
        assert!(shorten(&long).len() < 200);
        assert!(shorten(&long).ends_with("(100000 bytes)"));
        assert!(quote(&long).starts_with("\"xxx"));
        assert_eq!(quote("a\u{1b}b"), "\"a\\u{1b}b\"");
        assert_eq!(shorten("short"), "short");
    }
}
