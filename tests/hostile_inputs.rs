//! Hostile inputs (the hostile-input issue's classes, library side): memory
//! and time follow what an input is, not what it claims; special files and
//! captures that reach outside themselves are refused; descriptions that
//! contradict themselves are refused; plans stay near-linear. Inputs are
//! built in memory or in a temporary folder (the largest, 25 MB, is the
//! hwloc XML hwloc took minutes on) and each test takes a few seconds at
//! most.
#![allow(clippy::unwrap_used)] // tests and examples fail loudly

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use numapin::affinity::{plan, Mode, PlanOptions};
use numapin::internals::hwloc_readers_started;
use numapin::topology::limits::{
    MAX_CPUS, MAX_GPUS, MAX_IO_DEVICES, MAX_NODES, MAX_PCI_DEPTH, MAX_XML_DEPTH,
};
use numapin::topology::{ProbeOptions, Topology};
use numapin::{ErrorKind, GpuIndex};
use serde_json::{json, Value};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("topology")
        .join(name)
}

fn load(path: &Path) -> numapin::Result<Topology> {
    Ok(Topology::load(path, &ProbeOptions::default())?)
}

/// A fixture's JSON form, to edit.
fn json_of(name: &str) -> Value {
    serde_json::from_str(&load(&fixture(name)).unwrap().to_json()).unwrap()
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// Loads `v` as a JSON file: the error's text, which must be an input
/// error, must name `want` (what the reader counted when it stopped).
fn refused(v: &Value, want: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "t.json", v.to_string().as_bytes());
    let e = load(&p).expect_err(want);
    assert_eq!(e.kind(), ErrorKind::Input, "{e}");
    let text = numapin::error::with_causes(&e);
    assert!(text.contains(want), "wanted {want:?} in: {text}");
    assert!(e.fix().is_some());
    text
}

// ---- Class 2: amplification.

#[test]
fn cpu_numbers_beyond_the_limit_are_refused_before_allocating() {
    let mut v = json_of("dgx-h100.xml");
    // 3,000 cores claiming a million CPUs each: 100 KB of text.
    v["cores"] = Value::Array(vec![json!({"cpus": "0-1048575", "numa_node": 0}); 3000]);
    refused(&v, "8191");
    let mut v = json_of("dgx-h100.xml");
    v["allowed"]["cpus"] = json!("0-1048575");
    refused(&v, "8191");
    let mut v = json_of("dgx-h100.xml");
    v["numa_nodes"][0]["cpus"] = json!("8-1048575:1/1");
    refused(&v, "8191");
}

#[test]
fn cpu_lists_that_claim_too_much_in_all_are_refused() {
    // Every list within the CPU limit, but 8,192 of them each naming every
    // CPU: 260 MB of numbers from 200 KB of text.
    let mut v = json_of("dgx-h100.xml");
    v["cores"] = Value::Array(vec![json!({"cpus": "0-8191", "numa_node": 0}); 8192]);
    refused(&v, "CPU numbers in all");
}

#[test]
fn counts_beyond_the_limits_are_refused() {
    let mut v = json_of("cloud-vm-1n.xml");
    let node = v["numa_nodes"][0].clone();
    v["numa_nodes"] = Value::Array(
        (0..=MAX_NODES)
            .map(|i| {
                let mut n = node.clone();
                n["os_index"] = json!(i);
                n["cpus"] = json!("");
                n["distances"] = json!([]);
                n
            })
            .collect(),
    );
    refused(&v, "1024");
    let mut v = json_of("cloud-vm-1n.xml");
    v["numa_nodes"][0]["os_index"] = json!(1_048_576);
    refused(&v, "1023");
    let mut v = json_of("cloud-vm-1n.xml");
    let gpu = v["gpus"][0].clone();
    v["gpus"] = Value::Array(
        (0..=MAX_GPUS)
            .map(|i| {
                let mut g = gpu.clone();
                g["index"] = json!(i);
                g["pci_bus_id"] = json!(format!("0000:{:02x}:{:02x}.0", i / 32, i % 32));
                g
            })
            .collect(),
    );
    refused(&v, "1024");
}

#[test]
fn json_lists_are_refused_before_the_item_over_the_limit_is_built() {
    // The 1,025th GPU is not even a GPU: the list is refused by its length
    // before anything is made of it (a 60 MB file of a million GPUs took
    // 360 MB of memory before it was counted).
    let mut v = json_of("cloud-vm-1n.xml");
    let gpu = v["gpus"][0].clone();
    let mut gpus: Vec<Value> = (0..MAX_GPUS)
        .map(|i| {
            let mut g = gpu.clone();
            g["index"] = json!(i);
            g
        })
        .collect();
    gpus.push(json!("not a GPU"));
    v["gpus"] = Value::Array(gpus);
    refused(&v, "1025 or more GPUs, more than the limit of 1024");
    let mut v = json_of("cloud-vm-1n.xml");
    let mut distances = vec![json!(10); MAX_NODES as usize];
    distances.push(json!("not a distance"));
    v["numa_nodes"][0]["distances"] = Value::Array(distances);
    refused(&v, "1025 or more distances");
}

#[test]
fn nccl_files_are_held_to_the_limits_while_parsed() {
    let dir = tempfile::tempdir().unwrap();
    let gpus: String = (0..100_000)
        .map(|i| {
            format!(
                "<pci busid=\"0000:{:02x}:{:02x}.0\" class=\"0x030200\"/>",
                (i / 32) % 256,
                i % 32
            )
        })
        .collect();
    let xml = format!(
        "<system version=\"1\"><cpu numaid=\"0\" affinity=\"ffffffff\">{gpus}</cpu></system>"
    );
    // Refused at the first GPU over the limit, not after reading 100,000.
    let e = load(&write(dir.path(), "many.xml", xml.as_bytes())).unwrap_err();
    assert!(
        e.to_string()
            .contains("1025 GPUs, more than the limit of 1024"),
        "{e}"
    );
    let mask = format!("{}ffffffff", "ffffffff,".repeat(32_767));
    let xml = format!("<system version=\"1\"><cpu numaid=\"0\" affinity=\"{mask}\"/></system>");
    let e = load(&write(dir.path(), "mask.xml", xml.as_bytes())).unwrap_err();
    assert!(e.to_string().contains("8191"), "{e}");
    let xml = "<system version=\"1\"><cpu numaid=\"1048576\" affinity=\"ff\"/></system>";
    let e = load(&write(dir.path(), "node.xml", xml.as_bytes())).unwrap_err();
    assert!(e.to_string().contains("1023"), "{e}");
}

#[test]
fn nics_storage_and_pci_trees_beyond_the_limits_are_refused() {
    // JSON: more NICs and drives than the limit, and a drive among the NICs.
    let mut v = json_of("pcie-switch-2s.xml");
    let nic = v["nics"][0].clone();
    v["nics"] = Value::Array(vec![nic; MAX_IO_DEVICES + 1]);
    refused(&v, "NICs and storage devices, more than the limit of 4096");
    let mut v = json_of("dgx-h100.xml");
    v["nics"][0]["kind"] = json!("nvme");
    refused(&v, "belongs in storage");

    // NCCL: more NICs than the limit, refused while parsed.
    let dir = tempfile::tempdir().unwrap();
    let nics: String = (0..2 * MAX_IO_DEVICES)
        .map(|i| {
            format!(
                "<pci busid=\"0000:{:02x}:{:02x}.{}\" class=\"0x020000\"/>",
                i / 256,
                (i / 8) % 32,
                i % 8
            )
        })
        .collect();
    let xml = format!(
        "<system version=\"1\"><cpu numaid=\"0\" affinity=\"ffffffff\">{nics}</cpu></system>"
    );
    // Refused at the first NIC over the limit, not after reading 8,192.
    let e = load(&write(dir.path(), "nics.xml", xml.as_bytes())).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Input, "{e}");
    assert!(e.to_string().contains("4097 NICs"), "{e}");

    // hwloc XML: as many NICs below one root bus, and a chain of bridges
    // deeper than the limit.
    let src = std::fs::read_to_string(fixture("pcie-switch-2s.xml")).unwrap();
    let anchor = r#"bridge_pci="0000:[00-01]">"#;
    assert!(src.contains(anchor));
    let functions = |n: usize, class: &str| -> String {
        (0..n)
            .map(|i| {
                format!(
                    r#"<object type="PCIDev" pci_busid="0001:{:02x}:{:02x}.{}" pci_type="{class} [8086:1563] [8086:0000] a1"/>"#,
                    i / 256,
                    (i / 8) % 32,
                    i % 8
                )
            })
            .collect()
    };
    let many = src.replacen(
        anchor,
        &format!("{anchor}{}", functions(MAX_IO_DEVICES + 1, "0200")),
        1,
    );
    let bridge = r#"<object type="Bridge" bridge_type="1-1" depth="1" bridge_pci="0000:[02-02]" pci_busid="0000:01:00.0" pci_type="0604 [8086:a190] [0000:0000] 00">"#;
    let depth = MAX_PCI_DEPTH + 2;
    let deep = src.replacen(
        anchor,
        &format!(
            "{anchor}{}{}{}",
            bridge.repeat(depth),
            functions(1, "0200"),
            "</object>".repeat(depth)
        ),
        1,
    );
    // Too many NICs: counted while read, refused before hwloc reads it.
    let before = hwloc_readers_started();
    let e = load(&write(dir.path(), "io.xml", many.as_bytes())).unwrap_err();
    let text = numapin::error::with_causes(&e);
    assert_eq!(hwloc_readers_started(), before, "hwloc read it: {text}");
    assert_eq!(e.kind(), ErrorKind::Input, "{text}");
    assert!(text.contains("4097 NICs and storage devices"), "{text}");
    // Too deep a chain of bridges: refused once hwloc has built the tree.
    let e = load(&write(dir.path(), "io.xml", deep.as_bytes())).unwrap_err();
    let text = numapin::error::with_causes(&e);
    assert_eq!(e.kind(), ErrorKind::Input, "deep: {text}");
    assert!(text.contains("64 bridges deep"), "deep: {text}");
}

/// An hwloc XML export holding `body` in its Machine (the cloud VM's).
fn hwloc_xml_with(body: &str) -> String {
    let src = std::fs::read_to_string(fixture("cloud-vm-1n.xml")).unwrap();
    let at = src.find("gp_index=\"1\">").unwrap() + "gp_index=\"1\">".len();
    format!("{}{body}{}", &src[..at], &src[at..])
}

/// Loads `xml` as a file: refused as an input error naming `want` while
/// it was counted, before hwloc read it (which is what keeps a refusal
/// about as fast as reading the file).
fn refused_xml(what: &str, xml: &str, want: &str) {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "hostile.xml", xml.as_bytes());
    let before = hwloc_readers_started();
    let e = load(&p).expect_err(what);
    let text = numapin::error::with_causes(&e);
    assert_eq!(
        hwloc_readers_started(),
        before,
        "{what}: hwloc read it: {text}"
    );
    assert_eq!(e.kind(), ErrorKind::Input, "{what}: {text}");
    assert!(text.contains(want), "{what}: wanted {want:?} in: {text}");
}

#[test]
fn hwloc_xml_is_held_to_the_limits_while_read() {
    // The issue's file: 25 MB, 200,000 PUs (hwloc alone took 100 s on it).
    let pus: String = (0..200_000)
        .map(|i| {
            format!(
                r#"<object type="PU" os_index="{}" cpuset="0x1" complete_cpuset="0x1" nodeset="0x1" complete_nodeset="0x1" gp_index="{}"/>"#,
                i % 8192,
                i + 10
            )
        })
        .collect();
    refused_xml(
        "PUs",
        &hwloc_xml_with(&pus),
        "8193 CPUs, more than the limit of 8192",
    );
    refused_xml(
        "a PU number",
        &hwloc_xml_with(r#"<object type="PU" os_index="1048576" cpuset="0x1"/>"#),
        "CPU 1048576, beyond the limit of 8192 CPUs (0-8191)",
    );
    let nodes: String = (0..=MAX_NODES)
        .map(|i| {
            format!(
                r#"<object type="NUMANode" os_index="{}" local_memory="1"/>"#,
                i % MAX_NODES
            )
        })
        .collect();
    refused_xml("nodes", &hwloc_xml_with(&nodes), "1025 NUMA nodes");
    let gpus: String = (0..=MAX_GPUS)
        .map(|i| {
            format!(
                r#"<object type="PCIDev" pci_busid="0001:{:02x}:{:02x}.0" pci_type="0302 [10de:2330] [10de:16c1] a1"/>"#,
                i / 32,
                i % 32
            )
        })
        .collect();
    let bridge = |inside: &str| {
        format!(
            r#"<object type="Bridge" bridge_type="0-1" depth="0" bridge_pci="0001:[00-ff]">{inside}</object>"#
        )
    };
    refused_xml("GPUs", &hwloc_xml_with(&bridge(&gpus)), "1025 GPUs");
    // NICs by the network interfaces in them, 8,192 siblings a bridge.
    let nic = r#"<object type="PCIDev" pci_busid="0001:01:00.0" pci_type="0c03 [8086:0001] [0000:0000] 00"><object type="OSDev" name="eth" osdev_type="2"/></object>"#;
    let nics = bridge(&nic.repeat(2048)).repeat(2) + &bridge(nic);
    refused_xml(
        "NICs",
        &hwloc_xml_with(&nics),
        "4097 NICs and storage devices",
    );
    // 65,536 PCI devices is the limit, but not under one bridge: hwloc's
    // time grows with the square of the objects side by side.
    let usb = r#"<object type="PCIDev" pci_busid="0001:01:00.0" pci_type="0c03 [8086:0001] [0000:0000] 00"/>"#;
    refused_xml(
        "side by side",
        &hwloc_xml_with(&bridge(&usb.repeat(65_000))),
        "side by side",
    );
    let misc = r#"<object type="Misc" name="m"/>"#;
    let objects = bridge(&misc.repeat(256)).repeat(1025);
    refused_xml(
        "objects",
        &hwloc_xml_with(&objects),
        "more than 262144 objects",
    );
    let deep = format!(
        "{}{}",
        r#"<object type="Misc">"#.repeat(10_000),
        "</object>".repeat(10_000)
    );
    refused_xml("nesting", &hwloc_xml_with(&deep), "nest more than 128 deep");
}

#[test]
fn captures_are_held_to_the_limits_before_hwloc_reads_them() {
    let dir = tempfile::tempdir().unwrap();
    let cpus = dir.path().join("cpus");
    common::make_capture(&cpus);
    // hwloc takes minutes on 20,000 CPUs; their entries alone are refused
    // (files here: thousands of folders are slow to remove on some disks).
    for c in 8..20_000 {
        std::fs::write(cpus.join(format!("sys/devices/system/cpu/cpu{c}")), "").unwrap();
    }
    let nodes = dir.path().join("nodes");
    common::make_capture(&nodes);
    std::fs::create_dir(nodes.join("sys/devices/system/node/node4096")).unwrap();
    let gpus = dir.path().join("gpus");
    common::make_capture(&gpus);
    // As in sysfs, each PCI function is a link to its device's folder
    // (here all to one, a GPU).
    let gpu = gpus.join("sys/devices/pci0001:00/gpu");
    std::fs::create_dir_all(&gpu).unwrap();
    for (f, v) in [
        ("vendor", "0x10de\n"),
        ("device", "0x2330\n"),
        ("class", "0x030200\n"),
    ] {
        std::fs::write(gpu.join(f), v).unwrap();
    }
    for i in 0..=MAX_GPUS {
        let name = format!("0001:{:02x}:{:02x}.0", i / 32, i % 32);
        let link = gpus.join("sys/bus/pci/devices").join(name);
        std::os::unix::fs::symlink("../../../devices/pci0001:00/gpu", link).unwrap();
    }
    for (root, want) in [
        (cpus, "limit of 8192"),
        (nodes, "NUMA node 4096, beyond the limit of 1024 nodes"),
        (gpus, "1025 GPUs"),
    ] {
        let before = hwloc_readers_started();
        let e = load(&root).expect_err(want);
        let text = numapin::error::with_causes(&e);
        assert_eq!(hwloc_readers_started(), before, "hwloc read it: {text}");
        assert_eq!(e.kind(), ErrorKind::Input, "{text}");
        assert!(text.contains(want), "wanted {want:?} in: {text}");
    }
}

#[test]
fn readers_need_little_of_the_callers_stack() {
    // A trainer's own thread may be small; hwloc's recursion (in the
    // reader process) and the reply's buffer must not depend on it.
    let dir = tempfile::tempdir().unwrap();
    let cap = dir.path().join("cap");
    common::make_capture(&cap);
    let json = write(
        dir.path(),
        "dgx.json",
        load(&fixture("dgx-h100.xml")).unwrap().to_json().as_bytes(),
    );
    let nesting = MAX_XML_DEPTH - 8;
    let deep = format!(
        "{}{}",
        r#"<object type="Misc" name="m">"#.repeat(nesting),
        "</object>".repeat(nesting)
    );
    let deep = write(dir.path(), "deep.xml", hwloc_xml_with(&deep).as_bytes());
    let results = std::thread::Builder::new()
        .stack_size(64 << 10)
        .spawn(move || {
            [fixture("dgx-h100.xml"), cap, json, deep]
                .iter()
                .map(|p| load(p).map(|t| t.gpus.len()).map_err(|e| e.to_string()))
                .collect::<Vec<_>>()
        })
        .unwrap()
        .join()
        .unwrap();
    assert_eq!(results[..3], [Ok(8), Ok(1), Ok(8)], "{results:?}");
    // hwloc refuses Misc objects nested so; it does not crash on them.
    assert!(
        results[3].as_ref().is_err_and(|e| !e.contains("crash")),
        "{:?}",
        results[3]
    );
}

#[test]
fn infinite_hwloc_bitmaps_are_refused_not_expanded() {
    let dir = tempfile::tempdir().unwrap();
    let src = std::fs::read_to_string(fixture("cloud-vm-1n.xml")).unwrap();
    // The Machine's sets (or every CPU set) become infinite, in hwloc's own
    // syntax.
    let machine = |attrs: &[&str]| {
        let mut out = src.clone();
        for attr in attrs {
            let key = format!(" {attr}=\"");
            let start = out.find(&key).unwrap() + key.len();
            let end = start + out[start..].find('"').unwrap();
            out = format!("{}0xf...f{}", &out[..start], &out[end..]);
        }
        out
    };
    for (what, xml) in [
        ("machine cpuset", machine(&["cpuset", "complete_cpuset"])),
        ("machine nodeset", machine(&["nodeset", "complete_nodeset"])),
        ("every cpuset", src.replace("\"0x0000ffff\"", "\"0xf...f\"")),
    ] {
        let e = load(&write(dir.path(), "inf.xml", xml.as_bytes())).unwrap_err();
        let text = numapin::error::with_causes(&e);
        assert_eq!(e.kind(), ErrorKind::Input, "{what}: {text}");
        assert!(!text.contains("crash"), "{what}: {text}");
    }
}

#[test]
fn a_machine_at_the_limits_loads() {
    // 8,192 CPUs in 8 nodes of 512 two-thread cores, one GPU per node.
    let t = common::Shape::new(1, 8, 1, 1, 512).build();
    assert_eq!(t.all_cpus().len(), MAX_CPUS as usize);
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "big.json", t.to_json().as_bytes());
    let back = load(&p).unwrap();
    assert_eq!(back.all_cpus().len(), MAX_CPUS as usize);
    let ranks = vec![GpuIndex(0); 4096];
    let p = plan(
        &back,
        &ranks[..256],
        Mode::Exclusive,
        &PlanOptions::default(),
    )
    .unwrap();
    assert_eq!(p.ranks.len(), 256);
    let p = plan(&back, &ranks[..512], Mode::Core, &PlanOptions::default()).unwrap();
    assert_eq!(p.ranks.len(), 512);
    // Class 9: plans on it stay near-linear: 32 times the ranks take far
    // less than 32 x 32 times as long (as a quadratic planner would), each
    // the best of three runs in this process (a comparison within one run,
    // not a time goal).
    let all: Vec<GpuIndex> = (0..8192).map(|r| GpuIndex(r % 8)).collect();
    let best = |ranks: &[GpuIndex]| {
        (0..3)
            .map(|_| {
                let t = Instant::now();
                let p = plan(&back, ranks, Mode::Node, &PlanOptions::default()).unwrap();
                assert_eq!(p.ranks.len(), ranks.len());
                t.elapsed()
            })
            .min()
            .unwrap()
    };
    let (small, large) = (best(&all[..256]), best(&all));
    assert!(
        large < small * 256,
        "8192 ranks took {large:?}, 256 ranks {small:?}: more than linear"
    );
}

// ---- Class 4: special files and sizes.

#[test]
fn special_files_are_refused_without_opening_them() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    // Loaded on a thread; meanwhile this one checks that nobody opened the
    // FIFO for reading (a writer's non-blocking open then succeeds instead
    // of failing with ENXIO), which is what would block the load.
    let loading = {
        let fifo = fifo.clone();
        std::thread::spawn(move || load(&fifo))
    };
    while !loading.is_finished() {
        use std::os::unix::fs::OpenOptionsExt;
        let writer = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo);
        match writer {
            // Closing the writer lets the blocked reader go on.
            Ok(w) => {
                drop(w);
                panic!("the FIFO was opened for reading: the load would have blocked");
            }
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::ENXIO), "{e}"),
        }
        std::thread::yield_now();
    }
    let e = loading.join().unwrap().unwrap_err();
    assert!(e.to_string().contains("FIFO"), "{e}");
    assert_eq!(e.kind(), ErrorKind::Input);
    let e = load(Path::new("/dev/zero")).unwrap_err();
    assert!(e.to_string().contains("character device"), "{e}");
}

#[test]
fn files_over_the_size_limit_are_refused_unread() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("huge.json");
    let mut f = std::fs::File::create(&p).unwrap();
    f.write_all(b"{").unwrap();
    f.set_len(3 << 30).unwrap(); // sparse: nothing is written
    let e = load(&p).unwrap_err();
    assert!(e.to_string().contains("64 MiB"), "{e}");
}

// ---- Class 5: captures.

fn leftovers() -> Vec<PathBuf> {
    std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("numapin-capture-"))
        })
        .collect()
}

#[test]
fn captures_hold_only_what_stays_inside_them() {
    let before = leftovers();
    let dir = tempfile::tempdir().unwrap();
    let ok = dir.path().join("ok");
    common::make_capture(&ok);
    let t = load(&ok).unwrap();
    assert_eq!((t.numa_nodes.len(), t.gpus.len()), (2, 1));
    let archive = write(dir.path(), "ok.tar.gz", &common::tar_gz(&ok));
    let t = load(&archive).unwrap();
    assert_eq!((t.numa_nodes.len(), t.gpus.len()), (2, 1));

    links_that_leave_a_capture_are_refused(dir.path());
    a_fifo_in_a_capture_is_refused_unread(dir.path());
    archive_members_that_lie_or_leave_are_refused(dir.path());
    an_archive_of_too_many_entries_is_refused_by_the_survey(dir.path());

    // Nothing unpacked is left behind, on success or on error.
    let after: Vec<PathBuf> = leftovers()
        .into_iter()
        .filter(|p| !before.contains(p))
        .collect();
    assert!(after.is_empty(), "left behind: {after:?}");
}

/// Links leaving the capture (as a folder and as an archive, made in
/// `dir`), as hwloc would follow them: to a file that never ends, to the
/// live sysfs (this machine), relative escapes; and the live system itself.
fn links_that_leave_a_capture_are_refused(dir: &Path) {
    let cases: [(&str, &str, &str); 4] = [
        ("proc/cpuinfo", "/dev/zero", "outside the capture"),
        (
            "sys/devices/system/node/node0/cpumap",
            "/dev/zero",
            "outside the capture",
        ),
        (
            "sys/bus/pci/devices/0000:07:00.0/current_link_speed",
            "/dev/zero",
            "outside the capture",
        ),
        (
            "proc/meminfo",
            "../../../../../../../../etc/hostname",
            "outside the capture",
        ),
    ];
    for (i, (at, target, want)) in cases.iter().enumerate() {
        let root = dir.join(format!("link{i}"));
        common::make_capture(&root);
        std::fs::remove_file(root.join(at)).unwrap();
        std::os::unix::fs::symlink(target, root.join(at)).unwrap();
        for p in [
            root.clone(),
            write(dir, &format!("link{i}.tar.gz"), &common::tar_gz(&root)),
        ] {
            let before = hwloc_readers_started();
            let e = load(&p).unwrap_err();
            assert_eq!(hwloc_readers_started(), before, "hwloc read it: {e}");
            assert!(e.to_string().contains(want), "{at} -> {target}: {e}");
        }
    }
    let live = dir.join("live");
    std::fs::create_dir(&live).unwrap();
    std::os::unix::fs::symlink("/sys", live.join("sys")).unwrap();
    std::os::unix::fs::symlink("/proc", live.join("proc")).unwrap();
    let e = load(&live).unwrap_err();
    assert!(e.to_string().contains("outside the capture"), "{e}");
    let e = load(Path::new("/")).unwrap_err();
    assert!(e.to_string().contains("live system"), "{e}");
}

/// A FIFO inside a capture (made in `dir`): refused, not read.
fn a_fifo_in_a_capture_is_refused_unread(dir: &Path) {
    let fifo = dir.join("fifo");
    common::make_capture(&fifo);
    std::fs::remove_file(fifo.join("sys/devices/system/node/node0/cpumap")).unwrap();
    nix::unistd::mkfifo(
        &fifo.join("sys/devices/system/node/node0/cpumap"),
        nix::sys::stat::Mode::S_IRWXU,
    )
    .unwrap();
    let e = load(&fifo).unwrap_err();
    assert!(e.to_string().contains("FIFO"), "{e}");
}

/// Archives (written in `dir`) with a PAX header declaring 1 GiB (the
/// plain header says 0): refused by the size it declares, before anything
/// is written; with a link that leaves the archive: refused.
fn archive_members_that_lie_or_leave_are_refused(dir: &Path) {
    let mut b = tar::Builder::new(Vec::new());
    b.append_pax_extensions([("size", b"1073741824".as_slice())])
        .unwrap();
    let mut h = tar::Header::new_ustar();
    h.set_path("top/proc/cpuinfo").unwrap();
    h.set_size(0);
    h.set_cksum();
    b.append(&h, std::io::empty()).unwrap();
    let p = write(dir, "pax.tar", &b.into_inner().unwrap());
    let e = load(&p).unwrap_err();
    assert!(e.to_string().contains("MiB"), "{e}");

    // Members that climb out, and links in the archive that leave it.
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_size(0);
    b.append_link(&mut h, "top/sys", "/sys").unwrap();
    let p = write(dir, "link.tar", &b.into_inner().unwrap());
    let e = load(&p).unwrap_err();
    assert!(e.to_string().contains("outside the capture"), "{e}");
}

/// An archive (written in `dir`) of too many entries: refused by the
/// survey, before one is created.
fn an_archive_of_too_many_entries_is_refused_by_the_survey(dir: &Path) {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut b = tar::Builder::new(gz);
    let mut h = tar::Header::new_gnu();
    h.set_size(0);
    h.set_mode(0o644);
    for i in 0..=numapin::topology::limits::MAX_CAPTURE_ENTRIES {
        b.append_data(&mut h, format!("top/f{i}"), std::io::empty())
            .unwrap();
    }
    let p = write(
        dir,
        "many.tar.gz",
        &b.into_inner().unwrap().finish().unwrap(),
    );
    let before = hwloc_readers_started();
    let e = load(&p).unwrap_err();
    assert!(e.to_string().contains("entries"), "{e}");
    assert_eq!(hwloc_readers_started(), before, "hwloc read it: {e}");
}

// ---- Class 8: messages.

#[test]
fn hwloc_xml_at_a_path_that_is_not_utf8_loads() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    let p = dir
        .path()
        .join(std::ffi::OsStr::from_bytes(b"machine-\xff.xml"));
    std::fs::copy(fixture("cloud-vm-1n.xml"), &p).unwrap();
    let t = load(&p).unwrap();
    assert_eq!(t.gpus.len(), 1);
}

#[test]
fn long_values_are_shortened_in_messages() {
    let opts = ProbeOptions::default().with_env(numapin::topology::ProbeEnv {
        cuda_visible_devices: Some("x".repeat(100_000)),
        cuda_device_order: None,
    });
    let e = Topology::load(&fixture("dgx-h100.xml"), &opts).unwrap_err();
    let text = numapin::error::with_causes(&e);
    assert!(text.contains("CUDA_VISIBLE_DEVICES"), "{text}");
    assert!(text.len() < 2048, "{} bytes", text.len());
}

// ---- Class 10: inconsistent descriptions.

#[test]
fn contradictions_are_refused() {
    type Edit = fn(&mut Value);
    let cases: [(&str, Edit, &str); 12] = [
        (
            "cloud-vm-1n.xml",
            |v| v["allowed"]["numa_nodes"] = json!([4294967295u32]),
            "1023",
        ),
        (
            "dgx-h100.xml",
            |v| v["allowed"]["numa_nodes"] = json!([0, 5]),
            "node 5",
        ),
        (
            "dgx-h100.xml",
            |v| v["cuda"]["ordinals"][1]["gpu"] = json!(0),
            "GPU 0",
        ),
        (
            "dgx-h100.xml",
            |v| v["cuda"]["ordinals"][1]["ordinal"] = json!(0),
            "ordinal 0",
        ),
        (
            "dgx-h100.xml",
            |v| v["gpus"][1]["pci_bus_id"] = v["gpus"][0]["pci_bus_id"].clone(),
            "PCI bus id",
        ),
        (
            "dgx-h100.xml",
            |v| v["gpus"][1]["pci_bus_id"] = json!("../../../etc"),
            "PCI bus id",
        ),
        (
            "dgx-h100.xml",
            |v| v["packages"][0]["numa_nodes"] = json!([0, 7]),
            "node 7",
        ),
        (
            "dgx-h100.xml",
            |v| v["gpus"][0]["package"] = json!(9),
            "package 9",
        ),
        (
            "dgx-h100.xml",
            |v| v["numa_nodes"][1]["cpus"] = v["numa_nodes"][0]["cpus"].clone(),
            "both hold CPU",
        ),
        (
            "cloud-vm-1n.xml",
            |v| v["allowed"]["cpus"] = json!("0-999"),
            "allowed.cpus",
        ),
        (
            "dgx-h100.xml",
            |v| v["packages"][1]["index"] = json!(0),
            "index 0",
        ),
        (
            "dgx-h100.xml",
            |v| {
                v["cuda"]["ordinals"] =
                    json!([{"ordinal": 5, "entry": "*", "gpu": 0, "mig": false}])
            },
            "ordinal 5",
        ),
    ];
    for (name, edit, want) in cases {
        let mut v = json_of(name);
        edit(&mut v);
        refused(&v, want);
    }
}

#[test]
fn mig_entries_without_a_gpu_keep_the_other_ranks_on_their_gpus() {
    use numapin::affinity::launcher;
    let opts = ProbeOptions::default().with_env(numapin::topology::ProbeEnv {
        cuda_visible_devices: Some("MIG-1234abcd-aaaa-bbbb-cccc-000011112222,0,4".into()),
        cuda_device_order: None,
    });
    let t = Topology::load(&fixture("dgx-h100.xml"), &opts).unwrap();
    let slots = launcher::rank_gpus(&t);
    for (ordinal, gpu) in [(1, 0), (2, 4)] {
        let (slot, g) =
            launcher::slot_of_ordinal(&t, numapin::CudaOrdinal(ordinal), "--gpu").unwrap();
        assert_eq!(g, GpuIndex(gpu));
        assert_eq!(slots[slot], g, "ordinal {ordinal}");
    }
    assert!(launcher::slot_of_ordinal(&t, numapin::CudaOrdinal(0), "--gpu").is_err());
}
