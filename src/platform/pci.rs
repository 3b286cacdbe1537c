//! PCI bus ids, as CUDA, hwloc, sysfs and NCCL write them.

/// Whether `s` reads as a PCI function address as sysfs writes it,
/// `dddd:bb:dd.f` in hex (any case).
pub(crate) fn is_pci_address(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && b.iter()
            .enumerate()
            .all(|(i, c)| matches!(i, 4 | 7 | 10) || c.is_ascii_hexdigit())
}

/// Normalises a PCI bus id to `dddd:bb:dd.f`, lower case (CUDA and
/// nvidia-smi print 8-digit domains and upper case).
pub fn normalize_bus_id(id: &str) -> Option<String> {
    let id = id.trim().to_ascii_lowercase();
    let (domain, rest) = match id.rsplitn(3, ':').collect::<Vec<_>>().as_slice() {
        [devfn, bus, domain] => (domain.to_string(), format!("{bus}:{devfn}")),
        [devfn, bus] => ("0".to_string(), format!("{bus}:{devfn}")),
        _ => return None,
    };
    let dom = u32::from_str_radix(&domain, 16).ok()?;
    let (bus, devfn) = rest.split_once(':')?;
    let (dev, func) = devfn.split_once('.')?;
    let bus = u8::from_str_radix(bus, 16).ok()?;
    let dev = u8::from_str_radix(dev, 16).ok()?;
    let func = u8::from_str_radix(func, 16).ok()?;
    if dom > 0xffff || dev > 0x1f || func > 7 {
        return None;
    }
    Some(format!("{dom:04x}:{bus:02x}:{dev:02x}.{func:x}"))
}
