//! The stack a command runs on.
//!
//! The main thread's stack is what `ulimit -s` gave the process: 64 KiB is
//! too little for reading an hwloc export, and the limit is the user's
//! environment, not numapin's need. Each command therefore runs on a thread
//! whose stack numapin sizes, [`STACK_BYTES`]: reserved address space, of
//! which only the pages a command touches become memory.

/// The stack of the thread that runs a command: 64 MiB.
pub(crate) const STACK_BYTES: usize = 64 << 20;

/// Runs `f` on a thread with a [`STACK_BYTES`] stack and returns what it
/// returns; on this thread when no such thread can be made (an
/// address-space limit too small for its stack). A panic in `f` goes on
/// in the caller.
pub(crate) fn on_sized_stack<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    let work = std::sync::Mutex::new(Some(f));
    let take = || {
        work.lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .expect("the work runs once")
    };
    std::thread::scope(|s| {
        let spawned = std::thread::Builder::new()
            .name("numapin".into())
            .stack_size(STACK_BYTES)
            .spawn_scoped(s, || call(take()));
        match spawned {
            Ok(h) => h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
            Err(_) => call(take()),
        }
    })
}

/// Calls `f` in a frame of its own: inlined into the caller, `f`'s
/// locals would be reserved on the caller's (small) stack before any
/// thread is made.
#[inline(never)]
fn call<T>(f: impl FnOnce() -> T) -> T {
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_work_runs_once_on_a_thread_of_its_own() {
        let here = std::thread::current().id();
        let (there, value) = on_sized_stack(|| (std::thread::current().id(), 42));
        assert_ne!(here, there);
        assert_eq!(value, 42);
        // 8 MiB of locals: more than a default main thread allows, and
        // not reserved on this thread's stack either.
        let deep = on_sized_stack(|| {
            let big = [1u8; 8 << 20];
            std::hint::black_box(&big)
                .iter()
                .map(|&b| u64::from(b))
                .sum::<u64>()
        });
        assert_eq!(deep, 8 << 20);
    }
}
