//! DLPack export of a Rust-owned host buffer.
//!
//! Layouts follow dlpack.h 1.x (torch 2.11 ships 1.3). Both capsule kinds are
//! produced: `dltensor_versioned` (`DLManagedTensorVersioned`, asked for by
//! `max_version >= (1, 0)`, which torch 2.11 and NumPy >= 2.1 pass) and the
//! legacy `dltensor` (`DLManagedTensor`) for older consumers.
//!
//! Ownership: every export boxes an `Export` holding its own
//! `Arc<Memory>` clone plus the shape/strides arrays the `DLTensor`
//! points into. The consumer's deleter (or the capsule destructor, if the
//! capsule was never consumed) frees that box, dropping the `Arc`; the buffer
//! goes back when the last `Arc` goes. The deleter is plain Rust: it never
//! touches Python, so it is sound on any thread with or without the GIL
//! (torch runs it wherever the last storage reference dies, without the GIL).

use std::ffi::{c_void, CStr};
use std::ptr::NonNull;
use std::sync::Arc;

use crate::memory::Memory;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DLDevice {
    pub(crate) device_type: i32,
    pub(crate) device_id: i32,
}

pub(crate) const KDL_CPU: i32 = 1;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DLDataType {
    pub(crate) code: u8,
    pub(crate) bits: u8,
    pub(crate) lanes: u16,
}

#[repr(C)]
#[derive(Debug)]
pub(crate) struct DLTensor {
    pub(crate) data: *mut c_void,
    pub(crate) device: DLDevice,
    pub(crate) ndim: i32,
    pub(crate) dtype: DLDataType,
    pub(crate) shape: *mut i64,
    pub(crate) strides: *mut i64,
    pub(crate) byte_offset: u64,
}

#[repr(C)]
pub(crate) struct DLManagedTensor {
    pub(crate) dl_tensor: DLTensor,
    pub(crate) manager_ctx: *mut c_void,
    pub(crate) deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct DLPackVersion {
    pub(crate) major: u32,
    pub(crate) minor: u32,
}

/// The version written into versioned exports: the ABI this file implements.
pub(crate) const DLPACK_VERSION: DLPackVersion = DLPackVersion { major: 1, minor: 0 };
pub(crate) const FLAG_IS_COPIED: u64 = 1 << 1;

#[repr(C)]
pub(crate) struct DLManagedTensorVersioned {
    pub(crate) version: DLPackVersion,
    pub(crate) manager_ctx: *mut c_void,
    pub(crate) deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    pub(crate) flags: u64,
    pub(crate) dl_tensor: DLTensor,
}

pub(crate) const CAPSULE: &CStr = c"dltensor";
pub(crate) const CAPSULE_VERSIONED: &CStr = c"dltensor_versioned";

/// What one export owns. `#[repr(C)]` with the managed tensor first, so the
/// managed-tensor pointer handed out is also the `Export` pointer.
#[repr(C)]
struct Export<M> {
    managed: M,
    shape: Box<[i64]>,
    strides: Box<[i64]>,
    _owner: Arc<Memory>,
}

/// The tensor description an export is made from.
pub(crate) struct TensorDesc<'a> {
    pub(crate) owner: &'a Arc<Memory>,
    pub(crate) byte_offset: u64,
    pub(crate) dtype: DLDataType,
    pub(crate) shape: &'a [i64],
    /// In elements, as DLPack wants them.
    pub(crate) strides: &'a [i64],
}

impl TensorDesc<'_> {
    fn dl_tensor(&self, shape: &mut [i64], strides: &mut [i64]) -> DLTensor {
        DLTensor {
            data: self.owner.as_ptr().cast(),
            device: DLDevice {
                device_type: KDL_CPU,
                device_id: 0,
            },
            ndim: i32::try_from(shape.len()).expect("ndim fits i32"),
            dtype: self.dtype,
            shape: shape.as_mut_ptr(),
            strides: strides.as_mut_ptr(),
            byte_offset: self.byte_offset,
        }
    }
}

unsafe extern "C" fn delete_legacy(m: *mut DLManagedTensor) {
    if m.is_null() {
        return;
    }
    // SAFETY: `m` came from `export_legacy`, whose `manager_ctx` is the
    // `Box<Export<DLManagedTensor>>` leaked there; DLPack calls the deleter
    // exactly once, so the box is reclaimed exactly once. Dropping it only
    // frees Rust memory and an `Arc`, which needs no GIL.
    unsafe {
        drop(Box::from_raw(
            (*m).manager_ctx.cast::<Export<DLManagedTensor>>(),
        ))
    };
}

unsafe extern "C" fn delete_versioned(m: *mut DLManagedTensorVersioned) {
    if m.is_null() {
        return;
    }
    // SAFETY: as in `delete_legacy`, for the box leaked by `export_versioned`.
    unsafe {
        drop(Box::from_raw(
            (*m).manager_ctx.cast::<Export<DLManagedTensorVersioned>>(),
        ))
    };
}

/// Builds a legacy managed tensor; the caller owns it until its deleter runs.
pub(crate) fn export_legacy(desc: &TensorDesc<'_>) -> NonNull<DLManagedTensor> {
    let mut shape: Box<[i64]> = desc.shape.into();
    let mut strides: Box<[i64]> = desc.strides.into();
    let dl_tensor = desc.dl_tensor(&mut shape, &mut strides);
    // The boxed slices' heap storage does not move when the box moves below.
    let raw = Box::into_raw(Box::new(Export {
        managed: DLManagedTensor {
            dl_tensor,
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_legacy),
        },
        shape,
        strides,
        _owner: Arc::clone(desc.owner),
    }));
    // SAFETY: `raw` is a fresh, valid, uniquely owned allocation.
    unsafe { (*raw).managed.manager_ctx = raw.cast() };
    // SAFETY: `managed` is the first field of a `#[repr(C)]` struct, so the
    // pointer is non-null and points at the managed tensor.
    unsafe { NonNull::new_unchecked(raw.cast::<DLManagedTensor>()) }
}

/// Builds a versioned managed tensor; the caller owns it until its deleter runs.
pub(crate) fn export_versioned(
    desc: &TensorDesc<'_>,
    flags: u64,
) -> NonNull<DLManagedTensorVersioned> {
    let mut shape: Box<[i64]> = desc.shape.into();
    let mut strides: Box<[i64]> = desc.strides.into();
    let dl_tensor = desc.dl_tensor(&mut shape, &mut strides);
    let raw = Box::into_raw(Box::new(Export {
        managed: DLManagedTensorVersioned {
            version: DLPACK_VERSION,
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_versioned),
            flags,
            dl_tensor,
        },
        shape,
        strides,
        _owner: Arc::clone(desc.owner),
    }));
    // SAFETY: `raw` is a fresh, valid, uniquely owned allocation.
    unsafe { (*raw).managed.manager_ctx = raw.cast() };
    // SAFETY: as in `export_legacy`.
    unsafe { NonNull::new_unchecked(raw.cast::<DLManagedTensorVersioned>()) }
}

/// Capsule destructor for `dltensor`: frees the export only if no consumer
/// took it (a consumer renames the capsule to `used_dltensor`).
unsafe extern "C" fn capsule_destructor_legacy(capsule: *mut ffi::PyObject) {
    // SAFETY: called by CPython with the GIL held on a live capsule.
    // `PyCapsule_IsValid` never sets an exception (so any exception in flight
    // is left untouched, as the DLPack spec requires), and when it returns 1
    // `PyCapsule_GetPointer` with the same name succeeds and yields the
    // pointer made by `export_legacy`, still unconsumed.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, CAPSULE.as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(capsule, CAPSULE.as_ptr()).cast::<DLManagedTensor>();
            if let Some(del) = (*m).deleter {
                del(m);
            }
        }
    }
}

/// Capsule destructor for `dltensor_versioned`; see the legacy one.
unsafe extern "C" fn capsule_destructor_versioned(capsule: *mut ffi::PyObject) {
    // SAFETY: as in `capsule_destructor_legacy`, for `export_versioned`.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, CAPSULE_VERSIONED.as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(capsule, CAPSULE_VERSIONED.as_ptr())
                .cast::<DLManagedTensorVersioned>();
            if let Some(del) = (*m).deleter {
                del(m);
            }
        }
    }
}

/// Wraps an export in a `dltensor` / `dltensor_versioned` capsule.
pub(crate) fn to_capsule<'py>(
    py: Python<'py>,
    desc: &TensorDesc<'_>,
    versioned: bool,
    flags: u64,
) -> PyResult<Bound<'py, PyCapsule>> {
    if versioned {
        let m = export_versioned(desc, flags);
        // SAFETY: `m` stays valid until its deleter runs, which only the
        // capsule destructor (unconsumed) or the consumer (consumed) does.
        let cap = unsafe {
            PyCapsule::new_with_pointer_and_destructor(
                py,
                m.cast(),
                CAPSULE_VERSIONED,
                Some(capsule_destructor_versioned),
            )
        };
        if cap.is_err() {
            // SAFETY: no capsule owns `m`, so it is still ours to delete.
            unsafe { delete_versioned(m.as_ptr()) };
        }
        cap
    } else {
        let m = export_legacy(desc);
        // SAFETY: as above.
        let cap = unsafe {
            PyCapsule::new_with_pointer_and_destructor(
                py,
                m.cast(),
                CAPSULE,
                Some(capsule_destructor_legacy),
            )
        };
        if cap.is_err() {
            // SAFETY: no capsule owns `m`, so it is still ours to delete.
            unsafe { delete_legacy(m.as_ptr()) };
        }
        cap
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_dlpack_h() {
        // Sizes and offsets from dlpack.h on LP64.
        assert_eq!(std::mem::size_of::<DLTensor>(), 48);
        assert_eq!(std::mem::offset_of!(DLTensor, shape), 24);
        assert_eq!(std::mem::size_of::<DLManagedTensor>(), 64);
        assert_eq!(std::mem::offset_of!(DLManagedTensorVersioned, flags), 24);
        assert_eq!(
            std::mem::offset_of!(DLManagedTensorVersioned, dl_tensor),
            32
        );
    }

    #[test]
    fn deleter_releases_on_a_thread_without_python() {
        let owner = Arc::new(Memory::heap(64));
        let desc = TensorDesc {
            owner: &owner,
            byte_offset: 0,
            dtype: DLDataType {
                code: 2,
                bits: 32,
                lanes: 1,
            },
            shape: &[4, 4],
            strides: &[4, 1],
        };
        let m = export_versioned(&desc, 0);
        assert_eq!(Arc::strong_count(&owner), 2);
        let addr = m.as_ptr() as usize;
        std::thread::spawn(move || {
            let m = addr as *mut DLManagedTensorVersioned;
            // SAFETY: `m` is an unconsumed export; deleting it once is the contract.
            unsafe { ((*m).deleter.expect("deleter set"))(m) };
        })
        .join()
        .expect("deleter thread panicked");
        assert_eq!(Arc::strong_count(&owner), 1);
    }
}
