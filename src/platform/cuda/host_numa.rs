//! Pinned host memory the driver places on a NUMA node itself: the two
//! driver-side alternatives to numapin's own mmap + mbind + mlock +
//! `cuMemHostRegister` regions.
//!
//! - [`NumaAlloc`]: `cuMemCreate` with a `CU_MEM_LOCATION_TYPE_HOST_NUMA`
//!   location (CUDA 12.2+ drivers), reserved and mapped with
//!   `cuMemAddressReserve` / `cuMemMap`, made readable and writable from the
//!   host and from every GPU with `cuMemSetAccess`.
//! - [`host_alloc_on_node`]: `cuMemHostAlloc` while the calling thread's
//!   memory policy is `MPOL_BIND` to the node (the driver allocates and pins
//!   the pages inside the call, so the kernel places them by that policy),
//!   the thread's previous policy restored afterwards.

use cudarc::driver::sys;

use super::context::c_ordinal;
use super::memory::HostAlloc;
use super::{call_error, check, driver_version, ensure_context, CudaResult};
use sys::{CUdeviceptr, CUmemGenericAllocationHandle};

fn location(kind: sys::CUmemLocationType, id: i32) -> sys::CUmemLocation {
    sys::CUmemLocation { type_: kind, id }
}

/// A host-NUMA location: node numbers past `i32::MAX` are invalid values
/// to the driver.
fn host_numa(call: &'static str, node: u32) -> CudaResult<sys::CUmemLocation> {
    let id = i32::try_from(node)
        .map_err(|_| call_error(call, sys::CUresult::CUDA_ERROR_INVALID_VALUE))?;
    Ok(location(
        sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST_NUMA,
        id,
    ))
}

fn prop(call: &'static str, node: u32) -> CudaResult<sys::CUmemAllocationProp> {
    Ok(sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: sys::CUmemAllocationHandleType(0),
        location: host_numa(call, node)?,
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    })
}

/// The size `cuMemCreate` rounds host-NUMA allocations on `node` to
/// (`CU_MEM_ALLOC_GRANULARITY_RECOMMENDED`).
pub(crate) fn numa_granularity(node: u32) -> CudaResult<usize> {
    driver_version()?;
    ensure_context()?;
    let p = prop("cuMemGetAllocationGranularity", node)?;
    let mut g = 0usize;
    // SAFETY: g is an out-pointer; p is a fully initialised property.
    check("cuMemGetAllocationGranularity", unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut g,
            &p,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
        )
    })?;
    Ok(g.max(1))
}

/// Pinned host memory on one NUMA node from `cuMemCreate`, mapped for the
/// host and for every GPU; unmapped and released on drop.
#[derive(Debug)]
pub(crate) struct NumaAlloc {
    ptr: CUdeviceptr,
    len: usize,
    handle: CUmemGenericAllocationHandle,
    mapped: bool,
}

// SAFETY: the value owns the allocation and its mapping; the address is only
// an address. Access to the memory is coordinated by its user.
unsafe impl Send for NumaAlloc {}
// SAFETY: &NumaAlloc only exposes the address and length.
unsafe impl Sync for NumaAlloc {}

impl NumaAlloc {
    /// Allocates at least `len` bytes (rounded up to
    /// [`numa_granularity`]) on `node`, readable and writable from the host
    /// and from each of `devices` (CUDA ordinals).
    pub(crate) fn new(node: u32, len: usize, devices: &[u32]) -> CudaResult<NumaAlloc> {
        let g = numa_granularity(node)?;
        let len = len.max(1).div_ceil(g) * g;
        let p = prop("cuMemCreate", node)?;
        let mut handle: CUmemGenericAllocationHandle = 0;
        // SAFETY: handle is an out-pointer, p a valid property.
        check("cuMemCreate", unsafe {
            sys::cuMemCreate(&mut handle, len, &p, 0)
        })?;
        let mut a = NumaAlloc {
            ptr: 0,
            len,
            handle,
            mapped: false,
        };
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: ptr is an out-pointer; no fixed address is asked for.
        check("cuMemAddressReserve", unsafe {
            sys::cuMemAddressReserve(&mut ptr, len, g, 0, 0)
        })?;
        a.ptr = ptr;
        // SAFETY: the reservation and the allocation are both `len` bytes
        // and ours; Drop unmaps before releasing either.
        check("cuMemMap", unsafe { sys::cuMemMap(ptr, len, 0, handle, 0) })?;
        a.mapped = true;
        let rw = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        let mut descs = vec![sys::CUmemAccessDesc {
            // The id is ignored for a host-NUMA location.
            location: host_numa("cuMemSetAccess", node)?,
            flags: rw,
        }];
        for &d in devices {
            descs.push(sys::CUmemAccessDesc {
                location: location(
                    sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                    c_ordinal("cuMemSetAccess", d)?,
                ),
                flags: rw,
            });
        }
        // SAFETY: the range is fully mapped above; descs outlives the call.
        check("cuMemSetAccess", unsafe {
            sys::cuMemSetAccess(ptr, len, descs.as_ptr(), descs.len())
        })?;
        Ok(a)
    }

    /// The first byte, as a host pointer.
    pub(crate) fn ptr(&self) -> *mut u8 {
        crate::num::usize_from(self.ptr) as *mut u8
    }

    /// Bytes (a multiple of the granularity).
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for NumaAlloc {
    fn drop(&mut self) {
        // Failures cannot be reported from Drop; each step is attempted.
        // SAFETY: the mapping, reservation and handle are this value's own,
        // made in `new`, and no copy may still use them (the owner's rule).
        unsafe {
            if self.mapped {
                let _ = sys::cuMemUnmap(self.ptr, self.len);
            }
            if self.ptr != 0 {
                let _ = sys::cuMemAddressFree(self.ptr, self.len);
            }
            let _ = sys::cuMemRelease(self.handle);
        }
    }
}

/// `cuMemHostAlloc(PORTABLE | DEVICEMAP)` of `len` bytes with the calling
/// thread's memory policy set to `MPOL_BIND` to `node` for the call (and
/// restored after it, also on failure). The second value is why the policy
/// could not be set (`set_mempolicy` refused by a seccomp profile): the
/// memory was then placed wherever the kernel chose.
pub(crate) fn host_alloc_on_node(
    node: u32,
    len: usize,
) -> CudaResult<(HostAlloc, Option<std::io::Error>)> {
    use crate::platform::numa;
    let before = numa::get_mempolicy();
    let refused = numa::set_mempolicy(numa::Policy::Bind, &[node]).err();
    let r = HostAlloc::with_flags(
        len,
        sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP,
    );
    if refused.is_none() {
        let _ = match &before {
            Ok(saved) => numa::restore_mempolicy(saved),
            Err(_) => numa::set_default_mempolicy(),
        };
    }
    r.map(|a| (a, refused))
}
