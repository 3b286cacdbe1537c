//! `numapin.doctor()`: the library's checks ([`numapin::doctor`]) as
//! Python objects, for a trainer to log at start-up.

use numapin::doctor::{Check, DoctorOptions};
use numapin::topology::{CudaMode, ProbeOptions};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

use crate::errors::to_py;

/// One check of `numapin doctor`: its name, what it is about, the verdict,
/// the evidence it read and, for `warn` and `fail`, what to do.
#[pyclass(frozen, eq, hash, module = "numapin._numapin", name = "DoctorCheck")]
#[derive(PartialEq, Eq, Hash)]
pub(crate) struct DoctorCheck {
    name: &'static str,
    subject: Option<String>,
    verdict: &'static str,
    evidence: String,
    fix: Option<String>,
    gpu: Option<u32>,
    node: Option<u32>,
    nic: Option<usize>,
}

impl From<&Check> for DoctorCheck {
    fn from(c: &Check) -> Self {
        DoctorCheck {
            name: c.name,
            subject: c.subject.label(),
            verdict: c.verdict.as_str(),
            evidence: c.evidence.clone(),
            fix: c.fix.clone(),
            gpu: c.gpu().map(|g| g.get()),
            node: c.node(),
            nic: c.nic(),
        }
    }
}

#[pymethods]
impl DoctorCheck {
    /// The check's stable name (`memlock`, `pcie_link`, `pin_probe`, ...).
    #[getter]
    fn name(&self) -> &'static str {
        self.name
    }

    /// What it is about: `GPU 0`, `node 1`, `NIC 2`, or `None` for the
    /// machine as a whole.
    #[getter]
    fn subject(&self) -> Option<&str> {
        self.subject.as_deref()
    }

    /// `ok`, `warn`, `fail`, or `skip` (not run; the evidence says why).
    #[getter]
    fn verdict(&self) -> &'static str {
        self.verdict
    }

    /// What was read, with the values.
    #[getter]
    fn evidence(&self) -> &str {
        &self.evidence
    }

    /// What to do, or `None` when there is nothing to do.
    #[getter]
    fn fix(&self) -> Option<&str> {
        self.fix.as_deref()
    }

    /// The GPU it is about (its index in `Topology.gpus`), if any.
    #[getter]
    fn gpu(&self) -> Option<u32> {
        self.gpu
    }

    /// The NUMA node it is about, if any.
    #[getter]
    fn node(&self) -> Option<u32> {
        self.node
    }

    /// The NIC it is about (its index in the topology's NICs), if any.
    #[getter]
    fn nic(&self) -> Option<usize> {
        self.nic
    }

    /// The check as a dict with the keys of `numapin doctor --json`.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("name", self.name)?;
        d.set_item("verdict", self.verdict)?;
        d.set_item("evidence", &self.evidence)?;
        d.set_item("fix", &self.fix)?;
        d.set_item("gpu", self.gpu)?;
        d.set_item("node", self.node)?;
        d.set_item("nic", self.nic)?;
        d.set_item("subject", &self.subject)?;
        Ok(d)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        // Python's own quoting, so the text reads as it would for a str.
        let r = |v: Option<&str>| -> PyResult<String> {
            match v {
                Some(v) => Ok(PyString::new(py, v).repr()?.to_string()),
                None => Ok("None".into()),
            }
        };
        Ok(format!(
            "DoctorCheck(name={}, subject={}, verdict={}, evidence={}, fix={})",
            r(Some(self.name))?,
            r(self.subject.as_deref())?,
            r(Some(self.verdict))?,
            r(Some(&self.evidence))?,
            r(self.fix.as_deref())?,
        ))
    }
}

/// The checks of `numapin doctor` for this machine, or for a saved
/// machine at `input` (only the checks of its topology run; the others
/// come back with verdict `skip`). `cuda`: load the CUDA driver;
/// `pin_probe`: pin a small probe region on each NUMA node.
#[pyfunction]
#[pyo3(signature = (input=None, *, cuda=true, pin_probe=true))]
pub(crate) fn doctor(
    py: Python<'_>,
    input: Option<std::path::PathBuf>,
    cuda: bool,
    pin_probe: bool,
) -> PyResult<Vec<DoctorCheck>> {
    let report = py
        .detach(|| {
            let mut probe = ProbeOptions::from_process();
            if !cuda {
                probe.cuda = CudaMode::Off;
            }
            let topo = crate::topology::read(input.as_deref(), &probe)?;
            let opts = DoctorOptions::default()
                .with_live_state(input.is_none())
                .with_cuda(cuda)
                .with_pin_probe(pin_probe);
            Ok::<_, numapin::Error>(numapin::doctor::run(&topo, &opts))
        })
        .map_err(|e| to_py(py, &e))?;
    Ok(report.checks.iter().map(DoctorCheck::from).collect())
}
