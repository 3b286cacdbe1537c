//! Which drive holds a file: the file's device (`st_dev`) leads to
//! `/sys/dev/block/MAJ:MIN`, a link into the device tree
//! (`/sys/devices/pci0000:40/0000:40:01.1/0000:41:00.0/nvme/nvme0/nvme0n1/nvme0n1p2`):
//! the last PCI function on that path is the drive's controller. Device
//! mapper and md devices (LVM, dm-crypt, RAID) list the devices below them
//! in `slaves/`; multipath NVMe namespaces sit under an `nvme-subsystem`
//! whose controllers link to their PCI functions. A filesystem without a
//! block device of its own (btrfs subvolumes, overlay, NFS, tmpfs: major 0)
//! is looked up in `/proc/self/mountinfo`, whose source names the device
//! when there is one.
//!
//! Every path is read under a root (`/` live; a folder in tests).

use std::path::{Path, PathBuf};

/// Most devices followed below one file's device (RAID over many drives).
const MAX_DISKS: usize = 64;
/// Most levels of `slaves/` followed (dm over md over partitions ...).
const MAX_DEPTH: usize = 8;

/// A drive (a disk, not a partition) below a file's device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Disk {
    /// Its block device name (`nvme0n1`, `sda`, `vda`).
    pub name: String,
    /// The PCI function it hangs off (`0000:41:00.0`), when it has one.
    pub pci_bus_id: Option<String>,
    /// That function's NUMA node as the kernel reports it
    /// (`/sys/bus/pci/devices/<id>/numa_node`; `None` for -1 or unreadable).
    pub numa_node: Option<u32>,
}

/// Where a file's bytes come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Backing {
    /// A block device (`nvme0n1p2`, `dm-0`) and the drives below it.
    Block {
        /// The device of the file (a partition, a mapped device, a disk).
        device: String,
        /// The drives that hold it (several for RAID and LVM over drives).
        disks: Vec<Disk>,
    },
    /// A filesystem without a block device: network (`nfs4`, `cifs`,
    /// `lustre`, `fuse.*`), memory (`tmpfs`) or layered (`overlay`).
    Filesystem {
        /// Its type in mountinfo.
        fstype: String,
        /// Its source in mountinfo (`server:/export`, `overlay`).
        source: String,
    },
    /// Not found; the reason.
    Unknown(String),
}

/// Where the file on device `dev` (`st_dev` as major, minor) lives, read
/// under `root`.
pub(crate) fn locate(dev: (u32, u32), root: &Path) -> Backing {
    if dev.0 == 0 {
        return anonymous(dev, root);
    }
    let link = root.join(format!("sys/dev/block/{}:{}", dev.0, dev.1));
    match std::fs::canonicalize(&link) {
        Ok(dir) => block(&dir, root),
        Err(e) => Backing::Unknown(format!("{}: {e}", link.display())),
    }
}

/// The block device at `dir` (canonical, under `root`) and its disks.
fn block(dir: &Path, root: &Path) -> Backing {
    let device = name_of(dir);
    let mut disks = Vec::new();
    collect_disks(dir, root, 0, &mut disks);
    Backing::Block { device, disks }
}

fn name_of(dir: &Path) -> String {
    dir.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn collect_disks(dir: &Path, root: &Path, depth: usize, out: &mut Vec<Disk>) {
    if depth > MAX_DEPTH || out.len() >= MAX_DISKS {
        return;
    }
    // A partition's folder sits inside its disk's.
    let disk_dir = if dir.join("partition").exists() {
        dir.parent().unwrap_or(dir)
    } else {
        dir
    };
    let slaves = list(&disk_dir.join("slaves"));
    if !slaves.is_empty() {
        for s in slaves {
            if let Ok(d) = std::fs::canonicalize(root.join("sys/class/block").join(&s)) {
                collect_disks(&d, root, depth + 1, out);
            }
        }
        return;
    }
    let name = name_of(disk_dir);
    if out.iter().any(|d| d.name == name) {
        return;
    }
    let pci = last_pci_function(disk_dir).or_else(|| nvme_subsystem_pci(disk_dir));
    let numa_node = pci.as_deref().and_then(|p| pci_numa_node(p, root));
    out.push(Disk {
        name,
        pci_bus_id: pci,
        numa_node,
    });
}

fn list(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The last PCI function on a device path.
fn last_pci_function(dir: &Path) -> Option<String> {
    dir.components()
        .filter_map(|c| c.as_os_str().to_str())
        .rfind(|c| crate::platform::pci::is_pci_address(c))
        .map(str::to_ascii_lowercase)
}

/// A multipath NVMe namespace (`.../nvme-subsystem/nvme-subsys0/nvme0n1`):
/// the PCI function of its first controller that has one.
fn nvme_subsystem_pci(dir: &Path) -> Option<String> {
    let subsys = dir.parent()?;
    if !name_of(subsys).starts_with("nvme-subsys") {
        return None;
    }
    list(subsys)
        .into_iter()
        .filter(|n| is_controller(n))
        .filter_map(|n| std::fs::canonicalize(subsys.join(n)).ok())
        .find_map(|p| last_pci_function(&p))
}

/// `nvme0`, `nvme12`: a controller, not a namespace (`nvme0n1`).
fn is_controller(n: &str) -> bool {
    n.strip_prefix("nvme")
        .is_some_and(|d| !d.is_empty() && d.bytes().all(|c| c.is_ascii_digit()))
}

fn pci_numa_node(bus_id: &str, root: &Path) -> Option<u32> {
    let p = root
        .join("sys/bus/pci/devices")
        .join(bus_id)
        .join("numa_node");
    let t = std::fs::read_to_string(p).ok()?;
    t.trim()
        .parse::<i64>()
        .ok()
        .and_then(|n| u32::try_from(n).ok())
}

/// A mount from `/proc/self/mountinfo`.
struct Mount {
    fstype: String,
    source: String,
}

/// The mount whose device is `dev`.
fn mount_of(dev: (u32, u32), root: &Path) -> Option<Mount> {
    let text = std::fs::read_to_string(root.join("proc/self/mountinfo")).ok()?;
    let want = format!("{}:{}", dev.0, dev.1);
    text.lines().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        if f.get(2) != Some(&want.as_str()) {
            return None;
        }
        let dash = f.iter().position(|x| *x == "-")?;
        Some(Mount {
            fstype: f.get(dash + 1)?.to_string(),
            source: super::cgroup::unescape(f.get(dash + 2)?),
        })
    })
}

/// The filesystems on block devices (their source a `/dev/` path) in
/// `/proc/self/mountinfo` under `root`: each device once, with its first
/// mount point.
pub(crate) fn block_mounts(root: &Path) -> Vec<(PathBuf, (u32, u32))> {
    let Ok(text) = std::fs::read_to_string(root.join("proc/self/mountinfo")) else {
        return Vec::new();
    };
    let mut out: Vec<(PathBuf, (u32, u32))> = Vec::new();
    for l in text.lines() {
        let f: Vec<&str> = l.split(' ').collect();
        let Some(dash) = f.iter().position(|x| *x == "-") else {
            continue;
        };
        let (Some(dev), Some(point), Some(source)) = (f.get(2), f.get(4), f.get(dash + 2)) else {
            continue;
        };
        let Some((a, b)) = dev.split_once(':') else {
            continue;
        };
        let (Ok(a), Ok(b)) = (a.parse(), b.parse()) else {
            continue;
        };
        if source.starts_with("/dev/") && !out.iter().any(|m| m.1 == (a, b)) {
            out.push((PathBuf::from(super::cgroup::unescape(point)), (a, b)));
        }
    }
    out
}

/// A device without a block device of its own: its mount's source may
/// name one (btrfs: `/dev/nvme0n1p2`; LVM: `/dev/mapper/vg-root`).
fn anonymous(dev: (u32, u32), root: &Path) -> Backing {
    let Some(m) = mount_of(dev, root) else {
        return Backing::Unknown(format!(
            "no mount of device {}:{} in {}",
            dev.0,
            dev.1,
            root.join("proc/self/mountinfo").display()
        ));
    };
    if let Some(rel) = m.source.strip_prefix("/dev/") {
        let node: PathBuf = root.join("dev").join(rel);
        // /dev/mapper/vg-root links to ../dm-0: the device's name is the
        // link's last component.
        let name = std::fs::canonicalize(&node)
            .or_else(|_| std::fs::read_link(&node))
            .map(|p| name_of(&p))
            .unwrap_or_else(|_| name_of(Path::new(rel)));
        if let Ok(dir) = std::fs::canonicalize(root.join("sys/class/block").join(&name)) {
            return block(&dir, root);
        }
    }
    Backing::Filesystem {
        fstype: m.fstype,
        source: m.source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A fake root: an NVMe drive with a partition on node 1, a virtio disk
    /// with no node, a dm device over both, a multipath namespace, and
    /// mountinfo with btrfs, NFS and overlay mounts.
    fn fake() -> tempfile::TempDir {
        let d = crate::platform::fake_root(&[
            (
                "sys/devices/pci0000:40/0000:40:01.1/0000:41:00.0/nvme/nvme0/nvme0n1/nvme0n1p2/partition",
                "2",
            ),
            ("sys/bus/pci/devices/0000:41:00.0/numa_node", "1\n"),
            (
                "sys/devices/pci0000:00/0000:00:02.0/virtio1/block/vda/size",
                "1",
            ),
            ("sys/bus/pci/devices/0000:00:02.0/numa_node", "-1\n"),
            ("sys/devices/virtual/block/dm-0/size", "1"),
            (
                "sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0/nvme/nvme1/size",
                "1",
            ),
            (
                "sys/devices/virtual/nvme-subsystem/nvme-subsys1/nvme1n1/size",
                "1",
            ),
            ("sys/bus/pci/devices/0000:81:00.0/numa_node", "0\n"),
            (
                "proc/self/mountinfo",
                "22 1 0:31 / / rw - btrfs /dev/nvme0n1p2 rw\n\
                 23 1 0:52 / /mnt/nfs rw - nfs4 server:/export rw\n\
                 24 1 0:60 / /merged rw - overlay overlay rw\n\
                 25 1 0:61 / /mapped rw - ext4 /dev/mapper/vg-lv rw\n",
            ),
            ("dev/.keep", ""),
        ]);
        let r = d.path();
        let mk = |target: &str, link: &str| {
            let l = r.join(link);
            std::fs::create_dir_all(l.parent().expect("parent")).expect("folders");
            symlink(target, l).expect("symlink");
        };
        mk(
            "../../devices/pci0000:40/0000:40:01.1/0000:41:00.0/nvme/nvme0/nvme0n1/nvme0n1p2",
            "sys/dev/block/259:2",
        );
        mk(
            "../../devices/pci0000:40/0000:40:01.1/0000:41:00.0/nvme/nvme0/nvme0n1/nvme0n1p2",
            "sys/class/block/nvme0n1p2",
        );
        mk(
            "../../devices/pci0000:00/0000:00:02.0/virtio1/block/vda",
            "sys/dev/block/254:0",
        );
        mk(
            "../../devices/pci0000:00/0000:00:02.0/virtio1/block/vda",
            "sys/class/block/vda",
        );
        mk("../../devices/virtual/block/dm-0", "sys/dev/block/253:0");
        mk("../../devices/virtual/block/dm-0", "sys/class/block/dm-0");
        mk(
            "../../../../pci0000:40/0000:40:01.1/0000:41:00.0/nvme/nvme0/nvme0n1/nvme0n1p2",
            "sys/devices/virtual/block/dm-0/slaves/nvme0n1p2",
        );
        mk(
            "../../../../pci0000:00/0000:00:02.0/virtio1/block/vda",
            "sys/devices/virtual/block/dm-0/slaves/vda",
        );
        mk(
            "../../devices/virtual/nvme-subsystem/nvme-subsys1/nvme1n1",
            "sys/dev/block/259:5",
        );
        mk(
            "../../../pci0000:80/0000:80:01.0/0000:81:00.0/nvme/nvme1",
            "sys/devices/virtual/nvme-subsystem/nvme-subsys1/nvme1",
        );
        mk("../dm-0", "dev/mapper/vg-lv");
        d
    }

    fn disk(name: &str, pci: Option<&str>, node: Option<u32>) -> Disk {
        Disk {
            name: name.into(),
            pci_bus_id: pci.map(Into::into),
            numa_node: node,
        }
    }

    #[test]
    fn a_partition_leads_to_its_drive_and_node() {
        let d = fake();
        assert_eq!(
            locate((259, 2), d.path()),
            Backing::Block {
                device: "nvme0n1p2".into(),
                disks: vec![disk("nvme0n1", Some("0000:41:00.0"), Some(1))]
            }
        );
        assert_eq!(
            locate((254, 0), d.path()),
            Backing::Block {
                device: "vda".into(),
                disks: vec![disk("vda", Some("0000:00:02.0"), None)]
            }
        );
    }

    #[test]
    fn mapped_devices_list_every_drive_below() {
        let d = fake();
        let want = Backing::Block {
            device: "dm-0".into(),
            disks: vec![
                disk("nvme0n1", Some("0000:41:00.0"), Some(1)),
                disk("vda", Some("0000:00:02.0"), None),
            ],
        };
        assert_eq!(locate((253, 0), d.path()), want);
        // Through mountinfo and a /dev/mapper link.
        assert_eq!(locate((0, 61), d.path()), want);
    }

    #[test]
    fn multipath_namespaces_use_their_controller() {
        let d = fake();
        assert_eq!(
            locate((259, 5), d.path()),
            Backing::Block {
                device: "nvme1n1".into(),
                disks: vec![disk("nvme1n1", Some("0000:81:00.0"), Some(0))]
            }
        );
    }

    #[test]
    fn filesystems_without_a_device_say_what_they_are() {
        let d = fake();
        // btrfs: anonymous device, source names the partition.
        assert!(matches!(
            locate((0, 31), d.path()),
            Backing::Block { device, .. } if device == "nvme0n1p2"
        ));
        assert_eq!(
            locate((0, 52), d.path()),
            Backing::Filesystem {
                fstype: "nfs4".into(),
                source: "server:/export".into()
            }
        );
        assert!(
            matches!(locate((0, 60), d.path()), Backing::Filesystem { fstype, .. } if fstype == "overlay")
        );
        assert!(matches!(locate((0, 99), d.path()), Backing::Unknown(_)));
        assert!(matches!(locate((8, 1), d.path()), Backing::Unknown(_)));
    }

    #[test]
    fn block_mounts_are_listed_once_each() {
        let d = fake();
        let m = block_mounts(d.path());
        assert_eq!(
            m,
            vec![
                (PathBuf::from("/"), (0, 31)),
                (PathBuf::from("/mapped"), (0, 61))
            ]
        );
    }

    #[test]
    fn pci_addresses_and_controllers() {
        assert!(crate::platform::pci::is_pci_address("0000:41:00.0"));
        assert!(!crate::platform::pci::is_pci_address("pci0000:40"));
        assert!(!crate::platform::pci::is_pci_address("0000:41:00"));
        assert!(is_controller("nvme12") && !is_controller("nvme1n1") && !is_controller("nvme"));
    }

    #[test]
    fn this_machines_root_filesystem_is_found_or_explained() {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata("/").expect("stat /");
        let dev = (libc::major(m.dev()), libc::minor(m.dev()));
        // Whatever this machine is, the answer is one of the three, and a
        // block device names at least one drive.
        if let Backing::Block { disks, .. } = locate(dev, Path::new("/")) {
            assert!(!disks.is_empty());
        }
    }
}
