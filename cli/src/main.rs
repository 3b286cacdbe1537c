//! The `numapin` binary: the command line of the `numapin_cli` library.

fn main() {
    std::process::exit(numapin_cli::run(std::env::args_os()));
}
