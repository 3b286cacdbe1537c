//! PCI bus ids, as CUDA, hwloc, sysfs and NCCL write them.

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
