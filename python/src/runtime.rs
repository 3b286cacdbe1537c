//! The process's [`Runtime`]: made on first use from the configuration
//! `numapin.configure()` stored, and made afresh by a forked child.

use std::sync::{Arc, Mutex};

use numapin::runtime::{Runtime, RuntimeConfig};
use numapin::topology::ProbeOptions;
use numapin::Topology;
use pyo3::prelude::*;

use crate::errors::to_py;

/// The process's runtime (made on first use) and the configuration it will
/// be made with.
struct Global {
    config: RuntimeConfig,
    runtime: Option<Arc<Runtime>>,
    /// The process that made `runtime`: a forked child makes its own (the
    /// parent's regions are not mapped in the child).
    pid: u32,
}

impl Global {
    fn new() -> Self {
        Global {
            config: RuntimeConfig::default(),
            runtime: None,
            pid: std::process::id(),
        }
    }

    /// The runtime, if this process made it. One a forked child inherited
    /// is forgotten, never dropped: its regions are the parent's, not
    /// mapped here, and only the parent unmaps and unregisters them.
    fn own_runtime(&mut self) -> Option<Arc<Runtime>> {
        if self.runtime.is_some() && self.pid != std::process::id() {
            std::mem::forget(self.runtime.take());
        }
        self.runtime.clone()
    }
}

static GLOBAL: Mutex<Option<Global>> = Mutex::new(None);

/// Runs `f` on the process's [`Global`] (made now if this is the first
/// use). No Python runs while it is held: a thread waiting for it may hold
/// the GIL.
fn with_global<R>(f: impl FnOnce(&mut Global) -> R) -> R {
    let mut g = GLOBAL.lock().unwrap_or_else(|p| p.into_inner());
    f(g.get_or_insert_with(Global::new))
}

/// The runtime, made now (topology probe with the CUDA driver when present)
/// if this is the first use. Called with the GIL released.
fn runtime() -> Result<Arc<Runtime>, numapin::Error> {
    with_global(|global| {
        if let Some(rt) = global.own_runtime() {
            return Ok(rt);
        }
        let topo = Topology::probe(&ProbeOptions::from_process())?;
        let rt = Arc::new(Runtime::new(topo, global.config.clone())?);
        global.runtime = Some(rt.clone());
        global.pid = std::process::id();
        Ok(rt)
    })
}

/// The process's runtime (see [`runtime`]), made with the GIL released.
///
/// # Errors
///
/// numapin's exception for a failed probe or an unusable configuration.
pub(crate) fn rt(py: Python<'_>) -> PyResult<Arc<Runtime>> {
    py.detach(runtime).map_err(|e| to_py(py, &e))
}

/// Why [`store_config`] kept the configuration it had.
pub(crate) enum NotStored {
    /// The runtime was made already (with the configuration before).
    RuntimeMade,
    /// A setting is out of range ([`RuntimeConfig::check`]).
    Invalid(numapin::Error),
}

/// Stores the configuration `apply` makes of the current one, if it passes
/// [`RuntimeConfig::check`] and no runtime was made yet.
///
/// # Errors
///
/// [`NotStored`]; the configuration before stays.
pub(crate) fn store_config(apply: impl FnOnce(&mut RuntimeConfig)) -> Result<(), NotStored> {
    with_global(|global| {
        if global.own_runtime().is_some() {
            return Err(NotStored::RuntimeMade);
        }
        let mut c = global.config.clone();
        apply(&mut c);
        c.check().map_err(|e| NotStored::Invalid(e.into()))?;
        global.config = c;
        Ok(())
    })
}
