//! Kernels: modules loaded from PTX and their launch.

use cudarc::driver::sys;

use std::ffi::c_void;

use super::context::{primary_context, CUcontext, ContextGuard};
use super::{check, CudaError, CudaResult};
use cudarc::driver::sys::CUstream;

/// A module loaded from PTX text (`cuModuleLoadData`, JIT-compiled by the
/// driver for the current device), unloaded on drop.
#[derive(Debug)]
pub(crate) struct Module {
    raw: sys::CUmodule,
    ctx: CUcontext,
}

// SAFETY: a module handle may be used from any thread of the process; the
// wrapper owns it.
unsafe impl Send for Module {}
// SAFETY: looking up functions and launching them are thread-safe.
unsafe impl Sync for Module {}

impl Module {
    /// Loads `ptx` into ordinal `ordinal`'s primary context.
    pub(crate) fn load_ptx(ordinal: u32, ptx: &str) -> CudaResult<Module> {
        let ctx = primary_context(ordinal)?;
        let _g = ContextGuard::push_context(ctx)?;
        let text = std::ffi::CString::new(ptx).map_err(|_| CudaError::Call {
            call: "cuModuleLoadData",
            name: "CUDA_ERROR_INVALID_PTX".into(),
            description: "the PTX text holds a NUL byte".into(),
            code: 0,
        })?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: text is NUL-terminated PTX, alive for the call; raw is a
        // valid out-pointer; the context is current.
        check("cuModuleLoadData", unsafe {
            sys::cuModuleLoadData(&mut raw, text.as_ptr().cast())
        })?;
        Ok(Module { raw, ctx })
    }

    /// The kernel named `name` (its `.entry` name).
    pub(crate) fn function(&self, name: &str) -> CudaResult<Function> {
        let c = std::ffi::CString::new(name).map_err(|_| CudaError::Call {
            call: "cuModuleGetFunction",
            name: "CUDA_ERROR_NOT_FOUND".into(),
            description: "a kernel name holds a NUL byte".into(),
            code: 0,
        })?;
        let mut f = std::ptr::null_mut();
        // SAFETY: the module is loaded; c is NUL-terminated; f is a valid
        // out-pointer.
        check("cuModuleGetFunction", unsafe {
            sys::cuModuleGetFunction(&mut f, self.raw, c.as_ptr())
        })?;
        Ok(Function(f))
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        let guard = ContextGuard::push_context(self.ctx);
        // SAFETY: the module is ours; functions taken from it are only
        // used while it lives (Function borrows nothing, so callers keep
        // the module alive: see Function).
        unsafe { sys::cuModuleUnload(self.raw) };
        drop(guard);
    }
}

/// A kernel of a [`Module`]; valid while the module is loaded.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Function(sys::CUfunction);

// SAFETY: a function handle is an address usable from any thread.
unsafe impl Send for Function {}
// SAFETY: as above.
unsafe impl Sync for Function {}

impl Function {
    /// Queues the kernel on `stream` with `grid` x `block` threads (one
    /// dimension) and the given parameters (`cuLaunchKernel`).
    ///
    /// # Safety
    /// The module must still be loaded, `stream` must be a live stream of
    /// the module's context, and `params` must point to one value of the
    /// type and size of each kernel parameter, in order; whatever memory
    /// the kernel touches through them must stay valid until it completes.
    pub(crate) unsafe fn launch(
        &self,
        grid: u32,
        block: u32,
        stream: CUstream,
        params: &mut [*mut c_void],
    ) -> CudaResult<()> {
        // SAFETY: per the caller's guarantee; params outlives the call
        // (the driver copies the values when the launch is queued).
        check("cuLaunchKernel", unsafe {
            sys::cuLaunchKernel(
                self.0,
                grid.max(1),
                1,
                1,
                block.max(1),
                1,
                1,
                0,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }
}
