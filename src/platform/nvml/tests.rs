//! The query's logic against a fake NVML: the `_v3` → `_v2` → `v1`
//! fallback, the 535.43-535.86 struct, a list that grows, errors per GPU,
//! memory NVML cannot give, a query that blocks (timeout, then busy).

use std::sync::{Condvar, Mutex};

use super::fake::Fake;
use super::*;

fn two_gpus() -> Fake {
    Fake::new(vec![
        (
            "00000000:1B:00.0".into(),
            vec![(4242, 2 << 30), (4243, 512 << 20)],
            vec![],
        ),
        (
            "00000000:43:00.0".into(),
            vec![(4243, 522 << 20)],
            vec![(77, 9 << 20)],
        ),
    ])
}

fn pids(g: &Gpu) -> Vec<(u32, Option<u64>)> {
    g.processes.iter().map(|p| (p.pid, p.used_bytes)).collect()
}

#[test]
fn every_gpus_lists_with_the_memory_on_each() {
    let f = two_gpus();
    let a = read_all(&f).unwrap();
    assert_eq!(a.driver_version.as_deref(), Some("550.54.15"));
    assert_eq!(a.gpus.len(), 2);
    assert_eq!(a.gpus[0].bus_id.as_deref(), Some("00000000:1B:00.0"));
    assert_eq!(a.gpus[0].minor, Some(10));
    assert_eq!(
        pids(&a.gpus[0]),
        [(4242, Some(2 << 30)), (4243, Some(512 << 20))]
    );
    assert_eq!(
        pids(&a.gpus[1]),
        [(77, Some(9 << 20)), (4243, Some(522 << 20))]
    );
    assert_eq!(a.gpus[1].processes[0].lists, [List::Graphics]);
    assert!(a.gpus.iter().all(|g| g.error.is_none()));
    assert!(a.notes.is_empty(), "{:?}", a.notes);
    assert_eq!(f.open.load(Ordering::SeqCst), 0, "shut down after");
}

#[test]
fn a_missing_v3_falls_back_to_v2_then_v1() {
    let mut f = two_gpus();
    f.missing = vec![(List::Compute, Version::V3), (List::Graphics, Version::V3)];
    let a = read_all(&f).unwrap();
    assert_eq!(
        pids(&a.gpus[0]),
        [(4242, Some(2 << 30)), (4243, Some(512 << 20))]
    );
    assert!(
        a.notes.iter().any(|n| n
            == "nvmlDeviceGetComputeRunningProcesses_v3 is missing from this driver's NVML: nvmlDeviceGetComputeRunningProcesses_v2 was used"),
        "{:?}",
        a.notes
    );
    // Said once per list, not once per GPU.
    assert_eq!(a.notes.len(), 2, "{:?}", a.notes);
    // Older still: the 16-byte entries of the unversioned call.
    f.missing
        .extend([(List::Compute, Version::V2), (List::Graphics, Version::V2)]);
    let a = read_all(&f).unwrap();
    assert_eq!(
        pids(&a.gpus[1]),
        [(77, Some(9 << 20)), (4243, Some(522 << 20))]
    );
    // None at all: an error on each GPU, no crash; MPS missing is no error.
    f.missing.push((List::Compute, Version::V1));
    f.missing.extend(Version::ALL.map(|v| (List::Mps, v)));
    let a = read_all(&f).unwrap();
    let e = a.gpus[0].error.as_deref().unwrap();
    assert!(e.contains("nvmlDeviceGetComputeRunningProcesses_v3, nvmlDeviceGetComputeRunningProcesses_v2 and nvmlDeviceGetComputeRunningProcesses are all missing"), "{e}");
    assert!(!e.contains("MPS"), "{e}");
}

#[test]
fn drivers_535_43_to_535_86_write_a_longer_v3_struct() {
    assert_eq!(v3_stride(Some("535.54.03")), 32);
    assert_eq!(v3_stride(Some("535.43.02")), 32);
    assert_eq!(v3_stride(Some("535.86.10")), 32);
    assert_eq!(v3_stride(Some("535.98")), 24);
    assert_eq!(v3_stride(Some("535.154.05")), 24);
    assert_eq!(v3_stride(Some("550.54.15")), 24);
    assert_eq!(v3_stride(None), 24);
    assert_eq!(v3_stride(Some("garbage")), 24);
    let mut f = two_gpus();
    f.version = "535.54.03";
    f.v3_stride = 32;
    let a = read_all(&f).unwrap();
    assert_eq!(
        pids(&a.gpus[0]),
        [(4242, Some(2 << 30)), (4243, Some(512 << 20))]
    );
    assert!(a.notes.iter().any(|n| n.contains("535.43-535.86")));
}

#[test]
fn a_list_that_grows_between_count_and_fill_is_asked_again() {
    // 20 processes start at each of the first two calls: the count says
    // 21, the fill then finds 41 (more than its room), the next fits.
    let f = Fake::new(vec![("0000:1b:00.0".into(), vec![(1, 1)], vec![])]);
    f.grow_by.store(20, Ordering::SeqCst);
    f.grow_calls.store(2, Ordering::SeqCst);
    let p = list_once(&f, Device(1), List::Compute, Version::V3, 24).unwrap();
    assert_eq!(p.len(), 41, "{p:?}");
    assert_eq!(f.calls.load(Ordering::SeqCst), 3);
    // A list that keeps growing faster than the room: an error after 4 fills.
    f.grow_calls.store(100, Ordering::SeqCst);
    let e = list_once(&f, Device(1), List::Compute, Version::V3, 24).unwrap_err();
    assert_eq!(e, Status::Code(INSUFFICIENT_SIZE));
}

#[test]
fn errors_of_one_gpu_leave_the_others() {
    let mut f = two_gpus();
    f.fail = Some((1, List::Compute, 4));
    let a = read_all(&f).unwrap();
    assert_eq!(a.gpus[0].processes.len(), 2);
    let e = a.gpus[1].error.as_deref().unwrap();
    assert_eq!(
        e,
        "nvmlDeviceGetComputeRunningProcesses_v3 failed: NVML_ERROR_NO_PERMISSION (Insufficient Permissions)"
    );
    // A graphics list the GPU does not support is empty, not an error.
    f.fail = Some((1, List::Graphics, NOT_SUPPORTED));
    let a = read_all(&f).unwrap();
    assert!(a.gpus[1].error.is_none());
    assert_eq!(pids(&a.gpus[1]), [(4243, Some(522 << 20))]);
    // init failing: no lists at all, the code named.
    f.init_fails = Some(9);
    assert_eq!(
        read_all(&f).unwrap_err(),
        Failure::Init("nvmlInit_v2 failed: NVML_ERROR_DRIVER_NOT_LOADED".into())
    );
}

#[test]
fn memory_nvml_cannot_give_and_processes_in_two_lists() {
    let f = Fake::new(vec![(
        "0000:1b:00.0".into(),
        vec![(5, u64::MAX), (6, 100 << 20)],
        vec![(6, 120 << 20)],
    )]);
    let a = read_all(&f).unwrap();
    assert_eq!(pids(&a.gpus[0]), [(5, None), (6, Some(120 << 20))]);
    assert_eq!(
        a.gpus[0].processes[1].lists,
        [List::Compute, List::Graphics]
    );
}

#[test]
fn a_blocked_query_times_out_and_the_next_is_busy_not_stacked() {
    let gate = Arc::new((Mutex::new(true), Condvar::new()));
    let mut f = two_gpus();
    f.gate = Some(Arc::clone(&gate));
    let nvml = Nvml::new(Arc::new(f));
    let t = Instant::now();
    let r = nvml.start().wait(Duration::from_millis(100));
    assert_eq!(r, Err(Failure::TimedOut(Duration::from_millis(100))));
    assert!(t.elapsed() < Duration::from_secs(5));
    // The first query's thread still waits in "NVML": no second thread.
    assert_eq!(
        nvml.start().wait(Duration::from_secs(5)),
        Err(Failure::Busy)
    );
    // Once it returns, queries work again.
    *gate.0.lock().unwrap() = false;
    gate.1.notify_all();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match nvml.start().wait(Duration::from_secs(5)) {
            Ok(a) => {
                assert_eq!(a.gpus.len(), 2);
                break;
            }
            Err(Failure::Busy) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("{e}"),
        }
    }
    let msg = Failure::TimedOut(Duration::from_secs(5)).to_string();
    assert!(msg.starts_with("no answer within 5.0 s"), "{msg}");
}

#[test]
fn a_library_that_is_not_there() {
    let e = library::Library::load(std::ffi::OsStr::new("libnvidia-ml-not-here.so.1"))
        .err()
        .unwrap();
    assert!(
        e.starts_with("libnvidia-ml-not-here.so.1 could not be loaded"),
        "{e}"
    );
    assert!(e.contains("install the NVIDIA driver"), "{e}");
    // A library without NVML's calls (libc): named, not a crash.
    let e = library::Library::load(std::ffi::OsStr::new("libc.so.6"))
        .err()
        .unwrap();
    assert!(e.contains("lacks nvmlDeviceGetPciInfo"), "{e}");
}
