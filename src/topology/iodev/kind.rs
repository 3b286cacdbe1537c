//! What kind of NIC or storage device a PCI function is, from its PCI ids
//! and the OS devices hwloc found under it, and what its OS names are.

use super::DeviceKind;

/// The type of an hwloc OS device, as far as numapin cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OsType {
    /// A block device (`sda`, `nvme0n1`; hwloc "Storage", XML type 0).
    Block,
    /// A network interface (`eth0`, `ib0`; XML type 2).
    Network,
    /// A verbs device (`mlx5_0`, `efa_0`; hwloc "OpenFabrics", XML type 3).
    OpenFabrics,
    /// Anything else (GPU, DMA, co-processor, memory).
    Other,
}

/// An hwloc OS device below a PCI function.
#[derive(Debug, Clone)]
pub(crate) struct OsDev {
    pub name: String,
    pub ty: OsType,
    pub subtype: Option<String>,
    pub infos: Vec<(String, String)>,
}

impl OsDev {
    fn info(&self, key: &str) -> Option<&str> {
        self.infos
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// PCI class of an InfiniBand controller (network class 0x02, subclass 0x07).
const CLASS_INFINIBAND: u16 = 0x0207;
/// The older serial-bus class some InfiniBand HCAs report (ConnectX-3, QLogic).
const CLASS_SERIAL_INFINIBAND: u16 = 0x0c06;

/// The kind of a PCI function, or `None` when it is neither a NIC nor
/// storage. `class` is the 16-bit class (`0x0207`).
pub(crate) fn classify(
    vendor: u16,
    device: u16,
    class: u16,
    osdevs: &[OsDev],
) -> Option<DeviceKind> {
    let verbs = osdevs.iter().find(|o| o.ty == OsType::OpenFabrics);
    let nets: Vec<&OsDev> = osdevs.iter().filter(|o| o.ty == OsType::Network).collect();
    let ib_class = class == CLASS_INFINIBAND || class == CLASS_SERIAL_INFINIBAND;
    // AWS Elastic Fabric Adapter: 1d0f:efa0-efa3.
    if vendor == 0x1d0f && device & 0xfff0 == 0xefa0 {
        return Some(DeviceKind::Efa);
    }
    if let Some(v) = verbs {
        if v.name.starts_with("efa") {
            return Some(DeviceKind::Efa);
        }
        if v.name.starts_with("hfi1") {
            return Some(DeviceKind::Omnipath);
        }
        // An InfiniBand port has a LID; a RoCE port has LID 0. IPoIB
        // interfaces have 20-byte hardware addresses (59 characters).
        let lid = v.infos.iter().any(|(k, val)| {
            k.starts_with("Port")
                && k.ends_with("LID")
                && u32::from_str_radix(val.trim_start_matches("0x"), 16).is_ok_and(|x| x != 0)
        });
        let ipoib = nets
            .iter()
            .any(|n| n.info("Address").is_some_and(|a| a.len() > 17));
        return Some(if lid || ipoib || ib_class {
            DeviceKind::Infiniband
        } else {
            DeviceKind::Roce
        });
    }
    if nets.iter().any(|n| {
        n.subtype
            .as_deref()
            .is_some_and(|s| s.eq_ignore_ascii_case("slingshot"))
    }) {
        return Some(DeviceKind::Slingshot);
    }
    match class {
        _ if ib_class => Some(DeviceKind::Infiniband),
        0x0208 => Some(DeviceKind::Omnipath),
        0x0200 => Some(DeviceKind::Ethernet),
        c if c >> 8 == 0x02 => Some(DeviceKind::Network),
        _ if !nets.is_empty() => Some(DeviceKind::Ethernet),
        0x0108 => Some(DeviceKind::Nvme),
        0x0106 => Some(DeviceKind::Sata),
        0x0107 => Some(DeviceKind::Sas),
        0x0104 => Some(DeviceKind::Raid),
        0x0100 => Some(DeviceKind::Scsi),
        0x0101 => Some(DeviceKind::Ide),
        c if c >> 8 == 0x01 => Some(DeviceKind::Block),
        _ if osdevs.iter().any(|o| o.ty == OsType::Block) => Some(DeviceKind::Block),
        _ => None,
    }
}

/// A device's OS names: its verbs device first, then its network
/// interfaces and block devices; and the verbs device with the port to use
/// (the first active one, else the first listed).
pub(crate) fn names(osdevs: &[OsDev]) -> (Vec<String>, Option<String>, Option<u32>) {
    let verbs = osdevs.iter().find(|o| o.ty == OsType::OpenFabrics);
    let port = verbs.and_then(|v| {
        let mut ports: Vec<(u32, bool)> = v
            .infos
            .iter()
            .filter_map(|(k, val)| {
                let n = k
                    .strip_prefix("Port")?
                    .strip_suffix("State")?
                    .parse()
                    .ok()?;
                Some((n, val.trim() == "4"))
            })
            .collect();
        ports.sort_unstable();
        ports.iter().find(|p| p.1).or(ports.first()).map(|p| p.0)
    });
    let mut names: Vec<String> = verbs.map(|v| v.name.clone()).into_iter().collect();
    names.extend(
        osdevs
            .iter()
            .filter(|o| matches!(o.ty, OsType::Network | OsType::Block))
            .map(|o| o.name.clone()),
    );
    names.retain(|n| !n.is_empty());
    (names, verbs.map(|v| v.name.clone()), port)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(name: &str, ty: OsType, infos: &[(&str, &str)]) -> OsDev {
        OsDev {
            name: name.into(),
            ty,
            subtype: None,
            infos: infos
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    const IPOIB: &str = "00:00:10:29:fe:80:00:00:00:00:00:00:a0:88:c2:03:00:01:00:01";

    #[test]
    fn verbs_devices_are_infiniband_roce_efa_or_omnipath() {
        let ib = [
            dev(
                "mlx5_0",
                OsType::OpenFabrics,
                &[("Port1State", "4"), ("Port1LID", "0x1a")],
            ),
            dev("ibp26s0", OsType::Network, &[("Address", IPOIB)]),
        ];
        assert_eq!(
            classify(0x15b3, 0x1021, 0x0207, &ib),
            Some(DeviceKind::Infiniband)
        );
        // An Ethernet-class ConnectX whose port has LID 0: RoCE.
        let roce = [
            dev(
                "mlx5_8",
                OsType::OpenFabrics,
                &[("Port1State", "4"), ("Port1LID", "0x0")],
            ),
            dev(
                "enp65s0f0np0",
                OsType::Network,
                &[("Address", "b8:3f:d2:00:00:08")],
            ),
        ];
        assert_eq!(
            classify(0x15b3, 0x1021, 0x0200, &roce),
            Some(DeviceKind::Roce)
        );
        // The same card with an IPoIB interface is InfiniBand whatever its LID.
        let ipoib = [
            dev("mlx5_8", OsType::OpenFabrics, &[]),
            dev("ib0", OsType::Network, &[("Address", IPOIB)]),
        ];
        assert_eq!(
            classify(0x15b3, 0x1021, 0x0200, &ipoib),
            Some(DeviceKind::Infiniband)
        );
        assert_eq!(classify(0x1d0f, 0xefa1, 0x0200, &[]), Some(DeviceKind::Efa));
        let efa = [dev("rdmap16s27", OsType::OpenFabrics, &[])];
        assert_eq!(
            classify(0x1d0f, 0xefa2, 0x0200, &efa),
            Some(DeviceKind::Efa)
        );
        let opa = [dev("hfi1_0", OsType::OpenFabrics, &[])];
        assert_eq!(
            classify(0x8086, 0x24f0, 0x0208, &opa),
            Some(DeviceKind::Omnipath)
        );
    }

    #[test]
    fn classes_without_os_devices() {
        for (class, kind) in [
            (0x0207, Some(DeviceKind::Infiniband)),
            (0x0c06, Some(DeviceKind::Infiniband)),
            (0x0200, Some(DeviceKind::Ethernet)),
            (0x0280, Some(DeviceKind::Network)),
            (0x0108, Some(DeviceKind::Nvme)),
            (0x0106, Some(DeviceKind::Sata)),
            (0x0107, Some(DeviceKind::Sas)),
            (0x0104, Some(DeviceKind::Raid)),
            (0x0100, Some(DeviceKind::Scsi)),
            (0x0101, Some(DeviceKind::Ide)),
            (0x0180, Some(DeviceKind::Block)),
            (0x0302, None),
            (0x0604, None),
            (0x0c03, None),
        ] {
            assert_eq!(
                classify(0x1234, 0x0001, class, &[]),
                kind,
                "class {class:04x}"
            );
        }
        // A block device under an odd class is still storage; a network
        // interface makes anything a NIC.
        let blk = [dev("vda", OsType::Block, &[])];
        assert_eq!(
            classify(0x1af4, 0x1001, 0x0000, &blk),
            Some(DeviceKind::Block)
        );
        let net = [dev("eth0", OsType::Network, &[])];
        assert_eq!(
            classify(0x1af4, 0x1000, 0x0000, &net),
            Some(DeviceKind::Ethernet)
        );
        let mut ss = dev("hsn0", OsType::Network, &[]);
        ss.subtype = Some("Slingshot".into());
        assert_eq!(
            classify(0x17db, 0x0501, 0x0200, &[ss]),
            Some(DeviceKind::Slingshot)
        );
    }

    #[test]
    fn names_put_the_verbs_device_first_and_pick_the_active_port() {
        let osdevs = [
            dev("ib1", OsType::Network, &[]),
            dev(
                "mlx5_3",
                OsType::OpenFabrics,
                &[("Port1State", "1"), ("Port2State", "4")],
            ),
            dev("card0", OsType::Other, &[]),
        ];
        let (names, verbs, port) = names(&osdevs);
        assert_eq!(names, ["mlx5_3", "ib1"]);
        assert_eq!(verbs.as_deref(), Some("mlx5_3"));
        assert_eq!(port, Some(2), "the active port");
        let down = [dev(
            "mlx5_0",
            OsType::OpenFabrics,
            &[("Port2State", "1"), ("Port1State", "1")],
        )];
        assert_eq!(super::names(&down).2, Some(1), "no active port: the first");
        let plain = [dev("nvme0n1", OsType::Block, &[])];
        assert_eq!(
            super::names(&plain),
            (vec!["nvme0n1".to_string()], None, None)
        );
    }
}
