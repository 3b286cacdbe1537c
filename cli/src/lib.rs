//! The `numapin` command line: `topo`, `affinity`, `exec`, `bench` and
//! `doctor`, on the numapin library. This crate alone owns argument
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
mod topo;

use clap::{Parser, Subcommand};

use error::Result;
use numapin::topology::{CudaMode, PciId, ProbeOptions, Topology};
use output::report;

/// numapin: keep GPU data movement on the right side of the socket.
#[derive(Debug, Parser)]
#[command(name = "numapin", version, about, long_about = None)]
pub(crate) struct Cli {
    /// The command to run.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// How CPUs are chosen (`--mode`): the library's
/// [`numapin::affinity::Mode`], with its help text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ModeArg {
    /// Every allowed CPU of the GPU's NUMA node; memory on that node.
    Node,
    /// Every allowed CPU of the GPU's package (all of its nodes under
    /// SNC/NPS); memory on the package's nodes.
    Socket,
    /// The node's allowed physical cores divided into disjoint, contiguous
    /// shares among the ranks whose GPUs share the node.
    Exclusive,
    /// One last-level cache (core complex, L3 domain) of the node per rank.
    #[value(alias = "core-complex")]
    Cache,
    /// One physical core of the node per rank.
    Core,
}

impl From<ModeArg> for numapin::affinity::Mode {
    fn from(m: ModeArg) -> Self {
        use numapin::affinity::Mode;
        match m {
            ModeArg::Node => Mode::Node,
            ModeArg::Socket => Mode::Socket,
            ModeArg::Exclusive => Mode::Exclusive,
            ModeArg::Cache => Mode::Cache,
            ModeArg::Core => Mode::Core,
        }
    }
}

/// Options shared by every command that reads a topology.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct TopoSource {
    /// Describe a saved machine instead of this one: an hwloc XML export,
    /// a `numapin topo --json` file, an NCCL topology XML, or a captured
    /// filesystem root (folder, .tar.gz or .tar.bz2); `-` reads standard
    /// input. At most 64 MiB, 8192 CPUs, 1024 NUMA nodes, 1024 GPUs, 4096
    /// NICs and storage devices.
    #[arg(long, value_name = "PATH")]
    pub(crate) input: Option<std::path::PathBuf>,
    /// Treat PCI devices with this id as accelerators too (VENDOR or
    /// VENDOR:DEVICE in hex, as `lspci -n` prints; repeatable). A VENDOR
    /// alone matches all its devices but bridges.
    #[arg(long = "accelerator-pci-id", value_name = "VENDOR[:DEVICE]", value_parser = parse_pci_id)]
    pub(crate) accelerator_pci_id: Vec<PciId>,
    /// Do not load the CUDA driver (ordinals are then assumed from PCI order).
    #[arg(long)]
    pub(crate) no_cuda: bool,
}

fn parse_pci_id(s: &str) -> Result<PciId, String> {
    PciId::parse(s)
}

impl TopoSource {
    /// The probe options these flags ask for, with this process's environment.
    pub(crate) fn options(&self) -> ProbeOptions {
        let mut o = ProbeOptions::from_process();
        o.accelerator_ids = self.accelerator_pci_id.clone();
        if self.no_cuda {
            o.cuda = CudaMode::Off;
        }
        o
    }

    /// Probes this machine or reads `--input`.
    pub(crate) fn topology(&self) -> Result<Topology> {
        let o = self.options();
        Ok(match &self.input {
            Some(p) => Topology::load(p, &o)?,
            None => Topology::probe(&o)?,
        })
    }
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
/// (`doctor`'s verdict). Errors are reported on standard error, results on
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
    // Before any thread starts: SIGINT/SIGTERM/SIGHUP remove temporary
    // folders and reader processes before they end numapin.
    if let Err(e) = numapin::signals::install_cleanup() {
        output::eprintln(&format!(
            "numapin: warning: signals will not clean up temporary files: {e}"
        ));
    }
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
    };
    match r {
        Ok(code) => code,
        Err(e) => report(&e),
    }
}
