//! Releasing large regions off the caller's thread.
//!
//! Tearing a region down (`cuMemHostUnregister`, `munlock`, `munmap`) costs
//! about 20 ms per GiB with the driver (`pin_release_per_gib` in `numapin
//! bench --only pinning`), all of it in whichever thread dropped the last
//! buffer of a dedicated region. Regions of [`BACKGROUND_MIN`] bytes or more
//! are handed to one process-wide thread instead. Each arena counts the
//! bytes it has in flight there ([`Releasing`]): they still count against
//! its budget and the memlock limit until gone, an allocation that needs
//! them waits for them, and an arena being dropped waits for all of its
//! own, so nothing outlives the runtime.

use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

use super::region::Region;

/// Regions this large or larger are released in the background.
pub(crate) const BACKGROUND_MIN: usize = 64 << 20;

/// Bytes one arena has waiting to be released.
#[derive(Debug, Default)]
pub(crate) struct Releasing {
    bytes: Mutex<u64>,
    done: Condvar,
}

impl Releasing {
    /// Bytes not yet released.
    pub(crate) fn bytes(&self) -> u64 {
        *self.bytes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until every region handed over has been released.
    pub(crate) fn wait(&self) {
        let mut b = self.bytes.lock().unwrap_or_else(|p| p.into_inner());
        while *b > 0 {
            b = self.done.wait(b).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn finished(&self, bytes: u64) {
        let mut b = self.bytes.lock().unwrap_or_else(|p| p.into_inner());
        *b = b.saturating_sub(bytes);
        if *b == 0 {
            self.done.notify_all();
        }
    }
}

type Job = (Region, Arc<Releasing>);

/// Test hook: milliseconds the release thread waits before each release.
pub(crate) static DELAY_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn sender() -> Option<&'static Mutex<Sender<Job>>> {
    static TX: OnceLock<Option<Mutex<Sender<Job>>>> = OnceLock::new();
    TX.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("numapin-release".into())
            .spawn(move || {
                for (region, owner) in rx {
                    let bytes = region.len() as u64;
                    let delay = DELAY_MS.load(std::sync::atomic::Ordering::Relaxed);
                    if delay > 0 {
                        std::thread::sleep(std::time::Duration::from_millis(delay));
                    }
                    // A panic in a teardown (there is none: Drop ignores
                    // errors) must not leave the owner waiting.
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(region)));
                    owner.finished(bytes);
                    super::publish::changed();
                }
            })
            .ok()
            .map(|_| Mutex::new(tx))
    })
    .as_ref()
}

/// Drops `region` here when it is small, or hands it to the release thread
/// (counted in `owner` until released). Where no thread could be started,
/// it is dropped here.
pub(crate) fn release(region: Region, owner: &Arc<Releasing>) {
    if region.len() < BACKGROUND_MIN {
        drop(region);
        super::publish::changed();
        return;
    }
    let Some(tx) = sender() else {
        drop(region);
        super::publish::changed();
        return;
    };
    let bytes = region.len() as u64;
    *owner.bytes.lock().unwrap_or_else(|p| p.into_inner()) += bytes;
    let tx = tx.lock().unwrap_or_else(|p| p.into_inner());
    if let Err(mpsc::SendError((region, owner))) = tx.send((region, owner.clone())) {
        drop(tx);
        drop(region);
        owner.finished(bytes);
    }
}
