//! Everything the tool writes: standard output, standard error and files.
//!
//! * A write error on standard output (a full disk, `> /dev/full`) is a
//!   system failure: exit 1 with the system's reason. A reader that stops
//!   early (`| head`) ends the process quietly through SIGPIPE, which `main`
//!   sets back to its default action, as other command-line tools do.
//! * Standard error is written on a best-effort basis: when it fails there
//!   is nowhere left to report to, and the exit code still says what
//!   happened.
//! * On a terminal, control characters (names from a file may hold
//!   `ESC ] 0 ;` sequences) are shown escaped, never sent raw; redirected
//!   output keeps the bytes as they are.
//! * Files are written to a temporary file beside the target, then renamed
//!   over it: a failed write leaves the old file as it was.

use std::borrow::Cow;
use std::io::{IsTerminal, Write};
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use crate::error::{CliError, Result};

/// `text` with control characters other than newline and tab escaped
/// (`\x1b`, `\u{9b}`).
pub(crate) fn escape_controls(text: &str) -> Cow<'_, str> {
    let is_bad = |c: char| (c.is_control() && c != '\n' && c != '\t') || c == '\u{7f}';
    if !text.chars().any(is_bad) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if !is_bad(c) {
            out.push(c);
        } else if (c as u32) < 0x80 {
            out.push_str(&format!("\\x{:02x}", c as u32));
        } else {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        }
    }
    Cow::Owned(out)
}

/// Writes `text` to standard output (escaped on a terminal) and flushes it.
pub(crate) fn print(text: &str) -> Result<()> {
    let out = std::io::stdout();
    let text = if out.is_terminal() {
        escape_controls(text)
    } else {
        Cow::Borrowed(text)
    };
    let mut lock = out.lock();
    lock.write_all(text.as_bytes())
        .and_then(|()| lock.flush())
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                // SIGPIPE is ignored (a parent chose so): end as quietly.
                std::process::exit(141);
            }
            CliError::system(
                "writing to standard output",
                "check where the output goes (a full disk, a closed file, the file-size limit `ulimit -f`)",
                e,
            )
        })
}

/// Writes `text` and a newline to standard output.
pub(crate) fn println(text: &str) -> Result<()> {
    print(&format!("{text}\n"))
}

/// Writes a line to standard error (escaped on a terminal); errors are
/// ignored, there being nowhere left to report them.
pub(crate) fn eprintln(text: &str) {
    let err = std::io::stderr();
    let line = format!("{text}\n");
    let line = if err.is_terminal() {
        escape_controls(&line).into_owned()
    } else {
        line
    };
    let _ = err.lock().write_all(line.as_bytes());
}

/// Prints an error the way every command does (the message with its
/// causes, then the fix), returns its exit code.
pub(crate) fn report(e: &CliError) -> i32 {
    let mut text = format!("numapin: error: {}", numapin::error::with_causes(e));
    if let Some(fix) = e.fix() {
        text.push_str(&format!("\n  fix: {fix}"));
    }
    eprintln(&text);
    e.exit_code()
}

/// Writes terminal control text (a progress line) to standard error as it
/// is; errors are ignored.
pub(crate) fn progress(raw: &str) {
    let _ = std::io::stderr().lock().write_all(raw.as_bytes());
}

/// Checks that `path` can be written by [`write_file`] without blocking or
/// replacing something that is not a file: a regular file (or nothing yet)
/// in an existing folder, or a character device (`/dev/null`). Used before
/// any work is done, so a bad target fails first.
pub(crate) fn check_target(path: &Path, flag: &str) -> Result<()> {
    let shown = numapin::text::shorten(&path.display().to_string());
    let refuse = |what: &str| CliError::Usage {
        problem: format!("{flag} {shown}: {what}"),
        fix: format!("give {flag} a path to a regular file in an existing, writable folder"),
    };
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() || m.file_type().is_char_device() => Ok(()),
        Ok(m) if m.is_dir() => Err(refuse("is a folder")),
        Ok(m) if m.file_type().is_fifo() => Err(refuse("is a FIFO (named pipe)")),
        Ok(_) => Err(refuse("is not a regular file")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let dir = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            if dir.is_dir() {
                Ok(())
            } else {
                Err(refuse("its folder does not exist"))
            }
        }
        Err(e) => Err(CliError::system(
            format!("{flag} {shown}: cannot check it"),
            "check the path and its folder's permissions",
            e,
        )),
    }
}

/// Writes `bytes` to `path`: through a temporary file in the same folder,
/// flushed to disk, then renamed over `path`, so that a failure (a full
/// disk) leaves an old file intact and no partial one. A character device
/// (`/dev/null`) is written in place.
pub(crate) fn write_file(path: &Path, bytes: &[u8], flag: &str) -> Result<()> {
    check_target(path, flag)?;
    let shown = numapin::text::shorten(&path.display().to_string());
    let fail = |e: std::io::Error| {
        CliError::system(
            format!("{flag} {shown}: cannot write it"),
            "free space in its folder or raise the file-size limit (`ulimit -f`), or give a path on a disk with room",
            e,
        )
    };
    if std::fs::metadata(path).is_ok_and(|m| m.file_type().is_char_device()) {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(fail)?;
        return f.write_all(bytes).and_then(|()| f.flush()).map_err(fail);
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".numapin-")
        .tempfile_in(dir)
        .map_err(fail)?;
    tmp.write_all(bytes)
        .and_then(|()| tmp.as_file().sync_all())
        .map_err(fail)?;
    // Keep the permissions an old file had; a new one gets 0644 less umask
    // rather than the temporary file's 0600.
    let mode = std::fs::metadata(path).map_or(0o644, |m| {
        use std::os::unix::fs::PermissionsExt;
        m.permissions().mode()
    });
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(mode));
    }
    tmp.persist(path).map_err(|e| fail(e.error))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(escape_controls("a\u{1b}]0;x\u{7}b\n"), "a\\x1b]0;x\\x07b\n");
        assert_eq!(escape_controls("\u{9b}31m"), "\\u{9b}31m");
        assert!(matches!(escape_controls("plain\ttext\n"), Cow::Borrowed(_)));
    }

    #[test]
    fn files_are_replaced_whole() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.xml");
        std::fs::write(&p, "old").unwrap();
        write_file(&p, b"new", "--export").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "new");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        assert!(write_file(dir.path(), b"x", "--export").is_err());
        assert!(write_file(&dir.path().join("no/such/dir/f"), b"x", "--export").is_err());
        let e = write_file(Path::new("/dev/full"), b"x", "--export").unwrap_err();
        assert_eq!(e.exit_code(), 1);
        assert!(e.to_string().contains("--export"), "{e}");
    }
}
