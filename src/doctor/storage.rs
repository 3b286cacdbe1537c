//! `storage_locality`: the local filesystems (checkpoints, datasets) on
//! drives behind another socket than the GPUs that will read them.

use crate::storage::FileLocation;
use crate::topology::Topology;

use super::check::Check;

const NAME: &str = "storage_locality";

/// One check per mounted local filesystem on a multi-node machine: a
/// warning naming the GPUs that would read it across the socket link (or
/// from another node of their socket), a pass naming the GPUs it is local
/// to. One pass on a one-node machine or without local filesystems.
pub(crate) fn storage_locality(t: &Topology, mounts: &[FileLocation]) -> Vec<Check> {
    if t.numa_nodes.len() <= 1 {
        return vec![Check::ok(
            NAME,
            "one NUMA node: every drive is local to every GPU",
        )];
    }
    let placed: Vec<&FileLocation> = mounts
        .iter()
        .filter(|m| m.drives.iter().any(|d| d.numa_node.is_some()))
        .collect();
    if placed.is_empty() || t.gpus.is_empty() {
        return vec![Check::ok(
            NAME,
            format!(
                "{} local filesystem(s), none on a drive of known NUMA node, or no GPU",
                mounts.len()
            ),
        )];
    }
    placed.into_iter().map(|m| one(t, m)).collect()
}

fn one(t: &Topology, m: &FileLocation) -> Check {
    let mut far = Vec::new();
    let mut near = Vec::new();
    for g in &t.gpus {
        let Some(node) = g.numa_node else { continue };
        if m.warnings_for(t, node, Some(g.index)).is_empty() {
            near.push(g.index.to_string());
        } else {
            far.push((g.index.to_string(), node));
        }
    }
    let place = format!("{} is on {}", m.path.display(), m.describe());
    if far.is_empty() {
        return Check::ok(NAME, format!("{place}: local to GPU(s) {}", near.join(",")));
    }
    let ids: Vec<&str> = far.iter().map(|f| f.0.as_str()).collect();
    let mut nodes: Vec<u32> = far.iter().map(|f| f.1).collect();
    nodes.sort_unstable();
    nodes.dedup();
    let nodes: Vec<String> = nodes.iter().map(u32::to_string).collect();
    Check::warn(
        NAME,
        format!(
            "{place}: GPU(s) {} (node {}) read it from another NUMA node or across the socket link",
            ids.join(","),
            nodes.join(",")
        ),
        format!(
            "keep the checkpoints and datasets of GPU(s) {} on a drive of node {} (`numapin topo` lists the drives), or read these files on GPUs near the drive",
            ids.join(","),
            nodes.join(",")
        ),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::storage::Drive;

    #[test]
    fn a_drive_behind_the_other_socket_warns_for_the_far_gpus() {
        let p = concat!(env!("CARGO_MANIFEST_DIR"), "/topology/dgx-h100.xml");
        let t = Topology::load(std::path::Path::new(p), &Default::default()).expect("fixture");
        let far_node = t
            .numa_nodes
            .iter()
            .map(|n| n.os_index)
            .max()
            .expect("nodes");
        let m = FileLocation::on_drives(
            "/data",
            "nvme3n1p1",
            vec![Drive::new(
                "nvme3n1",
                Some("0000:c1:00.0".into()),
                Some(far_node),
            )],
        );
        let checks = storage_locality(&t, &[m]);
        assert_eq!(checks.len(), 1);
        let c = &checks[0];
        assert_eq!(
            c.verdict,
            super::super::check::Verdict::Warn,
            "{}",
            c.evidence
        );
        assert!(
            c.evidence.contains("/data is on") && c.evidence.contains("nvme3n1"),
            "{}",
            c.evidence
        );
        assert!(c
            .fix
            .as_deref()
            .is_some_and(|f| f.contains("drive of node")));
        let one = Topology::load(
            std::path::Path::new(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/topology/cloud-vm-1n.xml"
            )),
            &Default::default(),
        )
        .expect("fixture");
        assert_eq!(storage_locality(&one, &[]).len(), 1);
    }
}
