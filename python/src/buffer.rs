//! `PinnedBuffer`: host memory numapin owns ([`Memory`]), viewed as a
//! C-contiguous tensor of a dtype and shape, exported to torch and NumPy
//! with DLPack. The memory lives until this object and every tensor or
//! array exported from it (and their views) are gone.

use std::sync::Arc;

use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyCapsule, PyTuple};

use crate::dlpack::{self, TensorDesc, FLAG_IS_COPIED, KDL_CPU};
use crate::dtype::DType;
use crate::errors::{self, input_error};
use crate::lent;
use crate::memory::Memory;

/// A numapin-owned host buffer viewed as a tensor of `dtype` and `shape`.
/// The memory lives until this object and every tensor or array exported
/// from it (and their views) are gone.
#[pyclass(frozen, module = "numapin._numapin", name = "PinnedBuffer")]
pub(crate) struct PinnedBuffer {
    mem: Arc<Memory>,
    dtype: DType,
    shape: Vec<i64>,
    /// In elements (DLPack convention).
    strides: Vec<i64>,
}

fn contiguous_strides(shape: &[i64]) -> Vec<i64> {
    let mut strides = vec![0i64; shape.len()];
    let mut step = 1i64;
    for (s, &n) in strides.iter_mut().zip(shape).rev() {
        *s = step;
        step = step.saturating_mul(n.max(1));
    }
    strides
}

/// Most dimensions a buffer may have (DLPack allows 2^31 - 1; the Python
/// half's `MAX_RANK`).
pub(crate) const MAX_RANK: usize = 65536;

pub(crate) fn nbytes_of(py: Python<'_>, shape: &[i64], dtype: DType) -> PyResult<usize> {
    if shape.len() > MAX_RANK {
        return Err(input_error(
            py,
            format!(
                "shape of {} dimensions: more than numapin hands out ({MAX_RANK})",
                shape.len()
            ),
            "use fewer dimensions (reshape)",
        ));
    }
    let mut n = dtype.itemsize();
    for &d in shape {
        let d = usize::try_from(d).map_err(|_| {
            input_error(
                py,
                format!("shape {shape:?}: dimension {d} is negative"),
                "give sizes of zero or more",
            )
        })?;
        n = n.checked_mul(d).ok_or_else(|| {
            input_error(
                py,
                format!(
                    "shape {shape:?} of {} holds more bytes than an address space",
                    dtype.name
                ),
                "ask for a smaller tensor",
            )
        })?;
    }
    Ok(n)
}

impl PinnedBuffer {
    /// A view of `mem` as `shape` of `dtype`, whose bytes must be exactly
    /// `mem`'s length.
    pub(crate) fn checked(
        py: Python<'_>,
        mem: Memory,
        dtype: DType,
        shape: Vec<i64>,
    ) -> PyResult<Self> {
        if nbytes_of(py, &shape, dtype)? != mem.len() {
            return Err(PyValueError::new_err(format!(
                "{} bytes do not make a {shape:?} {} tensor",
                mem.len(),
                dtype.name
            )));
        }
        Ok(Self::new(mem, dtype, shape))
    }

    pub(crate) fn new(mem: Memory, dtype: DType, shape: Vec<i64>) -> Self {
        let strides = contiguous_strides(&shape);
        let mem = Arc::new(mem);
        if let Some(what) = mem.lent_as() {
            // Forgotten by the memory's Drop, at the same address.
            let key = Arc::as_ptr(&mem) as usize;
            lent::note(key, mem.as_ptr() as usize, mem.len(), what);
        }
        PinnedBuffer {
            mem,
            dtype,
            shape,
            strides,
        }
    }
}

#[pymethods]
impl PinnedBuffer {
    /// Bytes of the tensor.
    #[getter]
    fn nbytes(&self) -> usize {
        self.mem.len()
    }

    /// The shape.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.shape)
    }

    /// Strides in elements.
    #[getter]
    fn strides<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.strides)
    }

    /// The dtype's name (`float32`, `bfloat16`, ...).
    #[getter]
    fn dtype(&self) -> &'static str {
        self.dtype.name
    }

    /// Host address of the first byte.
    #[getter]
    fn address(&self) -> usize {
        self.mem.as_ptr() as usize
    }

    /// The NUMA node the memory is on (`None` for plain heap memory).
    #[getter]
    fn node(&self) -> Option<u32> {
        self.mem.node()
    }

    /// Whether the memory is registered with CUDA (page-locked for DMA).
    #[getter]
    fn registered(&self) -> bool {
        self.mem.registered()
    }

    /// How many Rust owners the memory has: this object plus one per live
    /// export (a consumed or unconsumed DLPack capsule). For tests.
    #[getter]
    fn _owners(&self) -> usize {
        Arc::strong_count(&self.mem)
    }

    fn __repr__(&self) -> String {
        format!(
            "PinnedBuffer(shape={:?}, dtype={}, nbytes={}, node={:?}, registered={})",
            self.shape,
            self.dtype.name,
            self.mem.len(),
            self.mem.node(),
            self.mem.registered(),
        )
    }

    /// DLPack producer (array API 2023.12 signature). Returns a
    /// `dltensor_versioned` capsule when the consumer passes
    /// `max_version >= (1, 0)`, else a legacy `dltensor` capsule.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        if !self.mem.mapped_here() {
            return Err(errors::forked(py, "this pinned buffer"));
        }
        if let Some(s) = stream {
            // For CPU data the only meaningful stream is "none given".
            if !s.is_none() && s.extract::<i64>().ok() != Some(-1) {
                return Err(PyBufferError::new_err("stream must be None for CPU memory"));
            }
        }
        if let Some(dev) = dl_device {
            if dev != (KDL_CPU, 0) {
                return Err(PyBufferError::new_err(format!(
                    "cannot export host memory to DLPack device {dev:?} without a copy"
                )));
            }
        }
        let versioned = max_version.is_some_and(|(major, _)| major >= 1);
        let (owner, flags) = if copy == Some(true) {
            let fresh = Arc::new(Memory::heap(self.mem.len()));
            let (src, dst, len) = (
                self.mem.as_ptr() as usize,
                fresh.as_ptr() as usize,
                self.mem.len(),
            );
            py.detach(|| {
                // SAFETY: both buffers are `len` bytes, live (owned by `self`
                // and `fresh` for the whole call) and distinct allocations.
                unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, len) }
            });
            (fresh, FLAG_IS_COPIED)
        } else {
            (Arc::clone(&self.mem), 0)
        };
        let desc = TensorDesc {
            owner: &owner,
            byte_offset: 0,
            dtype: self.dtype.dl(),
            shape: &self.shape,
            strides: &self.strides,
        };
        dlpack::to_capsule(py, &desc, versioned, flags)
    }

    fn __dlpack_device__(&self) -> (i32, i32) {
        (KDL_CPU, 0)
    }

    /// A copy of the bytes, read from the Rust side (GIL released). For
    /// tests.
    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        if !self.mem.mapped_here() {
            return Err(errors::forked(py, "this pinned buffer"));
        }
        let (ptr, len) = (self.mem.as_ptr() as usize, self.mem.len());
        let v = py.detach(|| {
            // SAFETY: `ptr..ptr+len` is the live memory owned by `self`,
            // which outlives this call; it is only read for the copy.
            unsafe { std::slice::from_raw_parts(ptr as *const u8, len) }.to_vec()
        });
        Ok(PyBytes::new(py, &v))
    }
}

/// Test hook: exports `buf` as a consumer would take it, then runs the
/// DLPack deleter on a fresh OS thread that is not attached to Python, while
/// this thread keeps the GIL. Returns the owner count after the join. If the
/// deleter needed the GIL this would deadlock.
#[pyfunction]
pub(crate) fn _delete_export_on_foreign_thread(buf: &PinnedBuffer) -> usize {
    let desc = TensorDesc {
        owner: &buf.mem,
        byte_offset: 0,
        dtype: buf.dtype.dl(),
        shape: &buf.shape,
        strides: &buf.strides,
    };
    let m = dlpack::export_versioned(&desc, 0).as_ptr() as usize;
    let joined = std::thread::spawn(move || {
        let m = m as *mut dlpack::DLManagedTensorVersioned;
        // SAFETY: `m` is a fresh export nobody else holds; its deleter is
        // called exactly once, here.
        if let Some(del) = unsafe { (*m).deleter } {
            // SAFETY: as above.
            unsafe { del(m) };
        }
    })
    .join();
    debug_assert!(joined.is_ok());
    Arc::strong_count(&buf.mem)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strides_are_c_order() {
        assert_eq!(contiguous_strides(&[2, 3, 4]), vec![12, 4, 1]);
        assert_eq!(contiguous_strides(&[]), Vec::<i64>::new());
        assert_eq!(contiguous_strides(&[0, 3]), vec![3, 1]);
    }
}
