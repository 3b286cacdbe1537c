//! The `numapin` command line.

fn main() {
    std::process::exit(numapin::cli::main());
}
