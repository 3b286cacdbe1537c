//! Hostile input and failing outputs, as the `numapin` binary meets them
//! (the hostile-input issue's classes, command side): broken outputs, flag
//! ranges, standard input, signals and what is left behind, hwloc's
//! variables, messages and exit codes, writes. Each test takes a few
//! seconds at most.
#![allow(clippy::unwrap_used)] // tests and examples fail loudly

#[path = "../../tests/common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn numapin(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_numapin"));
    c.args(args)
        .env_remove("CUDA_VISIBLE_DEVICES")
        .env_remove("CUDA_DEVICE_ORDER")
        .env_remove("LOCAL_RANK")
        .env_remove("SLURM_LOCALID")
        .env_remove("OMPI_COMM_WORLD_LOCAL_RANK")
        .env_remove("MV2_COMM_WORLD_LOCAL_RANK")
        .env_remove("PMI_LOCAL_RANK");
    for v in [
        "HWLOC_XMLFILE",
        "HWLOC_SYNTHETIC",
        "HWLOC_FSROOT",
        "HWLOC_CPUID_PATH",
    ] {
        c.env_remove(v);
    }
    c.stdin(Stdio::null());
    c
}

fn fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../topology")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

fn run(mut c: Command) -> Output {
    c.output().unwrap()
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn out(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn dev_full() -> std::fs::File {
    std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap()
}

/// Runs `c` with RLIMIT_NOFILE `n`.
fn with_nofile(c: &mut Command, n: u64) {
    // SAFETY: only setrlimit runs between fork and exec.
    unsafe {
        c.pre_exec(move || {
            nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, n, n)?;
            Ok(())
        });
    }
}

/// Runs `c` with the soft limit `limit` of `resource` (as `ulimit` sets it).
fn with_soft_limit(c: &mut Command, resource: nix::sys::resource::Resource, limit: u64) {
    // SAFETY: only getrlimit and setrlimit run between fork and exec.
    unsafe {
        c.pre_exec(move || {
            let (_, hard) = nix::sys::resource::getrlimit(resource)?;
            nix::sys::resource::setrlimit(resource, limit, hard)?;
            Ok(())
        });
    }
}

fn no_panic(o: &Output) {
    assert_ne!(o.status.code(), Some(101), "panicked: {}", err(o));
    assert!(!err(o).contains("panicked"), "{}", err(o));
}

// ---- Class 1: broken outputs.

#[test]
fn a_full_disk_on_stdout_is_exit_1_with_the_reason() {
    let dgx = fixture("dgx-a100-nps4.xml");
    for args in [
        vec!["topo", "--input", &dgx, "--json"],
        vec!["topo", "--input", &dgx],
        vec!["affinity", "--input", &dgx],
        vec!["doctor", "--input", &dgx],
        vec![
            "exec",
            "--input",
            &dgx,
            "--gpu",
            "0",
            "--dry-run",
            "--",
            "true",
        ],
    ] {
        let mut c = numapin(&args);
        c.stdout(dev_full());
        let o = run(c);
        no_panic(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", err(&o));
        assert!(err(&o).contains("No space left"), "{args:?}: {}", err(&o));
    }
    // --help too: a text that was not written is not a success.
    let mut c = numapin(&["topo", "--help"]);
    c.stdout(dev_full());
    assert_eq!(run(c).status.code(), Some(1));
    // An error whose message cannot be written keeps its own exit code.
    let mut c = numapin(&["topo", "--input", "/nonexistent/numapin"]);
    c.stderr(dev_full());
    assert_eq!(run(c).status.code(), Some(2));
}

#[test]
fn a_closed_pipe_ends_quietly() {
    let dgx = fixture("dgx-a100-nps4.xml");
    for args in [
        vec!["topo", "--input", &dgx, "--json"],
        vec!["topo", "--input", &dgx],
        vec!["affinity", "--input", &dgx, "--format", "json"],
    ] {
        let mut c = numapin(&args);
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        drop(child.stdout.take());
        let o = child.wait_with_output().unwrap();
        let quiet = o.status.signal() == Some(libc::SIGPIPE) || o.status.code() == Some(0);
        assert!(quiet, "{args:?}: {:?} {}", o.status, err(&o));
        assert!(o.stderr.is_empty(), "{args:?}: {}", err(&o));
    }
}

// ---- Class 2: amplification.

#[test]
fn an_hwloc_xml_over_the_cpu_limit_is_refused_as_fast_as_it_is_read() {
    // 25 MB, 200,000 PUs: hwloc alone took 100 s on it before numapin
    // could count them.
    let src = std::fs::read_to_string(fixture("cloud-vm-1n.xml")).unwrap();
    let at = src.find("gp_index=\"1\">").unwrap() + "gp_index=\"1\">".len();
    let pus: String = (0..200_000)
        .map(|i| {
            format!(
                r#"<object type="PU" os_index="{i}" cpuset="0x1" complete_cpuset="0x1" nodeset="0x1" complete_nodeset="0x1" gp_index="{}"/>"#,
                i + 10
            )
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("pus.xml");
    std::fs::write(&f, format!("{}{pus}{}", &src[..at], &src[at..])).unwrap();
    let start = Instant::now();
    let o = run(numapin(&["topo", "--input", f.to_str().unwrap()]));
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    assert!(err(&o).contains("limit of 8192"), "{}", err(&o));
}

// ---- Class 3: every numeric flag has a range.

#[test]
fn numbers_outside_a_flags_range_are_exit_2() {
    let dgx = fixture("dgx-h100.xml");
    let many = vec!["0"; 9000].join(",");
    for args in [
        vec!["bench", "--reps", "0"],
        vec!["bench", "--reps", "101"],
        vec!["bench", "--reps", "10000000"],
        vec!["bench", "--reps", "18446744073709551615"],
        vec!["bench", "--warmup", "101"],
        vec!["bench", "--gpus", "1024"],
        vec!["bench", "--size", "1025G"],
        vec![
            "exec",
            "--input",
            &dgx,
            "--dry-run",
            "--gpu",
            "1024",
            "--",
            "true",
        ],
        vec![
            "exec",
            "--input",
            &dgx,
            "--dry-run",
            "--node",
            "1024",
            "--",
            "true",
        ],
        vec!["affinity", "--input", &dgx, "--local-rank", "65536"],
        vec!["affinity", "--input", &dgx, "--gpus", "1024"],
        vec!["affinity", "--input", &dgx, "--gpus", &many],
    ] {
        let start = Instant::now();
        let o = run(numapin(&args));
        no_panic(&o);
        assert_eq!(o.status.code(), Some(2), "{:?}: {}", &args[..2], err(&o));
        assert!(start.elapsed() < Duration::from_secs(5), "{:?}", &args[..2]);
    }
    for (cmd, ranges) in [
        (
            "bench",
            &["0-1023", "1-100", "0-100", "1 byte to 1 TiB"][..],
        ),
        ("exec", &["0-1023"][..]),
        ("affinity", &["0-65535", "0-1023", "8192"][..]),
    ] {
        let help = out(&run(numapin(&[cmd, "--help"])));
        for r in ranges {
            assert!(
                help.contains(r),
                "`{cmd} --help` does not state {r}:\n{help}"
            );
        }
    }
}

// ---- Class 4: standard input.

#[test]
fn standard_input_is_read_once_and_within_the_limit() {
    let json = run(numapin(&[
        "topo",
        "--input",
        &fixture("dgx-h100.xml"),
        "--json",
    ]))
    .stdout;
    let xml = std::fs::read(fixture("cloud-vm-1n.xml")).unwrap();
    for (path, data, want) in [
        ("-", &json, "8 GPU"),
        ("/dev/stdin", &json, "8 GPU"),
        ("/dev/stdin", &xml, "1 GPU"),
    ] {
        let mut c = numapin(&["topo", "--input", path]);
        c.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        let mut w = child.stdin.take().unwrap();
        let data = data.clone();
        std::thread::spawn(move || w.write_all(&data));
        let o = child.wait_with_output().unwrap();
        assert!(o.status.success(), "{path}: {}", err(&o));
        assert!(out(&o).contains(want), "{path}: {}", out(&o));
    }
    // An endless stream: refused at the size limit, memory bounded.
    let mut c = numapin(&["topo", "--input", "-"]);
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut w = child.stdin.take().unwrap();
    std::thread::spawn(move || {
        let chunk = vec![b'y'; 1 << 20];
        let _ = w.write_all(b"{\n");
        while w.write_all(&chunk).is_ok() {}
    });
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    assert!(err(&o).contains("64 MiB"), "{}", err(&o));
}

// ---- Class 6: processes and signals.

/// `numapin exec` of a `grep` for `pattern` in the command's
/// /proc/self/status.
fn exec_status(pattern: &str) -> Command {
    numapin(&[
        "exec",
        "--no-cuda",
        "--node",
        "0",
        "--",
        "grep",
        "-E",
        pattern,
        "/proc/self/status",
    ])
}

#[test]
fn exec_gives_the_command_default_signals() {
    let o = run(exec_status("^Sig(Ign|Blk)"));
    assert!(o.status.success(), "{}", err(&o));
    for line in out(&o).lines() {
        let (k, v) = line.split_once(':').unwrap();
        let mask = u64::from_str_radix(v.trim(), 16).unwrap();
        match k {
            "SigIgn" => {
                assert_eq!(mask & (1 << (libc::SIGPIPE - 1)), 0, "SIGPIPE ignored");
                assert_eq!(mask & (1 << (libc::SIGXFSZ - 1)), 0, "SIGXFSZ ignored");
            }
            "SigBlk" => assert_eq!(mask, 0, "signals blocked: {v}"),
            _ => unreachable!(),
        }
    }
    // A SIGXFSZ the parent ignores stays ignored.
    let mut c = exec_status("^SigIgn");
    // SAFETY: only signal() runs between fork and exec.
    unsafe {
        c.pre_exec(|| {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
    let o = run(c);
    let mask = out(&o)
        .split(':')
        .nth(1)
        .map(|v| u64::from_str_radix(v.trim(), 16).unwrap());
    assert_eq!(
        mask.map(|m| m & (1 << (libc::SIGXFSZ - 1))),
        Some(1 << (libc::SIGXFSZ - 1)),
        "{}",
        out(&o)
    );
    // `numapin exec -- yes | head -1`: yes dies of SIGPIPE, quietly.
    let mut c = numapin(&["exec", "--no-cuda", "--node", "0", "--", "yes"]);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut first = [0u8; 2];
    child
        .stdout
        .as_mut()
        .unwrap()
        .read_exact(&mut first)
        .unwrap();
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.signal(), Some(libc::SIGPIPE), "{}", err(&o));
    assert!(o.stderr.is_empty(), "{}", err(&o));
}

/// A capture with `files` empty files: unpacking it takes seconds.
fn slow_capture(dir: &Path, files: usize) -> PathBuf {
    let root = dir.join("cap");
    common::make_capture(&root);
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut b = tar::Builder::new(gz);
    b.append_dir_all("top", &root).unwrap();
    let mut h = tar::Header::new_gnu();
    h.set_size(0);
    h.set_mode(0o644);
    for i in 0..files {
        b.append_data(
            &mut h,
            format!("top/filler/{}/f{i}", i % 64),
            std::io::empty(),
        )
        .unwrap();
    }
    let p = dir.join("slow.tar.gz");
    std::fs::write(&p, b.into_inner().unwrap().finish().unwrap()).unwrap();
    p
}

/// Whether this process ignores `sig` (`SigIgn` in /proc/self/status).
fn ignored_here(sig: i32) -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .map(|m| u64::from_str_radix(m.trim(), 16).unwrap())
        .unwrap();
    mask & (1u64 << (sig - 1)) != 0
}

#[test]
fn signals_leave_no_temporary_folder_behind() {
    let dir = tempfile::tempdir().unwrap();
    let archive = slow_capture(dir.path(), 200_000);
    for sig in [libc::SIGTERM, libc::SIGINT] {
        if ignored_here(sig) {
            // Inherited by the child, which keeps an ignored signal ignored
            // (as under nohup): a background job of a shell ignores SIGINT.
            eprintln!(
                "signal {sig} is ignored by this test process (a background job?): not tested"
            );
            continue;
        }
        // A run that ends before this thread sees it unpacking proves
        // nothing: try again.
        let mut tries = 0;
        loop {
            tries += 1;
            let tmp = tempfile::tempdir().unwrap();
            let mut c = numapin(&["topo", "--input", archive.to_str().unwrap()]);
            c.env("TMPDIR", tmp.path())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            let mut child = c.spawn().unwrap();
            // Wait until it is unpacking, then stop it.
            let start = Instant::now();
            let mut ended = None;
            while std::fs::read_dir(tmp.path()).unwrap().count() == 0 {
                if let Some(st) = child.try_wait().unwrap() {
                    ended = Some(st);
                    break;
                }
                assert!(start.elapsed() < Duration::from_secs(60), "never unpacked");
                std::thread::sleep(Duration::from_millis(2));
            }
            let status = match ended {
                // Done before this thread saw the folder: nothing to signal.
                Some(st) => {
                    assert_eq!(st.code(), Some(0), "{st:?}");
                    assert!(tries < 5, "every run ended before it could be signalled");
                    continue;
                }
                None => {
                    std::thread::sleep(Duration::from_millis(20));
                    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
                    nix::sys::signal::kill(pid, nix::sys::signal::Signal::try_from(sig).unwrap())
                        .unwrap();
                    child.wait().unwrap()
                }
            };
            let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
            assert!(left.is_empty(), "signal {sig} left {left:?} ({status:?})");
            // Signalled while unpacking: it ends by that signal, however
            // loaded the machine (never with exit 0 after the work).
            assert_eq!(status.signal(), Some(sig), "{status:?}");
            break;
        }
    }
}

#[test]
fn few_file_descriptors_give_the_systems_reason_and_leave_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cap = dir.path().join("cap");
    common::make_capture(&cap);
    let archive = dir.path().join("cap.tar.gz");
    std::fs::write(&archive, common::tar_gz(&cap)).unwrap();
    for input in [
        fixture("dgx-h100.xml"),
        cap.to_string_lossy().into_owned(),
        archive.to_string_lossy().into_owned(),
    ] {
        for n in 4..=12 {
            let tmp = tempfile::tempdir().unwrap();
            let mut c = numapin(&["topo", "--input", &input]);
            c.env("TMPDIR", tmp.path());
            with_nofile(&mut c, n);
            let o = run(c);
            no_panic(&o);
            let e = err(&o);
            match o.status.code() {
                // 127: the dynamic loader could not open a library.
                Some(0) | Some(127) => {}
                Some(1) => assert!(e.contains("Too many open files"), "n={n} {input}: {e}"),
                other => panic!("n={n} {input}: {other:?}: {e}"),
            }
            assert!(
                !e.contains("malformed") && !e.contains("corrupt"),
                "n={n} {input}: {e}"
            );
            let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
            assert!(left.is_empty(), "n={n} {input}: left {left:?}");
        }
    }
}

// ---- Class 7: hwloc's variables.

#[test]
fn hwloc_variables_do_not_replace_this_machine() {
    for (var, value) in [
        ("HWLOC_XMLFILE", fixture("dgx-h100.xml")),
        ("HWLOC_XMLFILE", "/dev/zero".into()),
        ("HWLOC_XMLFILE", "/nonexistent".into()),
        ("HWLOC_SYNTHETIC", "pack:4 core:4 pu:2".into()),
        ("HWLOC_SYNTHETIC", "garbage".into()),
        ("HWLOC_FSROOT", "/tmp".into()),
    ] {
        for args in [
            vec!["topo", "--no-cuda", "--json"],
            vec!["exec", "--no-cuda", "--gpu", "0", "--dry-run", "--", "true"],
        ] {
            let mut c = numapin(&args);
            c.env(var, &value);
            let start = Instant::now();
            let o = run(c);
            assert_eq!(o.status.code(), Some(2), "{var}={value}: {}", err(&o));
            assert!(err(&o).contains(var), "{var}={value}: {}", err(&o));
            assert!(start.elapsed() < Duration::from_secs(5));
        }
    }
    // As an explicit input they are not consulted.
    let mut c = numapin(&["topo", "--input", &fixture("cloud-vm-1n.xml")]);
    c.env("HWLOC_XMLFILE", fixture("dgx-h100.xml"));
    let o = run(c);
    assert!(o.status.success(), "{}", err(&o));
    assert!(out(&o).contains("1 GPU"), "{}", out(&o));
}

// ---- Class 8: messages.

#[test]
fn long_values_are_shortened_in_messages() {
    let big = "x".repeat(100_000);
    let dgx = fixture("dgx-h100.xml");
    for (args, var) in [
        (vec!["topo", "--input", &dgx], "CUDA_VISIBLE_DEVICES"),
        (vec!["topo", "--input", &dgx], "CUDA_DEVICE_ORDER"),
        (
            vec!["exec", "--input", &dgx, "--dry-run", "--", "true"],
            "LOCAL_RANK",
        ),
        (vec!["affinity", "--input", &dgx, "--gpus", &big], ""),
    ] {
        let mut c = numapin(&args);
        if !var.is_empty() {
            c.env(var, &big);
        }
        let o = run(c);
        assert_eq!(o.status.code(), Some(2), "{var}: {}", err(&o));
        assert!(err(&o).contains(var), "{}", err(&o));
        assert!(o.stderr.len() < 2048, "{var}: {} bytes", o.stderr.len());
    }
}

#[test]
fn control_characters_from_files_are_escaped_on_a_terminal() {
    if Command::new("script").arg("--version").output().is_err() {
        common::skip(common::Need::Tool, "needs script(1) for a terminal");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut t = numapin::Topology::load(
        Path::new(&fixture("cloud-vm-1n.xml")),
        &numapin::topology::ProbeOptions::default(),
    )
    .unwrap();
    t.gpus[0].name = Some("\u{1b}]0;PWNED\u{7}\u{1b}[31mRED".into());
    let p = dir.path().join("ctrl-\u{1b}[31m.json");
    std::fs::write(&p, t.to_json()).unwrap();
    let bin = env!("CARGO_BIN_EXE_numapin");
    for args in [
        format!("'{bin}' topo --input '{}'", p.display()),
        format!("'{bin}' affinity --input '{}'", p.display()),
        format!("'{bin}' topo --input '{}.missing'", p.display()),
    ] {
        let o = Command::new("script")
            .args(["-qec", &args, "/dev/null"])
            .env_remove("CUDA_VISIBLE_DEVICES")
            .output()
            .unwrap();
        let seen = String::from_utf8_lossy(&o.stdout);
        assert!(seen.contains("\\x1b"), "{args}: {seen}");
        assert!(
            !seen.contains('\u{7}') && !seen.contains("\u{1b}]0"),
            "{args}: {seen:?}"
        );
    }
    // Redirected, the bytes stay as they are (JSON escapes them itself).
    let o = run(numapin(&["topo", "--input", p.to_str().unwrap()]));
    assert!(out(&o).contains('\u{1b}'));
}

// ---- Class 11: writes.

#[test]
fn export_validates_first_and_replaces_whole() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("export.xml");
    let mut c = numapin(&["topo", "--no-cuda", "--export", f.to_str().unwrap()]);
    c.env("CUDA_VISIBLE_DEVICES", "abc");
    let o = run(c);
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    assert!(!f.exists(), "written before the error");

    std::fs::write(&f, "OLD").unwrap();
    let o = run(numapin(&[
        "topo",
        "--no-cuda",
        "--export",
        f.to_str().unwrap(),
    ]));
    assert!(o.status.success(), "{}", err(&o));
    assert!(std::fs::read_to_string(&f).unwrap().contains("<topology"));
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "a temporary file was left"
    );

    let o = run(numapin(&["topo", "--no-cuda", "--export", "/dev/full"]));
    assert_eq!(o.status.code(), Some(1), "{}", err(&o));
    assert!(err(&o).contains("No space left"), "{}", err(&o));

    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let start = Instant::now();
    let o = run(numapin(&[
        "topo",
        "--no-cuda",
        "--export",
        fifo.to_str().unwrap(),
    ]));
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "blocked on the FIFO"
    );
}

#[test]
fn a_file_size_limit_is_a_write_error_not_a_silent_death() {
    // `ulimit -f 1` (1,024 bytes, as RLIMIT_FSIZE counts them): SIGXFSZ
    // would end numapin without a word.
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("export.xml");
    std::fs::write(&f, "OLD").unwrap();
    let mut c = numapin(&["topo", "--no-cuda", "--export", f.to_str().unwrap()]);
    c.stdout(Stdio::null());
    with_soft_limit(&mut c, nix::sys::resource::Resource::RLIMIT_FSIZE, 1024);
    let o = run(c);
    assert_eq!(o.status.code(), Some(1), "{:?}: {}", o.status, err(&o));
    assert!(err(&o).contains("File too large"), "{}", err(&o));
    assert!(err(&o).contains("ulimit -f"), "{}", err(&o));
    assert_eq!(std::fs::read_to_string(&f).unwrap(), "OLD");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "a temporary file was left"
    );
    // Standard output redirected to a file.
    let out_file = std::fs::File::create(dir.path().join("topo.json")).unwrap();
    let dgx = fixture("dgx-h100.xml");
    let mut c = numapin(&["topo", "--input", &dgx, "--json"]);
    c.stdout(out_file);
    with_soft_limit(&mut c, nix::sys::resource::Resource::RLIMIT_FSIZE, 1024);
    let o = run(c);
    assert_eq!(o.status.code(), Some(1), "{:?}: {}", o.status, err(&o));
    assert!(
        err(&o).contains("writing to standard output"),
        "{}",
        err(&o)
    );
    // A capture unpacks into TMPDIR: the system's failure, not the file's.
    let cap = dir.path().join("cap");
    common::make_capture(&cap);
    std::fs::write(cap.join("proc/cpuinfo"), "processor\t: 0\n".repeat(200)).unwrap();
    let tgz = dir.path().join("cap.tar.gz");
    std::fs::write(&tgz, common::tar_gz(&cap)).unwrap();
    let mut c = numapin(&["topo", "--input", tgz.to_str().unwrap()]);
    with_soft_limit(&mut c, nix::sys::resource::Resource::RLIMIT_FSIZE, 1024);
    let o = run(c);
    assert_eq!(o.status.code(), Some(1), "{:?}: {}", o.status, err(&o));
    assert!(err(&o).contains("ulimit -f"), "{}", err(&o));
}

// ---- Class 12: the process's own limits.

#[test]
fn a_small_stack_limit_changes_nothing() {
    // `ulimit -s 64`: the main thread's stack is 64 KiB.
    let dgx = fixture("dgx-h100.xml");
    let dir = tempfile::tempdir().unwrap();
    let cap = dir.path().join("cap");
    common::make_capture(&cap);
    let cap = cap.to_str().unwrap();
    for args in [
        vec!["topo", "--input", &dgx],
        vec!["topo", "--input", &dgx, "--json"],
        vec!["topo", "--input", cap],
        vec!["affinity", "--input", &dgx],
        vec!["doctor", "--input", &dgx],
    ] {
        let free = run(numapin(&args));
        let mut c = numapin(&args);
        with_soft_limit(&mut c, nix::sys::resource::Resource::RLIMIT_STACK, 64 << 10);
        let small = run(c);
        no_panic(&small);
        assert_eq!(
            small.status.code(),
            free.status.code(),
            "{args:?}: {}",
            err(&small)
        );
        assert_eq!(out(&small), out(&free), "{args:?}");
    }
}

/// As user `nobody` with a 64 KiB memlock limit: the figures that pin no
/// memory are printed, then the failure.
#[test]
fn bench_under_a_memlock_limit_prints_what_it_could_measure() {
    if !nix::unistd::geteuid().is_root() {
        common::skip(
            common::Need::Root,
            "needs root to run numapin as user nobody",
        );
        return;
    }
    let (_dir, exe) = common::runnable_by_everyone(Path::new(env!("CARGO_BIN_EXE_numapin")));
    let mut c = Command::new(&exe);
    c.args(["bench", "--no-cuda", "--only", "arena", "--reps", "1"])
        .current_dir("/")
        .env("HOME", "/");
    // SAFETY: only system calls (setrlimit, setgroups, setgid, setuid) run
    // between fork and exec.
    unsafe {
        c.pre_exec(|| {
            nix::sys::resource::setrlimit(
                nix::sys::resource::Resource::RLIMIT_MEMLOCK,
                64 << 10,
                64 << 10,
            )?;
            nix::unistd::setgroups(&[])?;
            nix::unistd::setgid(nix::unistd::Gid::from_raw(65534))?;
            nix::unistd::setuid(nix::unistd::Uid::from_raw(65534))?;
            Ok(())
        });
    }
    // The copy may still be open for writing in a child another test forks
    // at the same moment ("Text file busy"): try again.
    let o = loop {
        match c.output() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            r => break r.unwrap(),
        }
    };
    assert_eq!(o.status.code(), Some(1), "{}", err(&o));
    assert!(out(&o).contains("malloc_free"), "{}", out(&o));
    assert!(out(&o).contains("arena_overhead"), "{}", out(&o));
    assert!(err(&o).contains("RLIMIT_MEMLOCK"), "{}", err(&o));
}
