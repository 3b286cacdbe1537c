//! Per-NUMA-node pinned arenas (work in progress: see the arena issue).

/// An arena failure.
#[derive(Debug, thiserror::Error)]
pub enum ArenaError {
    /// Pinned bytes would exceed the node's budget.
    #[error("node {node}: {requested} bytes requested with {in_use} in use would exceed the budget of {limit} bytes")]
    BudgetExceeded {
        /// The node.
        node: u32,
        /// Bytes asked for.
        requested: u64,
        /// Bytes in use.
        in_use: u64,
        /// The budget.
        limit: u64,
    },
}

impl ArenaError {
    /// Exit code for this error.
    pub fn exit_code(&self) -> i32 {
        1
    }
}
