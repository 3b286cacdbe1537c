//! Devices and contexts: ordinals to handles, primary contexts, attributes.

use std::sync::OnceLock;

use cudarc::driver::sys;

use super::{call_error, check, driver_version, CudaResult};
pub(crate) use sys::{CUcontext, CUdevice};

/// `ordinal` as the driver's `int`: one past `i32::MAX` names no device,
/// the driver's own answer for a number it does not know.
pub(crate) fn c_ordinal(call: &'static str, ordinal: u32) -> CudaResult<i32> {
    i32::try_from(ordinal).map_err(|_| call_error(call, sys::CUresult::CUDA_ERROR_INVALID_DEVICE))
}

/// The driver handle of ordinal `ordinal`.
pub(crate) fn device(ordinal: u32) -> CudaResult<CUdevice> {
    driver_version()?;
    let ordinal = c_ordinal("cuDeviceGet", ordinal)?;
    let mut dev = 0;
    // SAFETY: dev is a valid out-pointer; the driver is initialised.
    check("cuDeviceGet", unsafe {
        sys::cuDeviceGet(&mut dev, ordinal)
    })?;
    Ok(dev)
}

/// Makes ordinal `ordinal`'s primary context current on this thread
/// (retaining it once per process; primary contexts live until exit).
///
/// # Errors
///
/// [`CudaError::NoDriver`](crate::gpu::CudaError::NoDriver) without a usable driver (or with `NUMAPIN_NO_CUDA`
/// set), [`CudaError::Call`](crate::gpu::CudaError::Call) naming the driver call that failed, with its
/// `CUresult`. An ordinal past the devices this process sees is
/// `CUDA_ERROR_INVALID_DEVICE`.
pub fn set_device(ordinal: u32) -> CudaResult<CUcontext> {
    let ctx = primary_context(ordinal)?;
    // SAFETY: ctx is a retained primary context, valid for the process.
    check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx) })?;
    Ok(ctx)
}

/// Ordinal `ordinal`'s primary context, retained once per process (primary
/// contexts live until exit); does not make it current.
pub(crate) fn primary_context(ordinal: u32) -> CudaResult<CUcontext> {
    static CTXS: OnceLock<std::sync::Mutex<Vec<(u32, usize)>>> = OnceLock::new();
    let ctxs = CTXS.get_or_init(Default::default);
    let mut g = ctxs.lock().unwrap_or_else(|p| p.into_inner());
    let ctx = match g.iter().find(|(o, _)| *o == ordinal) {
        Some((_, c)) => *c as CUcontext,
        None => {
            let dev = device(ordinal)?;
            let mut ctx = std::ptr::null_mut();
            // SAFETY: ctx is a valid out-pointer; dev is a valid device.
            check("cuDevicePrimaryCtxRetain", unsafe {
                sys::cuDevicePrimaryCtxRetain(&mut ctx, dev)
            })?;
            g.push((ordinal, ctx as usize));
            ctx
        }
    };
    Ok(ctx)
}

/// Makes a context current on this thread until dropped, then restores the
/// one that was current before (`cuCtxPushCurrent` / `cuCtxPopCurrent`):
/// for work on a GPU from a thread that is not numapin's own, without
/// changing which context the caller had current.
///
/// Not `Send`: it must be dropped on the thread that made it.
#[derive(Debug)]
pub struct ContextGuard(std::marker::PhantomData<*const ()>);

impl ContextGuard {
    /// Pushes ordinal `ordinal`'s primary context.
    ///
    /// # Errors
    ///
    /// [`CudaError::NoDriver`](crate::gpu::CudaError::NoDriver) without a usable driver (or with
    /// `NUMAPIN_NO_CUDA` set), [`CudaError::Call`](crate::gpu::CudaError::Call) naming the driver call that
    /// failed, with its `CUresult`.
    pub fn push(ordinal: u32) -> CudaResult<ContextGuard> {
        Self::push_context(primary_context(ordinal)?)
    }

    pub(super) fn push_context(ctx: CUcontext) -> CudaResult<ContextGuard> {
        // SAFETY: ctx is a retained primary context, valid for the process.
        check("cuCtxPushCurrent", unsafe { sys::cuCtxPushCurrent_v2(ctx) })?;
        Ok(ContextGuard(std::marker::PhantomData))
    }
}

impl Drop for ContextGuard {
    fn drop(&mut self) {
        let mut old = std::ptr::null_mut();
        // SAFETY: pops the context this guard pushed: the guard is not
        // Send, so this runs on the thread that pushed it, and guards on
        // one thread are dropped in reverse order of creation (scopes).
        unsafe { sys::cuCtxPopCurrent_v2(&mut old) };
    }
}

/// Makes some context current (ordinal 0's primary context) when none is,
/// for calls such as `cuMemHostRegister` that need one.
///
/// # Errors
///
/// [`CudaError::NoDriver`](crate::gpu::CudaError::NoDriver) without a usable driver (or with `NUMAPIN_NO_CUDA`
/// set), [`CudaError::Call`](crate::gpu::CudaError::Call) naming the driver call that failed, with its
/// `CUresult`.
pub fn ensure_context() -> CudaResult<()> {
    let mut cur = std::ptr::null_mut();
    // SAFETY: cur is a valid out-pointer.
    check("cuCtxGetCurrent", unsafe { sys::cuCtxGetCurrent(&mut cur) })?;
    if cur.is_null() {
        set_device(0)?;
    }
    Ok(())
}

#[cfg(feature = "measure")]
/// A device attribute of ordinal `ordinal` (`cuDeviceGetAttribute`).
pub(crate) fn device_attribute(ordinal: u32, attr: sys::CUdevice_attribute) -> CudaResult<i32> {
    let dev = device(ordinal)?;
    let mut v = 0;
    // SAFETY: v is a valid out-pointer; dev is a valid device.
    check("cuDeviceGetAttribute", unsafe {
        sys::cuDeviceGetAttribute(&mut v, attr, dev)
    })?;
    Ok(v)
}

#[cfg(feature = "measure")]
/// The number of streaming multiprocessors of ordinal `ordinal`.
pub(crate) fn multiprocessor_count(ordinal: u32) -> CudaResult<u32> {
    device_attribute(
        ordinal,
        sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
    )
    .map(|v| u32::try_from(v).unwrap_or(0).max(1))
}
