//! Signals for programs built on numapin that read saved machines (which
//! unpack captures into temporary folders and read hwloc files in child
//! processes) or write output to pipes: the command-line tools, and any
//! tool of a user's that wants the same behaviour.

/// Makes SIGINT, SIGTERM and SIGHUP (those whose disposition is the
/// default: an ignored one, as under `nohup`, stays ignored) clean up
/// before they end the process: numapin's temporary folders are removed
/// and its reader children killed, then the process ends with the signal.
/// Call it first thing in `main`, before any thread starts: the signals are
/// blocked in the calling thread and every thread it starts afterwards,
/// and a thread of its own waits for them. Calling it again does nothing.
/// [`crate::affinity::exec`] restores the signal mask for the command it
/// runs.
///
/// # Errors
///
/// The system's error when the signal mask cannot be changed or the
/// waiting thread cannot start.
pub fn install_cleanup() -> std::io::Result<()> {
    crate::platform::cleanup::install_signal_cleanup()
}

/// Sets SIGPIPE back to its default action (Rust's runtime ignores it): a
/// write to a closed pipe then ends the process quietly, as it ends other
/// command-line tools.
pub fn default_sigpipe() {
    crate::platform::cleanup::default_sigpipe();
}

/// Ignores SIGXFSZ: a write past the file-size limit (`ulimit -f`) then
/// fails with `EFBIG`, an error the program reports, instead of ending the
/// process without a word (SIGXFSZ's default action). Python does the same
/// at start-up. [`crate::affinity::exec`] sets it back to the default for
/// the command it runs, when this found it so.
pub fn ignore_sigxfsz() {
    crate::platform::cleanup::ignore_sigxfsz();
}
