use super::*;
use proptest::prelude::*;

const KIB4: u64 = 4096;

#[test]
fn lines_as_the_kernel_prints_them() {
    let l = parse_line(
        b"7f5c2a000000 bind:0 anon=16384 dirty=16384 active=0 N0=16384 kernelpagesize_kB=4",
    )
    .unwrap();
    assert_eq!(l.start, 0x7f5c2a000000);
    assert_eq!(l.page_bytes, Some(4096));
    assert_eq!(l.nodes, vec![(0, 16384)]);
    assert_eq!(l.node_bytes().unwrap(), vec![(0, 64 << 20)]);
    assert!(!l.hugetlb);

    // No page present: no counts, no page size.
    let l = parse_line(b"7f5c2c000000 default").unwrap();
    assert_eq!((l.page_bytes, l.nodes.len()), (None, 0));
    assert_eq!(l.node_bytes().unwrap(), vec![]);

    // hugetlbfs: counts are huge pages.
    let l = parse_line(
        b"7f0000000000 default file=/dev/hugepages/x huge dirty=3 N0=2 N1=1 kernelpagesize_kB=2048",
    )
    .unwrap();
    assert!(l.hugetlb);
    assert_eq!(l.node_bytes().unwrap(), vec![(0, 4 << 20), (1, 2 << 20)]);

    // Policies with a space or an '=', escaped file names, stack/heap.
    let l =
        parse_line(b"55d0 prefer (many):0-1 heap anon=5 dirty=5 N1=5 kernelpagesize_kB=4").unwrap();
    assert_eq!(l.nodes, vec![(1, 5)]);
    let l = parse_line(
        b"55d0 bind=static:0-1 file=/tmp/a\\040N0\\0759 mapped=1 N0=1 kernelpagesize_kB=4",
    )
    .unwrap();
    assert_eq!(l.nodes, vec![(0, 1)]);
    let l =
        parse_line(b"7ffd1000 default stack anon=33 dirty=33 N0=33 kernelpagesize_kB=4\n").unwrap();
    assert_eq!(l.nodes, vec![(0, 33)]);
}

#[test]
fn bad_lines_are_errors_not_panics() {
    assert_eq!(parse_line(b"").unwrap_err(), LineError::BadAddress);
    assert_eq!(
        parse_line(b"zz default").unwrap_err(),
        LineError::BadAddress
    );
    assert_eq!(
        parse_line(b"11111111111111111 default").unwrap_err(),
        LineError::BadAddress
    );
    assert!(matches!(
        parse_line(b"1000 default N0=x").unwrap_err(),
        LineError::BadNumber(_)
    ));
    assert!(matches!(
        parse_line(b"1000 default N0=-1").unwrap_err(),
        LineError::BadNumber(_)
    ));
    assert!(matches!(
        parse_line(b"1000 default N99999999999=1").unwrap_err(),
        LineError::BadNumber(_)
    ));
    assert!(matches!(
        parse_line(b"1000 default N0=1 N0=2").unwrap_err(),
        LineError::Duplicate(_)
    ));
    assert!(matches!(
        parse_line(b"1000 default kernelpagesize_kB=0").unwrap_err(),
        LineError::BadNumber(_)
    ));
    assert!(matches!(
        parse_line(b"1000 default kernelpagesize_kB=18446744073709551615").unwrap_err(),
        LineError::BadNumber(_)
    ));
    // Overflow of count * page size is caught.
    let l = parse_line(b"1000 default N0=18446744073709551615 kernelpagesize_kB=4").unwrap();
    assert_eq!(l.node_bytes(), None);
    // "N" alone or "Nx" is some other key, ignored.
    assert_eq!(parse_line(b"1000 default N=1 Nx=2").unwrap().nodes, vec![]);
}

#[test]
fn maps_lines() {
    let v = parse_maps_line(b"7f5c2a000000-7f5c2e000000 rw-p 00000000 00:00 0 ").unwrap();
    assert_eq!(
        v,
        Vma {
            start: 0x7f5c2a000000,
            end: 0x7f5c2e000000
        }
    );
    let v = parse_maps_line(b"55d0a000-55d0b000 r--p 00000000 fd:01 1234   /usr/bin/with space")
        .unwrap();
    assert_eq!(v.end - v.start, 0x1000);
    assert_eq!(
        parse_maps_line(b"2000-1000 rw-p").unwrap_err(),
        LineError::EmptyVma
    );
    assert_eq!(
        parse_maps_line(b"garbage").unwrap_err(),
        LineError::BadAddress
    );
}

const MAPS: &[u8] = b"\
10000-20000 rw-p 00000000 00:00 0
20000-30000 rw-p 00000000 00:00 0
30000-40000 rw-p 00000000 00:00 0
50000-60000 rw-p 00000000 00:00 0 /bin/x
";
// 16 pages each: first all on N0, second 10 on N0 + 4 on N1 + 2 absent,
// third 16 on N1, fourth 3 on N0.
const NUMA: &[u8] = b"\
10000 default anon=16 dirty=16 N0=16 kernelpagesize_kB=4
20000 bind:0 anon=14 dirty=14 N0=10 N1=4 kernelpagesize_kB=4
30000 default anon=16 dirty=16 N1=16 kernelpagesize_kB=4
50000 default file=/bin/x mapped=3 N0=3 kernelpagesize_kB=4
";

#[test]
fn whole_vmas_are_exact() {
    let p = placement(NUMA, MAPS, 0x10000..0x30000).unwrap();
    assert!(p.is_exact());
    assert_eq!((p.vmas, p.straddling), (2, 0));
    assert_eq!(
        p.exact_nodes().unwrap(),
        BTreeMap::from([(0, 26 * KIB4), (1, 4 * KIB4)])
    );
    assert_eq!(
        p.not_present,
        Bounds {
            min: 2 * KIB4,
            max: 2 * KIB4
        }
    );
    assert_eq!(p.all_on(0), AllOn::No);
    let p = placement(NUMA, MAPS, 0x10000..0x20000).unwrap();
    assert_eq!(p.all_on(0), AllOn::Yes);
}

#[test]
fn straddling_vmas_give_tight_bounds() {
    // Half of the first VMA: it is all on N0, so the answer is still exact.
    let p = placement(NUMA, MAPS, 0x18000..0x20000).unwrap();
    assert_eq!(p.straddling, 1);
    assert!(p.is_exact());
    assert_eq!(p.all_on(0), AllOn::Yes);
    // 8 pages of the mixed VMA: 8 outside, so N0 is 2..=8, N1 0..=4,
    // absent 0..=2.
    let p = placement(NUMA, MAPS, 0x20000..0x28000).unwrap();
    assert!(!p.is_exact());
    assert_eq!(
        p.on(0),
        Bounds {
            min: 2 * KIB4,
            max: 8 * KIB4
        }
    );
    assert_eq!(
        p.on(1),
        Bounds {
            min: 0,
            max: 4 * KIB4
        }
    );
    assert_eq!(
        p.not_present,
        Bounds {
            min: 0,
            max: 2 * KIB4
        }
    );
    assert_eq!(p.all_on(0), AllOn::Unknown);
    assert_eq!(p.all_on(1), AllOn::No);
}

#[test]
fn holes_and_disagreements_are_reported() {
    assert_eq!(
        placement(NUMA, MAPS, 0x30000..0x58000).unwrap_err(),
        PlacementError::Hole { at: 0x40000 }
    );
    assert_eq!(
        placement(NUMA, MAPS, 0x0..0x11000).unwrap_err(),
        PlacementError::Hole { at: 0x0 }
    );
    assert_eq!(
        placement(NUMA, MAPS, 0x20000..0x20000).unwrap_err(),
        PlacementError::EmptyRange
    );
    // numa_maps missing a line.
    let numa = b"10000 default N0=16 kernelpagesize_kB=4\n";
    assert!(matches!(
        placement(numa, MAPS, 0x10000..0x30000),
        Err(PlacementError::Inconsistent {
            vma_start: 0x20000,
            ..
        })
    ));
    // numa_maps saw a split that maps did not.
    let numa = b"10000 default N0=8 kernelpagesize_kB=4\n18000 default N0=8 kernelpagesize_kB=4\n";
    assert!(matches!(
        placement(numa, MAPS, 0x10000..0x20000),
        Err(PlacementError::Inconsistent {
            vma_start: 0x10000,
            ..
        })
    ));
    // maps with overlapping (or repeated) VMAs is not a real process's.
    let maps = b"10000-20000 rw-p\n18000-30000 rw-p\n";
    assert!(matches!(
        placement(NUMA, maps, 0x10000..0x30000),
        Err(PlacementError::Inconsistent {
            vma_start: 0x18000,
            ..
        })
    ));
    let maps = b"10000-20000 rw-p\n10000-20000 rw-p\n";
    assert!(matches!(
        placement(NUMA, maps, 0x10000..0x20000),
        Err(PlacementError::Inconsistent { .. })
    ));
    // More pages than the VMA has.
    let numa = b"10000 default N0=17 kernelpagesize_kB=4\n";
    assert!(matches!(
        placement(numa, MAPS, 0x10000..0x20000),
        Err(PlacementError::Inconsistent { .. })
    ));
    // A bad line about another VMA does no harm; one about ours does.
    let numa = b"10000 default N0=16 kernelpagesize_kB=4\n50000 default N0=zz\n";
    assert!(placement(numa, MAPS, 0x10000..0x20000).is_ok());
    assert!(matches!(
        placement(numa, MAPS, 0x50000..0x60000),
        Err(PlacementError::NumaMaps { line: 2, .. })
    ));
}

/// A model address space: VMAs with each 4 KiB unit's state (-1 absent, or
/// a node), rendered to maps and numa_maps text.
#[derive(Debug, Clone)]
struct MVma {
    gap: u64,
    /// 1 for 4 KiB pages, 512 for 2 MiB hugetlb pages.
    unit: u64,
    /// One state per kernel page.
    pages: Vec<i8>,
    decor: u8,
}

fn vma_strategy() -> impl Strategy<Value = MVma> {
    (
        prop_oneof![3 => Just(0u64), 1 => 1u64..4],
        prop_oneof![5 => Just(1u64), 1 => Just(512u64)],
        proptest::collection::vec(-1i8..4, 1..12),
        any::<u8>(),
    )
        .prop_map(|(gap, unit, pages, decor)| MVma {
            gap,
            unit,
            pages,
            decor,
        })
}

struct Rendered {
    maps: Vec<u8>,
    numa: Vec<u8>,
    /// (start, end, state of each 4 KiB unit)
    vmas: Vec<(u64, u64, Vec<i8>)>,
}

fn render(vs: &[MVma]) -> Rendered {
    let mut cursor: u64 = 0x7f00_0000_0000;
    let (mut maps, mut numa, mut out) = (Vec::new(), Vec::new(), Vec::new());
    for v in vs {
        let page = v.unit * KIB4;
        let start = (cursor + v.gap * KIB4).next_multiple_of(page);
        let end = start + v.pages.len() as u64 * page;
        maps.extend(format!("{start:x}-{end:x} rw-p 00000000 00:00 0 \n").as_bytes());
        let policy = [
            "default",
            "bind:0",
            "prefer (many):0-1",
            "bind=static:0-3",
            "interleave:0-3",
        ][v.decor as usize % 5];
        let mut line = format!("{start:x} {policy}");
        if v.decor & 8 != 0 {
            line.push_str(" file=/tmp/x\\040N0\\0757");
        }
        if v.unit > 1 {
            line.push_str(" huge");
        }
        let mut counts = BTreeMap::<i8, u64>::new();
        for &s in &v.pages {
            *counts.entry(s).or_default() += 1;
        }
        let present: u64 = counts
            .iter()
            .filter(|(s, _)| **s >= 0)
            .map(|(_, c)| c)
            .sum();
        if present > 0 {
            line.push_str(&format!(" anon={present} dirty={present}"));
            for (s, c) in counts.iter().filter(|(s, _)| **s >= 0) {
                line.push_str(&format!(" N{s}={c}"));
            }
            line.push_str(&format!(" kernelpagesize_kB={}", page / 1024));
        }
        numa.extend(line.as_bytes());
        numa.push(b'\n');
        let units = v
            .pages
            .iter()
            .flat_map(|&s| std::iter::repeat_n(s, crate::num::usize_from(v.unit)))
            .collect();
        out.push((start, end, units));
        cursor = end;
    }
    Rendered {
        maps,
        numa,
        vmas: out,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Against a page-by-page model: the truth lies within the bounds, and
    /// a range made of whole VMAs is exact and equal to the truth.
    #[test]
    fn bounds_hold_the_truth(vs in proptest::collection::vec(vma_strategy(), 1..6), a in any::<u64>(), b in any::<u64>()) {
        let r = render(&vs);
        let first = r.vmas[0].0;
        let last = r.vmas.last().unwrap().1;
        let span = (last - first) / KIB4;
        let (x, y) = (a % (span + 1), b % (span + 1));
        let (lo, hi) = (x.min(y), x.max(y));
        let range = first + lo * KIB4..first + hi * KIB4;
        let got = placement(&r.numa, &r.maps, range.clone());
        if range.is_empty() {
            prop_assert_eq!(got.unwrap_err(), PlacementError::EmptyRange);
            return Ok(());
        }
        // The truth, 4 KiB unit by unit; a unit outside every VMA is a hole.
        let mut truth = BTreeMap::<i8, u64>::new();
        let mut hole = None;
        let mut addr = range.start;
        while addr < range.end {
            match r.vmas.iter().find(|(s, e, _)| *s <= addr && addr < *e) {
                Some((s, _, units)) => *truth.entry(units[((addr - s) / KIB4) as usize]).or_default() += KIB4,
                None => { hole.get_or_insert(addr); }
            }
            addr += KIB4;
        }
        if let Some(at) = hole {
            prop_assert_eq!(got.unwrap_err(), PlacementError::Hole { at });
            return Ok(());
        }
        let p = got.unwrap();
        let whole = r.vmas.iter().filter(|(s, e, _)| *s < range.end && *e > range.start).all(|(s, e, _)| *s >= range.start && *e <= range.end);
        prop_assert_eq!(whole, p.straddling == 0);
        for node in 0..4i8 {
            let t = truth.get(&node).copied().unwrap_or(0);
            let bnd = p.on(u32::try_from(node).unwrap());
            prop_assert!(bnd.min <= t && t <= bnd.max, "node {} truth {} bounds {:?}", node, t, bnd);
            if whole { prop_assert_eq!(bnd, Bounds { min: t, max: t }); }
        }
        let t = truth.get(&-1).copied().unwrap_or(0);
        prop_assert!(p.not_present.min <= t && t <= p.not_present.max);
        if whole { prop_assert!(p.is_exact()); }
        // Bounds never exceed the range, and the minimums never exceed it together.
        let len = range.end - range.start;
        let mins: u64 = p.nodes.values().map(|b| b.min).sum::<u64>() + p.not_present.min;
        prop_assert!(mins <= len);
        let maxs: u64 = p.nodes.values().map(|b| b.max).sum::<u64>() + p.not_present.max;
        prop_assert!(maxs >= len);
    }

    /// Arbitrary bytes and ranges: an answer or an error, never a panic.
    #[test]
    fn never_panics(numa in proptest::collection::vec(any::<u8>(), 0..400), maps in proptest::collection::vec(any::<u8>(), 0..400), s in any::<u64>(), e in any::<u64>()) {
        let _ = placement(&numa, &maps, s..e);
        for l in numa.split(|&b| b == b'\n') { let _ = parse_line(l).map(|l| l.node_bytes()); }
    }

    /// Text-shaped noise (digits, hex, '=', 'N', spaces) gets deeper into the parser.
    #[test]
    fn never_panics_on_plausible_text(numa in "([0-9a-f]{1,17}( (N[0-9]{1,12}|kernelpagesize_kB|huge|anon)=?[0-9]{0,21})*\n){0,6}", maps in "([0-9a-f]{1,17}-[0-9a-f]{1,17} rw-p\n){0,6}", s in any::<u64>(), e in any::<u64>()) {
        if let Ok(p) = placement(numa.as_bytes(), maps.as_bytes(), s..e) {
            let len = e - s;
            let mins: u64 = p.nodes.values().map(|b| b.min).sum::<u64>() + p.not_present.min;
            prop_assert!(mins <= len);
            prop_assert!(p.nodes.values().all(|b| b.min <= b.max && b.max <= len));
        }
    }

    /// Well-formed files with arbitrary VMAs and counts (overlaps, counts
    /// over the size): errors or consistent bounds.
    #[test]
    fn consistent_on_random_tables(v in proptest::collection::vec((0u64..64, 1u64..16, proptest::collection::vec((0u32..3, 0u64..20), 0..3)), 1..6), s in 0u64..80, l in 1u64..80) {
        let (mut maps, mut numa) = (String::new(), String::new());
        for (start, len, counts) in &v {
            maps.push_str(&format!("{:x}-{:x} rw-p\n", start * 4096, (start + len) * 4096));
            numa.push_str(&format!("{:x} default", start * 4096));
            for (n, c) in counts { numa.push_str(&format!(" N{n}={c}")); }
            numa.push_str(" kernelpagesize_kB=4\n");
        }
        if let Ok(p) = placement(numa.as_bytes(), maps.as_bytes(), s * 4096..(s + l) * 4096) {
            let len = l * 4096;
            let mins: u64 = p.nodes.values().map(|b| b.min).sum::<u64>() + p.not_present.min;
            let maxs: u64 = p.nodes.values().map(|b| b.max).sum::<u64>() + p.not_present.max;
            prop_assert!(mins <= len && maxs >= len, "{:?}", p);
        }
    }
}

/// A mapping of `len` bytes with a `PROT_NONE` guard page on each side,
/// unmapped on drop.
struct Guarded {
    base: *mut u8,
    len: usize,
}

const PAGE: usize = 4096;

impl Guarded {
    fn new(len: usize) -> Guarded {
        let base = crate::platform::numa::map_anonymous(len + 2 * PAGE).unwrap();
        // SAFETY: the first and last page of the mapping just made, unused.
        unsafe {
            crate::platform::numa::protect_none(base, PAGE).unwrap();
            crate::platform::numa::protect_none(base.add(PAGE + len), PAGE).unwrap();
        }
        Guarded { base, len }
    }

    fn ptr(&self) -> *mut u8 {
        self.base.wrapping_add(PAGE)
    }

    fn range(&self) -> Range<u64> {
        self.ptr() as u64..self.ptr() as u64 + self.len as u64
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        // SAFETY: our own mapping, guards included, referenced by nothing.
        let _ = unsafe { crate::platform::numa::unmap(self.base, self.len + 2 * PAGE) };
    }
}

/// This machine: touch part of a guarded mapping and compare with
/// move_pages page by page.
#[test]
fn agrees_with_move_pages_here() {
    let m = Guarded::new(8 << 20);
    // SAFETY: our own mapping; the advice changes no data.
    unsafe { crate::platform::numa::advise(m.ptr(), m.len, libc::MADV_NOHUGEPAGE) }.unwrap();
    // Touch 3 pages out of every 5.
    for i in (0..m.len / PAGE).filter(|i| i % 5 < 3) {
        // SAFETY: inside our own writable mapping.
        unsafe { m.ptr().add(i * PAGE).write_volatile(1) };
    }
    let p = read_self(m.range(), 3).unwrap();
    let mut per_node = BTreeMap::<u32, u64>::new();
    let mut absent = 0u64;
    // SAFETY: the mapping lives across the call.
    unsafe {
        crate::platform::numa::page_nodes(m.ptr(), m.len, PAGE, |b| {
            for &s in b {
                if let Ok(s) = u32::try_from(s) {
                    *per_node.entry(s).or_default() += PAGE as u64
                } else {
                    absent += PAGE as u64
                }
            }
        })
    }
    .unwrap();
    assert_eq!((p.vmas, p.straddling), (1, 0));
    assert_eq!(p.exact_nodes().unwrap(), per_node);
    assert_eq!(p.not_present.min, absent);
    assert_eq!(absent, (m.len / PAGE / 5 * 2 * PAGE) as u64);
}

/// The task's policy, from this process's own numa_maps, is what
/// get_mempolicy says of the main thread (the default in tests).
#[test]
fn policies_from_lines() {
    let l = |t: &[u8]| line_policy(t);
    assert_eq!(l(b"1000 default").as_deref(), Some("default"));
    assert_eq!(
        l(b"2000 prefer (many):0-1 anon=1 N0=1").as_deref(),
        Some("prefer (many):0-1")
    );
    assert_eq!(
        l(b"2000 weighted interleave:0-3 anon=1").as_deref(),
        Some("weighted interleave:0-3")
    );
    assert_eq!(
        l(b"3000 bind=static:1 N1=1").as_deref(),
        Some("bind=static:1")
    );
    assert_eq!(l(b"zz default"), None);
    assert_eq!(l(b"3000"), None);
    let t = b"1000 bind:1 anon=1\n2000 interleave:0-1 heap anon=1\n3000 local stack anon=3\n";
    assert_eq!(task_policy(t).as_deref(), Some("local"));
    assert_eq!(
        task_policy(b"2000 prefer:1 heap\n").as_deref(),
        Some("prefer:1")
    );
    assert_eq!(task_policy(b"garbage"), None);
    let here = std::fs::read("/proc/self/numa_maps").unwrap();
    let p = task_policy(&here).expect("a stack line");
    // Test threads inherit the main thread's policy and none changes it.
    let mode = crate::platform::numa::get_mempolicy().unwrap().0 & 0xff;
    let word = ["default", "prefer", "bind", "interleave", "local"][usize::try_from(mode).unwrap()];
    assert!(
        p.starts_with(word),
        "numa_maps says {p}, get_mempolicy mode {mode}"
    );
}

/// Two adjacent anonymous mappings with the same flags become one VMA
/// (so one numa_maps line); guard pages prevent it.
#[test]
fn adjacent_mappings_merge_without_guards() {
    // Reserve 3 MiB, then replace its two halves with fresh mappings.
    let len = 4 * PAGE;
    // SAFETY: a fresh anonymous mapping at a kernel-chosen address.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            2 * len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    let a = p as u64;
    // SAFETY: MAP_FIXED over our own reservation replaces only it.
    let q = unsafe {
        libc::mmap(
            (a + len as u64) as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    assert_eq!(q as u64, a + len as u64);
    let maps = std::fs::read("/proc/self/maps").unwrap();
    let v = overlapping_vmas(&maps, &(a..a + 2 * len as u64)).unwrap();
    // SAFETY: our own mapping.
    unsafe { libc::munmap(p, 2 * len) };
    assert_eq!(v.len(), 1, "the kernel merged them: {v:?}");
}

#[test]
fn read_lines_reads_a_prefix() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("numa_maps");
    let mut text = String::new();
    for i in 0..20000u64 {
        text.push_str(&format!(
            "{:x} default anon=1 N0=1 kernelpagesize_kB=4\n",
            0x10000 + i * 0x1000
        ));
    }
    std::fs::write(&p, &text).unwrap();
    // A regular file returns whole reads, so at least the lines asked for
    // and less than the whole file come back.
    let got = read_lines(&p, 100).unwrap();
    assert!(got.iter().filter(|&&b| b == b'\n').count() >= 100);
    assert!(got.len() < text.len());
    assert!(text.as_bytes().starts_with(&got));
    assert_eq!(read_lines(&p, usize::MAX).unwrap(), text.as_bytes());
    assert!(read_lines(&p, 0).unwrap().is_empty());
}

/// On /proc, reads stop right after the lines asked for.
#[test]
fn read_lines_on_proc_stops_at_the_line() {
    let maps = std::fs::read("/proc/self/maps").unwrap();
    let n = lines(&maps).count();
    let got = read_lines(std::path::Path::new("/proc/self/numa_maps"), n / 2).unwrap();
    let got_lines = got.split(|&b| b == b'\n').filter(|l| !l.is_empty()).count();
    assert!(
        got_lines >= n / 2 && got_lines <= n / 2 + 1,
        "{got_lines} lines for {}",
        n / 2
    );
}

#[test]
fn totals_split_data_from_files_and_read_the_task_policy() {
    let text: &[u8] = b"\
55d0a000 default file=/usr/bin/python3 mapped=10 N0=10 kernelpagesize_kB=4
55d1a000 default heap anon=100 dirty=100 N0=60 N1=40 kernelpagesize_kB=4
7f0000000000 bind:1 anon=512 dirty=512 N1=512 kernelpagesize_kB=4
7f1000000000 default file=/memfd:numapin-shared-1\\040(deleted) dirty=8 N1=8 kernelpagesize_kB=4
7f2000000000 default file=/dev/hugepages/x huge dirty=2 N0=2 kernelpagesize_kB=2048
7f3000000000 default file=/usr/lib/libtorch.so mapped=1000 N1=1000 kernelpagesize_kB=4
7f4000000000 default file=/dev/nvidiactl dirty=16 N1=16 kernelpagesize_kB=4
7ffd1000 bind:1 stack anon=33 dirty=33 N1=33 kernelpagesize_kB=4
7ffd9000 default
garbage line
7ffe0000 default anon=1 N4096=1 kernelpagesize_kB=4
";
    let mut t = Totals::default();
    for l in text.split(|&b| b == b'\n') {
        t.add_line(l, 1024);
    }
    let k = |p: u64| p * 4096;
    assert_eq!(
        t.data,
        BTreeMap::from([(0, k(60) + (4 << 20)), (1, k(40 + 512 + 8 + 33 + 16))])
    );
    assert_eq!(t.file, BTreeMap::from([(0, k(10)), (1, k(1000))]));
    assert_eq!(t.policy.as_deref(), Some("bind:1"));
    assert_eq!((t.vmas, t.bad_lines, t.bad_nodes), (11, 1, 1));
    // Without a stack line, the heap's.
    let mut h = Totals::default();
    h.add_line(
        b"55d1a000 prefer:0 heap anon=1 N0=1 kernelpagesize_kB=4",
        1024,
    );
    assert_eq!(h.policy.as_deref(), Some("prefer:0"));
}

proptest! {
    #[test]
    fn totals_take_any_lines(lines in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..80), 0..20)) {
        let mut t = Totals::default();
        for l in &lines {
            t.add_line(l, 8);
        }
        prop_assert!(t.data.keys().chain(t.file.keys()).all(|&n| n < 8));
        prop_assert!(t.vmas <= lines.len() as u64);
    }
}
