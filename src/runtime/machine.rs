//! The machine budget as a runtime sets it up: the setting (configuration,
//! else `NUMAPIN_MACHINE_BUDGET`, else [`MachineBudget::Auto`]), the
//! state file's folder, and each node's limit. The accounting itself is
//! the arena's (`arena::machine`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{RuntimeConfig, RuntimeError};
use crate::arena::machine::Ledger;
pub use crate::arena::machine::{
    BudgetHolder, MachineBudget, MachineNodeUse, MachineUsage, ParseMachineBudgetError,
    DEFAULT_STATE_DIR, MACHINE_BUDGET_DIR_VAR, MACHINE_BUDGET_VAR,
};
use crate::arena::MachineLimit;

/// The machine budget of a runtime: its setting and, unless off, the
/// ledger of its state file.
#[derive(Debug)]
pub(super) struct Resolved {
    setting: MachineBudget,
    ledger: Option<Arc<Ledger>>,
}

impl Resolved {
    /// The limit of the arena of a node of `memory` bytes whose own budget
    /// is `budget`.
    pub(super) fn for_node(&self, memory: u64, budget: u64) -> Option<MachineLimit> {
        let ledger = self.ledger.clone()?;
        let limit = self.setting.limit_for(memory, budget)?;
        Some(MachineLimit { ledger, limit })
    }
}

fn config_error(
    setting: &'static str,
    value: String,
    problem: String,
    fix: String,
) -> RuntimeError {
    RuntimeError::Config {
        setting,
        value,
        problem,
        fix,
    }
}

/// The setting: the configuration's, else the variable's, else `Auto`.
fn setting(config: &RuntimeConfig) -> Result<MachineBudget, RuntimeError> {
    if let Some(m) = config.machine_budget {
        return Ok(m);
    }
    match std::env::var(MACHINE_BUDGET_VAR) {
        Ok(v) => v.parse().map_err(|e: ParseMachineBudgetError| {
            config_error(
                MACHINE_BUDGET_VAR,
                format!("{:?} (environment variable)", e.text),
                e.problem,
                format!(
                    "{}; or unset {MACHINE_BUDGET_VAR} for the default (auto)",
                    ParseMachineBudgetError::FIX
                ),
            )
        }),
        Err(std::env::VarError::NotPresent) => Ok(MachineBudget::Auto),
        Err(std::env::VarError::NotUnicode(v)) => Err(config_error(
            MACHINE_BUDGET_VAR,
            format!("{v:?} (environment variable)"),
            "not UTF-8".into(),
            ParseMachineBudgetError::FIX.into(),
        )),
    }
}

/// The folder of the state file: the test hook's, else the variable's
/// (an absolute path), else [`DEFAULT_STATE_DIR`]; and whether it was
/// chosen (not the default).
fn state_dir(config: &RuntimeConfig) -> Result<(PathBuf, bool), RuntimeError> {
    if let Some(d) = &config.hooks.machine_dir {
        return Ok((d.clone(), true));
    }
    let Some(v) = std::env::var_os(MACHINE_BUDGET_DIR_VAR).filter(|v| !v.is_empty()) else {
        return Ok((PathBuf::from(DEFAULT_STATE_DIR), false));
    };
    let p = PathBuf::from(&v);
    if !p.is_absolute() {
        return Err(config_error(
            MACHINE_BUDGET_DIR_VAR,
            format!("{v:?} (environment variable)"),
            "not an absolute path".into(),
            format!("set {MACHINE_BUDGET_DIR_VAR} to the absolute path of a folder every process of the job sees (default {DEFAULT_STATE_DIR}), or unset it"),
        ));
    }
    Ok((p, true))
}

/// Checks the machine budget's setting and variables.
pub(super) fn check(config: &RuntimeConfig) -> Result<(), RuntimeError> {
    let bad = |value: String, problem: &str| {
        config_error(
            "machine_budget",
            value,
            problem.into(),
            ParseMachineBudgetError::FIX.into(),
        )
    };
    match setting(config)? {
        MachineBudget::Fraction(f) if !(f > 0.0 && f <= 1.0) => {
            return Err(bad(f.to_string(), "a fraction not in (0, 1]"))
        }
        MachineBudget::Bytes(0) => return Err(bad("0".into(), "zero bytes")),
        _ => {}
    }
    state_dir(config).map(|_| ())
}

/// The runtime's machine budget (no file is touched until a region is
/// made).
pub(super) fn resolve(config: &RuntimeConfig) -> Result<Resolved, RuntimeError> {
    let setting = setting(config)?;
    let (dir, chosen) = state_dir(config)?;
    // The default budget where the default folder does not exist (a
    // minimal container or initramfs without /dev/shm): none kept, rather
    // than every region refused. Asked for, it is an error at the first
    // region instead.
    let missing = || !chosen && !crate::platform::statefile::is_dir(&dir);
    let ledger = match setting {
        MachineBudget::Off => None,
        MachineBudget::Auto if missing() => None,
        _ => Some(Ledger::for_dir(&dir)),
    };
    Ok(Resolved { setting, ledger })
}

/// The machine budget's state files in `dir` (default: the folder the
/// runtimes use, `NUMAPIN_MACHINE_BUDGET_DIR` or `/dev/shm`), as `numapin
/// ps` shows them: every user's file this process may read, with the bytes
/// each live process holds per node. Never changes a file.
///
/// # Errors
///
/// None for the call as a whole: each file that is refused (another
/// version, corrupted, a link, the wrong owner or mode, a lock held for
/// seconds) is an [`RuntimeError::MachineState`] in the second list.
pub fn machine_budget_usage(dir: Option<&Path>) -> (Vec<MachineUsage>, Vec<RuntimeError>) {
    crate::arena::machine::read_usage(dir)
}
