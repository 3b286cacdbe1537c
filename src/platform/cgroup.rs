//! The cgroup memory limit over this process: the tightest of cgroup v2
//! `memory.max` and `memory.high` and cgroup v1 `memory.limit_in_bytes`
//! over its cgroup and the ancestors visible to it. Pinned memory (locked
//! or registered with CUDA) is charged to the cgroup and cannot be
//! reclaimed, so the limit caps the arena's default budget (the runtime
//! applies it; `docs/arena.md`). Above `memory.max` the OOM killer ends the
//! process without a word, so the cap matters.
//!
//! Everything is read under a filesystem root (`/` for this machine), so
//! tests build fake roots:
//!
//! 1. `proc/self/cgroup`: the v2 line `0::/path` and the v1 line whose
//!    controller list holds `memory` (`4:memory:/path`);
//! 2. `proc/self/mountinfo`: where each hierarchy is mounted and which of
//!    its cgroups is the mount's root (a container sees its own cgroup as
//!    `/` with a private cgroup namespace, or a bind mount of
//!    `/docker/ID` on v1), so the directory is the mount point plus the
//!    path below the mount's root; without mountinfo, `/sys/fs/cgroup`
//!    (v2) and `/sys/fs/cgroup/memory` (v1) are assumed;
//! 3. from that directory up to the mount point, each level's limit files.
//!    `max` (v2) and v1 values of 2^62 or more (v1 prints
//!    `PAGE_COUNTER_MAX * PAGE_SIZE`, 0x7ffffffffffff000 with 4 KiB pages,
//!    for "unlimited") mean no limit.
//!
//! Limits above the visible root (a pod's limit seen from a container with
//! its own cgroup namespace) cannot be read; the container's own limit is
//! normally the one set.

use std::path::{Path, PathBuf};

/// v1 values at or above this are "unlimited".
pub(crate) const V1_UNLIMITED: u64 = 1 << 62;

/// Which file a limit came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LimitKind {
    /// cgroup v2 `memory.max` (the OOM killer acts above it).
    V2Max,
    /// cgroup v2 `memory.high` (reclaim and throttling above it; pinned
    /// pages cannot be reclaimed, so the process stalls).
    V2High,
    /// cgroup v1 `memory.limit_in_bytes`.
    V1Limit,
}

impl LimitKind {
    /// The file name.
    pub fn file(&self) -> &'static str {
        match self {
            LimitKind::V2Max => "memory.max",
            LimitKind::V2High => "memory.high",
            LimitKind::V1Limit => "memory.limit_in_bytes",
        }
    }
}

/// One limit found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limit {
    /// Bytes.
    pub bytes: u64,
    /// The file.
    pub kind: LimitKind,
    /// The file's path (under the root given).
    pub path: PathBuf,
    /// Bytes in use at that level (`memory.current`, `memory.usage_in_bytes`).
    pub usage: Option<u64>,
}

/// What was found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryLimits {
    /// Every finite limit, leaf first (v2 before v1).
    pub limits: Vec<Limit>,
    /// The directories looked at (the leaf of each hierarchy found).
    pub cgroup_dirs: Vec<PathBuf>,
    /// Things worth saying (no memory controller found, a path outside
    /// the mount).
    pub notes: Vec<String>,
}

impl MemoryLimits {
    /// The tightest limit, if any.
    pub fn tightest(&self) -> Option<&Limit> {
        self.limits.iter().min_by_key(|l| l.bytes)
    }
}

struct Mount {
    root: String,
    point: String,
    fstype: String,
    super_opts: String,
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
pub(crate) fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = u32::from(b[i + 1] - b'0') * 64
                + u32::from(b[i + 2] - b'0') * 8
                + u32::from(b[i + 3] - b'0');
            if let Ok(v) = u8::try_from(v) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn mounts(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let f: Vec<&str> = pre.split(' ').collect();
            let p: Vec<&str> = post.split(' ').collect();
            Some(Mount {
                root: unescape(f.get(3)?),
                point: unescape(f.get(4)?),
                fstype: p.first()?.to_string(),
                super_opts: p.get(2).unwrap_or(&"").to_string(),
            })
        })
        .collect()
}

/// The directory of cgroup `path` in a hierarchy mounted at `m`, relative
/// to the filesystem root (`None` when the path is outside the mount).
fn cgroup_dir(m: &Mount, path: &str) -> Option<PathBuf> {
    let rel = if m.root == "/" {
        path.strip_prefix('/').unwrap_or(path)
    } else {
        let r = path.strip_prefix(m.root.as_str())?;
        if !(r.is_empty() || r.starts_with('/')) {
            return None;
        }
        r.trim_start_matches('/')
    };
    if rel.split('/').any(|c| c == "..") {
        return None;
    }
    let mut d = PathBuf::from(m.point.trim_start_matches('/'));
    if !rel.is_empty() {
        d.push(rel);
    }
    Some(d)
}

fn read_u64(root: &Path, p: &Path) -> Option<u64> {
    std::fs::read_to_string(root.join(p))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// A v2 limit file's value: `Some(None)` for `max`, `None` when absent or
/// unreadable.
fn read_v2(root: &Path, p: &Path) -> Option<Option<u64>> {
    let s = std::fs::read_to_string(root.join(p)).ok()?;
    let s = s.trim();
    if s == "max" {
        Some(None)
    } else {
        s.parse().ok().map(Some)
    }
}

/// Walks from `leaf` up to `top` (both relative to the root), calling
/// `f` on each directory.
fn walk_up(leaf: &Path, top: &Path, mut f: impl FnMut(&Path)) {
    let mut d = leaf.to_path_buf();
    loop {
        f(&d);
        if d == top || !d.starts_with(top) || !d.pop() {
            break;
        }
    }
}

/// The limits over this process (`read_limits` of `/`).
pub(crate) fn read_self() -> MemoryLimits {
    read_limits(Path::new("/"))
}

/// Reads the limits under `root` (see the module docs).
pub(crate) fn read_limits(root: &Path) -> MemoryLimits {
    let mut out = MemoryLimits::default();
    let Ok(cg) = std::fs::read_to_string(root.join("proc/self/cgroup")) else {
        out.notes.push("proc/self/cgroup is unreadable".into());
        return out;
    };
    // `None` without mountinfo: the usual mount points are assumed.
    let ms = std::fs::read_to_string(root.join("proc/self/mountinfo"))
        .ok()
        .map(|mi| mounts(&mi));
    let (v2_path, v1_path) = cgroup_paths(&cg);
    if let Some(path) = &v2_path {
        v2_limits(root, path, ms.as_deref(), &mut out);
    }
    if let Some(path) = &v1_path {
        v1_limits(root, path, ms.as_deref(), &mut out);
    }
    if v2_path.is_none() && v1_path.is_none() {
        out.notes
            .push("no cgroup v2 line and no v1 memory controller in proc/self/cgroup".into());
    }
    out
}

/// The cgroup paths of `proc/self/cgroup`: the v2 one (`0::/path`) and the
/// one of the v1 hierarchy with the memory controller.
fn cgroup_paths(cg: &str) -> (Option<String>, Option<String>) {
    let mut v2_path = None;
    let mut v1_path = None;
    for l in cg.lines() {
        let mut it = l.splitn(3, ':');
        let (Some(id), Some(ctrl), Some(path)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        if id == "0" && ctrl.is_empty() {
            v2_path = Some(path.to_string());
        } else if ctrl.split(',').any(|c| c == "memory") {
            v1_path = Some(path.to_string());
        }
    }
    (v2_path, v1_path)
}

/// The mount assumed at `point` without mountinfo.
fn assumed_mount(point: &str) -> Mount {
    Mount {
        root: "/".into(),
        point: point.into(),
        fstype: String::new(),
        super_opts: String::new(),
    }
}

/// The v2 limits over cgroup `path`, in each cgroup2 mount of `ms` (or the
/// assumed `/sys/fs/cgroup`) that has the memory controller.
fn v2_limits(root: &Path, path: &str, ms: Option<&[Mount]>, out: &mut MemoryLimits) {
    let fb = assumed_mount("/sys/fs/cgroup");
    let candidates: Vec<&Mount> = match ms {
        None => vec![&fb],
        Some(ms) => ms.iter().filter(|m| m.fstype == "cgroup2").collect(),
    };
    for m in candidates {
        let Some(leaf) = cgroup_dir(m, path) else {
            out.notes.push(format!(
                "cgroup v2 path {path} is outside the mount at {} (root {})",
                m.point, m.root
            ));
            continue;
        };
        let top = PathBuf::from(m.point.trim_start_matches('/'));
        // A hierarchy without the memory controller has no memory.* files.
        let controllers =
            std::fs::read_to_string(root.join(&top).join("cgroup.controllers")).unwrap_or_default();
        let has_files = root.join(&leaf).join("memory.max").exists()
            || root.join(&leaf).join("memory.current").exists();
        if !controllers.split_whitespace().any(|c| c == "memory") && !has_files {
            out.notes
                .push(format!("cgroup v2 at {} has no memory controller", m.point));
            continue;
        }
        out.cgroup_dirs.push(leaf.clone());
        walk_up(&leaf, &top, |d| {
            let usage = read_u64(root, &d.join("memory.current"));
            for kind in [LimitKind::V2Max, LimitKind::V2High] {
                let p = d.join(kind.file());
                if let Some(Some(bytes)) = read_v2(root, &p) {
                    out.limits.push(Limit {
                        bytes,
                        kind,
                        path: p,
                        usage,
                    });
                }
            }
        });
    }
}

/// The v1 limits over cgroup `path`, in the first v1 mount of `ms` with
/// the memory controller (or the assumed `/sys/fs/cgroup/memory`).
fn v1_limits(root: &Path, path: &str, ms: Option<&[Mount]>, out: &mut MemoryLimits) {
    let fb = assumed_mount("/sys/fs/cgroup/memory");
    let m = match ms {
        None => Some(&fb),
        Some(ms) => ms
            .iter()
            .find(|m| m.fstype == "cgroup" && m.super_opts.split(',').any(|o| o == "memory")),
    };
    let Some(m) = m else {
        out.notes
            .push("a v1 memory cgroup is listed but its hierarchy is not mounted".into());
        return;
    };
    let top = PathBuf::from(m.point.trim_start_matches('/'));
    let leaf = cgroup_dir(m, path).unwrap_or_else(|| {
        out.notes.push(format!("cgroup v1 path {path} is outside the mount at {} (root {}): reading the mount's own cgroup", m.point, m.root));
        top.clone()
    });
    out.cgroup_dirs.push(leaf.clone());
    walk_up(&leaf, &top, |d| {
        let p = d.join(LimitKind::V1Limit.file());
        if let Some(bytes) = read_u64(root, &p).filter(|&b| b < V1_UNLIMITED) {
            let usage = read_u64(root, &d.join("memory.usage_in_bytes"));
            out.limits.push(Limit {
                bytes,
                kind: LimitKind::V1Limit,
                path: p,
                usage,
            });
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::fake_root as root;

    const V2_MOUNT: &str =
        "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";

    #[test]
    fn v2_tightest_ancestor_wins() {
        let d = root(&[
            ("proc/self/cgroup", "0::/a/b/c\n"),
            ("proc/self/mountinfo", V2_MOUNT),
            (
                "sys/fs/cgroup/cgroup.controllers",
                "cpuset cpu io memory pids\n",
            ),
            ("sys/fs/cgroup/a/memory.max", "8589934592\n"),
            ("sys/fs/cgroup/a/memory.high", "max\n"),
            ("sys/fs/cgroup/a/b/memory.max", "max\n"),
            ("sys/fs/cgroup/a/b/memory.high", "6442450944\n"),
            ("sys/fs/cgroup/a/b/c/memory.max", "17179869184\n"),
            ("sys/fs/cgroup/a/b/c/memory.high", "max\n"),
            ("sys/fs/cgroup/a/b/c/memory.current", "1048576\n"),
        ]);
        let l = read_limits(d.path());
        let t = l.tightest().unwrap();
        assert_eq!((t.bytes, t.kind), (6 << 30, LimitKind::V2High));
        assert_eq!(t.path, PathBuf::from("sys/fs/cgroup/a/b/memory.high"));
        assert_eq!(l.limits.len(), 3);
        assert_eq!(l.limits[0].usage, Some(1 << 20));
    }

    #[test]
    fn v2_private_namespace_and_unlimited() {
        // Docker with cgroupns=private: the container's cgroup is "/".
        let d = root(&[
            ("proc/self/cgroup", "0::/\n"),
            (
                "proc/self/mountinfo",
                "600 590 0:26 / /sys/fs/cgroup ro,nosuid - cgroup2 cgroup rw\n",
            ),
            ("sys/fs/cgroup/cgroup.controllers", "cpu memory pids\n"),
            ("sys/fs/cgroup/memory.max", "2147483648\n"),
            ("sys/fs/cgroup/memory.high", "max\n"),
        ]);
        let l = read_limits(d.path());
        assert_eq!(l.tightest().unwrap().bytes, 2 << 30);
        let d = root(&[
            ("proc/self/cgroup", "0::/\n"),
            ("proc/self/mountinfo", V2_MOUNT),
            ("sys/fs/cgroup/cgroup.controllers", "memory\n"),
            ("sys/fs/cgroup/memory.max", "max\n"),
        ]);
        let l = read_limits(d.path());
        assert!(l.tightest().is_none());
    }

    #[test]
    fn v1_docker_bind_mount_and_sentinel() {
        // v1 Docker: the hierarchy's root inside the container is /docker/ID.
        let d = root(&[
            ("proc/self/cgroup", "12:memory:/docker/abc\n11:cpu,cpuacct:/docker/abc\n0::/\n"),
            ("proc/self/mountinfo", "700 690 0:40 /docker/abc /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory\n"),
            ("sys/fs/cgroup/memory/memory.limit_in_bytes", "536870912\n"),
            ("sys/fs/cgroup/memory/memory.usage_in_bytes", "4096\n"),
        ]);
        let l = read_limits(d.path());
        let t = l.tightest().unwrap();
        assert_eq!(
            (t.bytes, t.kind, t.usage),
            (512 << 20, LimitKind::V1Limit, Some(4096))
        );
        // The unlimited sentinel (4 KiB and 64 KiB page kernels).
        for s in ["9223372036854771712", "9223372036854710272"] {
            let d = root(&[
                ("proc/self/cgroup", "4:memory:/x\n"),
                (
                    "proc/self/mountinfo",
                    "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n",
                ),
                ("sys/fs/cgroup/memory/x/memory.limit_in_bytes", s),
                ("sys/fs/cgroup/memory/memory.limit_in_bytes", s),
            ]);
            assert!(read_limits(d.path()).tightest().is_none(), "{s}");
        }
    }

    #[test]
    fn hybrid_uses_v1_memory_when_v2_has_no_controller() {
        // This machine's layout: v2 at /sys/fs/cgroup/unified with no
        // controllers, memory on v1.
        let d = root(&[
            ("proc/self/cgroup", "4:memory:/process_api/9c\n3:cpuset:/\n0::/\n"),
            (
                "proc/self/mountinfo",
                "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n",
            ),
            ("sys/fs/cgroup/unified/cgroup.controllers", "hugetlb\n"),
            ("sys/fs/cgroup/memory/process_api/9c/memory.limit_in_bytes", "268435456\n"),
            ("sys/fs/cgroup/memory/process_api/memory.limit_in_bytes", "9223372036854771712\n"),
            ("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n"),
        ]);
        let l = read_limits(d.path());
        assert_eq!(l.tightest().unwrap().bytes, 256 << 20);
        assert!(
            l.notes.iter().any(|n| n.contains("no memory controller")),
            "{:?}",
            l.notes
        );
    }

    #[test]
    fn no_mountinfo_falls_back_to_the_usual_places() {
        let d = root(&[
            ("proc/self/cgroup", "0::/user.slice\n"),
            ("sys/fs/cgroup/user.slice/memory.max", "1073741824\n"),
        ]);
        assert_eq!(read_limits(d.path()).tightest().unwrap().bytes, 1 << 30);
    }

    #[test]
    fn odd_inputs_do_not_escape_the_mount_or_panic() {
        let d = root(&[
            ("proc/self/cgroup", "0::/../../etc\n4:memory:/../x\nnonsense\n"),
            ("proc/self/mountinfo", "garbage\n30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n35 31 0:32 /a /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"),
            ("sys/fs/cgroup/cgroup.controllers", "memory"),
            ("etc/memory.max", "1"),
            ("sys/fs/cgroup/memory/memory.limit_in_bytes", "not a number"),
        ]);
        let l = read_limits(d.path());
        assert!(l.tightest().is_none(), "{l:?}");
        assert!(!l.notes.is_empty());
        let l = read_limits(Path::new("/nonexistent-root"));
        assert!(l.tightest().is_none());
    }

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape("/a\\040b"), "/a b");
        assert_eq!(unescape("\\"), "\\");
        assert_eq!(unescape("\\04"), "\\04");
        assert_eq!(unescape("\\777x"), "\\777x");
    }

    #[test]
    fn reads_this_machine() {
        let l = read_limits(Path::new("/"));
        assert!(!l.cgroup_dirs.is_empty() || !l.notes.is_empty());
    }
}
