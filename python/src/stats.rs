//! The runtime's counters (`numapin.stats()`) and giving empty regions
//! back (`numapin.trim()`).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::runtime::rt;

/// Per-node counters of the runtime (made now if it was not yet), as a
/// list of dicts.
#[pyfunction]
pub(crate) fn stats<'py>(py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
    let rt = rt(py)?;
    let stats = py.detach(|| rt.stats());
    let json = py.import("json")?;
    stats
        .iter()
        .map(|s| {
            let text =
                serde_json::to_string(s).map_err(|e| PyValueError::new_err(e.to_string()))?;
            json.call_method1("loads", (text,))?
                .cast_into::<PyDict>()
                .map_err(Into::into)
        })
        .collect()
}

/// Gives every empty region back to the system; returns the bytes still
/// reserved.
#[pyfunction]
pub(crate) fn trim(py: Python<'_>) -> PyResult<u64> {
    let rt = rt(py)?;
    Ok(py.detach(|| rt.trim()))
}
