//! Platform code: the CUDA driver, NVML, Linux system calls and `/proc` and
//! cgroup files, and the helpers that isolate hwloc and cudarc failures.
//! Private to the crate (reached by numapin's own tools and tests through
//! [`crate::internals`]); the only place besides the arena's region and
//! buffer code where `unsafe` appears, each block with a `// SAFETY:`
//! comment.

pub(crate) mod block;
pub(crate) mod cgroup;
pub(crate) mod cleanup;
pub(crate) mod container;
pub(crate) mod cuda;
pub(crate) mod file;
pub(crate) mod file_write;
pub(crate) mod hugetlb;
pub(crate) mod isolate;
pub(crate) mod numa;
pub(crate) mod numa_maps;
pub(crate) mod nvml;
pub(crate) mod panic_guard;
pub(crate) mod pci;
pub(crate) mod probe;
pub(crate) mod procfs;
pub(crate) mod shm;
pub(crate) mod statefile;
pub(crate) mod sys;

/// A temporary filesystem root holding `files` (`(path, contents)`, paths
/// relative to the root), for the readers that take a root.
#[cfg(test)]
pub(crate) fn fake_root(files: &[(&str, &str)]) -> tempfile::TempDir {
    let d = tempfile::tempdir().expect("a temporary folder");
    for (p, c) in files {
        let p = d.path().join(p);
        std::fs::create_dir_all(p.parent().expect("a path below the root"))
            .expect("folders in the fake root");
        std::fs::write(p, c).expect("a file in the fake root");
    }
    d
}
