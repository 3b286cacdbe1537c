use super::*;
use proptest::prelude::*;

const STATUS: &[u8] = b"Name:\tpython3\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t4242\n\
Uid:\t1000\t1000\t1000\t1000\nGid:\t1000\t1000\t1000\t1000\nVmRSS:\t   43008 kB\n\
VmLck:\t       0 kB\nVmPin:\t    2048 kB\nThreads:\t12\n\
Cpus_allowed:\tffffffff\nCpus_allowed_list:\t0-31\nMems_allowed_list:\t0-1\n\
NSpid:\t84512\t37\n";

#[test]
fn status_fields() {
    let s = parse_status(STATUS);
    assert_eq!(s.name.as_deref(), Some("python3"));
    assert_eq!(s.state, Some('S'));
    assert_eq!((s.uid, s.uids.as_slice()), (Some(1000), &[1000; 4][..]));
    assert_eq!(parse_status(b"Uid:\t0\t1000\t0\t7\n").uids, [0, 1000, 0, 7]);
    assert_eq!(s.threads, Some(12));
    assert_eq!(s.cpus_allowed.as_deref(), Some("0-31"));
    assert_eq!(s.mems_allowed.as_deref(), Some("0-1"));
    assert_eq!(
        (s.rss, s.locked, s.pinned),
        (Some(43008 << 10), Some(0), Some(2 << 20))
    );
    // A kernel thread has no Vm lines; garbage values are None.
    let s = parse_status(b"Name:\tkworker/0:1\nState:\tI (idle)\nVmLck:\tlots kB\n");
    assert_eq!((s.state, s.rss, s.locked), (Some('I'), None, None));
    let s = parse_status(b"VmRSS:\t99999999999999999999 kB\n");
    assert_eq!(s.rss, None);
}

#[test]
fn pid_namespaces_of_a_process() {
    // Its pid in this /proc's namespace first, its own namespace's last.
    assert_eq!(parse_status(STATUS).nspid, [84512, 37]);
    assert_eq!(parse_status(b"NSpid:\t12\n").nspid, [12]);
    // Absent (old kernels), garbage or impossibly deep: none believed.
    assert!(parse_status(b"Name:\tx\n").nspid.is_empty());
    assert!(parse_status(b"NSpid:\t12\tx\n").nspid.is_empty());
    let deep = format!("NSpid:{}\n", "\t7".repeat(MAX_PID_NS_LEVELS + 1));
    assert!(parse_status(deep.as_bytes()).nspid.is_empty());
    let deepest = format!("NSpid:{}\n", "\t7".repeat(MAX_PID_NS_LEVELS));
    assert_eq!(
        parse_status(deepest.as_bytes()).nspid.len(),
        MAX_PID_NS_LEVELS
    );
}

#[test]
fn kernel_threads_mark_the_hosts_pid_namespace() {
    // kthreadd's stat: flags 0x208040 (PF_KTHREAD set), command with a space.
    let kthreadd = "2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 7";
    assert_eq!(stat_flags(kthreadd.as_bytes()), Some(2_129_984));
    assert_eq!(stat_flags(b"2 (a) b) S 0 0 0 0 -1 64 0"), Some(64));
    assert_eq!(stat_flags(b"2 (x) S 0"), None);
    let root = |stat: &str| crate::platform::fake_root(&[("proc/2/stat", stat)]);
    assert!(shows_host_pids(root(kthreadd).path()));
    // A user process at pid 2 (a container's namespace): no PF_KTHREAD.
    let user = "2 (kthreadd) S 1 2 2 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 7";
    assert!(!shows_host_pids(root(user).path()));
    assert!(!shows_host_pids(crate::platform::fake_root(&[]).path()));
    // This machine's own /proc is one or the other; never a panic.
    let _ = shows_host_pids(Path::new("/"));
}

#[test]
fn the_processor_field_counts_from_the_last_parenthesis() {
    // Field 39 is the 37th after the command; a command with spaces and
    // parentheses must not shift it.
    let tail: Vec<String> = (3..=52)
        .map(|f| if f == 39 { "7".into() } else { f.to_string() })
        .collect();
    let stat = format!("4242 (a) (b c) {}", tail.join(" "));
    assert_eq!(stat_processor(stat.as_bytes()), Some(7));
    assert_eq!(stat_processor(b"4242 (x) S 1 2"), None);
    assert_eq!(stat_processor(b"no parenthesis"), None);
}

#[test]
fn environment_values_first_definition_wins() {
    let env = b"PATH=/bin\0LOCAL_RANK=3\0UCX_NET_DEVICES=mlx5_0:1\0LOCAL_RANK=9\0BROKEN\0CUDA_VISIBLE_DEVICES=\0";
    assert_eq!(
        environ_values(env, &["LOCAL_RANK", "CUDA_VISIBLE_DEVICES", "RANK"]),
        vec![
            ("LOCAL_RANK".to_string(), "3".to_string()),
            ("CUDA_VISIBLE_DEVICES".to_string(), String::new())
        ]
    );
    assert_eq!(environ_values(b"", &["X"]), vec![]);
}

#[test]
fn command_lines_and_map_paths() {
    assert_eq!(
        cmdline_text(b"python3\0train.py\0--lr\x003\0"),
        "python3 train.py --lr 3"
    );
    assert_eq!(cmdline_text(b""), "");
    assert_eq!(
        maps_path(b"7f0000000000-7f0000200000 rw-s 00000000 00:05 123   /dev/nvidia3"),
        b"/dev/nvidia3"
    );
    assert_eq!(
        maps_path(b"55d0a000-55d0b000 r--p 00000000 fd:01 1234   /usr/bin/with space"),
        b"/usr/bin/with space"
    );
    assert_eq!(maps_path(b"7ffd1000-7ffd2000 rw-p 00000000 00:00 0 "), b"");
    assert_eq!(maps_path(b"short"), b"");
}

#[test]
fn nvidia_information_files() {
    let text = b"Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 35\nGPU UUID: \t GPU-578d\n\
Video BIOS: \t 96.00.99.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\n\
Bus Location: \t 0000:00:06.0\nDevice Minor: \t 0\nGPU Excluded:\t No\n";
    assert_eq!(
        parse_nvidia_information(text),
        Some((0, "0000:00:06.0".into()))
    );
    assert_eq!(
        parse_nvidia_information(b"Device Minor: x\nBus Location: 0000:00:06.0"),
        None
    );
    assert_eq!(
        parse_nvidia_information(b"Bus Location: 0000:00:06.0"),
        None
    );
    let d = crate::platform::fake_root(&[
        (
            "proc/driver/nvidia/gpus/0000:47:00.0/information",
            "Bus Location: 00000000:47:00.0\nDevice Minor: 3\n",
        ),
        (
            "proc/driver/nvidia/gpus/0000:07:00.0/information",
            "garbage",
        ),
    ]);
    let (minors, notes) = nvidia_minors(d.path(), 16);
    assert_eq!(minors, vec![(3, "0000:47:00.0".to_string())]);
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(notes[0].contains("Device Minor"), "{notes:?}");
    assert_eq!(
        nvidia_minors(Path::new("/nonexistent"), 16),
        (vec![], vec![])
    );
}

#[test]
fn lines_past_the_limits_are_errors_not_allocations() {
    let mut seen = Vec::new();
    let n = for_each_line(&b"a\nbb\n\nccc"[..], 8, 10, |l| seen.push(l.to_vec())).unwrap();
    assert_eq!(n, 4);
    assert_eq!(
        seen,
        [b"a".to_vec(), b"bb".to_vec(), vec![], b"ccc".to_vec()]
    );
    let e = for_each_line(&b"short\nthis line is too long\n"[..], 8, 10, |_| {}).unwrap_err();
    assert!(
        e.to_string()
            .contains("line 2 is longer than the 8-byte limit"),
        "{e}"
    );
    // A line of exactly the limit, with its newline, is fine.
    assert_eq!(for_each_line(&b"12345678\n"[..], 8, 10, |_| {}).unwrap(), 1);
    let e = for_each_line(&b"1\n2\n3\n"[..], 8, 2, |_| {}).unwrap_err();
    assert!(e.to_string().contains("more than the 2-line limit"), "{e}");
    // An endless line costs no more than the limit.
    let endless = std::io::repeat(b'x');
    let e = for_each_line(endless, 1 << 16, 10, |_| {}).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData);
}

#[test]
fn capped_reads_and_folders() {
    let d = crate::platform::fake_root(&[
        ("proc/1/status", "x"),
        ("proc/12/status", "x"),
        ("proc/self/status", "x"),
        ("proc/big", &"y".repeat(100)),
    ]);
    assert_eq!(
        read_capped(&d.path().join("proc/big"), 100).unwrap().len(),
        100
    );
    let e = read_capped(&d.path().join("proc/big"), 99).unwrap_err();
    assert!(e.to_string().contains("99-byte limit"), "{e}");
    let (pids, truncated) = numeric_entries(&d.path().join("proc"), 10).unwrap();
    assert_eq!((pids, truncated), (vec![1, 12], false));
    let (pids, truncated) = numeric_entries(&d.path().join("proc"), 1).unwrap();
    assert_eq!((pids.len(), truncated), (1, true));
    assert_eq!(pid_path(d.path(), 7, "fd"), d.path().join("proc/7/fd"));
}

fn seqlock_file(seq: u32, len: u32, data: &[u8]) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    let mut v = 0x1122_3344_5566_7788u64.to_le_bytes().to_vec();
    v.extend(seq.to_le_bytes());
    v.extend(len.to_le_bytes());
    v.extend(data);
    std::io::Write::write_all(&mut f, &v).unwrap();
    f
}

#[test]
fn seqlocked_reads() {
    let magic = 0x1122_3344_5566_7788;
    let f = seqlock_file(2, 5, b"hello");
    assert_eq!(read_seqlocked(f.path(), magic, 100, 3).unwrap(), b"hello");
    // Odd: being written, and never finished.
    let f = seqlock_file(3, 5, b"hello");
    let e = read_seqlocked(f.path(), magic, 100, 3).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
    assert!(e.to_string().contains("3 tries"), "{e}");
    // Another magic; a length past the limit (nothing allocated for it); a
    // file shorter than its length or its header.
    let e = read_seqlocked(f.path(), 1, 100, 3).unwrap_err();
    assert!(e.to_string().contains("magic"), "{e}");
    let f = seqlock_file(2, u32::MAX, b"");
    let e = read_seqlocked(f.path(), magic, 100, 3).unwrap_err();
    assert!(e.to_string().contains("past the 100-byte limit"), "{e}");
    let f = seqlock_file(2, 50, b"short");
    let e = read_seqlocked(f.path(), magic, 100, 3).unwrap_err();
    assert!(e.to_string().contains("ends inside its data"), "{e}");
    let mut g = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(&mut g, b"tiny").unwrap();
    let e = read_seqlocked(g.path(), magic, 100, 3).unwrap_err();
    assert!(e.to_string().contains("ends inside its header"), "{e}");
}

proptest! {
    #[test]
    fn parsers_take_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse_status(&bytes);
        let _ = stat_processor(&bytes);
        let _ = stat_flags(&bytes);
        let _ = stat_identity(&bytes);
        let _ = environ_values(&bytes, &["LOCAL_RANK", "A"]);
        let _ = cmdline_text(&bytes);
        let _ = maps_path(&bytes);
        let _ = parse_nvidia_information(&bytes);
        let mut n = 0;
        let _ = for_each_line(&bytes[..], 16, 8, |_| n += 1);
        prop_assert!(n <= 8);
    }

    /// A command of any bytes (the kernel prints it raw, parentheses and
    /// spaces too) does not shift the fields after it.
    #[test]
    fn stat_identity_reads_past_any_command(
        comm in proptest::collection::vec(any::<u8>(), 0..16),
        start in any::<u64>(),
        stack in any::<u64>(),
    ) {
        let mut stat = b"42 (".to_vec();
        stat.extend(&comm);
        let fields: Vec<String> = (3..=52)
            .map(|f| match f {
                22 => start.to_string(),
                28 => stack.to_string(),
                _ => f.to_string(),
            })
            .collect();
        stat.extend(format!(") {}\n", fields.join(" ")).as_bytes());
        let id = stat_identity(&stat).unwrap();
        prop_assert_eq!(id.start, Some(start));
        prop_assert_eq!(id.program, (comm, [26, 27, stack]));
    }
}
