//! Machines described in tests: built as `Topology` values directly, so the
//! plan tests need no files.
#![allow(dead_code)]

pub(crate) mod seccomp;
pub(crate) mod storage;

use numapin::topology::{
    Allowed, Cache, Core, CudaInfo, DeviceKind, Gpu, IoDevice, NodeKind, NumaNode, Package,
    Relation, Topology, VisibleEntry,
};
use numapin::CpuList;

/// The shape of a mocked machine, as in PyTorch's NUMA binding tests: CPUs
/// are numbered in order, socket by socket, node by node, L3 by L3; each
/// physical core has two hardware threads with consecutive numbers (when
/// `smt`), and the GPUs of each node come in order.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    pub sockets: u32,
    pub nodes_per_socket: u32,
    pub gpus_per_node: u32,
    pub l3_per_node: u32,
    pub cores_per_l3: u32,
    pub smt: bool,
}

impl Shape {
    pub(crate) fn new(
        sockets: u32,
        nodes_per_socket: u32,
        gpus_per_node: u32,
        l3_per_node: u32,
        cores_per_l3: u32,
    ) -> Self {
        Self {
            sockets,
            nodes_per_socket,
            gpus_per_node,
            l3_per_node,
            cores_per_l3,
            smt: true,
        }
    }

    pub(crate) fn threads(&self) -> u32 {
        if self.smt {
            2
        } else {
            1
        }
    }

    pub(crate) fn build(&self) -> Topology {
        let mut t = empty("mock");
        let mut cpu = 0u32;
        let mut node = 0u32;
        for s in 0..self.sockets {
            let mut pkg = Package {
                index: s,
                cpus: CpuList::new(),
                numa_nodes: vec![],
            };
            for _ in 0..self.nodes_per_socket {
                let first = cpu;
                for _ in 0..self.l3_per_node {
                    let l3_first = cpu;
                    for _ in 0..self.cores_per_l3 {
                        let core = CpuList::range(cpu, cpu + self.threads() - 1);
                        t.cores.push(Core {
                            cpus: core,
                            numa_node: Some(node),
                        });
                        cpu += self.threads();
                    }
                    t.caches.push(Cache {
                        level: 3,
                        size_bytes: None,
                        cpus: CpuList::range(l3_first, cpu - 1),
                    });
                }
                let cpus = CpuList::range(first, cpu - 1);
                t.numa_nodes.push(NumaNode {
                    os_index: node,
                    package: Some(s),
                    cpus: cpus.clone(),
                    memory_bytes: 1 << 30,
                    distances: vec![],
                    kind: NodeKind::Normal,
                });
                for _ in 0..self.gpus_per_node {
                    add_gpu(&mut t, Some(node), Some(s), cpus.clone());
                }
                pkg.cpus = pkg.cpus.union(&cpus);
                pkg.numa_nodes.push(node);
                node += 1;
            }
            t.packages.push(pkg);
        }
        allow_everything(&mut t);
        t
    }
}

/// A topology with nothing in it.
pub(crate) fn empty(source: &str) -> Topology {
    Topology {
        schema_version: numapin::topology::SCHEMA_VERSION,
        source: source.into(),
        packages: vec![],
        numa_nodes: vec![],
        gpus: vec![],
        allowed: Allowed::default(),
        warnings: vec![],
        cores: vec![],
        caches: vec![],
        cuda: CudaInfo {
            ordinal_source: "pci_order".into(),
            device_order: "FASTEST_FIRST".into(),
            ..Default::default()
        },
        nics: vec![],
        storage: vec![],
    }
}

/// Adds a GPU (with the next CUDA ordinal).
pub(crate) fn add_gpu(
    t: &mut Topology,
    node: Option<u32>,
    package: Option<u32>,
    local_cpus: CpuList,
) {
    let i = u32::try_from(t.gpus.len()).unwrap();
    t.gpus.push(Gpu {
        index: numapin::GpuIndex(i),
        cuda_ordinal: Some(numapin::CudaOrdinal(i)),
        pci_bus_id: format!("0000:{:02x}:00.0", i + 1),
        name: None,
        uuid: None,
        numa_node: node,
        package,
        local_cpus,
        pcie: None,
        vendor_id: "0x10de".into(),
        device_id: "0x2330".into(),
        class_id: "0x0302".into(),
    });
    t.cuda.ordinals.push(VisibleEntry {
        ordinal: numapin::CudaOrdinal(i),
        entry: "*".into(),
        gpu: Some(numapin::GpuIndex(i)),
        mig: false,
    });
}

/// Adds a NIC named `verbs` (an RDMA device on port 1, and interface
/// `if_<verbs>`) of `kind`, at `relations` from the GPUs (in their order).
pub(crate) fn add_nic(t: &mut Topology, verbs: &str, kind: DeviceKind, relations: &[Relation]) {
    let i = t.nics.len();
    t.nics.push(IoDevice {
        pci_bus_id: Some(format!("0000:{:02x}:00.0", 0x80 + i)),
        kind,
        names: vec![verbs.to_string(), format!("if_{verbs}")],
        rdma_device: kind.is_rdma().then(|| verbs.to_string()),
        rdma_port: kind.is_rdma().then_some(1),
        numa_node: None,
        package: None,
        pcie: None,
        gpu_relations: relations.to_vec(),
        vendor_id: "0x15b3".into(),
        device_id: "0x1021".into(),
        class_id: "0x0207".into(),
    });
}

/// Lets the process use every CPU and node.
pub(crate) fn allow_everything(t: &mut Topology) {
    t.allowed.cpus = t.all_cpus();
    t.allowed.numa_nodes = t.numa_nodes.iter().map(|n| n.os_index).collect();
}

pub(crate) fn cpus(s: &str) -> CpuList {
    CpuList::parse(s).unwrap()
}

/// Writes `t` as a numapin JSON file in a temporary folder.
pub(crate) fn write_json(t: &Topology) -> tempfile::TempPath {
    let mut f = tempfile::Builder::new().suffix(".json").tempfile().unwrap();
    std::io::Write::write_all(&mut f, t.to_json().as_bytes()).unwrap();
    f.into_temp_path()
}

/// A copy of the executable `exe` that any user can run: the build folder
/// may sit below a directory only its owner can enter (a `mktemp -d`
/// checkout), and tests run some binaries as user `nobody`. Keep the
/// returned folder alive while the copy runs.
pub(crate) fn runnable_by_everyone(
    exe: &std::path::Path,
) -> (tempfile::TempDir, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new()
        .prefix("numapin-exe")
        .tempdir_in("/tmp")
        .expect("a folder in /tmp");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let copy = dir.path().join(exe.file_name().expect("a file name"));
    std::fs::copy(exe, &copy).expect("copy the executable");
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    (dir, copy)
}

/// A minimal hwloc-gather-topology root: 2 packages, 2 nodes, 8 CPUs, one
/// NVIDIA GPU on node 1.
pub(crate) fn make_capture(root: &std::path::Path) {
    let w = |rel: &str, text: &str| {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    let mask = |ids: &[u32]| format!("{:08x}\n", ids.iter().fold(0u32, |m, i| m | 1 << i));
    for f in ["possible", "present", "online"] {
        w(&format!("sys/devices/system/cpu/{f}"), "0-7\n");
    }
    for c in 0..8u32 {
        let node = c / 4;
        let sib = [c - c % 2, c - c % 2 + 1];
        let pkg: Vec<u32> = (node * 4..node * 4 + 4).collect();
        let t = format!("sys/devices/system/cpu/cpu{c}/topology/");
        w(&format!("{t}physical_package_id"), &format!("{node}\n"));
        w(&format!("{t}core_id"), &format!("{}\n", (c % 4) / 2));
        w(&format!("{t}thread_siblings"), &mask(&sib));
        w(
            &format!("{t}thread_siblings_list"),
            &format!("{}-{}\n", sib[0], sib[1]),
        );
        w(&format!("{t}core_siblings"), &mask(&pkg));
        w(
            &format!("{t}core_siblings_list"),
            &format!("{}-{}\n", pkg[0], pkg[3]),
        );
    }
    for n in 0..2u32 {
        let ids: Vec<u32> = (n * 4..n * 4 + 4).collect();
        let d = format!("sys/devices/system/node/node{n}/");
        w(&format!("{d}cpumap"), &mask(&ids));
        w(&format!("{d}cpulist"), &format!("{}-{}\n", ids[0], ids[3]));
        w(
            &format!("{d}distance"),
            if n == 0 { "10 21\n" } else { "21 10\n" },
        );
        w(
            &format!("{d}meminfo"),
            &format!("Node {n} MemTotal:       16777216 kB\n"),
        );
    }
    for f in [
        "possible",
        "online",
        "has_cpu",
        "has_normal_memory",
        "has_memory",
    ] {
        w(&format!("sys/devices/system/node/{f}"), "0-1\n");
    }
    let g = "sys/bus/pci/devices/0000:07:00.0/";
    for (f, v) in [
        ("vendor", "0x10de\n"),
        ("device", "0x2330\n"),
        ("class", "0x030200\n"),
        ("numa_node", "1\n"),
        ("local_cpus", "000000f0\n"),
        ("current_link_speed", "32.0 GT/s PCIe\n"),
        ("current_link_width", "16\n"),
    ] {
        w(&format!("{g}{f}"), v);
    }
    let cpuinfo: String = (0..8)
        .map(|c| {
            format!(
                "processor\t: {c}\nphysical id\t: {}\ncore id\t\t: {}\n\n",
                c / 4,
                (c % 4) / 2
            )
        })
        .collect();
    w("proc/cpuinfo", &cpuinfo);
    w("proc/meminfo", "MemTotal:       33554432 kB\n");
}

/// A gzipped tar of `root`'s contents under `top/`, links kept as links.
pub(crate) fn tar_gz(root: &std::path::Path) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut b = tar::Builder::new(gz);
    b.follow_symlinks(false);
    b.append_dir_all("top", root).unwrap();
    b.into_inner().unwrap().finish().unwrap()
}

/// The variable that names the child test a parent started
/// ([`run_child`]).
const CHILD_VAR: &str = "NUMAPIN_TEST_CHILD";

/// Re-runs this test binary's test `name` (an `#[ignore]`d test that calls
/// [`in_child`] first) in a child process with `NUMAPIN_TEST_CHILD=name`
/// and the variables `env`, running `pre` in the child before exec (drop to
/// another user, lower a limit, install a seccomp filter). The child runs
/// from a copy any user can run, in `/`. Prints the child's output; `None`
/// (with a message) when it cannot be started.
pub(crate) fn run_child(
    name: &str,
    env: &[(&str, &str)],
    pre: impl FnMut() -> std::io::Result<()> + Send + Sync + 'static,
) -> Option<std::process::Output> {
    use std::os::unix::process::CommandExt;
    let (_dir, exe) = runnable_by_everyone(&std::env::current_exe().expect("this test binary"));
    let mut cmd = std::process::Command::new(&exe);
    cmd.current_dir("/")
        .args([
            "--exact",
            name,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_VAR, name)
        .envs(env.iter().copied());
    // SAFETY: `pre` only makes system calls (setrlimit, setgid, setuid,
    // prctl) between fork and exec.
    unsafe { cmd.pre_exec(pre) };
    match cmd.output() {
        Ok(out) => {
            eprintln!(
                "--- child {name} ---\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            Some(out)
        }
        Err(e) => {
            eprintln!("skipped: cannot start the child test {name}: {e}");
            None
        }
    }
}

/// Whether this process is the child [`run_child`] started for `name`
/// (otherwise says the test is skipped here).
pub(crate) fn in_child(name: &str) -> bool {
    if std::env::var(CHILD_VAR).as_deref() == Ok(name) {
        true
    } else {
        eprintln!("skipped: {name} runs in a child process started by its parent test");
        false
    }
}

/// Asserts that a [`run_child`] child passed, having run its one test.
#[track_caller]
pub(crate) fn assert_child_passed(out: &std::process::Output) {
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "child failed");
    assert!(text.contains("1 passed"), "the child test did not run");
}

/// A `pre_exec` step that makes the child user `nobody` (uid and gid
/// 65534, no groups) with RLIMIT_MEMLOCK `memlock` (soft and hard).
pub(crate) fn as_nobody(memlock: u64) -> impl FnMut() -> std::io::Result<()> + Send + Sync {
    move || {
        nix::sys::resource::setrlimit(
            nix::sys::resource::Resource::RLIMIT_MEMLOCK,
            memlock,
            memlock,
        )?;
        nix::unistd::setgroups(&[])?;
        nix::unistd::setgid(nix::unistd::Gid::from_raw(65534))?;
        nix::unistd::setuid(nix::unistd::Uid::from_raw(65534))?;
        Ok(())
    }
}

/// A fake filesystem root whose process sits in a cgroup v2 with
/// `memory.max` = `limit`.
pub(crate) fn cgroup_v2_root(limit: u64) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for (p, c) in [
        ("proc/self/cgroup", "0::/job\n".to_string()),
        (
            "proc/self/mountinfo",
            "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n".to_string(),
        ),
        (
            "sys/fs/cgroup/cgroup.controllers",
            "cpu memory\n".to_string(),
        ),
        ("sys/fs/cgroup/job/memory.max", format!("{limit}\n")),
        ("sys/fs/cgroup/job/memory.high", "max\n".to_string()),
    ] {
        let p = d.path().join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, c).unwrap();
    }
    d
}

/// A hugetlb pool reserved on one node for a test, given back on drop (the
/// node's `nr_hugepages` restored to what it was, even when the test
/// fails).
pub(crate) struct HugePool {
    file: std::path::PathBuf,
    before: u64,
    /// The node.
    pub node: u32,
    /// Bytes per page.
    pub page_bytes: u64,
}

impl HugePool {
    /// The node's pool file for `page_bytes` pages.
    pub(crate) fn dir(node: u32, page_bytes: u64) -> std::path::PathBuf {
        std::path::PathBuf::from(format!(
            "/sys/devices/system/node/node{node}/hugepages/hugepages-{}kB",
            page_bytes >> 10
        ))
    }

    fn read(file: &std::path::Path) -> Option<u64> {
        std::fs::read_to_string(file).ok()?.trim().parse().ok()
    }

    /// The node's free pages of this size now.
    pub(crate) fn free(&self) -> u64 {
        Self::read(&Self::dir(self.node, self.page_bytes).join("free_hugepages")).unwrap_or(0)
    }

    /// Adds `pages` free pages to `node`'s pool of `page_bytes` pages, or
    /// says why not (not root, no such pool, the kernel found fewer free
    /// blocks): the caller skips with that message.
    pub(crate) fn reserve(node: u32, page_bytes: u64, pages: u64) -> Result<HugePool, String> {
        if !nix::unistd::geteuid().is_root() {
            return Err("not root: cannot reserve a hugetlb pool".into());
        }
        let dir = Self::dir(node, page_bytes);
        let file = dir.join("nr_hugepages");
        let before = Self::read(&file).ok_or_else(|| format!("no pool at {}", dir.display()))?;
        let free_before = Self::read(&dir.join("free_hugepages")).unwrap_or(0);
        let pool = HugePool {
            file,
            before,
            node,
            page_bytes,
        };
        std::fs::write(&pool.file, format!("{}\n", before + pages))
            .map_err(|e| format!("writing {}: {e}", pool.file.display()))?;
        let free = pool.free();
        if free < free_before + pages {
            return Err(format!(
                "asked {} for {pages} more pages, {} free now (memory too fragmented?)",
                pool.file.display(),
                free
            ));
        }
        Ok(pool)
    }
}

impl Drop for HugePool {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.file, format!("{}\n", self.before));
    }
}

/// The `/proc/self/smaps` block of the mapping that starts at `addr` (its
/// header line and fields), empty when there is none.
pub(crate) fn smaps_of(addr: usize) -> String {
    let text = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let head = format!("{addr:x}-");
    let mut out = String::new();
    let mut inside = false;
    for line in text.lines() {
        let is_header = line.split_whitespace().next().is_some_and(|w| {
            w.contains('-') && w.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
        });
        if is_header {
            inside = line.starts_with(&head);
        }
        if inside {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// What a test that cannot run here needed. `NUMAPIN_REQUIRE` (a comma
/// list of these names, or `all`) turns a skip for a listed need into a
/// failure, for a machine where the test must run (the GPU machine, a
/// root CI, a checkout with the real-machine data beside it);
/// `NUMAPIN_VM_REQUIRED=1` is `NUMAPIN_REQUIRE=vm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Need {
    /// A CUDA driver and a GPU.
    Gpu,
    /// Root (to run a child as `nobody`, make cgroups, reserve huge pages).
    Root,
    /// `../shared/topologies`, the real machines' data.
    Shared,
    /// The emulated multi-node machine (QEMU, a kernel, busybox).
    Vm,
    /// A kernel feature (hugetlb pools, memory cgroups, MADV_POPULATE_WRITE).
    Kernel,
    /// A program the test drives (`script`, `taskset`).
    Tool,
}

impl Need {
    fn name(self) -> &'static str {
        match self {
            Need::Gpu => "gpu",
            Need::Root => "root",
            Need::Shared => "shared",
            Need::Vm => "vm",
            Need::Kernel => "kernel",
            Need::Tool => "tool",
        }
    }

    /// Whether `NUMAPIN_REQUIRE` (or, for the VM, `NUMAPIN_VM_REQUIRED`)
    /// asks for this need to be met.
    pub(crate) fn required(self) -> bool {
        if self == Need::Vm && std::env::var_os("NUMAPIN_VM_REQUIRED").is_some() {
            return true;
        }
        std::env::var("NUMAPIN_REQUIRE").is_ok_and(|v| {
            v.split(',')
                .map(str::trim)
                .any(|n| n == "all" || n == self.name())
        })
    }
}

/// Skips the calling test for want of `need` (a line on standard error),
/// or fails it when `NUMAPIN_REQUIRE` says this machine must meet it.
pub(crate) fn skip(need: Need, why: &str) {
    assert!(
        !need.required(),
        "NUMAPIN_REQUIRE asks for {}, and this test cannot run: {why}",
        need.name()
    );
    eprintln!("skipped: {why}");
}
