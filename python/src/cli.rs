//! The `numapin` command inside the wheel: `numapin.__main__` (the
//! package's `numapin` script and `python -m numapin`) hands its command
//! line to [`run_cli`], which runs numapin's own command-line tool,
//! [`numapin_cli::run`], in this process. Outputs, exit codes and `exec`
//! are therefore the Rust binary's.

use std::ffi::OsString;

use pyo3::prelude::*;

/// Runs the `numapin` command line with `args` (the program name first) in
/// this process, with the GIL released, and returns its exit code. The
/// caller sets SIGINT back to its default action first (see
/// [`numapin_cli::run`]); `exec` does not return when it succeeds.
#[pyfunction]
pub(crate) fn run_cli(py: Python<'_>, args: Vec<OsString>) -> i32 {
    py.detach(move || numapin_cli::run(args))
}
