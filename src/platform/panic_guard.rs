//! Turning panics inside third-party code (hwloc bindings fed a hostile file,
//! a driver library missing an entry point) into errors, quietly.
//!
//! [`catch`] runs a closure under `catch_unwind` with the panic message
//! captured instead of printed, so a bad input file gives one clear error
//! line instead of a backtrace.

use std::cell::Cell;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Once;

thread_local! {
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

static HOOK: Once = Once::new();

/// Installs numapin's quiet-aware panic hook (once). [`super::isolate`]
/// calls it before forking, so the child never takes the hook lock.
pub(crate) fn install_hook() {
    HOOK.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if !QUIET.with(Cell::get) {
                previous(info);
            }
        }));
    });
}

/// Runs `f`; a panic comes back as `Err(message)` and prints nothing.
pub(crate) fn catch<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    install_hook();
    let was = QUIET.with(|q| q.replace(true));
    let r = panic::catch_unwind(AssertUnwindSafe(f));
    QUIET.with(|q| q.set(was));
    r.map_err(|p| {
        p.downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "internal error".into())
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn catches_and_returns() {
        assert_eq!(super::catch(|| 3).unwrap(), 3);
        let e = super::catch(|| -> u8 { panic!("boom {}", 1) }).unwrap_err();
        assert_eq!(e, "boom 1");
    }
}
