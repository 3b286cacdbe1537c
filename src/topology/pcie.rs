//! PCIe links: read from sysfs (live machines and captures) and from the
//! link speeds hwloc and NCCL files give.

use std::path::Path;

use super::PcieLink;

/// A PCI function's link: from sysfs under `sysfs_root` (live and captured
/// machines) and hwloc's link speed in GB/s (0 when unknown).
pub(crate) fn pcie_of(sysfs_root: Option<&Path>, bus_id: &str, speed: f32) -> Option<PcieLink> {
    let mut pcie = sysfs_root.and_then(|r| read_pcie(r, bus_id));
    if speed > 0.0 {
        pcie.get_or_insert_with(PcieLink::default).speed_gbps = Some(speed);
    }
    pcie
}

/// Reads a PCI device's link state from sysfs under `root`.
fn read_pcie(root: &Path, bus_id: &str) -> Option<PcieLink> {
    let dir = root.join("sys/bus/pci/devices").join(bus_id);
    let read = |f: &str| read_attribute(&dir.join(f));
    let link = PcieLink {
        current_gen: read("current_link_speed").and_then(|s| gen_of_speed(&s)),
        current_width: read("current_link_width").and_then(|s| s.trim().parse().ok()),
        max_gen: read("max_link_speed").and_then(|s| gen_of_speed(&s)),
        max_width: read("max_link_width").and_then(|s| s.trim().parse().ok()),
        speed_gbps: None,
    };
    (link.current_gen.is_some() || link.current_width.is_some() || link.max_gen.is_some())
        .then_some(link)
}

/// A sysfs attribute's text: a page at most, no more is read (`None` when
/// it cannot be read).
pub(crate) fn read_attribute(path: &Path) -> Option<String> {
    use std::io::Read;
    let mut s = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(4096)
        .read_to_string(&mut s)
        .ok()?;
    Some(s)
}

/// PCIe generation from a sysfs or NCCL link speed (`16.0 GT/s PCIe`).
pub(crate) fn gen_of_speed(s: &str) -> Option<u8> {
    let num: f32 = s.split_whitespace().next()?.parse().ok()?;
    Some(match num {
        x if x < 3.0 => 1,
        x if x < 6.0 => 2,
        x if x < 10.0 => 3,
        x if x < 20.0 => 4,
        x if x < 40.0 => 5,
        x if x < 80.0 => 6,
        _ => 7,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_speed_generations() {
        assert_eq!(gen_of_speed("2.5 GT/s PCIe\n"), Some(1));
        assert_eq!(gen_of_speed("16.0 GT/s PCIe"), Some(4));
        assert_eq!(gen_of_speed("32.0 GT/s PCIe"), Some(5));
        assert_eq!(gen_of_speed("16 GT/s"), Some(4));
        assert_eq!(gen_of_speed("Unknown"), None);
    }
}
