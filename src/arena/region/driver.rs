//! The driver backends ([`Backend::DriverNuma`],
//! [`Backend::HostAllocBound`]): one driver allocation replaces steps 1 to
//! 5, then the placement check of step 6.

use std::ptr::NonNull;
use std::time::Instant;

use super::super::huge::PageKind;
use super::super::{Backend, PinnedBy, PlacedBy, RegionMethods, RuntimeError, VerifiedBy};
use super::{
    fail_after, DriverMemory, Region, RegionOptions, Registration, Step, StepTimes, HUGE_PAGE,
};
use crate::platform::numa;

impl Region {
    /// A region from a driver backend: one allocation call (timed as the
    /// `map` step), then the placement check.
    pub(super) fn create_by_driver(o: &RegionOptions) -> Result<Region, RuntimeError> {
        use crate::platform::cuda::{self, host_numa};
        let len = o.size.div_ceil(HUGE_PAGE).max(1) * HUGE_PAGE;
        let driver_err = |source| RuntimeError::Backend {
            node: o.node,
            size: len as u64,
            backend: o.backend,
            source,
        };
        let started = Instant::now();
        let mut notes = Vec::new();
        let (memory, placed) = match o.backend {
            Backend::DriverNuma => {
                let devices: Vec<u32> = (0..cuda::device_count().map_err(driver_err)?).collect();
                let a = host_numa::NumaAlloc::new(o.node, len, &devices).map_err(driver_err)?;
                (DriverMemory::Numa(a), PlacedBy::DriverNuma)
            }
            _ => {
                let (a, refused) =
                    host_numa::host_alloc_on_node(o.node, len).map_err(driver_err)?;
                if let Some(e) = refused {
                    notes.push(format!(
                        "set_mempolicy refused ({}): cuMemHostAlloc placed the pages where the kernel chose",
                        numa::errno_name(&e)
                    ));
                }
                (DriverMemory::HostAlloc(a), PlacedBy::BindPolicy)
            }
        };
        let (ptr, got) = match &memory {
            DriverMemory::Numa(a) => (a.ptr(), a.len()),
            DriverMemory::HostAlloc(a) => (a.ptr().cast::<u8>(), a.len()),
        };
        let region = Region {
            ptr: NonNull::new(ptr).expect("the driver never returns null on success"),
            len: got,
            node: o.node,
            locked: false,
            registered: false,
            shared: false,
            parts: Vec::new(),
            part: 0,
            registration: Registration::Registered,
            pages_on_node: 0,
            pages_off_node: 0,
            methods: RegionMethods {
                placed,
                pinned: PinnedBy::Driver,
                verified: VerifiedBy::MovePages,
                pages: PageKind::Driver,
            },
            notes,
            charge: None,
            machine: None,
            pid: std::process::id(),
            times: StepTimes {
                map: started.elapsed(),
                ..StepTimes::default()
            },
            threads: o.populate_threads.max(1),
            driver: Some(memory),
        };
        if fail_after(o, Step::Map) {
            return Err(RuntimeError::System {
                node: o.node,
                size: len as u64,
                step: Step::Map,
                source: std::io::Error::other("failure injected by a test"),
            });
        }
        region.verify(o, None)
    }
}
