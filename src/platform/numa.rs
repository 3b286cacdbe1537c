//! The raw NUMA and memory system calls, in one place: `mbind`,
//! `set_mempolicy`, `get_mempolicy`, `move_pages`, `migrate_pages`,
//! `set_mempolicy_home_node` and `getcpu` (no `nix` wrapper exists for
//! them), and `mmap` (plain and `MAP_HUGETLB`)/`munmap`, `mprotect`,
//! `mlock`/`munlock`, `madvise` (`MADV_POPULATE_WRITE` among the advice)
//! and `mincore`.
//!
//! A seccomp profile (Docker's default without CAP_SYS_NICE) refuses the
//! NUMA calls with `EPERM`; a kernel without NUMA support answers `ENOSYS`.
//! [`is_refusal`] tells those apart from real failures, so that callers can
//! fall back (first touch, `numa_maps`, CPU-only binding).
//!
//! Each is a thin checked wrapper with the kernel's own argument layout and
//! `libc`'s constants; every `unsafe` block says why its pointers are valid.
//! Node numbers are limited by [`MAX_NODES`] everywhere.

use std::io;

/// Node numbers run from 0 to `MAX_NODES - 1`: the kernel's own
/// `MAX_NUMNODES` on x86-64 `MAXSMP` kernels, the largest distributions
/// ship. Every node mask numapin builds, and every node number it reads
/// from a description, is checked against it.
pub const MAX_NODES: u32 = 1024;

/// `MPOL_PREFERRED_MANY` (Linux 5.15), not in `libc` yet.
const MPOL_PREFERRED_MANY: libc::c_int = 5;
/// `MPOL_MF_STRICT` from `<linux/mempolicy.h>`, not in `libc` yet: fail if
/// existing pages do not follow the policy.
const MPOL_MF_STRICT: libc::c_ulong = 1;

/// A memory policy over a set of nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Policy {
    /// `MPOL_BIND`: only these nodes.
    Bind,
    /// `MPOL_PREFERRED`: this node first (one node).
    Preferred,
    /// `MPOL_PREFERRED_MANY`: these nodes first (Linux 5.15 and later).
    PreferredMany,
}

impl Policy {
    fn mode(self) -> libc::c_int {
        match self {
            Policy::Bind => libc::MPOL_BIND,
            Policy::Preferred => libc::MPOL_PREFERRED,
            Policy::PreferredMany => MPOL_PREFERRED_MANY,
        }
    }
}

/// A node mask for the kernel: one bit per node, in `c_ulong` words.
fn node_mask(nodes: &[u32]) -> io::Result<Vec<libc::c_ulong>> {
    let max = nodes.iter().copied().max().unwrap_or(0);
    if max >= MAX_NODES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "NUMA node {max} is beyond the supported node numbers (0 to {})",
                MAX_NODES - 1
            ),
        ));
    }
    let bits = libc::c_ulong::BITS;
    let mut mask = vec![0 as libc::c_ulong; (max / bits) as usize + 1];
    for &n in nodes {
        mask[(n / bits) as usize] |= 1 << (n % bits);
    }
    Ok(mask)
}

/// `maxnode` for a mask: the kernel reads `maxnode - 1` bits (a historical
/// off-by-one that libnuma also accounts for), so one more than it holds.
fn maxnode(mask: &[libc::c_ulong]) -> libc::c_ulong {
    (mask.len() * libc::c_ulong::BITS as usize + 1) as libc::c_ulong
}

/// Whether an error from one of the NUMA calls means the call is not
/// available to this process (`EPERM`/`EACCES`: a seccomp profile or a
/// security module refused it; `ENOSYS`: no NUMA support, or a filter that
/// answers so) rather than that it ran and failed.
pub(crate) fn is_refusal(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EPERM) | Some(libc::EACCES) | Some(libc::ENOSYS)
    )
}

/// `EPERM`, `ENOSYS`, ... for the errors the NUMA calls give, else
/// `errno N`.
pub(crate) fn errno_name(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EPERM) => "EPERM".into(),
        Some(libc::EACCES) => "EACCES".into(),
        Some(libc::ENOSYS) => "ENOSYS".into(),
        Some(libc::EINVAL) => "EINVAL".into(),
        Some(libc::ENOMEM) => "ENOMEM".into(),
        Some(libc::EFAULT) => "EFAULT".into(),
        Some(libc::EIO) => "EIO".into(),
        Some(libc::ENOENT) => "ENOENT".into(),
        Some(n) => format!("errno {n}"),
        None => e.to_string(),
    }
}

fn result(r: libc::c_long) -> io::Result<()> {
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Binds `len` bytes at `addr` to `node` (`mbind(MPOL_BIND, {node},
/// MPOL_MF_STRICT)`).
///
/// # Safety
/// `addr..addr+len` must be a mapping owned by the caller (the policy of
/// that range changes).
pub(crate) unsafe fn mbind_node(addr: *mut u8, len: usize, node: u32) -> io::Result<()> {
    let mask = node_mask(&[node])?;
    // SAFETY: the kernel reads maxnode - 1 = mask.len() words of bits from
    // the live mask; the caller owns the range.
    result(unsafe {
        libc::syscall(
            libc::SYS_mbind,
            addr,
            len,
            libc::c_long::from(libc::MPOL_BIND),
            mask.as_ptr(),
            maxnode(&mask),
            MPOL_MF_STRICT,
        )
    })
}

/// Resets the policy of `len` bytes at `addr` to the default
/// (`mbind(MPOL_DEFAULT)`): a harmless call, used to probe whether `mbind`
/// is allowed.
///
/// # Safety
/// `addr..addr+len` must be a mapping owned by the caller.
pub(crate) unsafe fn mbind_default(addr: *mut u8, len: usize) -> io::Result<()> {
    // SAFETY: MPOL_DEFAULT with a null mask and maxnode 0 reads no memory
    // of ours; the caller owns the range.
    result(unsafe {
        libc::syscall(
            libc::SYS_mbind,
            addr,
            len,
            libc::c_long::from(libc::MPOL_DEFAULT),
            std::ptr::null::<libc::c_ulong>(),
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    })
}

/// `migrate_pages(0, 0, NULL, NULL)`: from no node to no node, which moves
/// nothing; it reaches the kernel's permission checks, so it probes whether
/// the call is allowed.
pub(crate) fn migrate_pages_noop() -> io::Result<()> {
    // SAFETY: maxnode 0 with null masks: the kernel reads no memory of ours
    // and, with empty node sets, moves no page.
    let r = unsafe {
        libc::syscall(
            libc::SYS_migrate_pages,
            0 as libc::c_long,
            0 as libc::c_ulong,
            std::ptr::null::<libc::c_ulong>(),
            std::ptr::null::<libc::c_ulong>(),
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `set_mempolicy_home_node` (Linux 5.17), the same number on x86-64 and
/// aarch64 (every asm-generic architecture); not in `libc` yet.
const SYS_SET_MEMPOLICY_HOME_NODE: libc::c_long = 450;

/// `set_mempolicy_home_node(addr, len, node, 0)`: on a range without a
/// bind or preferred-many policy it changes nothing, so it probes whether
/// the call is allowed.
///
/// # Safety
/// `addr..addr+len` must be a mapping owned by the caller.
pub(crate) unsafe fn set_mempolicy_home_node(
    addr: *mut u8,
    len: usize,
    node: u32,
) -> io::Result<()> {
    // SAFETY: integer arguments only; the caller owns the range.
    result(unsafe {
        libc::syscall(
            SYS_SET_MEMPOLICY_HOME_NODE,
            addr as libc::c_ulong,
            len as libc::c_ulong,
            libc::c_ulong::from(node),
            0 as libc::c_ulong,
        )
    })
}

/// Sets the calling thread's memory policy (`set_mempolicy(2)`).
pub(crate) fn set_mempolicy(policy: Policy, nodes: &[u32]) -> io::Result<()> {
    let mask = node_mask(nodes)?;
    // SAFETY: set_mempolicy reads maxnode - 1 = mask.len() words from the
    // live mask; it writes no memory of ours and changes only this
    // thread's memory policy.
    result(unsafe {
        libc::syscall(
            libc::SYS_set_mempolicy,
            policy.mode(),
            mask.as_ptr(),
            maxnode(&mask),
        )
    })
}

/// Restores a policy read with [`get_mempolicy`] (any mode, including
/// interleave and local) on the calling thread.
pub(crate) fn restore_mempolicy(saved: &(i32, Vec<u32>)) -> io::Result<()> {
    let (mode, nodes) = saved;
    if *mode == libc::MPOL_DEFAULT {
        return set_default_mempolicy();
    }
    let mask = node_mask(nodes)?;
    // SAFETY: as in `set_mempolicy`: the kernel reads the live mask and
    // changes only this thread's policy.
    result(unsafe {
        libc::syscall(
            libc::SYS_set_mempolicy,
            *mode,
            mask.as_ptr(),
            maxnode(&mask),
        )
    })
}

/// Resets the calling thread's memory policy to the default (`MPOL_DEFAULT`:
/// memory comes from the node of the CPU that first touches it).
pub(crate) fn set_default_mempolicy() -> io::Result<()> {
    // SAFETY: MPOL_DEFAULT with a null mask and maxnode 0 reads no memory
    // of ours and changes only this thread's memory policy.
    result(unsafe {
        libc::syscall(
            libc::SYS_set_mempolicy,
            libc::MPOL_DEFAULT,
            std::ptr::null::<libc::c_ulong>(),
            0 as libc::c_ulong,
        )
    })
}

/// The calling thread's memory policy mode and nodes (`get_mempolicy(2)`),
/// as `(mode, nodes)`; mode 0 is `MPOL_DEFAULT`, 1 preferred, 2 bind.
pub(crate) fn get_mempolicy() -> io::Result<(i32, Vec<u32>)> {
    let bits = libc::c_ulong::BITS as usize;
    let words = MAX_NODES as usize / bits;
    let mut mode: libc::c_int = 0;
    let mut mask = vec![0 as libc::c_ulong; words];
    // SAFETY: `mode` is a live c_int and `mask` a live vector of `words`
    // words; with maxnode = words * bits-per-word the kernel writes at most
    // that many bits into it. addr = NULL and flags = 0 ask for this
    // thread's policy.
    result(unsafe {
        libc::syscall(
            libc::SYS_get_mempolicy,
            &mut mode as *mut libc::c_int,
            mask.as_mut_ptr(),
            (words * bits) as libc::c_ulong,
            std::ptr::null_mut::<libc::c_void>(),
            0 as libc::c_ulong,
        )
    })?;
    let nodes = (0..MAX_NODES)
        .filter(|&n| {
            let i = n as usize;
            mask[i / bits] & (1 << (i % bits)) != 0
        })
        .collect();
    Ok((mode, nodes))
}

/// The node of each 4 KiB page of `bytes` (a negative errno for a page not
/// present), as [`page_nodes`] reads them.
#[cfg(feature = "internals")]
pub(crate) fn nodes_of(bytes: &[u8]) -> io::Result<Vec<i32>> {
    let mut out = Vec::with_capacity(bytes.len() / 4096);
    // SAFETY: a slice is mapped for as long as it is borrowed.
    unsafe {
        page_nodes(bytes.as_ptr(), bytes.len(), 4096, |b| {
            out.extend_from_slice(b)
        })
    }?;
    Ok(out)
}

/// Where the pages at `addr..addr+len` (`page`-sized steps) are: the node
/// of each page, or a negative errno (`-ENOENT` for a page not present),
/// through `move_pages(0, n, pages, NULL, status, 0)`, which moves
/// nothing.
///
/// `visit` gets each batch of statuses in address order.
///
/// # Safety
/// `addr..addr+len` must be mapped in this process for the whole call.
pub(crate) unsafe fn page_nodes(
    addr: *const u8,
    len: usize,
    page: usize,
    mut visit: impl FnMut(&[i32]),
) -> io::Result<()> {
    const BATCH: usize = 4096;
    let count = len.div_ceil(page);
    let mut pages: Vec<*const libc::c_void> = Vec::with_capacity(BATCH);
    let mut status = vec![0i32; BATCH];
    let mut done = 0;
    while done < count {
        let n = BATCH.min(count - done);
        pages.clear();
        // wrapping_add: only addresses are computed, nothing is read here.
        pages.extend((done..done + n).map(|i| addr.wrapping_add(i * page) as *const libc::c_void));
        // SAFETY: `pages` and `status` each hold `n` entries; a null node
        // list makes move_pages report placement and move nothing; the
        // caller keeps the range mapped.
        let r = unsafe {
            libc::syscall(
                libc::SYS_move_pages,
                0 as libc::c_long,
                n as libc::c_ulong,
                pages.as_ptr(),
                std::ptr::null::<i32>(),
                status.as_mut_ptr(),
                0 as libc::c_long,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        visit(&status[..n]);
        done += n;
    }
    Ok(())
}

/// The NUMA node of the CPU the calling thread runs on (`getcpu`).
pub(crate) fn current_node() -> io::Result<u32> {
    let mut cpu: libc::c_uint = 0;
    let mut node: libc::c_uint = 0;
    // SAFETY: both out-pointers are valid; the third argument (a cache) is
    // unused by the kernel and may be null.
    result(unsafe {
        libc::syscall(
            libc::SYS_getcpu,
            &mut cpu,
            &mut node,
            std::ptr::null_mut::<libc::c_void>(),
        )
    })?;
    Ok(node)
}

#[cfg(feature = "internals")]
/// Whether the page at `addr` (page-aligned) is mapped in this process:
/// `mincore` fails with `ENOMEM` for an unmapped address. Makes only the
/// system call, so it may be used in a forked child.
pub(crate) fn is_mapped(addr: usize) -> bool {
    let mut vec = [0u8; 1];
    // SAFETY: mincore reads no memory at `addr`; it writes one byte per
    // page into `vec`, which has room for the single page asked about.
    let r = unsafe { libc::mincore(addr as *mut libc::c_void, 1, vec.as_mut_ptr()) };
    r == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ENOMEM)
}

/// A fresh anonymous private read-write mapping of `len` bytes.
pub(crate) fn map_anonymous(len: usize) -> io::Result<*mut u8> {
    map_anonymous_with(len, 0)
}

/// A fresh anonymous private read-write mapping of `len` bytes, faulted in
/// by the kernel inside `mmap` (`MAP_POPULATE`) under the calling thread's
/// memory policy (a measurement's baseline).
#[cfg(feature = "measure")]
pub(crate) fn map_anonymous_populated(len: usize) -> io::Result<*mut u8> {
    map_anonymous_with(len, libc::MAP_POPULATE)
}

/// [`map_anonymous`] with `extra` mmap flags (`MAP_POPULATE`).
fn map_anonymous_with(len: usize, extra: libc::c_int) -> io::Result<*mut u8> {
    // SAFETY: an anonymous private mapping at an address of the kernel's
    // choosing touches no existing memory.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | extra,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        Err(io::Error::last_os_error())
    } else {
        Ok(p.cast())
    }
}

/// A shared read-write mapping of `len` bytes of the file `fd` from
/// `offset` (a multiple of the page size), at an address of the kernel's
/// choosing; with `populate`, the page table entries of the file's pages
/// already there are made now (`MAP_POPULATE`) instead of one fault per
/// page at first touch.
pub(crate) fn map_shared_populated(
    fd: std::os::fd::RawFd,
    len: usize,
    offset: u64,
    populate: bool,
) -> io::Result<*mut u8> {
    let offset = libc::off_t::try_from(offset)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset past off_t"))?;
    let flags = libc::MAP_SHARED | if populate { libc::MAP_POPULATE } else { 0 };
    // SAFETY: a new shared mapping of a file at an address of the kernel's
    // choosing touches no existing memory; a bad descriptor is an error.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            fd,
            offset,
        )
    };
    if p == libc::MAP_FAILED {
        Err(io::Error::last_os_error())
    } else {
        Ok(p.cast())
    }
}

/// [`map_shared_populated`] without populating.
pub(crate) fn map_shared(fd: std::os::fd::RawFd, len: usize, offset: u64) -> io::Result<*mut u8> {
    map_shared_populated(fd, len, offset, false)
}

/// `MAP_HUGE_SHIFT` from `<linux/mman.h>`: the huge page size of a
/// `MAP_HUGETLB` mapping goes in the bits above it, as its log2.
const MAP_HUGE_SHIFT: libc::c_int = 26;

/// A fresh anonymous private read-write mapping of `len` bytes backed by
/// hugetlb pages of `page_bytes` (a power of two: 2 MiB, 1 GiB), from the
/// kernel's huge page pool (`MAP_HUGETLB | MAP_HUGE_<size>`). The kernel
/// aligns it to the page size and reserves `len / page_bytes` pages of the
/// machine's pool (not of a node's) for it; `ENOMEM` when the pool cannot
/// cover that. `len` must be a multiple of `page_bytes`.
pub(crate) fn map_hugetlb(len: usize, page_bytes: usize) -> io::Result<*mut u8> {
    if !page_bytes.is_power_of_two() || len == 0 || len % page_bytes != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a hugetlb mapping of {len} bytes in {page_bytes}-byte pages"),
        ));
    }
    #[allow(clippy::cast_possible_wrap)] // trailing_zeros of a usize is at most 64
    let size_bits = (page_bytes.trailing_zeros() as libc::c_int) << MAP_HUGE_SHIFT;
    // SAFETY: an anonymous private mapping at an address of the kernel's
    // choosing touches no existing memory.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB | size_bits,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        Err(io::Error::last_os_error())
    } else {
        Ok(p.cast())
    }
}

/// Faults in `addr..addr+len` for writing (`madvise(MADV_POPULATE_WRITE)`,
/// Linux 5.14): where touching the memory would raise `SIGBUS` (a hugetlb
/// page the node cannot supply) this returns `EFAULT` instead, and `ENOMEM`
/// when memory runs out. `EINVAL` from an older kernel: see
/// [`populate_write_supported`].
///
/// # Safety
/// The range must be a writable mapping owned by the caller (its pages are
/// allocated and zeroed if not present; present pages are not changed).
pub(crate) unsafe fn populate_write(addr: *mut u8, len: usize) -> io::Result<()> {
    // SAFETY: per the caller's guarantee; populating changes no data.
    result(unsafe { libc::madvise(addr.cast(), len, libc::MADV_POPULATE_WRITE) }.into())
}

/// Whether this kernel has `MADV_POPULATE_WRITE` (asked once, on a page
/// mapped for the question).
pub(crate) fn populate_write_supported() -> bool {
    static KNOWN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *KNOWN.get_or_init(|| {
        let Ok(p) = map_anonymous(4096) else {
            return false;
        };
        // SAFETY: p is the page just mapped, referenced by nothing else.
        unsafe {
            let ok = populate_write(p, 4096).is_ok();
            let _ = unmap(p, 4096);
            ok
        }
    })
}

/// Unmaps `addr..addr+len`.
///
/// # Safety
/// The range must be (part of) a mapping owned by the caller that nothing
/// references any more.
pub(crate) unsafe fn unmap(addr: *mut u8, len: usize) -> io::Result<()> {
    // SAFETY: per the caller's guarantee.
    result(unsafe { libc::munmap(addr.cast(), len) }.into())
}

/// Makes `addr..addr+len` inaccessible (`mprotect(PROT_NONE)`): a guard
/// page that keeps the kernel from merging a mapping with its neighbours.
///
/// # Safety
/// The range must be a mapping owned by the caller holding nothing anyone
/// reads or writes.
pub(crate) unsafe fn protect_none(addr: *mut u8, len: usize) -> io::Result<()> {
    // SAFETY: per the caller's guarantee.
    result(unsafe { libc::mprotect(addr.cast(), len, libc::PROT_NONE) }.into())
}

/// Locks `addr..addr+len` in memory (`mlock`).
///
/// # Safety
/// The range must be a mapping owned by the caller.
pub(crate) unsafe fn lock(addr: *mut u8, len: usize) -> io::Result<()> {
    // SAFETY: per the caller's guarantee; mlock changes no data.
    result(unsafe { libc::mlock(addr.cast(), len) }.into())
}

/// Locks `addr..addr+len` page by page as its pages are faulted in
/// (`mlock2(MLOCK_ONFAULT)`, Linux 4.4+): the limit is checked for the
/// whole range at once, and nothing is faulted in by the call.
///
/// # Safety
/// The range must be a mapping owned by the caller.
pub(crate) unsafe fn lock_on_fault(addr: *mut u8, len: usize) -> io::Result<()> {
    // SAFETY: per the caller's guarantee; mlock2 changes no data.
    result(unsafe { libc::mlock2(addr.cast(), len, libc::MLOCK_ONFAULT) }.into())
}

/// Unlocks `addr..addr+len` (`munlock`).
///
/// # Safety
/// The range must be a mapping owned by the caller.
pub(crate) unsafe fn unlock(addr: *mut u8, len: usize) -> io::Result<()> {
    // SAFETY: per the caller's guarantee; munlock changes no data.
    result(unsafe { libc::munlock(addr.cast(), len) }.into())
}

/// Gives the kernel `advice` (`MADV_*`) about `addr..addr+len`.
///
/// # Safety
/// The range must be a mapping owned by the caller, and the advice one that
/// changes no data the caller relies on (`MADV_HUGEPAGE`, `MADV_DONTFORK`).
pub(crate) unsafe fn advise(addr: *mut u8, len: usize, advice: libc::c_int) -> io::Result<()> {
    // SAFETY: per the caller's guarantee.
    result(unsafe { libc::madvise(addr.cast(), len, advice) }.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn current_node_is_a_node_of_this_machine() {
        let node = current_node().unwrap();
        assert!(std::path::Path::new(&format!("/sys/devices/system/node/node{node}")).exists());
    }

    #[test]
    fn mincore_tells_mapped_from_unmapped() {
        let v = vec![1u8; 1 << 16];
        let page = (v.as_ptr() as usize + 4095) & !4095;
        assert!(is_mapped(page));
        // The zero page is never mapped.
        assert!(!is_mapped(0));
    }

    #[test]
    fn out_of_range_nodes_are_refused_before_the_kernel() {
        // SAFETY: the call is refused before reaching the kernel.
        let e = unsafe { mbind_node(std::ptr::null_mut(), 4096, MAX_NODES) }.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let e = set_mempolicy(Policy::Bind, &[0, MAX_NODES]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn node_masks_set_one_bit_per_node() {
        let m = node_mask(&[0, 3, 64]).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m[0], 0b1001);
        assert_eq!(m[1], 1);
        assert_eq!(maxnode(&m), 129);
    }

    #[test]
    fn hugetlb_mappings_check_their_arguments() {
        for (len, page) in [(0, 2 << 20), (3 << 20, 2 << 20), (2 << 20, 3 << 20)] {
            let e = map_hugetlb(len, page).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{len} {page}");
        }
    }

    /// A hugetlb mapping without a reservation (`MAP_NORESERVE`) and with
    /// no free page in the pool: touching it would raise SIGBUS, populating
    /// it returns an error instead.
    #[test]
    fn populating_hugetlb_memory_the_pool_cannot_supply_is_an_error_not_sigbus() {
        if !populate_write_supported() {
            eprintln!("skipped: this kernel has no MADV_POPULATE_WRITE");
            return;
        }
        let g = std::path::Path::new("/sys/kernel/mm/hugepages/hugepages-2048kB");
        let read = |f: &str| -> Option<u64> {
            std::fs::read_to_string(g.join(f)).ok()?.trim().parse().ok()
        };
        let (Some(free), Some(over)) = (read("free_hugepages"), read("nr_overcommit_hugepages"))
        else {
            eprintln!("skipped: no 2 MiB hugetlb pool on this kernel");
            return;
        };
        if over > 0 {
            eprintln!("skipped: hugetlb overcommit is on ({over} pages)");
            return;
        }
        // One page more than the pool has free.
        let len = (crate::num::usize_from(free) + 1) * (2 << 20);
        // SAFETY: an anonymous private mapping of the kernel's choosing.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE
                    | libc::MAP_ANONYMOUS
                    | libc::MAP_HUGETLB
                    | libc::MAP_NORESERVE
                    | (21 << MAP_HUGE_SHIFT),
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED, "{}", io::Error::last_os_error());
        // SAFETY: the mapping just made; then unmapped, referenced by nothing.
        unsafe {
            let e = populate_write(p.cast(), len).unwrap_err();
            assert!(
                matches!(e.raw_os_error(), Some(libc::EFAULT) | Some(libc::ENOMEM)),
                "{e}"
            );
            unmap(p.cast(), len).unwrap();
        }
    }

    #[test]
    fn map_lock_advise_unmap_round_trip() {
        let len = 2 << 20;
        let p = map_anonymous(len).unwrap();
        // SAFETY: p..p+len is the mapping just made, referenced by nothing else.
        unsafe {
            advise(p, len, libc::MADV_DONTFORK).unwrap();
            lock(p, 4096).unwrap();
            unlock(p, 4096).unwrap();
            unmap(p, len).unwrap();
        }
        assert!(!is_mapped(p as usize));
    }
}
