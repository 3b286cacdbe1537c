//! `SharedBuffer`: the Python face of [`numapin::shared`]'s shared pinned
//! memory (made by one process, attached by name by the others; views are
//! tensors or arrays over it).

use std::sync::Arc;
use std::time::Duration;

use numapin::shared::{AttachedRegion, SharedError, SharedRegion};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::buffer::{nbytes_of, PinnedBuffer};
use crate::dtype::DType;
use crate::errors::{self, input_error, to_py};
use crate::memory::{Held, Here, Memory};
use crate::place;
use crate::runtime::rt;

fn shared_err(py: Python<'_>, e: SharedError) -> PyErr {
    to_py(py, &numapin::Error::from(e))
}

/// Pinned memory several processes of a job map (see `numapin.SharedBuffer`).
#[pyclass(frozen, module = "numapin._numapin", name = "SharedBuffer")]
pub(crate) struct SharedBuffer {
    /// Forgotten, not dropped, in a forked child ([`Here`]).
    held: Arc<Here<Held>>,
    name: String,
}

#[pymethods]
impl SharedBuffer {
    /// Makes `nbytes` of shared pinned memory called `name` on the node of
    /// CUDA device `gpu` (or NUMA node `node`, or the calling thread's).
    #[staticmethod]
    #[pyo3(signature = (name, nbytes, *, gpu=None, node=None))]
    fn create(
        py: Python<'_>,
        name: &str,
        nbytes: usize,
        gpu: Option<u32>,
        node: Option<u32>,
    ) -> PyResult<SharedBuffer> {
        let rt = rt(py)?;
        let target = place::target(gpu, node);
        let r = py
            .detach(|| SharedRegion::create(&rt, target, nbytes, name))
            .map_err(|e| shared_err(py, e))?;
        Ok(SharedBuffer {
            held: Arc::new(Here::new(Held::Made(Box::new(r)))),
            name: name.into(),
        })
    }

    /// Maps the shared memory called `name` (or at a path from `.path`),
    /// waiting up to `timeout` seconds for another process to make it.
    #[staticmethod]
    #[pyo3(signature = (name, *, timeout=0.0))]
    fn attach(py: Python<'_>, name: &str, timeout: f64) -> PyResult<SharedBuffer> {
        if !(0.0..=86_400.0).contains(&timeout) {
            return Err(PyValueError::new_err(format!(
                "timeout={timeout}: give 0 to 86400 seconds"
            )));
        }
        let wait = Duration::from_secs_f64(timeout);
        let a = py
            .detach(|| AttachedRegion::attach(name, wait))
            .map_err(|e| shared_err(py, e))?;
        Ok(SharedBuffer {
            held: Arc::new(Here::new(Held::Attached(a))),
            name: name.into(),
        })
    }

    /// The name it was made or attached by.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// Bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.held.len()
    }

    /// The NUMA node its pages are on.
    #[getter]
    fn node(&self) -> u32 {
        self.held.node()
    }

    /// Whether it is registered with CUDA in this process.
    #[getter]
    fn registered(&self) -> bool {
        self.held.registered()
    }

    /// Whether this process made it (and counts it in its budget).
    #[getter]
    fn owner(&self) -> bool {
        matches!(**self.held, Held::Made(_))
    }

    /// The path other processes of the same user may attach by.
    #[getter]
    fn path(&self) -> Option<String> {
        match &**self.held {
            Held::Made(r) => Some(r.path().display().to_string()),
            Held::Attached(a) => Some(a.path().display().to_string()),
        }
    }

    /// A `dtype` view of shape `shape` (default: 1-D, as many elements as
    /// fit) from byte `offset` on; it keeps the memory mapped while it
    /// lives.
    #[pyo3(signature = (dtype, shape=None, *, offset=0))]
    fn view(
        &self,
        py: Python<'_>,
        dtype: DType,
        shape: Option<Vec<i64>>,
        offset: usize,
    ) -> PyResult<PinnedBuffer> {
        if !self.held.here() {
            return Err(errors::forked(py, "this SharedBuffer"));
        }
        let len = self.held.len();
        let room = len.checked_sub(offset).ok_or_else(|| {
            input_error(
                py,
                format!("offset {offset} is past the {len}-byte shared buffer"),
                "give an offset inside the buffer",
            )
        })?;
        let shape = match shape {
            Some(s) => s,
            None => vec![i64::try_from(room / dtype.itemsize()).unwrap_or(i64::MAX)],
        };
        let nbytes = nbytes_of(py, &shape, dtype)?;
        if nbytes > room {
            return Err(input_error(
                py,
                format!(
                    "a {shape:?} {} view ({nbytes} bytes) at offset {offset} runs past the {len}-byte shared buffer",
                    dtype.name
                ),
                "view a range inside the buffer (offset + size <= nbytes)",
            ));
        }
        let mem = Memory::Shared {
            held: self.held.clone(),
            ptr: self.held.ptr().wrapping_add(offset),
            len: nbytes,
        };
        PinnedBuffer::checked(py, mem, dtype, shape)
    }

    fn __repr__(&self) -> String {
        format!(
            "SharedBuffer(name={:?}, nbytes={}, node={}, owner={}, registered={})",
            self.name,
            self.held.len(),
            self.held.node(),
            self.owner(),
            self.held.registered()
        )
    }
}
