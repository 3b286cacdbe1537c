//! Which NUMA system calls this process may make: each is called once with
//! arguments that change nothing outside a scratch page or a throwaway
//! thread, so the answer is the one numapin's real calls would get.
//!
//! | call | probe |
//! | --- | --- |
//! | `mbind` | `MPOL_DEFAULT` on a fresh private page |
//! | `set_mempolicy` | `MPOL_DEFAULT`, in a thread that then exits |
//! | `get_mempolicy` | this thread's policy |
//! | `move_pages` | where a touched scratch page is (null node list) |
//! | `migrate_pages` | from no node to no node |
//! | `set_mempolicy_home_node` | on the scratch page (no policy: a no-op) |
//!
//! `EPERM`/`EACCES` read as refused, `ENOSYS` as unsupported, anything else
//! (success, or `EINVAL` and the like) as allowed: the call reached the
//! kernel's own checks.

use std::io;

use super::numa;

/// The calls probed, in report order.
pub const CALLS: [&str; 6] = [
    "mbind",
    "set_mempolicy",
    "get_mempolicy",
    "move_pages",
    "migrate_pages",
    "set_mempolicy_home_node",
];

/// What a probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CallState {
    /// The kernel ran the call: `None` on success, else the error's name
    /// (it failed on its arguments, which is no refusal).
    Allowed(Option<String>),
    /// Refused: `EPERM` or `EACCES` (a seccomp profile, a security module).
    Refused(String),
    /// `ENOSYS`: no NUMA support, or a filter that answers so.
    Unsupported,
    /// Not probed (the scratch page could not be mapped), and why.
    Unknown(String),
}

impl CallState {
    /// The state for a call's result.
    pub fn of(r: io::Result<()>) -> CallState {
        match r {
            Ok(()) => CallState::Allowed(None),
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => CallState::Unsupported,
            Err(e) if numa::is_refusal(&e) => CallState::Refused(numa::errno_name(&e)),
            Err(e) => CallState::Allowed(Some(numa::errno_name(&e))),
        }
    }

    /// Whether the call is not available (refused or unsupported).
    pub fn unavailable(&self) -> bool {
        matches!(self, CallState::Refused(_) | CallState::Unsupported)
    }

    /// Short text: `allowed`, `refused (EPERM)`, `unsupported (ENOSYS)`.
    pub fn text(&self) -> String {
        match self {
            CallState::Allowed(None) => "allowed".into(),
            CallState::Allowed(Some(e)) => format!("allowed (ran, {e})"),
            CallState::Refused(e) => format!("refused ({e})"),
            CallState::Unsupported => "unsupported (ENOSYS)".into(),
            CallState::Unknown(why) => format!("not probed ({why})"),
        }
    }
}

/// `set_mempolicy` probed in a thread of its own (the policy is per
/// thread; the probe thread exits at once).
pub(crate) fn probe_set_mempolicy() -> CallState {
    std::thread::scope(|s| {
        s.spawn(|| CallState::of(numa::set_default_mempolicy()))
            .join()
            .unwrap_or_else(|_| CallState::Unknown("the probe thread panicked".into()))
    })
}

/// Probes the six calls (see the module docs), in [`CALLS`] order.
pub(crate) fn probe_calls() -> Vec<(&'static str, CallState)> {
    let page = 4096;
    let scratch = numa::map_anonymous(page);
    let with_page = |f: &dyn Fn(*mut u8) -> io::Result<()>| match &scratch {
        Ok(p) => CallState::of(f(*p)),
        Err(e) => CallState::Unknown(format!("no scratch page: {e}")),
    };
    // SAFETY: the scratch page is ours; MPOL_DEFAULT only resets its policy.
    let mbind = with_page(&|p| unsafe { numa::mbind_default(p, page) });
    let set = probe_set_mempolicy();
    let get = CallState::of(numa::get_mempolicy().map(drop));
    let move_pages = with_page(&|p| {
        // SAFETY: the scratch page is ours and writable; nothing else uses it.
        unsafe { p.write_volatile(1) };
        // SAFETY: the page stays mapped for the call.
        unsafe { numa::page_nodes(p, page, page, |_| {}) }
    });
    let migrate = CallState::of(numa::migrate_pages_noop());
    let home = numa::current_node().unwrap_or(0);
    // SAFETY: the scratch page is ours and has no policy: nothing changes.
    let home = with_page(&|p| unsafe { numa::set_mempolicy_home_node(p, page, home) });
    if let Ok(p) = scratch {
        // SAFETY: the scratch page, referenced by nothing now.
        let _ = unsafe { numa::unmap(p, page) };
    }
    CALLS
        .into_iter()
        .zip([mbind, set, get, move_pages, migrate, home])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_from_errors() {
        let e = |n| Err(io::Error::from_raw_os_error(n));
        assert_eq!(
            CallState::of(e(libc::EPERM)),
            CallState::Refused("EPERM".into())
        );
        assert_eq!(CallState::of(e(libc::ENOSYS)), CallState::Unsupported);
        assert_eq!(
            CallState::of(e(libc::EINVAL)),
            CallState::Allowed(Some("EINVAL".into()))
        );
        assert!(CallState::of(e(libc::EACCES)).unavailable());
        assert!(!CallState::of(Ok(())).unavailable());
        assert_eq!(CallState::of(e(libc::EPERM)).text(), "refused (EPERM)");
    }

    /// Unfiltered (the test binary runs without a seccomp filter unless a
    /// test installs one in a child): every call is allowed, and the probe
    /// left this thread's policy as it was.
    #[test]
    fn probes_here_change_nothing() {
        let before = numa::get_mempolicy().unwrap();
        let got = probe_calls();
        assert_eq!(got.len(), 6);
        if super::super::sys::proc_status_field("Seccomp").as_deref() == Some("0") {
            for (c, s) in &got {
                assert!(matches!(s, CallState::Allowed(_)), "{c}: {s:?}");
            }
        }
        assert_eq!(numa::get_mempolicy().unwrap(), before);
    }
}
