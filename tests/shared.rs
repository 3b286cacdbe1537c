//! Shared pinned memory (`numapin::shared`): made once on a node by the
//! arena's steps and counted in its budget, attached by name by another
//! process (a child of this test) without being counted again, and gone
//! with its last holder.
#![allow(clippy::unwrap_used)] // tests fail loudly

use std::process::Command;
use std::time::Duration;

use numapin::runtime::{Runtime, RuntimeConfig, Target};
use numapin::shared::{AttachedRegion, SharedError, SharedRegion};
use numapin::topology::{ProbeOptions, Topology};
use numapin::ErrorKind;

const MIB: usize = 1 << 20;

fn runtime() -> Runtime {
    let t = Topology::probe(&ProbeOptions::from_process()).unwrap();
    Runtime::new(t, RuntimeConfig::default().with_register(false)).unwrap()
}

fn shared_bytes(rt: &Runtime) -> u64 {
    rt.stats().iter().map(|s| s.bytes_shared).sum()
}

/// A name no other test (or earlier run) uses.
fn unique(tag: &str) -> String {
    format!("test-{tag}-{}", std::process::id())
}

/// Set in the child this test starts: the name to attach to.
const CHILD: &str = "NUMAPIN_TEST_SHARED_CHILD";

/// The child's half of `another_process_attaches_by_name_and_sees_the_same_pages`
/// (does nothing unless started by it).
#[test]
fn child_side() {
    let Ok(name) = std::env::var(CHILD) else {
        return;
    };
    let mut a = AttachedRegion::attach(&name, Duration::from_secs(10)).unwrap();
    assert_eq!(a.len(), 3 * MIB + 5);
    assert!(
        a.as_slice().iter().take(4096).all(|&b| b == 7),
        "the maker's bytes"
    );
    assert_eq!(a.as_slice()[3 * MIB + 4], 8);
    a.as_mut_slice()[1] = 42;
}

#[test]
fn another_process_attaches_by_name_and_sees_the_same_pages() {
    let rt = runtime();
    let name = unique("attach");
    let mut r = SharedRegion::create(&rt, Target::Host, 3 * MIB + 5, &name).unwrap();
    assert_eq!(r.len(), 3 * MIB + 5);
    assert_eq!(r.name(), name);
    assert!(rt.arena_nodes().any(|n| n == r.node()));
    // Counted once, in whole 2 MiB, on its node.
    assert_eq!(shared_bytes(&rt), 4 * MIB as u64);
    r.as_mut_slice()[..4096].fill(7);
    r.as_mut_slice()[3 * MIB + 4] = 8;
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_side",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD, &name)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "child: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(r.as_slice()[1], 42, "the child's write");
    // The child attached without charging anything here.
    assert_eq!(shared_bytes(&rt), 4 * MIB as u64);
    drop(r);
    assert_eq!(shared_bytes(&rt), 0);
    assert_eq!(rt.trim(), 0);
}

#[test]
fn an_attachment_in_this_process_sees_the_pages_and_outlives_nothing() {
    let rt = runtime();
    let name = unique("self");
    let mut r = SharedRegion::create(&rt, Target::Host, MIB, &name).unwrap();
    r.as_mut_slice()[0] = 5;
    let by_path = AttachedRegion::attach(r.path().to_str().unwrap(), Duration::ZERO).unwrap();
    let by_name = AttachedRegion::attach(&name, Duration::ZERO).unwrap();
    assert_eq!((by_path.as_slice()[0], by_name.as_slice()[0]), (5, 5));
    assert_eq!(by_name.node(), r.node());
    assert!(!by_name.registered(), "no CUDA here");
    // A second maker of the same name is refused while the first lives.
    let e = SharedRegion::create(&rt, Target::Host, MIB, &name).unwrap_err();
    assert!(matches!(e, SharedError::Name { .. }), "{e}");
    assert_eq!(e.kind(), ErrorKind::Input);
    drop((by_path, by_name, r));
    // Gone with its holders: the name is free again, nothing is counted.
    let e = AttachedRegion::attach(&name, Duration::from_millis(30)).unwrap_err();
    assert!(matches!(e, SharedError::NotFound { .. }), "{e}");
    assert_eq!(shared_bytes(&rt), 0);
    let again = SharedRegion::create(&rt, Target::Host, MIB, &name).unwrap();
    drop(again);
}

#[test]
fn bad_names_sizes_and_paths_are_input_errors_with_a_fix() {
    let rt = runtime();
    for bad in ["", "a/b", "x y", &"n".repeat(65), "caf\u{e9}"] {
        let e = SharedRegion::create(&rt, Target::Host, MIB, bad).unwrap_err();
        assert!(matches!(e, SharedError::Name { .. }), "{bad:?}: {e}");
        assert_eq!(e.kind(), ErrorKind::Input);
        assert!(e.fix().is_some());
        assert!(AttachedRegion::attach(bad, Duration::ZERO).is_err());
    }
    let e = SharedRegion::create(&rt, Target::Host, 0, &unique("zero")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Input, "{e}");
    let e = SharedRegion::create(&rt, Target::HostNode(999), MIB, &unique("node")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Input, "{e}");
    let e = AttachedRegion::attach("/proc/self/status", Duration::ZERO).unwrap_err();
    assert!(matches!(e, SharedError::Attach { .. }), "{e}");
    let e = AttachedRegion::attach("/nonexistent/x", Duration::ZERO).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/x"), "{e}");
    assert_eq!(shared_bytes(&rt), 0);
}

#[test]
fn shared_memory_over_the_budget_is_refused_with_nothing_made() {
    let t = Topology::probe(&ProbeOptions::from_process()).unwrap();
    let rt = Runtime::new(
        t,
        RuntimeConfig::default()
            .with_register(false)
            .with_budget_bytes(Some(8 * MIB as u64)),
    )
    .unwrap();
    let name = unique("budget");
    let e = SharedRegion::create(&rt, Target::Host, 9 * MIB, &name).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Budget, "{e}");
    assert_eq!(shared_bytes(&rt), 0);
    // The budget is one for buffers and shared memory.
    let r = SharedRegion::create(&rt, Target::Host, 6 * MIB, &name).unwrap();
    let node = r.node();
    assert!(
        rt.alloc(Target::HostNode(node), 4 * MIB).is_err(),
        "6 + 4 > 8 MiB"
    );
    drop(r);
    assert!(rt.alloc(Target::HostNode(node), 4 * MIB).is_ok());
}

/// The publication `numapin ps` reads: this process's `numapin-stats`
/// memfd, its header and JSON text, rewritten as regions come and go.
fn published() -> serde_json::Value {
    let fd = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .find(|e| {
            std::fs::read_link(e.path())
                .is_ok_and(|t| t.as_os_str() == "/memfd:numapin-stats (deleted)")
        })
        .expect("a numapin-stats memfd")
        .path();
    for _ in 0..100 {
        let bytes = std::fs::read(&fd).unwrap();
        assert_eq!(bytes.len(), 64 << 10);
        let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        let magic = u64::from_le_bytes(bytes[..8].try_into().unwrap());
        assert_eq!(magic, 0x6e75_6d61_7073_7431);
        let (seq, len) = (word(8), word(12) as usize);
        if seq % 2 == 1 {
            continue;
        }
        if let Ok(v) = serde_json::from_slice(&bytes[16..16 + len]) {
            return v;
        }
    }
    panic!("no complete text in 100 reads");
}

fn published_shared(v: &serde_json::Value) -> u64 {
    v["runtimes"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["nodes"].as_array().unwrap().iter())
        .map(|n| n["bytes_shared"].as_u64().unwrap())
        .sum()
}

/// Set in the child `the_process_publishes_its_arenas_for_other_processes`
/// starts (alone in its process, so the published figures are its own).
const PUBLISH_CHILD: &str = "NUMAPIN_TEST_PUBLISH_CHILD";

#[test]
fn publish_child_side() {
    if std::env::var_os(PUBLISH_CHILD).is_none() {
        return;
    }
    let rt = runtime();
    let v = published();
    assert_eq!(v["version"], 1);
    assert_eq!(v["pid"], std::process::id());
    assert_eq!(v["runtimes"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(published_shared(&v), 0);
    let r = SharedRegion::create(&rt, Target::Host, 5 * MIB, &unique("published")).unwrap();
    assert_eq!(published_shared(&published()), 6 * MIB as u64);
    let b = rt.alloc(Target::HostNode(r.node()), MIB).unwrap();
    let nodes = &published()["runtimes"][0]["nodes"];
    let reserved: u64 = nodes
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["bytes_reserved"].as_u64().unwrap())
        .sum();
    assert!(reserved >= 2 * MIB as u64, "{nodes}");
    drop((r, b));
    assert_eq!(published_shared(&published()), 0);
    drop(rt);
    assert_eq!(published()["runtimes"].as_array().unwrap().len(), 0);
}

#[test]
fn the_process_publishes_its_arenas_for_other_processes() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "publish_child_side",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(PUBLISH_CHILD, "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "child: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
