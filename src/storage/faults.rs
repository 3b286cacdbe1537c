//! Test hook: faults injected into the storage reader's and writer's
//! system calls (every `eintr_every`th call fails with `EINTR`, no call
//! moves more than `short_max` bytes, a call touching `errno_at.0` fails
//! with `errno_at.1`, direct calls fail with `EINVAL` when
//! `refuse_direct`, `fsync` fails with `fsync_errno`). Tests that inject
//! run one at a time ([`Injected`]): the hook is global.

use std::sync::{Mutex, MutexGuard};

#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Faults {
    pub(crate) eintr_every: u64,
    pub(crate) short_max: usize,
    pub(crate) errno_at: Option<(u64, i32)>,
    pub(crate) refuse_direct: bool,
    /// `O_DIRECT` opens fail with `EINVAL` (a filesystem refusing it at open).
    pub(crate) refuse_direct_open: bool,
    pub(crate) fsync_errno: Option<i32>,
    pub(crate) calls: u64,
}

static FAULTS: Mutex<Option<Faults>> = Mutex::new(None);
static SERIAL: Mutex<()> = Mutex::new(());

/// Faults in force while it lives (and no other test's).
pub(crate) struct Injected(#[allow(dead_code)] MutexGuard<'static, ()>);

impl Injected {
    /// `f` injected.
    pub(crate) fn new(f: Faults) -> Injected {
        Self::set(Some(f))
    }

    /// No fault, and no other test injecting meanwhile.
    pub(crate) fn none() -> Injected {
        Self::set(None)
    }

    fn set(f: Option<Faults>) -> Injected {
        let g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        *FAULTS.lock().unwrap_or_else(|p| p.into_inner()) = f;
        Injected(g)
    }
}

impl Drop for Injected {
    fn drop(&mut self) {
        *FAULTS.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

/// `Err` to return instead of the call, or the length to ask for
/// (direct calls stay whole 4 KiB blocks, as the kernel needs).
pub(crate) fn apply(len: usize, offset: u64, direct: bool) -> Result<usize, std::io::Error> {
    let mut g = FAULTS.lock().unwrap_or_else(|p| p.into_inner());
    let Some(f) = g.as_mut() else {
        return Ok(len);
    };
    f.calls += 1;
    if f.eintr_every > 0 && f.calls % f.eintr_every == 0 {
        return Err(std::io::Error::from_raw_os_error(libc::EINTR));
    }
    if direct && f.refuse_direct {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    let len = match (f.short_max, direct) {
        (0, _) => len,
        (m, false) => len.min(m),
        (m, true) => len.min((m / 4096).max(1) * 4096),
    };
    if let Some((at, errno)) = f.errno_at {
        if at >= offset && at < offset + len as u64 {
            return Err(std::io::Error::from_raw_os_error(errno));
        }
    }
    Ok(len)
}

/// The `fsync` failure injected, if any.
pub(crate) fn fsync() -> Result<(), std::io::Error> {
    let g = FAULTS.lock().unwrap_or_else(|p| p.into_inner());
    match g.as_ref().and_then(|f| f.fsync_errno) {
        Some(e) => Err(std::io::Error::from_raw_os_error(e)),
        None => Ok(()),
    }
}

/// Whether `O_DIRECT` opens are refused now.
pub(crate) fn direct_open_refused() -> bool {
    FAULTS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .is_some_and(|f| f.refuse_direct_open)
}
