//! The `numapin` command line: `topo`, `affinity`, `exec`, `bench`,
//! `doctor` and `ps`, on the numapin library. This crate alone owns argument
//! parsing, printing and exit codes; everything it prints goes through
//! `output` (the `print!` family would panic on a full disk).
//!
//! The whole tool is one function, [`run`]: the `numapin` binary
//! (`src/main.rs`) calls it with its arguments and exits with what it
//! returns, and so does the `numapin` command of the Python wheel, so that
//! both print the same and exit with the same codes.
#![deny(clippy::print_stdout, clippy::print_stderr)]

mod affinity;
mod bench;
mod doctor;
mod error;
mod exec;
mod output;
mod ps;
mod source;
mod stack;
mod topo;

use clap::{Parser, Subcommand};

use output::report;

/// numapin: keep GPU data movement on the right side of the socket.
#[derive(Debug, Parser)]
#[command(name = "numapin", version, about, long_about = None)]
pub(crate) struct Cli {
    /// The command to run.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Show which GPU hangs off which socket, NUMA node and CPUs.
    Topo(topo::TopoArgs),
    /// Print each local rank's CPUs and memory nodes near its GPU.
    Affinity(affinity::AffinityArgs),
    /// Bind this rank near its GPU, then run the command in its place
    /// (`torchrun --no-python ... numapin exec -- python train.py`).
    Exec(exec::ExecArgs),
    /// Measure how fast data reaches each GPU, and what the arena costs.
    Bench(bench::BenchArgs),
    /// Check this machine for what keeps GPU data movement slow or broken
    /// (memlock, driver, PCIe links, locality, kernel settings, pinning).
    Doctor(doctor::DoctorArgs),
    /// Check running processes: which GPU each uses, and whether its
    /// threads, memory and NICs are on that GPU's side of the socket.
    Ps(ps::PsArgs),
}

/// The exit code for a command line clap did not accept, or for
/// `--help` and `--version`: their text goes to standard output, and a
/// failure to write it is an error (exit 1), not a silent success.
fn clap_exit(e: clap::Error) -> i32 {
    let code = e.exit_code();
    if e.use_stderr() {
        output::progress(&e.render().to_string());
        return code;
    }
    match output::print(&e.render().to_string()) {
        Ok(()) => code,
        Err(err) => report(&err),
    }
}

/// Runs the `numapin` command line with `args` (the program name first, as
/// in [`std::env::args_os`]) and returns the exit code: 0 on success, 2 for
/// a usage or input error, 1 for a system failure, or a command's own code
/// (`doctor`'s and `ps`'s verdicts). Errors are reported on standard error, results on
/// standard output, each written and flushed as it is produced.
///
/// It acts on the whole process, as the binary's `main` would, so call it
/// once, from the main thread, before any other thread starts:
/// * SIGPIPE is set to its default action (a closed pipe ends the process
///   quietly, as `numapin topo | head` expects);
/// * SIGINT, SIGTERM and SIGHUP, where their action is the default one,
///   are blocked and handled by a thread that removes temporary folders
///   and reader processes, then ends the process by the same signal. A
///   caller that installed handlers for them (Python does for SIGINT)
///   should set them back to the default first, or they will not stop the
///   command;
/// * `exec` does not return when it succeeds: the process becomes the
///   command (`execvp`), with the signal mask and SIGPIPE as they were;
/// * the process may end inside this call: by a signal above, or with
///   code 141 when standard output is a closed pipe while SIGPIPE is
///   ignored.
pub fn run<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    // A closed pipe ends the process quietly (Rust's runtime ignores
    // SIGPIPE, which would turn `numapin topo | head` into a write error).
    numapin::signals::default_sigpipe();
    // A write past the file-size limit (`ulimit -f`) fails with EFBIG and
    // is reported, rather than SIGXFSZ ending numapin without a word.
    numapin::signals::ignore_sigxfsz();
    // Before any thread starts: SIGINT/SIGTERM/SIGHUP remove temporary
    // folders and reader processes before they end numapin.
    if let Err(e) = numapin::signals::install_cleanup() {
        output::eprintln(&format!(
            "numapin: warning: signals will not clean up temporary files: {e}"
        ));
    }
    let args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
    // Each command runs on a thread whose stack numapin sizes: a small
    // `ulimit -s` changes nothing.
    stack::on_sized_stack(move || {
        let cli = match Cli::try_parse_from(args) {
            Ok(cli) => cli,
            Err(e) => return clap_exit(e),
        };
        let r = match cli.command {
            Command::Topo(a) => topo::run(&a),
            Command::Affinity(a) => affinity::run(&a),
            Command::Exec(a) => exec::run(&a),
            Command::Bench(a) => bench::run(&a),
            Command::Doctor(a) => doctor::run(&a),
            Command::Ps(a) => ps::run(&a),
        };
        match r {
            Ok(code) => code,
            Err(e) => report(&e),
        }
    })
}
