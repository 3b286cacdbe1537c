//! Host side of the VM tests: describes an emulated machine, boots it once
//! through `tests/vm/harness.sh` with a script of `step` lines, and hands back
//! what each step printed. See docs/vm-tests.md.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The stand-in accelerator the harness puts on a node (QEMU's pci-testdev).
pub(crate) const TESTDEV_PCI_ID: &str = "1b36:0005";

/// The PCI id of the emulated NIC (QEMU's e1000e, an Intel 82574L).
pub(crate) const E1000E_PCI_ID: (&str, &str) = ("0x8086", "0x10d3");

/// Writes to the real stderr, past libtest's output capture, so that skips
/// and timings show in every `cargo test` log.
pub(crate) fn note(msg: &str) {
    let _ = writeln!(std::io::stderr(), "{msg}");
}

/// An emulated machine: `nodes` NUMA nodes, each with `cpus_per_node` CPUs
/// (node N has CPUs N*K..N*K+K-1) and `node_mem_mib` of memory, and stand-in
/// accelerators on chosen nodes.
#[derive(Debug, Clone)]
pub(crate) struct Machine {
    name: String,
    nodes: u32,
    cpus_per_node: u32,
    node_mem_mib: u32,
    accelerators: Vec<u32>,
    nics: Vec<u32>,
    bins: Vec<(PathBuf, String)>,
    files: Vec<(PathBuf, String)>,
    timeout: Duration,
}

impl Machine {
    /// A machine named `name` (its logs go to `target/tmp/vm/NAME/`) with
    /// `nodes` nodes of one CPU and 512 MiB each. `/bin/numapin` and
    /// `/bin/vm-tests` (this test binary, whose `guest::` tests are the
    /// in-guest checks) are shipped.
    pub(crate) fn new(name: &str, nodes: u32) -> Self {
        let timeout = std::env::var("NUMAPIN_VM_TIMEOUT")
            .ok()
            .and_then(|s| s.parse().ok())
            .map_or(Duration::from_secs(480), Duration::from_secs);
        let this = std::env::current_exe().expect("the path of this test binary");
        Self {
            name: name.into(),
            nodes,
            cpus_per_node: 1,
            node_mem_mib: 512,
            accelerators: Vec::new(),
            nics: Vec::new(),
            bins: vec![
                (
                    PathBuf::from(env!("CARGO_BIN_EXE_numapin")),
                    "numapin".into(),
                ),
                (this, "vm-tests".into()),
            ],
            files: Vec::new(),
            timeout,
        }
    }

    /// Puts a stand-in accelerator (PCI id [`TESTDEV_PCI_ID`]) on `node`.
    pub(crate) fn accelerator_on(mut self, node: u32) -> Self {
        self.accelerators.push(node);
        self
    }

    /// Puts an emulated Ethernet NIC (QEMU e1000e, PCI id [`E1000E_PCI_ID`])
    /// behind its own PCIe expander bridge on `node`; the harness loads its
    /// driver when the kernel's modules have it.
    pub(crate) fn nic_on(mut self, node: u32) -> Self {
        self.nics.push(node);
        self
    }

    /// Gives every node `k` CPUs.
    #[allow(dead_code)]
    pub(crate) fn cpus_per_node(mut self, k: u32) -> Self {
        self.cpus_per_node = k;
        self
    }

    /// Ships another executable as `/bin/NAME` (with its shared libraries).
    #[allow(dead_code)]
    pub(crate) fn bin(mut self, path: impl Into<PathBuf>, name: &str) -> Self {
        self.bins.push((path.into(), name.into()));
        self
    }

    /// Ships a file or folder to `dest`, an absolute path inside.
    #[allow(dead_code)]
    pub(crate) fn file(mut self, path: impl Into<PathBuf>, dest: &str) -> Self {
        self.files.push((path.into(), dest.into()));
        self
    }

    /// Boots the machine, runs `script` (busybox sh, with `step NAME CMD...`
    /// available) and powers it off. Never hangs: the harness kills the guest
    /// after the time limit. The error names what went wrong and where the
    /// kernel console log is.
    pub(crate) fn boot(&self, script: &str) -> Outcome {
        let harness = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vm/harness.sh");
        let work = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join("vm")
            .join(&self.name);
        if let Err(e) = std::fs::create_dir_all(&work) {
            return Outcome::Failed(format!("cannot create {}: {e}", work.display()));
        }
        let script_path = work.join("guest.sh");
        if let Err(e) = std::fs::write(&script_path, script) {
            return Outcome::Failed(format!("cannot write {}: {e}", script_path.display()));
        }
        let mut cmd = Command::new("bash");
        cmd.arg(&harness)
            .args(["--nodes", &self.nodes.to_string()])
            .args(["--cpus-per-node", &self.cpus_per_node.to_string()])
            .args(["--node-mem", &self.node_mem_mib.to_string()])
            .args(["--timeout", &self.timeout.as_secs().to_string()])
            .arg("--workdir")
            .arg(&work);
        for n in &self.accelerators {
            cmd.args(["--accel-node", &n.to_string()]);
        }
        for n in &self.nics {
            cmd.args(["--nic-node", &n.to_string()]);
        }
        for (path, name) in &self.bins {
            cmd.arg("--bin").arg(format!("{}:{name}", path.display()));
        }
        for (path, dest) in &self.files {
            cmd.arg("--file").arg(format!("{}:{dest}", path.display()));
        }
        cmd.arg(&script_path);
        let started = Instant::now();
        let out = match cmd.output() {
            Ok(o) => o,
            Err(e) => return Outcome::Failed(format!("cannot run {}: {e}", harness.display())),
        };
        let seconds = started.elapsed().as_secs_f64();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let log = String::from_utf8_lossy(&out.stderr).into_owned();
        let code = out.status.code();
        let exit = stdout
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("NUMAPIN-VM-EXIT "));
        let Some(exit) = exit else {
            if code == Some(77) {
                let why = log
                    .lines()
                    .find_map(|l| l.strip_prefix("vm-harness: skipped: "))
                    .unwrap_or("?");
                if crate::common::Need::Vm.required() {
                    return Outcome::Failed(format!(
                        "NUMAPIN_REQUIRE (or NUMAPIN_VM_REQUIRED) asks for the VM, and it cannot run: {why}"
                    ));
                }
                note(&format!(
                    "skipped: VM tests on machine '{}': {why}",
                    self.name
                ));
                return Outcome::Skipped;
            }
            return Outcome::Failed(format!(
                "machine '{}': the harness failed (exit {code:?}) after {seconds:.1} s; logs in {}\n{log}\nguest output:\n{stdout}",
                self.name,
                work.display()
            ));
        };
        let exit_code = exit
            .split_whitespace()
            .next()
            .and_then(|c| c.parse().ok())
            .unwrap_or(-1);
        let boot = Boot {
            machine: self.name.clone(),
            steps: parse_steps(&stdout),
            output: stdout,
            exit_code,
            log,
            seconds,
        };
        let timing = boot
            .log
            .lines()
            .filter(|l| l.contains("boot+run+poweroff"))
            .collect::<Vec<_>>()
            .join("; ");
        let steps: Vec<String> = boot
            .steps
            .iter()
            .map(|(n, s)| format!("{n} {:.2} s", s.seconds))
            .collect();
        note(&format!(
            "vm '{}': guest exit {}, {:.1} s in all; {timing}; steps: {}",
            self.name,
            boot.exit_code,
            boot.seconds,
            steps.join(", ")
        ));
        Outcome::Ran(boot)
    }
}

/// What booting a machine came to.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// The guest ran the script and reported its exit code.
    Ran(Boot),
    /// Something needed (QEMU, a kernel, busybox) is missing; a message said what.
    Skipped,
    /// The VM could not be built, booted or did not report in time.
    Failed(String),
}

impl Outcome {
    /// The boot, `None` when skipped; panics (in the calling test) on failure.
    pub(crate) fn get(&self) -> Option<&Boot> {
        match self {
            Outcome::Ran(b) => Some(b),
            Outcome::Skipped => None,
            Outcome::Failed(why) => panic!("{why}"),
        }
    }
}

/// What one boot printed.
#[derive(Debug)]
pub(crate) struct Boot {
    /// The machine's name.
    pub machine: String,
    /// Everything the guest script printed.
    pub output: String,
    /// The guest script's exit code.
    pub exit_code: i32,
    /// The steps, by name.
    pub steps: BTreeMap<String, Step>,
    /// The harness's own messages (timings).
    pub log: String,
    /// Host seconds for building the initramfs, booting, running, powering off.
    pub seconds: f64,
}

/// What one `step NAME CMD...` printed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Step {
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
    /// Its exit code (124 when the guest-side step timeout killed it).
    pub rc: i32,
    /// Guest seconds it took.
    pub seconds: f64,
}

impl Boot {
    /// The step named `name`; panics with the whole guest output when it did
    /// not run.
    pub(crate) fn step(&self, name: &str) -> &Step {
        self.steps.get(name).unwrap_or_else(|| {
            panic!(
                "machine '{}': step '{name}' did not report (steps: {:?}); guest output:\n{}",
                self.machine,
                self.steps.keys().collect::<Vec<_>>(),
                self.output
            )
        })
    }

    /// The step named `name`, which must have exited 0.
    pub(crate) fn ok(&self, name: &str) -> &Step {
        let s = self.step(name);
        assert_eq!(
            s.rc, 0,
            "machine '{}': step '{name}' failed with {}\nstdout:\n{}\nstderr:\n{}",
            self.machine, s.rc, s.stdout, s.stderr
        );
        s
    }

    /// Asserts that step `name`, which ran `vm-tests --ignored --exact
    /// --nocapture TEST`, ran that one in-guest test, that it did not skip
    /// (it would if the guest environment were missing) and that it passed.
    pub(crate) fn guest_test_passed(&self, name: &str, test: &str) {
        let s = self.ok(name);
        let all = format!("{}\n{}", s.stdout, s.stderr);
        assert!(
            all.contains(&format!("test {test} ..."))
                && all.contains("test result: ok. 1 passed")
                && !all.contains("skipped:"),
            "machine '{}': step '{name}' did not run and pass {test}:\n{}\n{}",
            self.machine,
            s.stdout,
            s.stderr
        );
    }
}

/// Splits the guest output into steps (see the markers in harness.sh). Each
/// section had one newline added after it, which is taken off again.
pub(crate) fn parse_steps(output: &str) -> BTreeMap<String, Step> {
    #[derive(PartialEq)]
    enum Part {
        Out,
        Err,
    }
    let mut steps = BTreeMap::new();
    let mut cur: Option<(String, Part)> = None;
    let (mut out, mut err) = (String::new(), String::new());
    let trim_one = |s: &mut String| {
        if s.ends_with('\n') {
            s.pop();
        }
    };
    for line in output.split_inclusive('\n') {
        let bare = line.trim_end_matches('\n');
        if let Some(rest) = bare.strip_prefix("=== STEP ") {
            if let Some((name, what)) = rest.rsplit_once(' ') {
                match what {
                    "stdout" => {
                        cur = Some((name.to_string(), Part::Out));
                        out.clear();
                        err.clear();
                        continue;
                    }
                    "stderr" if cur.as_ref().is_some_and(|(n, _)| n == name) => {
                        cur = Some((name.to_string(), Part::Err));
                        continue;
                    }
                    _ => {}
                }
            }
            if let Some((name, tail)) = rest.split_once(" rc=") {
                if cur
                    .as_ref()
                    .is_some_and(|(n, p)| n == name && *p == Part::Err)
                {
                    let mut it = tail.split(" seconds=");
                    let rc = it.next().and_then(|r| r.parse().ok()).unwrap_or(-1);
                    let seconds = it.next().and_then(|s| s.parse().ok()).unwrap_or(f64::NAN);
                    let (mut o, mut e) = (std::mem::take(&mut out), std::mem::take(&mut err));
                    trim_one(&mut o);
                    trim_one(&mut e);
                    steps.insert(
                        name.to_string(),
                        Step {
                            stdout: o,
                            stderr: e,
                            rc,
                            seconds,
                        },
                    );
                    cur = None;
                    continue;
                }
            }
        }
        match &cur {
            Some((_, Part::Out)) => out.push_str(line),
            Some((_, Part::Err)) => err.push_str(line),
            None => {}
        }
    }
    steps
}
