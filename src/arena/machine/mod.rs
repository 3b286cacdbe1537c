//! The machine budget: pinned bytes per NUMA node over every numapin
//! process of a user on the machine, kept in a state file with one record
//! per process (`docs/arena.md`, Machine budget).
//!
//! * The file is `numapin-budget-<uid>` in `/dev/shm` (or
//!   `NUMAPIN_MACHINE_BUDGET_DIR`), mode 0600, opened without following
//!   links and checked (owner, mode, kind, size, layout version) before
//!   anything in it is believed; [`format`] is its layout.
//! * A process that holds bytes keeps a lock (an OFD lock, which the
//!   kernel drops when the process ends, however it ends) on its record's
//!   bytes. A record whose lock is free belongs to no live process: it is
//!   cleared, and its bytes count no more. No daemon is needed.
//! * Only making and releasing a region touches the file (under the
//!   header's lock: the sum over live records, the check, this process's
//!   record rewritten); allocations served from regions never do.

mod file;
mod format;
mod ledger;
mod read;
mod setting;

use std::sync::Arc;

use serde::Serialize;

#[cfg(feature = "internals")]
pub(crate) use ledger::Refusal;
#[cfg(feature = "internals")]
pub(crate) use ledger::KILL_AT;
pub(crate) use ledger::{KillAt, Ledger};
pub(crate) use read::read_usage;
pub use read::{MachineNodeUse, MachineUsage};
pub use setting::{
    MachineBudget, ParseMachineBudgetError, MACHINE_BUDGET_DIR_VAR, MACHINE_BUDGET_VAR,
};

use super::{NodeArena, NodeStats, RuntimeError};

/// The folder of the state file when `NUMAPIN_MACHINE_BUDGET_DIR` is not
/// set: every process of the machine sees it (unless a container gives it
/// a `/dev/shm` of its own).
pub const DEFAULT_STATE_DIR: &str = "/dev/shm";

/// A process holding part of a node's machine budget.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BudgetHolder {
    /// Its process id.
    pub pid: u32,
    /// Its command name (`/proc/<pid>/comm`, up to 15 characters).
    pub command: String,
    /// Bytes it holds pinned on the node.
    pub bytes: u64,
}

impl std::fmt::Display for BudgetHolder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "pid {} ({}) {}",
            self.pid,
            self.command,
            super::fmt_bytes(self.bytes)
        )
    }
}

/// One node's machine budget as a runtime's arena uses it.
#[derive(Debug, Clone)]
pub(crate) struct MachineLimit {
    /// The process's ledger of the state file.
    pub(crate) ledger: Arc<Ledger>,
    /// The limit on the node.
    pub(crate) limit: u64,
}

/// Bytes of a region charged to the machine budget, given back when
/// dropped (in the process that charged them only: a forked child's copy
/// of a region does nothing).
#[derive(Debug)]
pub(crate) struct MachineCharge {
    ledger: Arc<Ledger>,
    node: u32,
    bytes: u64,
    pid: u32,
}

impl MachineCharge {
    /// Bytes charged.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Gives back all but `bytes` (a region made smaller than reserved).
    pub(crate) fn shrink_to(&mut self, bytes: u64) {
        if bytes < self.bytes && self.pid == std::process::id() {
            self.ledger.release(self.node, self.bytes - bytes);
            self.bytes = bytes;
        }
    }
}

impl Drop for MachineCharge {
    fn drop(&mut self) {
        if self.bytes > 0 && self.pid == std::process::id() {
            self.ledger.release(self.node, self.bytes);
        }
    }
}

impl NodeArena {
    /// Reserves a region of `size` bytes (or, short of room, `fitted`) in
    /// the machine budget for a request of `bytes`, when there is one:
    /// this process's empty regions on the node are given back first when
    /// the room is short.
    ///
    /// # Errors
    ///
    /// [`RuntimeError::MachineBudget`] naming the processes that hold the
    /// node's budget, or [`RuntimeError::MachineState`] when the state file
    /// cannot be used.
    pub(super) fn reserve_machine(
        &self,
        bytes: u64,
        size: u64,
        fitted: u64,
    ) -> Result<Option<MachineCharge>, RuntimeError> {
        let Some(m) = &self.cfg.machine else {
            return Ok(None);
        };
        let charge = |size| {
            ledger::kill_point(KillAt::Reserved);
            Ok(Some(MachineCharge {
                ledger: m.ledger.clone(),
                node: self.node,
                bytes: size,
                pid: std::process::id(),
            }))
        };
        let mut short = None;
        // Empty regions held for reuse make room after the first refusal.
        for (i, s) in [size, size, fitted].into_iter().enumerate() {
            if i == 1 {
                self.trim();
            }
            if i == 2 && fitted >= size {
                break;
            }
            match m.ledger.reserve(self.node, s, m.limit) {
                Ok(()) => return charge(s),
                Err(ledger::Refusal::Short(s)) => short = Some(s),
                Err(ledger::Refusal::State(e)) => return Err(e),
            }
        }
        let s = short.expect("refused at least once");
        Err(RuntimeError::MachineBudget {
            node: self.node,
            requested: bytes,
            in_use: s.in_use,
            limit: m.limit,
            holders: s.holders,
        })
    }

    /// Fills the machine budget's figures of `s`.
    pub(super) fn machine_stats(&self, s: &mut NodeStats) {
        let Some(m) = &self.cfg.machine else {
            return;
        };
        s.machine_budget = m.limit;
        s.machine_share = m.ledger.own_on(self.node);
        match m.ledger.used_on(self.node) {
            Ok(used) => s.machine_used = used,
            Err(e) => {
                s.machine_used = s.machine_share;
                s.machine_note = crate::report::with_causes(&e);
            }
        }
    }
}

/// The fuzz target's check (`internals::fuzz_machine_budget`): `data` as
/// a setting and as a state file; panics when a reader disagrees with
/// itself.
#[cfg(feature = "internals")]
pub(crate) fn fuzz_one(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(v) = text.parse::<MachineBudget>() {
            assert_eq!(v.to_string().parse::<MachineBudget>(), Ok(v), "{text:?}");
        }
    }
    let head = &data[..data.len().min(format::BLOCK)];
    let mut block = [0u8; format::BLOCK];
    block[..head.len()].copy_from_slice(head);
    let _ = format::check_file(&block, data.len() as u64);
    for chunk in data.chunks(format::BLOCK) {
        let mut b = [0u8; format::BLOCK];
        b[..chunk.len()].copy_from_slice(chunk);
        if let Ok(Some(r)) = format::decode(&b) {
            assert_eq!(format::decode(&format::encode(&r)), Ok(Some(r)));
        }
    }
}

#[cfg(test)]
mod tests;
