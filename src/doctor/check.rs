//! One diagnosis: [`Check`], its [`Verdict`] and its [`Subject`].

use serde::ser::{Serialize, SerializeStruct, Serializer};

use crate::gpu::GpuIndex;

/// How a check came out. Ordered: `Skip < Ok < Warn < Fail`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Verdict {
    /// Not run (a saved machine's topology has no live state to read, or
    /// the caller turned the check off); the evidence says why.
    Skip,
    /// Nothing to do.
    Ok,
    /// Worth a look: costs performance or hides information, numapin still
    /// works.
    Warn,
    /// Broken: numapin (or the workload) cannot do its job this way.
    Fail,
}

impl Verdict {
    /// `skip`, `ok`, `warn` or `fail`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Verdict::Skip => "skip",
            Verdict::Ok => "ok",
            Verdict::Warn => "warn",
            Verdict::Fail => "fail",
        }
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a check is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Subject {
    /// The machine or the process as a whole.
    Machine,
    /// A GPU ([`crate::topology::Gpu::index`]).
    Gpu(GpuIndex),
    /// A NUMA node (its OS index).
    Node(u32),
    /// A NIC (its position in [`crate::Topology::nics`]).
    Nic(usize),
    /// A running process, by pid (`numapin ps`: [`crate::procs`]).
    Process(u32),
}

impl Subject {
    /// `GPU 0`, `node 1`, `NIC 2`, `pid 42`; `None` for [`Subject::Machine`].
    pub fn label(&self) -> Option<String> {
        match self {
            Subject::Machine => None,
            Subject::Gpu(g) => Some(format!("GPU {g}")),
            Subject::Node(n) => Some(format!("node {n}")),
            Subject::Nic(n) => Some(format!("NIC {n}")),
            Subject::Process(p) => Some(format!("pid {p}")),
        }
    }
}

/// One diagnosis: what was checked, about what, the verdict, the evidence
/// read and, for `warn` and `fail`, what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Check {
    /// A stable name (`memlock`, `pcie_link`, `pin_probe`, ...:
    /// [`CHECKS`](super::CHECKS)).
    pub name: &'static str,
    /// What it is about.
    pub subject: Subject,
    /// The verdict.
    pub verdict: Verdict,
    /// What was read, with the values, in a sentence a person can check
    /// (for [`Verdict::Skip`], why the check did not run).
    pub evidence: String,
    /// What to do (`None` when there is nothing to do).
    pub fix: Option<String>,
}

impl Check {
    /// A passing check.
    pub(crate) fn ok(name: &'static str, evidence: impl Into<String>) -> Self {
        Self::new(name, Verdict::Ok, evidence, None)
    }

    /// A warning with its fix.
    pub(crate) fn warn(
        name: &'static str,
        evidence: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self::new(name, Verdict::Warn, evidence, Some(fix.into()))
    }

    /// A failure with its fix.
    pub(crate) fn fail(
        name: &'static str,
        evidence: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self::new(name, Verdict::Fail, evidence, Some(fix.into()))
    }

    /// A check that did not run, and why.
    pub(crate) fn skip(name: &'static str, why: impl Into<String>) -> Self {
        Self::new(name, Verdict::Skip, why, None)
    }

    fn new(
        name: &'static str,
        verdict: Verdict,
        evidence: impl Into<String>,
        fix: Option<String>,
    ) -> Self {
        Self {
            name,
            subject: Subject::Machine,
            verdict,
            evidence: evidence.into(),
            fix,
        }
    }

    /// The same check, about GPU `gpu`.
    pub(crate) fn for_gpu(mut self, gpu: GpuIndex) -> Self {
        self.subject = Subject::Gpu(gpu);
        self
    }

    /// The same check, about NIC `nic`.
    pub(crate) fn for_nic(mut self, nic: usize) -> Self {
        self.subject = Subject::Nic(nic);
        self
    }

    /// The same check, about NUMA node `node`.
    pub(crate) fn for_node(mut self, node: u32) -> Self {
        self.subject = Subject::Node(node);
        self
    }

    /// The same check, about process `pid`.
    pub(crate) fn for_process(mut self, pid: u32) -> Self {
        self.subject = Subject::Process(pid);
        self
    }

    /// The GPU it is about, if any.
    pub fn gpu(&self) -> Option<GpuIndex> {
        match self.subject {
            Subject::Gpu(g) => Some(g),
            _ => None,
        }
    }

    /// The NUMA node it is about, if any.
    pub fn node(&self) -> Option<u32> {
        match self.subject {
            Subject::Node(n) => Some(n),
            _ => None,
        }
    }

    /// The NIC it is about, if any.
    pub fn nic(&self) -> Option<usize> {
        match self.subject {
            Subject::Nic(n) => Some(n),
            _ => None,
        }
    }
}

/// Serialized as `numapin doctor --json` prints each check: `name`,
/// `verdict`, `evidence`, `fix`, then the subject as `gpu`, `node` and
/// `nic` (each a number or `null`) and `subject` (its label, or `null`).
impl Serialize for Check {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("Check", 8)?;
        st.serialize_field("name", self.name)?;
        st.serialize_field("verdict", &self.verdict)?;
        st.serialize_field("evidence", &self.evidence)?;
        st.serialize_field("fix", &self.fix)?;
        st.serialize_field("gpu", &self.gpu())?;
        st.serialize_field("node", &self.node())?;
        st.serialize_field("nic", &self.nic())?;
        st.serialize_field("subject", &self.subject.label())?;
        st.end()
    }
}
