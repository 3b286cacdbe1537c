//! Writing a batch into a slot from the process that holds it: the bytes
//! go in with streaming stores (no read of each destination line first,
//! nothing left in the writer's cache, which the copy to the GPU does not
//! read), on threads bound to CPUs the caller names.

use std::sync::atomic::Ordering;

use super::{pool_error, SlotPool};
use crate::cpulist::CpuList;
use crate::shared::SharedError;

impl SlotPool {
    /// Copies `srcs` one after another into slot `slot` from byte
    /// `offset` on (each source starting where the one before ended, plus
    /// `gap(i)` bytes of padding after source `i`), with streaming stores,
    /// a source of 4 MiB or more on threads bound to `cpus` (kept per CPU
    /// set, so a worker pays no thread start per batch; one CPU or none: the
    /// calling thread). The calling process must hold the slot (it took it
    /// with [`acquire`](Self::acquire)). Returns the byte after the last
    /// source.
    ///
    /// # Errors
    ///
    /// [`SharedError::Pool`] for a slot not made or not held by this
    /// process, or bytes that run past the slot; [`SharedError::System`]
    /// when a worker cannot map the slots.
    pub fn write(
        &self,
        slot: u32,
        offset: usize,
        srcs: &[&[u8]],
        gap: impl Fn(usize) -> usize,
        cpus: &CpuList,
    ) -> Result<usize, SharedError> {
        let (_, slot_bytes) = self.geometry();
        let past = || {
            pool_error(format!(
                "{} sources from offset {offset} run past the {slot_bytes}-byte slot",
                srcs.len()
            ))
        };
        if offset > slot_bytes {
            return Err(past());
        }
        let mut end = offset;
        let mut at = Vec::with_capacity(srcs.len());
        for (i, s) in srcs.iter().enumerate() {
            at.push(end);
            end = end
                .checked_add(s.len())
                .and_then(|e| e.checked_add(gap(i)))
                .filter(|&e| e <= slot_bytes)
                .ok_or_else(past)?;
        }
        let base = self.slot_ptr(slot)?;
        let me = nix::unistd::getpid().as_raw();
        if self.header().holder[slot as usize].load(Ordering::Acquire) != me {
            return Err(pool_error(format!(
                "slot {slot} is not held by this process (take it with acquire first)"
            )));
        }
        for (s, &off) in srcs.iter().zip(&at) {
            if s.is_empty() {
                continue;
            }
            // SAFETY: off..off + s.len() lies inside the slot (checked
            // above), which this process holds: no other process writes it
            // until it is released, and the main process reads it only
            // after the batch is handed over. `s` is the caller's memory,
            // which cannot overlap the slot (a slice of the pool's
            // mapping cannot be borrowed immutably while it is written).
            let dst = unsafe { std::slice::from_raw_parts_mut(base.add(off), s.len()) };
            let _ = crate::staged::copy_host(dst, s, cpus);
        }
        Ok(end)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests fail loudly

    use std::time::Duration;

    use super::SlotPool;
    use crate::cpulist::CpuList;
    use crate::runtime::{Runtime, RuntimeConfig, Target};
    use crate::topology::{ProbeOptions, Topology};

    const MIB: usize = 1 << 20;

    fn pool(slot_bytes: usize) -> (SlotPool, Runtime) {
        let t = Topology::probe(&ProbeOptions::from_process()).unwrap();
        let rt = Runtime::new(t, RuntimeConfig::default().with_register(false)).unwrap();
        let p = SlotPool::create().unwrap();
        p.provision(&rt, Target::Host, (2, slot_bytes), 2, false)
            .unwrap();
        (p, rt)
    }

    /// Sources land one after another at the offset, each followed by its
    /// padding, byte for byte (small ones on the calling thread, one of
    /// 4 MiB or more on two threads), and nothing outside them changes.
    #[test]
    fn sources_land_one_after_another_with_their_padding() {
        let (p, _rt) = pool(8 * MIB);
        let slot = p.acquire(Duration::ZERO).unwrap();
        let base = p.slot_ptr(slot).unwrap();
        // SAFETY: the slot is this process's (taken above), 8 MiB long.
        let mem = unsafe { std::slice::from_raw_parts_mut(base, 8 * MIB) };
        mem.fill(0xEE);
        let a: Vec<u8> = (0..1000).map(|i| u8::try_from(i % 251).unwrap()).collect();
        let b: Vec<u8> = (0..(4 * MIB + 33))
            .map(|i| u8::try_from(i % 241).unwrap() ^ 0x5A)
            .collect();
        let cpus: CpuList = (0..2).collect();
        let pad = |i: usize| [24, 0][i];
        let end = p.write(slot, 100, &[&a, &b], pad, &cpus).unwrap();
        assert_eq!(end, 100 + 1000 + 24 + b.len());
        // SAFETY: as above.
        let mem = unsafe { std::slice::from_raw_parts(base, 8 * MIB) };
        assert!(mem[..100].iter().all(|&x| x == 0xEE));
        assert_eq!(&mem[100..1100], &a[..]);
        assert!(
            mem[1100..1124].iter().all(|&x| x == 0xEE),
            "padding is skipped, not written"
        );
        assert_eq!(&mem[1124..1124 + b.len()], &b[..]);
        assert!(mem[end..].iter().all(|&x| x == 0xEE));
    }

    /// Bytes past the slot, a slot this process does not hold, and a slot
    /// the pool does not have are errors, and nothing is written.
    #[test]
    fn writes_past_the_slot_or_into_a_free_one_are_refused() {
        let (p, _rt) = pool(2 * MIB);
        let slot = p.acquire(Duration::ZERO).unwrap();
        let big = vec![1u8; 2 * MIB];
        let cpus = CpuList::new();
        let e = p.write(slot, 1, &[&big], |_| 0, &cpus).unwrap_err();
        assert!(e.to_string().contains("run past"), "{e}");
        let e = p
            .write(slot, 0, &[&big[..10]], |_| 2 * MIB, &cpus)
            .unwrap_err();
        assert!(e.to_string().contains("run past"), "{e}");
        assert_eq!(p.write(slot, 0, &[&big], |_| 0, &cpus).unwrap(), 2 * MIB);
        p.release(slot);
        let e = p.write(slot, 0, &[&big[..10]], |_| 0, &cpus).unwrap_err();
        assert!(e.to_string().contains("not held"), "{e}");
        assert!(p.write(7, 0, &[&big[..10]], |_| 0, &cpus).is_err());
    }
}
