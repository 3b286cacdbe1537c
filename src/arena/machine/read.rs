//! Reading the state files as `numapin ps` shows them: every user's file
//! this process may read in the folder, each checked as the writers check
//! it, read under a shared lock, never changed.

use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::file::{self, Live};
use super::ledger::on_node;
use super::{BudgetHolder, DEFAULT_STATE_DIR, MACHINE_BUDGET_DIR_VAR};
use crate::arena::RuntimeError;
use crate::platform::statefile::{self as sf, Access, Lock};

/// One node's machine budget, over the live processes of one state file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct MachineNodeUse {
    /// The node.
    pub node: u32,
    /// Bytes pinned there over the processes.
    pub used: u64,
    /// The smallest limit the processes check against there.
    pub limit_min: u64,
    /// The largest (the same as `limit_min` when they agree).
    pub limit_max: u64,
    /// The processes, largest first.
    pub holders: Vec<BudgetHolder>,
}

/// One user's state file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MachineUsage {
    /// The file.
    pub path: PathBuf,
    /// The user whose file it is.
    pub uid: u32,
    /// Nodes where live processes hold bytes, by node.
    pub nodes: Vec<MachineNodeUse>,
}

/// The folder of the state files: `NUMAPIN_MACHINE_BUDGET_DIR` when set,
/// else [`DEFAULT_STATE_DIR`].
pub(crate) fn state_dir_from_env() -> PathBuf {
    std::env::var_os(MACHINE_BUDGET_DIR_VAR)
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_STATE_DIR), PathBuf::from)
}

/// Reads the machine budget's state files in `dir` (default: the folder
/// the runtimes use, `NUMAPIN_MACHINE_BUDGET_DIR` or `/dev/shm`): each
/// user's file this process may read (its own, or every one for root),
/// checked as the runtimes check it and read under a shared lock. Files
/// of other users that cannot be opened are left out; files that are
/// refused (another version, corrupted, a link, the wrong owner or mode)
/// are returned as errors beside the others.
pub(crate) fn read_usage(dir: Option<&Path>) -> (Vec<MachineUsage>, Vec<RuntimeError>) {
    let dir = dir.map_or_else(state_dir_from_env, Path::to_path_buf);
    let me = sf::euid();
    let mut found = Vec::new();
    let mut refused = Vec::new();
    let Ok(names) = sf::names_in(&dir) else {
        return (found, refused);
    };
    for name in names {
        let Some(uid) = name
            .strip_prefix("numapin-budget-")
            .filter(|u| !u.is_empty() && u.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|u| u.parse::<u32>().ok())
        else {
            continue;
        };
        if file::file_name(uid) != name {
            continue;
        }
        match read_one(&dir, &name, uid) {
            Ok(Some(u)) => found.push(u),
            Ok(None) => {}
            // Another user's file this user may not open: not ours to judge.
            Err(RuntimeError::MachineState {
                source: Some(e), ..
            }) if uid != me && e.raw_os_error() == Some(libc::EACCES) => {}
            Err(e) => refused.push(e),
        }
    }
    (found, refused)
}

/// One file: `None` when it vanished or holds no live record.
fn read_one(dir: &Path, name: &str, uid: u32) -> Result<Option<MachineUsage>, RuntimeError> {
    let path = dir.join(name);
    let o = match file::open(dir, name, Access::Read, uid) {
        Ok(o) => o,
        Err(RuntimeError::MachineState {
            source: Some(e), ..
        }) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
        Err(e) => return Err(e),
    };
    let fd = o.file.as_raw_fd();
    let _held = file::lock_header(&path, fd, Lock::Read)?;
    let facts = sf::stat(fd).map_err(|e| file::refused(&path, "fstat failed", Some(e)))?;
    if facts.size == 0 || facts.links == 0 {
        return Ok(None);
    }
    let live = file::live_records(&path, fd, facts.size, None, false)?;
    if live.is_empty() {
        return Ok(None);
    }
    Ok(Some(MachineUsage {
        path,
        uid,
        nodes: per_node(&live),
    }))
}

/// The live records summed per node.
fn per_node(live: &[Live]) -> Vec<MachineNodeUse> {
    let mut nodes: BTreeMap<u32, MachineNodeUse> = BTreeMap::new();
    for (_, r) in live {
        for e in r.entries.iter().filter(|e| e.bytes > 0) {
            let n = nodes.entry(e.node).or_insert_with(|| MachineNodeUse {
                node: e.node,
                limit_min: u64::MAX,
                ..MachineNodeUse::default()
            });
            n.used = n.used.saturating_add(e.bytes);
            n.limit_min = n.limit_min.min(e.limit);
            n.limit_max = n.limit_max.max(e.limit);
            n.holders.push(BudgetHolder {
                pid: r.pid,
                command: r.command.clone(),
                bytes: on_node(r, e.node),
            });
        }
    }
    let mut out: Vec<MachineNodeUse> = nodes.into_values().collect();
    for n in &mut out {
        n.holders
            .sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.pid.cmp(&b.pid)));
    }
    out
}
