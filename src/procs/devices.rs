//! Which open files (descriptors and mappings) are a GPU.
//!
//! * `/dev/nvidia<N>`: the NVIDIA GPU whose `Device Minor` is `N` in the
//!   driver's `/proc/driver/nvidia/gpus/<bus id>/information`.
//! * `/dev/nvidiactl`, `/dev/nvidia-uvm`, `/dev/nvidia-modeset`,
//!   `/dev/nvidia-caps/...`: the NVIDIA driver itself (a CUDA process), no
//!   GPU in particular.
//! * A PCI device's own files in sysfs, `/sys/devices/.../<bus id>/config`
//!   or `resource<N>` (`_wc`): the device with that bus id, when the
//!   topology lists it as a GPU or accelerator. This is how user-space
//!   drivers reach a device without a kernel driver, and how tests name an
//!   accelerator a process uses (`exec 3< /sys/bus/pci/devices/<bus id>/config`).

use std::collections::BTreeMap;
use std::path::Path;

use crate::gpu::GpuIndex;
use crate::topology::Topology;

/// The name the stats publication's memfd has (its `/proc/<pid>/fd/<n>`
/// link reads `/memfd:numapin-stats (deleted)`): the writer's own constant.
pub const STATS_MEMFD_NAME: &str = crate::arena::publish::MEMFD_NAME;

/// What an open file is, for `numapin ps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FileKind {
    /// A GPU's device file (`path` as the link shows it).
    Gpu {
        /// The GPU's PCI bus id, when known.
        bus_id: Option<String>,
        /// The GPU in the topology, when the bus id is one of its GPUs.
        gpu: Option<GpuIndex>,
    },
    /// The NVIDIA driver's control or memory files.
    Driver,
    /// numapin's stats publication.
    Stats,
    /// Anything else.
    Other,
}

/// The rules of the module docs, made for one topology and one root.
#[derive(Debug, Clone, Default)]
pub(crate) struct DeviceFiles {
    /// NVIDIA device minor -> bus id.
    minors: BTreeMap<u32, String>,
    /// GPU bus id -> index.
    gpus: BTreeMap<String, GpuIndex>,
    /// Why some driver files could not be used.
    pub(crate) notes: Vec<String>,
}

impl DeviceFiles {
    /// Reads the NVIDIA driver's GPU list under `root`.
    pub(crate) fn read(topo: &Topology, root: &Path) -> Self {
        let (minors, notes) =
            crate::platform::procfs::nvidia_minors(root, crate::topology::limits::MAX_GPUS);
        Self {
            minors: minors.into_iter().collect(),
            gpus: topo
                .gpus
                .iter()
                .map(|g| (g.pci_bus_id.to_ascii_lowercase(), g.index))
                .collect(),
            notes,
        }
    }

    /// The topology's GPU with this PCI bus id.
    pub(crate) fn gpu_of(&self, bus_id: &str) -> Option<GpuIndex> {
        self.gpus.get(&bus_id.to_ascii_lowercase()).copied()
    }

    fn gpu(&self, bus_id: Option<String>) -> FileKind {
        let gpu = bus_id
            .as_ref()
            .and_then(|b| self.gpus.get(&b.to_ascii_lowercase()).copied());
        FileKind::Gpu { bus_id, gpu }
    }

    /// What the file at `path` (a descriptor's link or a mapping's path) is.
    pub(crate) fn classify(&self, path: &[u8]) -> FileKind {
        if is_stats(path) {
            return FileKind::Stats;
        }
        if let Some(rest) = path.strip_prefix(b"/dev/nvidia") {
            if !rest.is_empty() && rest.iter().all(u8::is_ascii_digit) {
                let minor = std::str::from_utf8(rest).ok().and_then(|s| s.parse().ok());
                return self.gpu(minor.and_then(|m| self.minors.get(&m).cloned()));
            }
            return if rest == b"ctl"
                || rest.starts_with(b"-uvm")
                || rest == b"-modeset"
                || rest.starts_with(b"-caps")
            {
                FileKind::Driver
            } else {
                FileKind::Other
            };
        }
        match sysfs_bus_id(path) {
            Some(bus) if self.gpus.contains_key(&bus) => self.gpu(Some(bus)),
            _ => FileKind::Other,
        }
    }
}

/// Whether a link names the stats memfd (also when it resolves into a
/// folder, as in a test's fake root: `<dir>/memfd:numapin-stats (deleted)`).
fn is_stats(path: &[u8]) -> bool {
    let name = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
    let Some(rest) = name.strip_prefix(b"memfd:") else {
        return false;
    };
    let rest = rest.strip_suffix(b" (deleted)").unwrap_or(rest);
    rest == STATS_MEMFD_NAME.as_bytes() && name.len() < path.len()
}

/// The bus id of a PCI device's `config` or `resource<N>[_wc]` file in
/// sysfs (`/sys/devices/pci0000:00/.../0000:65:00.0/resource0`,
/// `/sys/bus/pci/devices/0000:65:00.0/config`), lower case.
fn sysfs_bus_id(path: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(path).ok()?;
    let rest = text
        .strip_prefix("/sys/devices/")
        .or_else(|| text.strip_prefix("/sys/bus/pci/devices/"))?;
    let (dir, file) = rest.rsplit_once('/')?;
    let res = file.strip_prefix("resource");
    let ok = file == "config"
        || res.is_some_and(|n| {
            let n = n.strip_suffix("_wc").unwrap_or(n);
            !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())
        });
    let bus = dir.rsplit('/').next()?;
    (ok && crate::platform::pci::is_pci_address(bus)).then(|| bus.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files() -> DeviceFiles {
        DeviceFiles {
            minors: [(3, "0000:47:00.0".to_string())].into(),
            gpus: [
                ("0000:47:00.0".to_string(), GpuIndex(3)),
                ("0000:65:00.0".to_string(), GpuIndex(5)),
            ]
            .into(),
            notes: vec![],
        }
    }

    #[test]
    fn nvidia_device_files() {
        let f = files();
        assert_eq!(
            f.classify(b"/dev/nvidia3"),
            FileKind::Gpu {
                bus_id: Some("0000:47:00.0".into()),
                gpu: Some(GpuIndex(3))
            }
        );
        // A minor the driver does not list: a GPU, but which one is unknown.
        assert_eq!(
            f.classify(b"/dev/nvidia7"),
            FileKind::Gpu {
                bus_id: None,
                gpu: None
            }
        );
        for d in [
            &b"/dev/nvidiactl"[..],
            b"/dev/nvidia-uvm",
            b"/dev/nvidia-uvm-tools",
            b"/dev/nvidia-modeset",
            b"/dev/nvidia-caps/nvidia-cap1",
        ] {
            assert_eq!(f.classify(d), FileKind::Driver, "{d:?}");
        }
        for d in [&b"/dev/nvidia"[..], b"/dev/nvidiax", b"/dev/null", b""] {
            assert_eq!(f.classify(d), FileKind::Other, "{d:?}");
        }
    }

    #[test]
    fn sysfs_files_of_a_listed_accelerator() {
        let f = files();
        let gpu5 = FileKind::Gpu {
            bus_id: Some("0000:65:00.0".into()),
            gpu: Some(GpuIndex(5)),
        };
        for p in [
            &b"/sys/devices/pci0000:64/0000:64:00.0/0000:65:00.0/config"[..],
            b"/sys/devices/pci0000:64/0000:65:00.0/resource0",
            b"/sys/devices/pci0000:64/0000:65:00.0/resource2_wc",
            b"/sys/bus/pci/devices/0000:65:00.0/config",
        ] {
            assert_eq!(f.classify(p), gpu5, "{p:?}");
        }
        for p in [
            // Not a GPU of the topology, or not the device's own file.
            &b"/sys/devices/pci0000:00/0000:00:01.0/config"[..],
            b"/sys/devices/pci0000:64/0000:65:00.0/vendor",
            b"/sys/devices/pci0000:64/0000:65:00.0/resource",
            b"/sys/devices/pci0000:64/0000:65:00.0/resourcex",
            b"/tmp/0000:65:00.0/config",
        ] {
            assert_eq!(f.classify(p), FileKind::Other, "{p:?}");
        }
    }

    #[test]
    fn the_stats_memfd() {
        let f = files();
        assert_eq!(
            f.classify(b"/memfd:numapin-stats (deleted)"),
            FileKind::Stats
        );
        assert_eq!(f.classify(b"/memfd:numapin-stats"), FileKind::Stats);
        assert_eq!(
            f.classify(b"/tmp/x/memfd:numapin-stats (deleted)"),
            FileKind::Stats
        );
        for p in [
            &b"/memfd:numapin-shared-1 (deleted)"[..],
            b"memfd:numapin-stats (deleted)",
            b"/memfd:numapin-statsx (deleted)",
        ] {
            assert_eq!(f.classify(p), FileKind::Other, "{p:?}");
        }
    }
}
