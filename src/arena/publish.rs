//! What this process's arenas hold, published for other processes
//! (`numapin ps`) in a memfd that goes away with the process.
//!
//! The memfd is named `numapin-stats` (its `/proc/<pid>/fd/<n>` link reads
//! `/memfd:numapin-stats (deleted)`) and is [`FILE_BYTES`] long:
//!
//! | bytes | what |
//! | --- | --- |
//! | 0..8 | [`MAGIC`], little-endian |
//! | 8..12 | a sequence counter, odd while the text is being rewritten |
//! | 12..16 | the text's length `n` |
//! | 16..16+n | UTF-8 JSON: `{"version":1,"pid":P,"runtimes":[{"nodes":[NodeStats...]}]}` |
//!
//! A reader reads the counter, the text, then the counter again, and tries
//! again when it changed or was odd. The text is rewritten (from every live
//! runtime's [`NodeStats`]) when a runtime is made and whenever a region or
//! shared region is made or released: rare events next to allocations,
//! which never publish.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use super::{NodeArena, NodeStats};
use crate::platform::shm::{SeqFile, SEQ_DATA_AT};

/// `"numapst1"`: the file's first word once it holds text.
pub(crate) const MAGIC: u64 = 0x6e75_6d61_7073_7431;
/// The file's length.
pub(crate) const FILE_BYTES: usize = 64 << 10;
/// The memfd's name.
pub(crate) const MEMFD_NAME: &str = "numapin-stats";

/// The runtimes whose arenas are published (one list of arenas each).
static RUNTIMES: Mutex<Vec<Vec<Weak<NodeArena>>>> = Mutex::new(Vec::new());
/// Held while the text is rebuilt and written.
static WRITING: Mutex<Option<SeqFile>> = Mutex::new(None);
/// Set when a change came in while another thread was writing.
static DIRTY: AtomicBool = AtomicBool::new(false);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Publishes the arenas of a new runtime (and publishes now).
pub(crate) fn register(arenas: &[Arc<NodeArena>]) {
    lock(&RUNTIMES).push(arenas.iter().map(Arc::downgrade).collect());
    changed();
}

/// Rewrites the published text from every live runtime. Call it holding
/// no arena lock. A call made while another thread writes leaves the
/// rewrite to that thread (so an arena dropped during a rewrite, which
/// calls this again, never waits for itself).
pub(crate) fn changed() {
    DIRTY.store(true, Ordering::Release);
    let Ok(mut file) = WRITING.try_lock() else {
        return;
    };
    while DIRTY.swap(false, Ordering::AcqRel) {
        let text = text();
        write(&mut file, &text);
    }
}

/// The JSON text of every live runtime's stats.
fn text() -> String {
    let runtimes: Vec<Vec<Weak<NodeArena>>> = {
        let mut r = lock(&RUNTIMES);
        r.retain(|arenas| arenas.iter().any(|a| a.strong_count() > 0));
        r.clone()
    };
    let stats: Vec<Vec<NodeStats>> = runtimes
        .iter()
        .map(|arenas| {
            arenas
                .iter()
                .filter_map(Weak::upgrade)
                .map(|a| a.stats())
                .collect()
        })
        .collect();
    let mut doc = serde_json::json!({
        "version": 1,
        "pid": std::process::id(),
        "runtimes": stats.iter().map(|nodes| serde_json::json!({"nodes": nodes})).collect::<Vec<_>>(),
    });
    let mut s = doc.to_string();
    if s.len() > FILE_BYTES - SEQ_DATA_AT {
        doc["runtimes"] = serde_json::json!([]);
        doc["truncated"] = serde_json::json!(true);
        s = doc.to_string();
    }
    s
}

/// Writes `text` into this process's file, made (again, after a fork) when
/// needed. Publishing is best effort: a process that cannot make the file
/// (descriptor or memory limits) just is not shown in detail by `ps`.
fn write(file: &mut Option<SeqFile>, text: &str) {
    if file.as_ref().is_some_and(|f| f.pid() != std::process::id()) {
        // Inherited across fork: the parent's file, not mapped here.
        *file = None;
    }
    if file.is_none() {
        *file = SeqFile::new(MEMFD_NAME, FILE_BYTES).ok();
    }
    if let Some(f) = file.as_mut() {
        f.write(MAGIC, text.as_bytes());
    }
}
