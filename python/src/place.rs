//! `numapin.place`: the runtime's one placement ([`Runtime::place`]), for
//! the Python package and its DataLoader.

use numapin::runtime::Target;
use numapin::CudaOrdinal;
use pyo3::prelude::*;

use crate::errors::to_py;
use crate::runtime::rt;

/// The target of CUDA device `gpu`, of node `node` (which wins when both
/// are given), or of the calling thread.
pub(crate) fn target(gpu: Option<u32>, node: Option<u32>) -> Target {
    match (gpu, node) {
        (_, Some(n)) => Target::HostNode(n),
        (Some(g), None) => Target::Gpu(CudaOrdinal(g)),
        (None, None) => Target::Host,
    }
}

/// A placement as Python receives it: `(node, cpus, gpu index or None,
/// warnings)`.
type SiteTuple = (u32, Vec<u32>, Option<u32>, Vec<String>);

/// `(node, cpus, gpu index or None, warnings)` of the placement of
/// CUDA device `gpu`, or of `node`, or of the calling thread.
#[pyfunction]
#[pyo3(signature = (gpu=None, *, node=None))]
pub(crate) fn place(py: Python<'_>, gpu: Option<u32>, node: Option<u32>) -> PyResult<SiteTuple> {
    let rt = rt(py)?;
    let site = py
        .detach(|| rt.place(target(gpu, node)))
        .map_err(|e| to_py(py, &numapin::Error::from(e)))?;
    Ok((
        site.node,
        site.cpus.iter().collect(),
        site.gpu.map(|g| g.0),
        site.warnings,
    ))
}
