//! The NUMA system calls that have no `nix` wrapper: `mbind`, `move_pages`
//! and `getcpu`, plus `mincore` for checking whether a range is mapped.
//!
//! Each is a raw `syscall(2)` with the kernel's own argument layout; every
//! unsafe block says why its pointers are valid.

use std::io;

/// `MPOL_BIND` from `<linux/mempolicy.h>`.
const MPOL_BIND: libc::c_long = 2;
/// `MPOL_MF_STRICT`: fail if existing pages do not follow the policy.
const MPOL_MF_STRICT: libc::c_ulong = 1;
/// Highest node number accepted (the kernel's own limit is `MAX_NUMNODES`,
/// 1024 on common distribution kernels).
pub const MAX_NODE: u32 = 4095;

/// Binds `len` bytes at `addr` to `node` (`mbind(MPOL_BIND, {node},
/// MPOL_MF_STRICT)`).
///
/// # Safety
/// `addr..addr+len` must be a mapping owned by the caller (the policy of
/// that range changes).
pub unsafe fn mbind_node(addr: *mut u8, len: usize, node: u32) -> io::Result<()> {
    if node > MAX_NODE {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let words = node as usize / 64 + 1;
    let mut mask = vec![0 as libc::c_ulong; words];
    mask[node as usize / 64] |= 1 << (node % 64);
    // The kernel reads `maxnode - 1` bits of the mask.
    let maxnode = (words * 64 + 1) as libc::c_ulong;
    // SAFETY: the mask holds `words * 64` bits, which is all the kernel
    // reads; the caller owns the range.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            addr,
            len,
            MPOL_BIND,
            mask.as_ptr(),
            maxnode,
            MPOL_MF_STRICT,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
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
pub unsafe fn page_nodes(
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
pub fn current_node() -> io::Result<u32> {
    let mut cpu: libc::c_uint = 0;
    let mut node: libc::c_uint = 0;
    // SAFETY: both out-pointers are valid; the third argument (a cache) is
    // unused by the kernel and may be null.
    let r = unsafe {
        libc::syscall(
            libc::SYS_getcpu,
            &mut cpu,
            &mut node,
            std::ptr::null_mut::<libc::c_void>(),
        )
    };
    if r == 0 {
        Ok(node)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether the page at `addr` (page-aligned) is mapped in this process:
/// `mincore` fails with `ENOMEM` for an unmapped address. Makes only the
/// system call, so it may be used in a forked child.
pub fn is_mapped(addr: usize) -> bool {
    let mut vec = [0u8; 1];
    // SAFETY: mincore reads no memory at `addr`; it writes one byte per
    // page into `vec`, which has room for the single page asked about.
    let r = unsafe { libc::mincore(addr as *mut libc::c_void, 1, vec.as_mut_ptr()) };
    r == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ENOMEM)
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
    fn out_of_range_node_is_refused() {
        // SAFETY: the call is refused before reaching the kernel.
        let e = unsafe { mbind_node(std::ptr::null_mut(), 4096, MAX_NODE + 1) }.unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
    }
}
