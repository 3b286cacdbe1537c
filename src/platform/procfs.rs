//! Other processes' `/proc/<pid>` files, read under a root (`/` on a live
//! machine, a folder in tests): bounded reads, line by line where files can
//! be huge, and pure parsers of what the kernel prints. Nothing here
//! decides anything; [`crate::procs`] builds its snapshots from these.
//!
//! Every reader takes a limit and fails with `InvalidData` (naming the
//! limit) rather than allocate past it; every parser takes arbitrary bytes
//! and never panics.

use std::io::{self, BufRead, Read};
use std::path::{Path, PathBuf};

/// `InvalidData` with `msg`.
pub(crate) fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// The whole of a file of at most `cap` bytes (procfs files report size 0,
/// so the size is learnt by reading); a longer file is an error naming the
/// limit, and no more than `cap + 1` bytes are ever held.
pub(crate) fn read_capped(path: &Path, cap: usize) -> io::Result<Vec<u8>> {
    let f = std::fs::File::open(path)?;
    let mut out = Vec::new();
    f.take(cap as u64 + 1).read_to_end(&mut out)?;
    if out.len() > cap {
        return Err(invalid(format!("longer than the {cap}-byte limit")));
    }
    Ok(out)
}

/// Calls `f` on each line of `r` (without its newline), at most `max_lines`
/// lines of at most `max_line` bytes each; one buffer of `max_line` bytes
/// is reused. A longer line or more lines are an error naming the limit.
pub(crate) fn for_each_line(
    r: impl Read,
    max_line: usize,
    max_lines: u64,
    mut f: impl FnMut(&[u8]),
) -> io::Result<u64> {
    let mut r = io::BufReader::with_capacity(64 << 10, r);
    let mut line = Vec::with_capacity(256);
    let mut n = 0u64;
    loop {
        line.clear();
        let got = (&mut r)
            .take(max_line as u64 + 1)
            .read_until(b'\n', &mut line)?;
        if got == 0 {
            return Ok(n);
        }
        if line.last() == Some(&b'\n') {
            line.pop();
        } else if line.len() > max_line {
            return Err(invalid(format!(
                "line {} is longer than the {max_line}-byte limit",
                n + 1
            )));
        }
        n += 1;
        if n > max_lines {
            return Err(invalid(format!("more than the {max_lines}-line limit")));
        }
        f(&line);
    }
}

/// The numeric entries of a folder (`/proc`, `/proc/<pid>/task`,
/// `/proc/<pid>/fd`), ascending, at most `max`; `truncated` when there were
/// more. Other names are skipped.
pub(crate) fn numeric_entries(dir: &Path, max: usize) -> io::Result<(Vec<u32>, bool)> {
    let mut out = Vec::new();
    let mut truncated = false;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let Some(n) = e.file_name().to_str().and_then(parse_u32) else {
            continue;
        };
        if out.len() >= max {
            truncated = true;
            break;
        }
        out.push(n);
    }
    out.sort_unstable();
    Ok((out, truncated))
}

fn parse_u32(s: &str) -> Option<u32> {
    if s.is_empty() || s.len() > 10 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// `<root>/proc/<pid>/<rest>`.
pub(crate) fn pid_path(root: &Path, pid: u32, rest: &str) -> PathBuf {
    let mut p = root.join("proc").join(pid.to_string());
    if !rest.is_empty() {
        p.push(rest);
    }
    p
}

/// The target of a `/proc/<pid>/fd/<n>` link, as bytes (paths need not be
/// UTF-8), at most `PATH_MAX` long.
pub(crate) fn link_target(path: &Path) -> io::Result<Vec<u8>> {
    use std::os::unix::ffi::OsStringExt;
    Ok(std::fs::read_link(path)?.into_os_string().into_vec())
}

/// Whether an error means the file (or the process behind it) is gone:
/// `ENOENT`, or `ESRCH` which some `/proc` files return for a process that
/// is exiting.
pub(crate) fn is_gone(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ESRCH))
        || e.kind() == io::ErrorKind::NotFound
}

/// Whether an error is a refusal for want of permission.
pub(crate) fn is_denied(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EACCES) | Some(libc::EPERM))
}

/// The fields of `/proc/<pid>/status` a process snapshot uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Status {
    /// `Name:` (the command, at most 15 bytes, escaped by the kernel).
    pub name: Option<String>,
    /// The letter of `State:` (`R`, `S`, `Z`, ...).
    pub state: Option<char>,
    /// The real uid (first of `Uid:`).
    pub uid: Option<u32>,
    /// All of `Uid:` (real, effective, saved, filesystem; at most 4).
    pub uids: Vec<u32>,
    /// `Threads:`.
    pub threads: Option<u32>,
    /// `Cpus_allowed_list:` as printed.
    pub cpus_allowed: Option<String>,
    /// `Mems_allowed_list:` as printed.
    pub mems_allowed: Option<String>,
    /// `VmRSS:` in bytes.
    pub rss: Option<u64>,
    /// `VmLck:` in bytes (mlock).
    pub locked: Option<u64>,
    /// `VmPin:` in bytes (pages pinned long-term: RDMA, io_uring, ...).
    pub pinned: Option<u64>,
    /// `NSpid:`: the process's pid in each PID namespace from the one of
    /// the `/proc` read (first) down to its own (last); at most
    /// [`MAX_PID_NS_LEVELS`] entries, empty when absent (kernels before 4.1)
    /// or unreadable.
    pub nspid: Vec<u32>,
}

/// PID namespaces nest at most 32 deep (the kernel's `MAX_PID_NS_LEVEL`),
/// so `NSpid:` has at most 33 entries.
pub(crate) const MAX_PID_NS_LEVELS: usize = 33;

/// `1234 kB` in bytes (`None` for anything else or an overflow).
pub(crate) fn kb(v: &str) -> Option<u64> {
    let n: u64 = v.strip_suffix("kB")?.trim().parse().ok()?;
    n.checked_mul(1024)
}

/// Parses `/proc/<pid>/status` (unknown fields are skipped).
pub(crate) fn parse_status(text: &[u8]) -> Status {
    let mut s = Status::default();
    for line in text.split(|&b| b == b'\n') {
        let line = String::from_utf8_lossy(line);
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let v = v.trim();
        match k {
            "Name" => s.name = Some(v.to_string()),
            "State" => s.state = v.chars().next(),
            "Uid" => {
                s.uids = v.split_whitespace().take(4).map_while(parse_u32).collect();
                s.uid = s.uids.first().copied();
            }
            "Threads" => s.threads = parse_u32(v),
            "Cpus_allowed_list" => s.cpus_allowed = Some(v.to_string()),
            "Mems_allowed_list" => s.mems_allowed = Some(v.to_string()),
            "VmRSS" => s.rss = kb(v),
            "VmLck" => s.locked = kb(v),
            "VmPin" => s.pinned = kb(v),
            "NSpid" => s.nspid = nspid(v),
            _ => {}
        }
    }
    s
}

/// The entries of `NSpid:`, all or none: a list longer than
/// [`MAX_PID_NS_LEVELS`] or holding a non-number is not believed.
fn nspid(v: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for w in v.split_ascii_whitespace() {
        match parse_u32(w) {
            Some(n) if out.len() < MAX_PID_NS_LEVELS => out.push(n),
            _ => return Vec::new(),
        }
    }
    out
}

/// The kernel's flag of a kernel thread in `/proc/<pid>/stat`'s `flags`
/// (field 9): `PF_KTHREAD`.
const PF_KTHREAD: u64 = 0x0020_0000;

/// The `flags` field (9) of `/proc/<pid>/stat`, counted after the
/// command's closing parenthesis.
pub(crate) fn stat_flags(stat: &[u8]) -> Option<u64> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(stat.get(close + 1..)?).ok()?;
    // Field 3 (state) is the first after the parenthesis; 9 is the 7th.
    rest.split_ascii_whitespace().nth(6)?.parse().ok()
}

/// What `/proc/<pid>/stat` says of which process, and which program, a
/// pid names: its start time in clock ticks since boot (field 22: another
/// process given the same pid later starts later), and its command (field
/// 2) with the addresses of its code and stack (fields 26-28, placed anew
/// by each `exec`). To a reader that may not trace it the kernel shows
/// `start_code` and `end_code` as 1 and `start_stack` as 0, so only a
/// change of command is seen; all three are 0 only for a process with no
/// memory left (a zombie, or one exiting). The command also changes
/// without an `exec` (`prctl(PR_SET_NAME)`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct StatIdentity {
    pub start: Option<u64>,
    pub program: (Vec<u8>, [u64; 3]),
}

/// The [`StatIdentity`] in a `/proc/<pid>/stat`; `None` when it is not one.
pub(crate) fn stat_identity(stat: &[u8]) -> Option<StatIdentity> {
    let open = stat.iter().position(|&b| b == b'(')?;
    let close = stat.iter().rposition(|&b| b == b')')?;
    let comm = stat.get(open + 1..close)?.to_vec();
    let rest = std::str::from_utf8(stat.get(close + 1..)?).ok()?;
    // Field 3 (state) is the first after the parenthesis.
    let f: Vec<&str> = rest.split_ascii_whitespace().take(26).collect();
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
    Some(StatIdentity {
        start: num(19),
        program: (comm, [num(23)?, num(24)?, num(25)?]),
    })
}

/// Whether `<root>/proc` shows the host's PID namespace (the initial one,
/// whose pids NVML reports): there, and only there, pid 2 is the kernel
/// thread `kthreadd` (every kernel thread belongs to the initial namespace;
/// a user process cannot set `PF_KTHREAD`). Without it (a container's own
/// `/proc`, or one that hides pid 2 from this user with `hidepid=`), the
/// answer is `false`: pids there cannot be matched with the host's.
pub(crate) fn shows_host_pids(root: &Path) -> bool {
    let stat = read_capped(&pid_path(root, 2, "stat"), 64 << 10);
    stat.ok()
        .and_then(|b| stat_flags(&b))
        .is_some_and(|f| f & PF_KTHREAD != 0)
}

/// The CPU a task last ran on: field 39 (`processor`) of
/// `/proc/<pid>/task/<tid>/stat`, counted after the command's closing
/// parenthesis (the command itself may hold spaces and parentheses).
pub(crate) fn stat_processor(stat: &[u8]) -> Option<u32> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(stat.get(close + 1..)?).ok()?;
    // Field 3 (state) is the first after the parenthesis; 39 is the 37th.
    rest.split_ascii_whitespace().nth(36).and_then(parse_u32)
}

/// The values of the variables named in `wanted` in a NUL-separated
/// `/proc/<pid>/environ`, in `wanted`'s order, lossily decoded; the first
/// definition of a name wins, as `getenv` does.
pub(crate) fn environ_values(environ: &[u8], wanted: &[&str]) -> Vec<(String, String)> {
    let mut found: Vec<Option<String>> = vec![None; wanted.len()];
    for entry in environ.split(|&b| b == 0) {
        let Some(eq) = entry.iter().position(|&b| b == b'=') else {
            continue;
        };
        let (k, v) = (&entry[..eq], &entry[eq + 1..]);
        if let Some(i) = wanted.iter().position(|w| w.as_bytes() == k) {
            if found[i].is_none() {
                found[i] = Some(String::from_utf8_lossy(v).into_owned());
            }
        }
    }
    wanted
        .iter()
        .zip(found)
        .filter_map(|(k, v)| Some((k.to_string(), v?)))
        .collect()
}

/// `/proc/<pid>/cmdline` as one line: arguments joined by spaces (a
/// trailing NUL dropped), lossily decoded.
pub(crate) fn cmdline_text(raw: &[u8]) -> String {
    let raw = raw.strip_suffix(&[0]).unwrap_or(raw);
    raw.split(|&b| b == 0)
        .map(String::from_utf8_lossy)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The path of a `/proc/<pid>/maps` line (the sixth field onwards; empty
/// for an anonymous mapping).
pub(crate) fn maps_path(line: &[u8]) -> &[u8] {
    let mut rest = line;
    for _ in 0..5 {
        let t = rest.iter().position(|b| !b.is_ascii_whitespace());
        rest = &rest[t.unwrap_or(rest.len())..];
        let end = rest
            .iter()
            .position(u8::is_ascii_whitespace)
            .unwrap_or(rest.len());
        rest = &rest[end..];
    }
    let t = rest.iter().position(|b| !b.is_ascii_whitespace());
    &rest[t.unwrap_or(rest.len())..]
}

/// The NVIDIA driver's GPUs: `(device minor, PCI bus id)` from each
/// `<root>/proc/driver/nvidia/gpus/*/information` (`Device Minor:` and
/// `Bus Location:`), at most `max`. An empty list when the driver is not
/// loaded; a file that cannot be read or parsed is skipped and named in
/// the notes.
pub(crate) fn nvidia_minors(root: &Path, max: usize) -> (Vec<(u32, String)>, Vec<String>) {
    let dir = root.join("proc/driver/nvidia/gpus");
    let mut out = Vec::new();
    let mut notes = Vec::new();
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return (out, notes);
    };
    for e in entries.flatten().take(max) {
        let path = e.path().join("information");
        match read_capped(&path, 64 << 10) {
            Ok(text) => match parse_nvidia_information(&text) {
                Some(pair) => out.push(pair),
                None => notes.push(format!(
                    "{}: no `Device Minor:` and `Bus Location:`",
                    path.display()
                )),
            },
            Err(e) => notes.push(format!("{}: {e}", path.display())),
        }
    }
    out.sort();
    (out, notes)
}

/// `(minor, bus id)` from one driver `information` file.
pub(crate) fn parse_nvidia_information(text: &[u8]) -> Option<(u32, String)> {
    let text = String::from_utf8_lossy(text);
    let field = |name: &str| {
        text.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == name).then(|| v.trim().to_string())
        })
    };
    let minor = field("Device Minor").as_deref().and_then(parse_u32)?;
    let bus = field("Bus Location")?;
    Some((minor, crate::platform::pci::normalize_bus_id(&bus)?))
}

/// Reads a seqlock-protected publication from the start of `path` (a
/// `/proc/<pid>/fd/<n>` link to another process's memfd): bytes 0..8 the
/// little-endian `magic`, 8..12 a counter that is odd while the writer is
/// at work, 12..16 the length `N` of the data after it. Reads the counter,
/// the data and the counter again with positioned reads, retrying (up to
/// `tries` times, yielding between) while the counter is odd or changed.
/// The length is checked against `max_len` before anything is allocated.
pub(crate) fn read_seqlocked(
    path: &Path,
    magic: u64,
    max_len: usize,
    tries: u32,
) -> io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(path)?;
    let word = |off: u64| -> io::Result<u32> {
        let mut b = [0u8; 4];
        f.read_exact_at(&mut b, off)?;
        Ok(u32::from_le_bytes(b))
    };
    let mut head = [0u8; 16];
    for _ in 0..tries.max(1) {
        f.read_exact_at(&mut head, 0)
            .map_err(|e| short(e, "header"))?;
        let mut m = [0u8; 8];
        m.copy_from_slice(&head[..8]);
        let found = u64::from_le_bytes(m);
        if found != magic {
            return Err(invalid(format!("magic {found:#018x}, not {magic:#018x}")));
        }
        let seq = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
        let len = u32::from_le_bytes([head[12], head[13], head[14], head[15]]) as usize;
        if seq % 2 == 1 {
            std::thread::yield_now();
            continue;
        }
        if len > max_len {
            return Err(invalid(format!(
                "a length of {len} bytes, past the {max_len}-byte limit"
            )));
        }
        let mut data = vec![0u8; len];
        f.read_exact_at(&mut data, 16)
            .map_err(|e| short(e, "data"))?;
        if word(8)? == seq {
            return Ok(data);
        }
        std::thread::yield_now();
    }
    Err(io::Error::new(
        io::ErrorKind::WouldBlock,
        format!("still being written after {tries} tries"),
    ))
}

fn short(e: io::Error, what: &str) -> io::Error {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        invalid(format!("the file ends inside its {what}"))
    } else {
        e
    }
}

#[cfg(test)]
mod tests;
