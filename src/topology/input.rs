//! Reading what `--input` names, once and within [`MAX_INPUT_BYTES`]:
//! a regular file, a folder (a captured root), or standard input (`-`, or a
//! path such as `/dev/stdin` that is this process's standard input). Other
//! file types (FIFOs, devices, sockets) are refused before they are opened,
//! so that nothing blocks or reads without end.

use std::io::Read;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::limits::{self, MAX_INPUT_BYTES};
use super::TopologyError as Error;

type Result<T, E = Error> = std::result::Result<T, E>;

/// What an input turned out to be.
pub(crate) enum Input {
    /// The whole content of a file or of standard input.
    Bytes(Vec<u8>),
    /// A folder.
    Folder(PathBuf),
}

/// The name `path` has in messages and in [`super::Topology::source`]
/// (control characters are escaped by the tools when they print to a
/// terminal).
pub(crate) fn shown(path: &Path) -> String {
    path.display().to_string()
}

/// Reads `path` (`-` is standard input).
pub(crate) fn read(path: &Path) -> Result<Input> {
    if path.as_os_str() == "-" {
        return read_stdin(&shown(path)).map(Input::Bytes);
    }
    let meta = std::fs::metadata(path).map_err(|e| Error::io_input(path, e))?;
    if meta.is_dir() {
        return Ok(Input::Folder(path.to_path_buf()));
    }
    if is_stdin(&meta) {
        return read_stdin(&shown(path)).map(Input::Bytes);
    }
    check_regular(path, &meta)?;
    if meta.len() > MAX_INPUT_BYTES {
        return Err(too_big(&shown(path), meta.len()));
    }
    // O_NONBLOCK: should the path have been replaced by a FIFO since the
    // check above, opening it does not wait for a writer.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| Error::io_input(path, e))?;
    let meta = file.metadata().map_err(|e| Error::io_input(path, e))?;
    check_regular(path, &meta)?;
    read_limited(file, &shown(path)).map(Input::Bytes)
}

/// Whether `meta` is the file this process has as standard input.
fn is_stdin(meta: &std::fs::Metadata) -> bool {
    use std::os::fd::AsFd;
    let Ok(fd) = std::io::stdin().as_fd().try_clone_to_owned() else {
        return false;
    };
    let Ok(stdin) = std::fs::File::from(fd).metadata() else {
        return false;
    };
    stdin.dev() == meta.dev() && stdin.ino() == meta.ino() && !meta.is_file()
}

fn check_regular(path: &Path, meta: &std::fs::Metadata) -> Result<()> {
    let ft = meta.file_type();
    let what = if ft.is_file() || ft.is_dir() {
        return Ok(());
    } else if ft.is_fifo() {
        "a FIFO (named pipe)"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    };
    Err(Error::input(
        shown(path),
        format!("is {what}, not a file numapin reads"),
        "give a regular file, a folder, a .tar.gz/.tar.bz2, or `-` to read standard input",
    ))
}

fn too_big(input: &str, size: u64) -> Error {
    limits::over(
        input,
        format!(
            "it is {} bytes or more, over the size limit of {} MiB for a description",
            size,
            MAX_INPUT_BYTES >> 20
        ),
    )
}

fn read_stdin(input: &str) -> Result<Vec<u8>> {
    read_limited(std::io::stdin().lock(), input)
}

/// Reads to the end, refusing more than [`MAX_INPUT_BYTES`].
fn read_limited(r: impl Read, input: &str) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    r.take(MAX_INPUT_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(|e| Error::io_named(input, "cannot read it", e))?;
    if buf.len() as u64 > MAX_INPUT_BYTES {
        return Err(too_big(input, buf.len() as u64));
    }
    Ok(buf)
}
