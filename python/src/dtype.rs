//! Element types, named as torch and NumPy name them (`str(torch.float32)`
//! less the `torch.` prefix, `numpy.dtype(...).name`), with their DLPack
//! type codes.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyString;

use crate::dlpack::DLDataType;
use crate::errors::input_error;

/// DLPack `DLDataTypeCode` values (dlpack.h 1.x).
pub(crate) mod code {
    pub(crate) const INT: u8 = 0;
    pub(crate) const UINT: u8 = 1;
    pub(crate) const FLOAT: u8 = 2;
    pub(crate) const BFLOAT: u8 = 4;
    pub(crate) const COMPLEX: u8 = 5;
    pub(crate) const BOOL: u8 = 6;
    pub(crate) const FLOAT8_E4M3FN: u8 = 10;
    pub(crate) const FLOAT8_E4M3FNUZ: u8 = 11;
    pub(crate) const FLOAT8_E5M2: u8 = 12;
    pub(crate) const FLOAT8_E5M2FNUZ: u8 = 13;
    pub(crate) const FLOAT8_E8M0FNU: u8 = 14;
}

/// One supported element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DType {
    pub(crate) name: &'static str,
    pub(crate) code: u8,
    pub(crate) bits: u8,
}

impl DType {
    pub(crate) fn itemsize(self) -> usize {
        usize::from(self.bits) / 8
    }

    pub(crate) fn dl(self) -> DLDataType {
        DLDataType {
            code: self.code,
            bits: self.bits,
            lanes: 1,
        }
    }
}

const fn d(name: &'static str, code: u8, bits: u8) -> DType {
    DType { name, code, bits }
}

/// Every dtype `empty` accepts. Aliases (`float` -> `float32`, `half`, ...)
/// are resolved on the Python side by torch/NumPy before they reach here.
pub(crate) const ALL: &[DType] = &[
    d("bool", code::BOOL, 8),
    d("uint8", code::UINT, 8),
    d("int8", code::INT, 8),
    d("uint16", code::UINT, 16),
    d("int16", code::INT, 16),
    d("uint32", code::UINT, 32),
    d("int32", code::INT, 32),
    d("uint64", code::UINT, 64),
    d("int64", code::INT, 64),
    d("float16", code::FLOAT, 16),
    d("bfloat16", code::BFLOAT, 16),
    d("float32", code::FLOAT, 32),
    d("float64", code::FLOAT, 64),
    d("complex32", code::COMPLEX, 32),
    d("complex64", code::COMPLEX, 64),
    d("complex128", code::COMPLEX, 128),
    d("float8_e4m3fn", code::FLOAT8_E4M3FN, 8),
    d("float8_e4m3fnuz", code::FLOAT8_E4M3FNUZ, 8),
    d("float8_e5m2", code::FLOAT8_E5M2, 8),
    d("float8_e5m2fnuz", code::FLOAT8_E5M2FNUZ, 8),
    d("float8_e8m0fnu", code::FLOAT8_E8M0FNU, 8),
];

pub(crate) fn by_name(name: &str) -> Option<DType> {
    ALL.iter().copied().find(|t| t.name == name)
}

/// The names `by_name` accepts, in table order.
pub(crate) fn names() -> Vec<&'static str> {
    ALL.iter().map(|t| t.name).collect()
}

/// The dtype called `name`, or an `InputError` listing the ones there are.
pub(crate) fn of(py: Python<'_>, name: &str) -> PyResult<DType> {
    by_name(name).ok_or_else(|| {
        input_error(
            py,
            format!("dtype {name:?} is not one numapin hands out"),
            format!("use one of {}", names().join(", ")),
        )
    })
}

/// A `dtype` argument: the name of one numapin hands out.
impl<'py> FromPyObject<'_, 'py> for DType {
    type Error = PyErr;

    fn extract(obj: Borrowed<'_, 'py, PyAny>) -> PyResult<Self> {
        match obj.cast::<PyString>() {
            Ok(name) => of(obj.py(), &name.to_cow()?),
            Err(_) => Err(PyTypeError::new_err(format!(
                "dtype={} is not a dtype name\n  fix: pass one of {}",
                obj.repr()?,
                names().join(", ")
            ))),
        }
    }
}

/// Names of the dtypes numapin hands out.
#[pyfunction]
pub(crate) fn dtypes() -> Vec<&'static str> {
    names()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_sizes_whole_bytes() {
        for (i, a) in ALL.iter().enumerate() {
            assert_eq!(a.bits % 8, 0);
            assert!(ALL[i + 1..].iter().all(|b| b.name != a.name));
        }
        assert_eq!(by_name("bfloat16").expect("bf16").itemsize(), 2);
        assert!(by_name("float").is_none());
    }
}
