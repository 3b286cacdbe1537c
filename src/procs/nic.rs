//! The `nic` check: the NICs `UCX_NET_DEVICES` and `NCCL_IB_HCA` select
//! for a process, against its GPU's nearest ([`crate::Topology::nic_pairing`],
//! as [`RankPlan::nics`](crate::affinity::RankPlan::nics) carries it).

use super::expect::Expected;
use super::snapshot::ProcessSnapshot;
use super::words::check;
use crate::affinity::{nic_env, NicEnv};
use crate::doctor::{Check, Verdict};
use crate::gpu::GpuIndex;
use crate::topology::{IoDevice, Relation, Topology};

/// The NICs a variable's value selects (positions in `Topology::nics`),
/// and the names in it that match no NIC. `None` for a value that selects
/// every NIC (`UCX_NET_DEVICES=all`).
pub(super) fn selected(t: &Topology, var: &str, value: &str) -> Option<(Vec<usize>, Vec<String>)> {
    let v = value.trim();
    if var == "UCX_NET_DEVICES" && (v.is_empty() || v == "all") {
        return None;
    }
    let (exclude, exact, list) = match (v.strip_prefix('^'), v.strip_prefix('=')) {
        (Some(rest), _) => (true, rest.starts_with('='), rest.trim_start_matches('=')),
        (None, Some(rest)) => (false, true, rest),
        // UCX names devices exactly; NCCL_IB_HCA entries are prefixes.
        _ => (false, var != "NCCL_IB_HCA", v),
    };
    let names: Vec<&str> = list
        .split(',')
        .map(|e| e.trim().split(':').next().unwrap_or("").trim())
        .filter(|e| !e.is_empty())
        .collect();
    let matches = |n: &IoDevice, name: &str| {
        n.rdma_device.iter().chain(&n.names).any(|d| {
            if exact {
                d == name
            } else {
                d.starts_with(name)
            }
        })
    };
    let unmatched: Vec<String> = names
        .iter()
        .filter(|name| !t.nics.iter().any(|n| matches(n, name)))
        .map(|s| s.to_string())
        .collect();
    let picked = (0..t.nics.len()).filter(|&i| {
        let hit = names.iter().any(|name| matches(&t.nics[i], name));
        if exclude {
            !hit && t.nics[i].kind.is_rdma()
        } else {
            hit
        }
    });
    Some((picked.collect(), unmatched))
}

/// The label and relation of NIC `i` to `gpu`.
fn nic_text(t: &Topology, i: usize, gpu: GpuIndex) -> String {
    let n = &t.nics[i];
    format!("{} ({} from GPU {gpu})", n.label(), n.relation_to(gpu))
}

/// The check, for a process judged against one GPU whose plan has NICs.
pub(super) fn nic(t: &Topology, s: &ProcessSnapshot, e: &Expected) -> Option<Check> {
    let plan = e.plan.as_ref()?;
    let gpu = plan.gpu?;
    let best = plan.nics.first()?;
    let env = s.environment.as_ref()?;
    let pid = s.pid;
    let nearest = format!("its nearest NIC is {}", nic_text(t, best.nic, gpu));
    let mut parts = Vec::new();
    let mut verdict = Verdict::Ok;
    let mut fix_for = None;
    for (var, which) in [
        ("UCX_NET_DEVICES", NicEnv::Ucx),
        ("NCCL_IB_HCA", NicEnv::Nccl),
    ] {
        let Some(value) = env.get(var) else { continue };
        let (v, text) = judge_var(t, var, value, gpu, best.relation);
        if v > Verdict::Ok && fix_for.is_none() {
            fix_for = Some((var, which));
        }
        verdict = verdict.max(v);
        parts.push(text);
    }
    if parts.is_empty() {
        parts.push("UCX_NET_DEVICES and NCCL_IB_HCA are not set (the libraries choose; NCCL picks the GPU's nearest NIC itself)".into());
    }
    let evidence = format!("{}; {nearest}", parts.join("; "));
    let fix = match fix_for {
        Some((var, which)) => match nic_env(t, plan, which) {
            Ok((_, value)) => format!(
                "start it with `numapin exec --nic-env {} -- CMD`, which sets {var}={value} for GPU {gpu}",
                if which == NicEnv::Ucx { "ucx" } else { "nccl" }
            ),
            Err(e) => format!("set {var} to the NIC near GPU {gpu} ({})", e),
        },
        None => String::new(),
    };
    Some(check("nic", pid, verdict, evidence, fix))
}

/// One variable's verdict and sentence.
fn judge_var(
    t: &Topology,
    var: &str,
    value: &str,
    gpu: GpuIndex,
    best: Relation,
) -> (Verdict, String) {
    let shown = crate::report::shorten(value);
    let Some((picked, unmatched)) = selected(t, var, value) else {
        return (Verdict::Ok, format!("{var}={shown} (every NIC)"));
    };
    let missing = if unmatched.is_empty() {
        String::new()
    } else {
        format!(
            ", and names {} which this machine does not have",
            unmatched.join(", ")
        )
    };
    if picked.is_empty() {
        return (
            Verdict::Warn,
            format!("{var}={shown} selects no NIC of this machine{missing}"),
        );
    }
    let rel = |i: usize| t.nics[i].relation_to(gpu);
    let closest = picked
        .iter()
        .map(|&i| rel(i))
        .min()
        .unwrap_or(Relation::Sys);
    let farthest = picked
        .iter()
        .map(|&i| rel(i))
        .max()
        .unwrap_or(Relation::Sys);
    let names: Vec<String> = picked.iter().map(|&i| nic_text(t, i, gpu)).collect();
    // Crossing to another node (SOCK, SYS) fails; a NIC of the same node
    // reached through the host bridge instead of a switch only warns.
    let v = if closest > best && closest >= Relation::Sock {
        Verdict::Fail
    } else if closest > best || farthest > best || !unmatched.is_empty() {
        Verdict::Warn
    } else {
        Verdict::Ok
    };
    let tail = if closest > best {
        ": all farther than its nearest"
    } else if farthest > best {
        ": some farther than its nearest"
    } else {
        ""
    };
    (
        v,
        format!("{var}={shown} selects {}{missing}{tail}", names.join(", ")),
    )
}
