//! numapin's errors as Python exceptions.
//!
//! The classes live in `numapin/_errors.py` (so that they can also derive
//! from Python's own `ValueError`, `MemoryError` and `PermissionError`):
//! `Error` for system failures, `InputError` for bad input, `BudgetError`
//! when a node's pinned budget is spent, `LimitError` when a permission or
//! limit refused (the memlock limit, a system call blocked by a seccomp
//! profile). The message is the error with its causes; the fix is below it
//! and in the exception's `fix` attribute.

use numapin::ErrorKind;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

fn class_name(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::Input => "InputError",
        ErrorKind::Budget => "BudgetError",
        ErrorKind::Permission => "LimitError",
        _ => "Error",
    }
}

fn make(py: Python<'_>, class: &str, message: String, fix: Option<String>, kind: &str) -> PyErr {
    let text = match &fix {
        Some(f) => format!("{message}\n  fix: {f}"),
        None => message.clone(),
    };
    let build = || -> PyResult<PyErr> {
        let module = py.import("numapin._errors")?;
        let cls = module.getattr(class)?;
        let exc = cls.call1((text.clone(),))?;
        exc.setattr("fix", fix.clone())?;
        exc.setattr("kind", kind)?;
        Ok(PyErr::from_value(exc))
    };
    build().unwrap_or_else(|e| {
        // The package's Python half is missing (the extension imported on
        // its own): still raise, with the whole text.
        PyRuntimeError::new_err(format!("{text} (numapin._errors: {e})"))
    })
}

/// The exception for a numapin error.
pub(crate) fn to_py(py: Python<'_>, e: &numapin::Error) -> PyErr {
    let kind = e.kind();
    make(
        py,
        class_name(kind),
        numapin::error::with_causes(e),
        e.fix(),
        match kind {
            ErrorKind::Input => "input",
            ErrorKind::Budget => "budget",
            ErrorKind::Permission => "permission",
            _ => "system",
        },
    )
}

/// An `InputError` for an argument the Python caller gave.
pub(crate) fn input_error(
    py: Python<'_>,
    problem: impl Into<String>,
    fix: impl Into<String>,
) -> PyErr {
    make(py, "InputError", problem.into(), Some(fix.into()), "input")
}

/// The `numapin.Error` for memory a forked child inherited from the process
/// that made it (not mapped in the child).
pub(crate) fn forked(py: Python<'_>, what: &str) -> PyErr {
    make(
        py,
        "Error",
        format!(
            "{what} was made by the parent before this process forked; its pages are not mapped in the child (numapin's pinned memory is MADV_DONTFORK)"
        ),
        Some("make numapin memory in the child itself (numapin.empty, numapin.pin), or attach a SharedBuffer by name".into()),
        "system",
    )
}
