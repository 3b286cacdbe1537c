//! `CUDA_VISIBLE_DEVICES` and `CUDA_DEVICE_ORDER`: which CUDA ordinals this
//! process sees and which physical GPU each one is.
//!
//! CUDA numbers the physical GPUs in an order (`FASTEST_FIRST`, the default,
//! or `PCI_BUS_ID`), then `CUDA_VISIBLE_DEVICES` picks and reorders them:
//! entries are indices into that order, `GPU-<uuid>` (or a unique prefix of
//! one), or MIG instances (`MIG-<uuid>`, or the older
//! `MIG-GPU-<uuid>/<gi>/<ci>`), which map to their parent GPU. An empty value
//! hides every GPU; `-1` (a common way to hide them all) ends the list.
//!
//! CUDA silently ignores everything from the first invalid entry on; numapin
//! reports such a value as an error that names the variable, since a typo
//! there otherwise moves a job onto the wrong GPUs without a word.

use serde::{Deserialize, Serialize};

use super::TopologyError as Error;
use crate::gpu::{CudaOrdinal, GpuIndex};
use crate::num::u32_saturating;

/// CUDA's device enumeration order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum DeviceOrder {
    /// Fastest device first (CUDA's default); ties in PCI bus order.
    #[default]
    #[serde(rename = "FASTEST_FIRST")]
    FastestFirst,
    /// PCI bus id order.
    #[serde(rename = "PCI_BUS_ID")]
    PciBusId,
}

impl DeviceOrder {
    /// Reads `CUDA_DEVICE_ORDER` (unset = `FASTEST_FIRST`).
    ///
    /// # Errors
    ///
    /// [`TopologyError::Env`](Error::Env) for a value other than
    /// `FASTEST_FIRST` or `PCI_BUS_ID`.
    pub fn from_env(value: Option<&str>) -> Result<Self, Error> {
        match value.map(str::trim) {
            None | Some("") | Some("FASTEST_FIRST") => Ok(Self::FastestFirst),
            Some("PCI_BUS_ID") => Ok(Self::PciBusId),
            Some(other) => Err(Error::env(
                "CUDA_DEVICE_ORDER",
                other,
                "not a CUDA device order",
                "set it to FASTEST_FIRST (CUDA's default) or PCI_BUS_ID, or unset it",
            )),
        }
    }

    /// The name CUDA uses.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::FastestFirst => "FASTEST_FIRST",
            Self::PciBusId => "PCI_BUS_ID",
        }
    }
}

/// One entry of `CUDA_VISIBLE_DEVICES`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VisibleToken {
    /// A position in CUDA's enumeration order.
    Index(u32),
    /// A GPU UUID or unique prefix of one, lower case, without `GPU-`.
    GpuUuid(String),
    /// A MIG instance UUID (lower case, without `MIG-`).
    MigUuid(String),
    /// The older MIG form: parent GPU UUID (without `GPU-`), GPU and compute
    /// instance.
    MigLegacy {
        /// Parent GPU UUID, lower case, without `GPU-`.
        gpu_uuid: String,
        /// GPU instance.
        gi: u32,
        /// Compute instance.
        ci: u32,
    },
}

/// The parsed variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VisibleDevices {
    /// The raw value.
    pub raw: String,
    /// The entries, in order (after an end marker such as `-1`, none).
    pub tokens: Vec<(String, VisibleToken)>,
}

/// One CUDA ordinal this process sees.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VisibleEntry {
    /// The CUDA ordinal (0, 1, ... as the process sees them).
    pub ordinal: CudaOrdinal,
    /// The `CUDA_VISIBLE_DEVICES` entry that produced it (or `"*"` when the
    /// variable is unset).
    pub entry: String,
    /// The GPU it is ([`super::Gpu::index`]), `None` when it cannot be
    /// worked out without the driver (a MIG UUID, a UUID with no UUIDs known).
    pub gpu: Option<GpuIndex>,
    /// Whether the entry is a MIG instance of that GPU.
    pub mig: bool,
}

fn env_err(value: &str, problem: String) -> Error {
    Error::env(
        "CUDA_VISIBLE_DEVICES",
        value,
        problem,
        "use comma-separated GPU indices (0,1), GPU-<uuid> or MIG-<uuid> as `nvidia-smi -L` prints them, or unset the variable",
    )
}

fn is_uuid_text(s: &str) -> bool {
    !s.is_empty() && s.len() <= 36 && s.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

impl VisibleDevices {
    /// Parses the variable's value.
    ///
    /// # Errors
    ///
    /// [`TopologyError::Env`](Error::Env) naming `CUDA_VISIBLE_DEVICES` for an
    /// entry that is not an index, `GPU-`/`MIG-` UUID or prefix.
    pub fn parse(value: &str) -> Result<Self, Error> {
        let mut tokens = Vec::new();
        let trimmed = value.trim();
        if !trimmed.is_empty() {
            for raw_tok in trimmed.split(',') {
                let tok = raw_tok.trim();
                // As messages quote it: a hostile value can be megabytes.
                let shown = crate::report::shorten(tok);
                if tok.is_empty() {
                    return Err(env_err(
                        value,
                        "an entry is empty (two commas in a row, or a trailing comma)".into(),
                    ));
                }
                let lower = tok.to_ascii_lowercase();
                let parsed = if let Some(rest) = lower.strip_prefix("mig-gpu-") {
                    let mut parts = rest.split('/');
                    let uuid = parts.next().unwrap_or_default();
                    let gi = parts.next().and_then(|s| s.parse().ok());
                    let ci = parts.next().and_then(|s| s.parse().ok());
                    match (is_uuid_text(uuid), gi, ci, parts.next()) {
                        (true, Some(gi), Some(ci), None) => VisibleToken::MigLegacy {
                            gpu_uuid: uuid.into(),
                            gi,
                            ci,
                        },
                        _ => {
                            return Err(env_err(
                                value,
                                format!("`{shown}` is not a MIG-GPU-<uuid>/<gi>/<ci> identifier"),
                            ))
                        }
                    }
                } else if let Some(rest) = lower.strip_prefix("mig-") {
                    if !is_uuid_text(rest) {
                        return Err(env_err(
                            value,
                            format!("`{shown}` is not a MIG-<uuid> identifier"),
                        ));
                    }
                    VisibleToken::MigUuid(rest.into())
                } else if let Some(rest) = lower.strip_prefix("gpu-") {
                    if !is_uuid_text(rest) {
                        return Err(env_err(
                            value,
                            format!("`{shown}` is not a GPU-<uuid> identifier"),
                        ));
                    }
                    VisibleToken::GpuUuid(rest.into())
                } else if let Some(neg) = tok.strip_prefix('-') {
                    if neg.bytes().all(|b| b.is_ascii_digit()) && !neg.is_empty() {
                        // CUDA stops at a negative index: `-1` hides every
                        // GPU listed after it (and, first, all of them).
                        break;
                    }
                    return Err(env_err(
                        value,
                        format!("`{shown}` is not a GPU index or UUID"),
                    ));
                } else if tok.bytes().all(|b| b.is_ascii_digit()) {
                    match tok.parse::<u32>() {
                        Ok(i) if i < 1 << 16 => VisibleToken::Index(i),
                        _ => {
                            return Err(env_err(
                                value,
                                format!("GPU index `{shown}` is out of range"),
                            ))
                        }
                    }
                } else {
                    return Err(env_err(
                        value,
                        format!("`{shown}` is not a GPU index, GPU-<uuid> or MIG-<uuid>"),
                    ));
                };
                tokens.push((tok.to_string(), parsed));
            }
        }
        Ok(Self {
            raw: value.to_string(),
            tokens,
        })
    }

    /// Maps each entry to a GPU. `order` lists [`super::Gpu::index`] values in
    /// CUDA's enumeration order; `uuids` gives each GPU's UUID (by GPU index,
    /// `GPU-...` form) when known. Returns the entries and notes for warnings.
    ///
    /// # Errors
    ///
    /// [`TopologyError::Env`](Error::Env) naming `CUDA_VISIBLE_DEVICES` for an
    /// entry that names no GPU of the machine, or one matching several.
    pub fn resolve(
        &self,
        order: &[u32],
        uuids: &[Option<String>],
    ) -> Result<(Vec<VisibleEntry>, Vec<String>), Error> {
        let mut out: Vec<VisibleEntry> = Vec::new();
        let mut notes = Vec::new();
        let norm = |u: &Option<String>| {
            u.as_ref().map(|s| {
                s.to_ascii_lowercase()
                    .trim_start_matches("gpu-")
                    .to_string()
            })
        };
        let any_uuid = uuids.iter().any(Option::is_some);
        for (text, tok) in &self.tokens {
            let (gpu, mig) = match tok {
                VisibleToken::Index(i) => match order.get(*i as usize) {
                    Some(g) => (Some(*g), false),
                    None => {
                        return Err(env_err(
                            &self.raw,
                            format!(
                                "GPU index {i} is out of range: this machine has {} GPU(s), indices 0-{} (CUDA would silently hide it and every GPU after it)",
                                order.len(),
                                order.len().saturating_sub(1)
                            ),
                        ))
                    }
                },
                VisibleToken::GpuUuid(prefix) | VisibleToken::MigLegacy { gpu_uuid: prefix, .. } => {
                    let is_mig = matches!(tok, VisibleToken::MigLegacy { .. });
                    if !any_uuid {
                        notes.push(format!(
                            "CUDA_VISIBLE_DEVICES entry `{text}` names a UUID, but no GPU UUIDs are known without the CUDA driver: its GPU is unknown"
                        ));
                        (None, is_mig)
                    } else {
                        let matches: Vec<u32> = order
                            .iter()
                            .copied()
                            .filter(|g| {
                                norm(&uuids.get(*g as usize).cloned().flatten())
                                    .is_some_and(|u| u.starts_with(prefix.as_str()))
                            })
                            .collect();
                        match matches.as_slice() {
                            [g] => (Some(*g), is_mig),
                            [] => return Err(env_err(&self.raw, format!("no GPU has a UUID starting with `{text}`"))),
                            _ => return Err(env_err(&self.raw, format!("`{text}` matches {} GPUs: give more of the UUID", matches.len()))),
                        }
                    }
                }
                VisibleToken::MigUuid(_) => {
                    notes.push(format!(
                        "CUDA_VISIBLE_DEVICES entry `{text}` is a MIG instance: its parent GPU is known only through the CUDA driver"
                    ));
                    (None, true)
                }
            };
            let gpu = gpu.map(GpuIndex);
            if let Some(g) = gpu {
                if !mig && out.iter().any(|e| e.gpu == Some(g) && !e.mig) {
                    return Err(env_err(&self.raw, format!("`{text}` names a GPU that is already listed (CUDA would silently stop here)")));
                }
            }
            out.push(VisibleEntry {
                ordinal: CudaOrdinal(u32_saturating(out.len())),
                entry: text.clone(),
                gpu,
                mig,
            });
        }
        Ok((out, notes))
    }
}

impl super::Topology {
    /// This description as a process with the CUDA variables `env` sees it
    /// (another process's `CUDA_VISIBLE_DEVICES` and `CUDA_DEVICE_ORDER`):
    /// [`CudaInfo::ordinals`](super::CudaInfo::ordinals), each GPU's
    /// [`cuda_ordinal`](super::Gpu::cuda_ordinal) and the
    /// `CUDA_VISIBLE_DEVICES` warnings worked out again; everything else
    /// is kept.
    ///
    /// CUDA's enumeration order comes from this description: PCI order for
    /// `PCI_BUS_ID` and when the ordinals were assumed from PCI order; the
    /// driver's order for `FASTEST_FIRST` when this description was made
    /// with every GPU visible in that order (as `numapin ps` makes it).
    /// Otherwise PCI order is assumed, with a warning.
    ///
    /// # Errors
    ///
    /// [`TopologyError::Env`](Error::Env) for values CUDA would not accept
    /// (the same as [`Topology::probe`](super::Topology::probe) gives).
    pub fn with_cuda_env(&self, env: &super::ProbeEnv) -> Result<super::Topology, Error> {
        let target = DeviceOrder::from_env(env.cuda_device_order.as_deref())?;
        let (order, mut notes) = self.enumeration_order(target);
        let uuids: Vec<Option<String>> = self.gpus.iter().map(|g| g.uuid.clone()).collect();
        let entries = match &env.cuda_visible_devices {
            Some(v) => {
                let parsed = VisibleDevices::parse(v)?;
                let (entries, more) = parsed.resolve(&order, &uuids)?;
                notes.extend(more);
                if parsed.tokens.is_empty() {
                    notes.push(format!(
                        "CUDA_VISIBLE_DEVICES={} hides every GPU from CUDA",
                        crate::report::quote(v)
                    ));
                }
                entries
            }
            None => order
                .iter()
                .enumerate()
                .map(|(i, &g)| VisibleEntry {
                    ordinal: CudaOrdinal(u32_saturating(i)),
                    entry: "*".into(),
                    gpu: Some(GpuIndex(g)),
                    mig: false,
                })
                .collect(),
        };
        let mut t = self.clone();
        for g in &mut t.gpus {
            g.cuda_ordinal = entries
                .iter()
                .find(|e| e.gpu == Some(g.index))
                .map(|e| e.ordinal);
        }
        t.cuda.visible_devices = env.cuda_visible_devices.clone();
        t.cuda.device_order = target.as_str().into();
        t.cuda.ordinals = entries;
        t.warnings
            .retain(|w| w.kind != super::WarningKind::CudaVisibleDevices);
        t.warnings
            .extend(notes.into_iter().map(|message| super::Warning {
                kind: super::WarningKind::CudaVisibleDevices,
                gpu: None,
                message,
            }));
        Ok(t)
    }

    /// GPU indices in CUDA's enumeration order `target`, as far as this
    /// description knows it, and a note when it had to assume PCI order.
    fn enumeration_order(&self, target: DeviceOrder) -> (Vec<u32>, Vec<String>) {
        let n = u32_saturating(self.gpus.len());
        let pci: Vec<u32> = (0..n).collect();
        let own = DeviceOrder::from_env(Some(&self.cuda.device_order)).unwrap_or_default();
        if target == DeviceOrder::PciBusId || self.cuda.ordinal_source != "driver" {
            return (pci, Vec::new());
        }
        if self.cuda.visible_devices.is_some() || own != target {
            return (pci, vec![format!(
                "CUDA's {} order of every GPU is unknown from {} (made with CUDA_VISIBLE_DEVICES or another order): PCI order assumed",
                target.as_str(),
                self.source
            )]);
        }
        let mut order: Vec<u32> = Vec::with_capacity(pci.len());
        for g in self.cuda.ordinals.iter().filter_map(|e| e.gpu) {
            if !order.contains(&g.0) {
                order.push(g.0);
            }
        }
        // GPUs the driver does not enumerate (other vendors' accelerators)
        // have no CUDA ordinal, as in the probe.
        (order, Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn uuids() -> Vec<Option<String>> {
        vec![
            Some("GPU-8932f937-d72c-4106-c12f-20bd9faed9f6".into()),
            Some("GPU-1f4e2a10-0000-1111-2222-333344445555".into()),
            Some("GPU-1f4e9b77-aaaa-bbbb-cccc-ddddeeeeffff".into()),
        ]
    }

    #[test]
    fn indices_pick_and_reorder() {
        let v = VisibleDevices::parse("2,0").unwrap();
        let (e, notes) = v.resolve(&[0, 1, 2], &[None, None, None]).unwrap();
        assert_eq!(
            e.iter()
                .map(|e| e.gpu.map(GpuIndex::get))
                .collect::<Vec<_>>(),
            vec![Some(2), Some(0)]
        );
        assert_eq!(e[1].ordinal, CudaOrdinal(1));
        assert!(notes.is_empty());
    }

    #[test]
    fn order_maps_indices() {
        // CUDA order puts GPU 2 first (fastest): index 0 is GPU 2.
        let v = VisibleDevices::parse("0").unwrap();
        let (e, _) = v.resolve(&[2, 0, 1], &[None, None, None]).unwrap();
        assert_eq!(e[0].gpu, Some(GpuIndex(2)));
    }

    #[test]
    fn uuids_and_prefixes() {
        let v = VisibleDevices::parse("GPU-8932f937,GPU-1f4e9").unwrap();
        let (e, _) = v.resolve(&[0, 1, 2], &uuids()).unwrap();
        assert_eq!(
            e.iter()
                .map(|e| e.gpu.map(GpuIndex::get))
                .collect::<Vec<_>>(),
            vec![Some(0), Some(2)]
        );
        let err = VisibleDevices::parse("GPU-1f4e")
            .unwrap()
            .resolve(&[0, 1, 2], &uuids())
            .unwrap_err();
        assert!(err.to_string().contains("matches 2 GPUs"), "{err}");
        let err = VisibleDevices::parse("GPU-ffff")
            .unwrap()
            .resolve(&[0, 1, 2], &uuids())
            .unwrap_err();
        assert!(err.to_string().contains("CUDA_VISIBLE_DEVICES"));
    }

    #[test]
    fn empty_hides_all_and_minus_one_ends() {
        let (e, _) = VisibleDevices::parse("")
            .unwrap()
            .resolve(&[0, 1], &[None, None])
            .unwrap();
        assert!(e.is_empty());
        let (e, _) = VisibleDevices::parse("-1")
            .unwrap()
            .resolve(&[0, 1], &[None, None])
            .unwrap();
        assert!(e.is_empty());
        let (e, _) = VisibleDevices::parse("1,-1,0")
            .unwrap()
            .resolve(&[0, 1], &[None, None])
            .unwrap();
        assert_eq!(e.len(), 1);
    }

    #[test]
    fn mig_maps_to_parent() {
        let v = VisibleDevices::parse("MIG-GPU-1f4e2a10-0000-1111-2222-333344445555/1/0,MIG-1234abcd-aaaa-bbbb-cccc-000011112222").unwrap();
        let (e, notes) = v.resolve(&[0, 1, 2], &uuids()).unwrap();
        assert_eq!(e[0].gpu, Some(GpuIndex(1)));
        assert!(e[0].mig);
        assert_eq!(e[1].gpu, None);
        assert!(e[1].mig);
        assert_eq!(notes.len(), 1);
    }

    #[test]
    fn garbage_names_the_variable() {
        for bad in [
            "abc",
            "0,,1",
            "0,",
            "1.5",
            "GPU-xyz",
            "MIG-GPU-abc",
            "99999999999",
            "--1",
        ] {
            let err = VisibleDevices::parse(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad:?} should fail"));
            assert!(err.to_string().contains("CUDA_VISIBLE_DEVICES"), "{err}");
        }
        let err = VisibleDevices::parse("0,7")
            .unwrap()
            .resolve(&[0, 1], &[None, None])
            .unwrap_err();
        assert!(err.to_string().contains("out of range"), "{err}");
        let err = VisibleDevices::parse("1,1")
            .unwrap()
            .resolve(&[0, 1], &[None, None])
            .unwrap_err();
        assert!(err.to_string().contains("already listed"), "{err}");
    }

    #[test]
    fn device_order() {
        assert_eq!(
            DeviceOrder::from_env(None).unwrap(),
            DeviceOrder::FastestFirst
        );
        assert_eq!(
            DeviceOrder::from_env(Some("PCI_BUS_ID")).unwrap(),
            DeviceOrder::PciBusId
        );
        let err = DeviceOrder::from_env(Some("pci")).unwrap_err();
        assert!(err.to_string().contains("CUDA_DEVICE_ORDER"));
    }

    proptest! {
        #[test]
        fn never_panics(s in "\\PC{0,60}", n in 0u32..9) {
            if let Ok(v) = VisibleDevices::parse(&s) {
                let order: Vec<u32> = (0..n).collect();
                let _ = v.resolve(&order, &vec![None; n as usize]);
            }
        }

        #[test]
        fn valid_index_lists_resolve(perm in Just((0u32..8).collect::<Vec<_>>()).prop_shuffle(), k in 0usize..8) {
            let pick = &perm[..k];
            let text = pick.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",");
            let (e, _) = VisibleDevices::parse(&text).unwrap().resolve(&(0..8).collect::<Vec<_>>(), &vec![None; 8]).unwrap();
            prop_assert_eq!(e.iter().map(|e| e.gpu.unwrap().get()).collect::<Vec<_>>(), pick.to_vec());
        }
    }

    fn env(cvd: Option<&str>, order: Option<&str>) -> crate::topology::ProbeEnv {
        crate::topology::ProbeEnv {
            cuda_visible_devices: cvd.map(String::from),
            cuda_device_order: order.map(String::from),
        }
    }

    fn ordinals(t: &crate::Topology) -> Vec<(u32, Option<u32>)> {
        t.cuda
            .ordinals
            .iter()
            .map(|e| (e.ordinal.0, e.gpu.map(GpuIndex::get)))
            .collect()
    }

    #[test]
    fn another_process_view_of_the_gpus() {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("topology/dgx-h100.xml");
        let t = crate::Topology::load(&p, &Default::default()).unwrap();
        assert_eq!(t.cuda.ordinal_source, "pci_order");
        let v = t.with_cuda_env(&env(Some("5,2"), None)).unwrap();
        assert_eq!(ordinals(&v), [(0, Some(5)), (1, Some(2))]);
        assert_eq!(v.gpus[5].cuda_ordinal, Some(CudaOrdinal(0)));
        assert_eq!(v.gpus[0].cuda_ordinal, None);
        assert_eq!(v.cuda.visible_devices.as_deref(), Some("5,2"));
        let all = t.with_cuda_env(&env(None, None)).unwrap();
        assert_eq!(ordinals(&all).len(), 8);
        let none = t.with_cuda_env(&env(Some(""), None)).unwrap();
        assert!(none.cuda.ordinals.is_empty());
        assert!(none
            .warnings
            .iter()
            .any(|w| w.message.contains("hides every GPU")));
        assert!(t.with_cuda_env(&env(Some("0,banana"), None)).is_err());
        assert!(t.with_cuda_env(&env(None, Some("SLOWEST"))).is_err());
        // A driver that enumerated the GPUs in another order (FASTEST_FIRST
        // with mixed models): indices follow it; PCI_BUS_ID follows PCI order.
        let mut d = t.clone();
        d.cuda.ordinal_source = "driver".into();
        d.cuda.ordinals.reverse();
        for (i, e) in d.cuda.ordinals.iter_mut().enumerate() {
            e.ordinal = CudaOrdinal(u32::try_from(i).unwrap());
        }
        let v = d.with_cuda_env(&env(Some("0"), None)).unwrap();
        assert_eq!(ordinals(&v), [(0, Some(7))]);
        let v = d
            .with_cuda_env(&env(Some("0"), Some("PCI_BUS_ID")))
            .unwrap();
        assert_eq!(ordinals(&v), [(0, Some(0))]);
        // Made with CUDA_VISIBLE_DEVICES: the driver's order of every GPU is
        // unknown, PCI order is assumed and said.
        d.cuda.visible_devices = Some("7,6".into());
        let v = d.with_cuda_env(&env(Some("0"), None)).unwrap();
        assert_eq!(ordinals(&v), [(0, Some(0))]);
        assert!(v
            .warnings
            .iter()
            .any(|w| w.message.contains("PCI order assumed")));
    }
}
