//! Typed arguments: what a Python value must be to reach numapin, checked
//! as it is extracted (as pydantic-core types its options), so that each
//! error names the argument, the value given and what is accepted.
//!
//! A string option is a [`Choice`] of an enum ([`Choices`] lists its names
//! and what each means). A number is checked for its type (a bool is no
//! integer) and for the range it is read into; whether a value fits the
//! rest of a configuration is the library's to say
//! (`RuntimeConfig::check`), not this file's. A value is shown in an error
//! cut to [`SHOWN`] characters.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt, PyString};

use crate::errors::input_error;

/// The most characters of a value an error shows.
const SHOWN: usize = 60;

/// `text`, cut to [`SHOWN`] characters (`...` where it was cut).
fn shown(text: &str) -> String {
    match text.char_indices().nth(SHOWN) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text.to_string(),
    }
}

/// Each name of a string option, its value and what it means (`""` for
/// nothing to add).
pub(crate) type Names<T> = &'static [(&'static str, T, &'static str)];

/// The accepted names of a string option, and what each means.
pub(crate) trait Choices: Copy + 'static {
    /// The keyword it is given as (`huge_pages`).
    const ARG: &'static str;
    /// What one value is, after "is not" (`a huge page choice`).
    const WHAT: &'static str;
    /// Each name, its value and what it means.
    const NAMES: Names<Self>;

    /// The value called `name` (by default one of [`NAMES`](Self::NAMES);
    /// a type the library parses takes the library's other spellings too).
    fn parse(name: &str) -> Option<Self> {
        Self::NAMES
            .iter()
            .find(|(n, _, _)| *n == name)
            .map(|&(_, v, _)| v)
    }

    /// `use "a" (what a is), "b" or "c" (what c is)`.
    fn fix() -> String {
        let names: Vec<String> = Self::NAMES
            .iter()
            .map(|(n, _, what)| match *what {
                "" => format!("{n:?}"),
                what => format!("{n:?} ({what})"),
            })
            .collect();
        match names.split_last() {
            Some((last, [])) => format!("use {last}"),
            Some((last, rest)) => format!("use {} or {last}", rest.join(", ")),
            None => String::new(),
        }
    }
}

/// A string option's value: a `str` naming one of `T`'s [`Choices`]. Not a
/// string is a `TypeError`, an unknown name an `InputError`; both name the
/// argument, the value and the accepted names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Choice<T>(pub(crate) T);

impl<'py, T: Choices> FromPyObject<'_, 'py> for Choice<T> {
    type Error = PyErr;

    fn extract(obj: Borrowed<'_, 'py, PyAny>) -> PyResult<Self> {
        let Ok(s) = obj.cast::<PyString>() else {
            return Err(not_a(&obj, T::ARG, "a string", &T::fix()));
        };
        let name = s.to_cow()?;
        T::parse(&name).map(Choice).ok_or_else(|| {
            input_error(
                obj.py(),
                format!("{}={:?} is not {}", T::ARG, shown(&name), T::WHAT),
                T::fix(),
            )
        })
    }
}

/// `repr(obj)` (cut), or a stand-in when even that fails.
fn repr(obj: &Borrowed<'_, '_, PyAny>) -> String {
    obj.repr()
        .map_or_else(|_| "<unprintable>".into(), |r| shown(&r.to_string()))
}

/// The `TypeError` for `arg=obj`, which is not `what`.
fn not_a(obj: &Borrowed<'_, '_, PyAny>, arg: &str, what: &str, fix: &str) -> PyErr {
    let kind = obj
        .get_type()
        .fully_qualified_name()
        .map_or_else(|_| "?".into(), |n| n.to_string());
    PyTypeError::new_err(format!(
        "{arg}={} is not {what} ({kind})\n  fix: {fix}",
        repr(obj)
    ))
}

/// Whether `obj` is a Python or NumPy bool (which `__index__` would take as
/// 0 or 1).
pub(crate) fn is_bool(obj: &Borrowed<'_, '_, PyAny>) -> bool {
    obj.is_instance_of::<PyBool>()
        || obj
            .get_type()
            .name()
            .is_ok_and(|n| n == "bool_" || n == "bool")
}

/// `arg=obj`, a keyword with a default, as an integer from 0 to `hi`
/// (and in `T`): a Python, NumPy or torch integer (anything with
/// `__index__`) but a bool. A bool or a non-integer is a `TypeError`, an
/// integer out of range an `InputError`.
pub(crate) fn int<T: TryFrom<u64>>(
    obj: &Borrowed<'_, '_, PyAny>,
    arg: &str,
    hi: u64,
) -> PyResult<T> {
    let fix = format!("pass {arg} as a whole number from 0 to {hi}, or None for the default");
    if is_bool(obj) {
        return Err(PyTypeError::new_err(format!(
            "{arg}={} is a bool, not an integer\n  fix: {fix}",
            repr(obj)
        )));
    }
    let Ok(n) = obj.call_method0("__index__") else {
        return Err(not_a(obj, arg, "an integer", &fix));
    };
    let n = n.cast_into::<PyInt>()?;
    n.extract::<u64>()
        .ok()
        .filter(|v| *v <= hi)
        .and_then(|v| T::try_from(v).ok())
        .ok_or_else(|| {
            input_error(
                obj.py(),
                format!(
                    "{arg}={} is out of range (0 to {hi})",
                    shown(&n.to_string())
                ),
                fix,
            )
        })
}

/// `arg=obj` as a real number: a Python int or float (or a subclass, such
/// as NumPy's `float64`) but a bool, else a `TypeError`. Whether it is in
/// range is the caller's to check.
pub(crate) fn number(obj: &Borrowed<'_, '_, PyAny>, arg: &str, fix: &str) -> PyResult<f64> {
    if is_bool(obj) || !(obj.is_instance_of::<PyFloat>() || obj.is_instance_of::<PyInt>()) {
        return Err(not_a(obj, arg, "a number", fix));
    }
    // An int too large for a float is as far out of any range as infinity.
    Ok(obj.extract::<f64>().unwrap_or(f64::INFINITY))
}

/// `arg=obj` as a bool: `True` or `False` (not 0, 1 or a NumPy bool), else
/// a `TypeError`.
pub(crate) fn flag(obj: &Borrowed<'_, '_, PyAny>, arg: &str, fix: &str) -> PyResult<bool> {
    match obj.cast::<PyBool>() {
        Ok(b) => Ok(b.is_true()),
        Err(_) => Err(not_a(obj, arg, "a bool", fix)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Pick {
        A,
        B,
        C,
    }

    impl Choices for Pick {
        const ARG: &'static str = "pick";
        const WHAT: &'static str = "a pick";
        const NAMES: Names<Self> = &[
            ("a", Pick::A, "the first"),
            ("b", Pick::B, ""),
            ("c", Pick::C, "the last"),
        ];
    }

    #[test]
    fn a_fix_lists_every_name_with_what_it_means() {
        assert_eq!(Pick::fix(), r#"use "a" (the first), "b" or "c" (the last)"#);
        assert_eq!(Pick::parse("b"), Some(Pick::B));
        assert_eq!(Pick::parse("B"), None);
    }

    #[test]
    fn long_values_are_cut() {
        assert_eq!(shown("auto"), "auto");
        let long = "é".repeat(SHOWN + 5);
        assert_eq!(shown(&long), format!("{}...", "é".repeat(SHOWN)));
        assert_eq!(shown(&"x".repeat(SHOWN)), "x".repeat(SHOWN));
    }
}
