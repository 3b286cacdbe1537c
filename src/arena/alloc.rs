//! The sub-allocator's bookkeeping: a TLSF (two-level segregated fit)
//! allocator over any number of regions, with no memory of its own.
//!
//! # Why TLSF
//!
//! Requests run from one 4 KiB page to a whole 256 MiB region, and the
//! arena must hold at most 1.10 bytes per byte requested.
//!
//! * A **buddy** allocator rounds every request up to a power of two: on
//!   random sizes it holds about 1.33-1.5 bytes per byte, and the
//!   power-of-two pinned cache of one well-known framework was seen holding
//!   1.85. Ruled out by the waste target.
//! * **Size-class slabs** waste up to a class step per buffer and cannot
//!   serve sizes from a page to 256 MiB without thousands of classes or a
//!   second allocator for large sizes.
//! * **TLSF** splits a free block to the exact (page-rounded) size and
//!   merges neighbours on free, so the only rounding is to the granule
//!   (4 KiB by default). Finding a block is O(1): two bitmap scans pick the
//!   first non-empty list of free blocks whose class is at least the
//!   request's class ("good fit", at most 1/32 larger than needed).
//!   Freeing is O(1) too. The worst case is bounded, which matters under a
//!   lock on the allocation path.
//!
//! # Model
//!
//! Sizes and offsets are bytes, multiples of the granule (a power of two
//! from 4 KiB to 2 MiB, also the alignment of every block: regions start
//! 2 MiB-aligned). Each region is a run of blocks in address order; a block
//! is free or used; two free neighbours never stay apart, except across a
//! *part boundary*: a region added in parts ([`Tlsf::add_region_in_parts`])
//! never has a block that spans two parts (CUDA refuses a copy whose range
//! spans two registrations, and such a region is registered part by part).
//! Blocks live in a
//! slab (`Vec`) and refer to each other by index, so the whole structure is
//! safe code with no pointers, and Miri can run its tests.

/// No block (end of a list).
const NIL: u32 = u32::MAX;
/// Log2 of the number of second-level lists per first-level class.
const SL_LOG2: u32 = 5;
/// Second-level lists per first-level class.
const SL_COUNT: usize = 1 << SL_LOG2;
/// First-level classes: block sizes up to 2^63 granules.
const FL_COUNT: usize = 64;

/// A block in use, as handed out by [`Tlsf::alloc`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    /// Handle to give back to [`Tlsf::free`].
    pub id: u32,
    /// The region (as returned by [`Tlsf::add_region`]).
    pub region: u32,
    /// Offset from the region's start, in bytes.
    pub offset: u64,
    /// Size in bytes (the request rounded up to the granule).
    pub size: u64,
}

#[derive(Debug, Clone, Copy)]
struct Node {
    region: u32,
    offset: u64,
    size: u64,
    free: bool,
    prev_phys: u32,
    next_phys: u32,
    prev_free: u32,
    next_free: u32,
}

#[derive(Debug, Clone, Copy)]
struct RegionInfo {
    size: u64,
    first: u32,
    /// Bytes per part (a multiple of the granule), 0 for a region in one
    /// piece: no block crosses a multiple of it.
    part: u64,
    /// Blocks in use.
    used: u32,
}

/// TLSF bookkeeping over regions of address space (see the module docs).
#[derive(Debug, Clone)]
pub struct Tlsf {
    granule_log2: u32,
    nodes: Vec<Node>,
    spare_nodes: Vec<u32>,
    regions: Vec<Option<RegionInfo>>,
    fl_bitmap: u64,
    sl_bitmap: [u32; FL_COUNT],
    heads: Vec<u32>,
    used_bytes: u64,
    region_bytes: u64,
}

/// Rounds `n` up to a multiple of the power of two `to`.
pub fn round_up(n: u64, to: u64) -> u64 {
    debug_assert!(to.is_power_of_two());
    n.div_ceil(to) * to
}

impl Tlsf {
    /// Empty bookkeeping with blocks aligned to `granule` bytes (a power of
    /// two, at least 1).
    pub fn new(granule: u64) -> Self {
        assert!(granule.is_power_of_two(), "granule must be a power of two");
        Tlsf {
            granule_log2: granule.trailing_zeros(),
            nodes: Vec::new(),
            spare_nodes: Vec::new(),
            regions: Vec::new(),
            fl_bitmap: 0,
            sl_bitmap: [0; FL_COUNT],
            heads: vec![NIL; FL_COUNT * SL_COUNT],
            used_bytes: 0,
            region_bytes: 0,
        }
    }

    /// The granule (block alignment and size unit) in bytes.
    pub fn granule(&self) -> u64 {
        1 << self.granule_log2
    }

    /// Bytes in blocks handed out and not yet freed.
    pub fn used_bytes(&self) -> u64 {
        self.used_bytes
    }

    /// Bytes in all regions.
    pub fn region_bytes(&self) -> u64 {
        self.region_bytes
    }

    #[cfg(any(test, feature = "internals"))]
    /// The number of live regions.
    pub fn region_count(&self) -> usize {
        self.regions.iter().filter(|r| r.is_some()).count()
    }

    #[cfg(any(test, feature = "internals"))]
    /// The size of region `region`, if it is live.
    pub fn region_size(&self, region: u32) -> Option<u64> {
        self.regions
            .get(region as usize)
            .copied()
            .flatten()
            .map(|r| r.size)
    }

    #[cfg(any(test, feature = "internals", feature = "measure"))]
    /// Adds a region of `size` bytes (a non-zero multiple of the granule),
    /// wholly free; returns its id. Ids of removed regions are reused.
    pub fn add_region(&mut self, size: u64) -> u32 {
        self.add_region_in_parts(size, 0)
    }

    /// [`Tlsf::add_region`] of a region in parts of `part` bytes (a
    /// multiple of the granule; 0 or at least `size`: one part): no block
    /// handed out from it spans two parts.
    pub fn add_region_in_parts(&mut self, size: u64, part: u64) -> u32 {
        assert!(
            size > 0 && size % self.granule() == 0,
            "region size must be a non-zero multiple of the granule"
        );
        assert!(
            part % self.granule() == 0,
            "part size must be a multiple of the granule"
        );
        let part = if part >= size { 0 } else { part };
        let id = match self.regions.iter().position(Option::is_none) {
            Some(i) => id(i),
            None => {
                self.regions.push(None);
                id(self.regions.len() - 1)
            }
        };
        let step = if part == 0 { size } else { part };
        let mut first = NIL;
        let mut prev = NIL;
        let mut offset = 0;
        while offset < size {
            let n = self.new_node(Node {
                region: id,
                offset,
                size: step.min(size - offset),
                free: true,
                prev_phys: prev,
                next_phys: NIL,
                prev_free: NIL,
                next_free: NIL,
            });
            if prev == NIL {
                first = n;
            } else {
                self.nodes[prev as usize].next_phys = n;
            }
            self.insert_free(n);
            prev = n;
            offset += step;
        }
        self.regions[id as usize] = Some(RegionInfo {
            size,
            first,
            part,
            used: 0,
        });
        self.region_bytes += size;
        id
    }

    /// Whether region `region` holds no block in use.
    pub fn region_is_empty(&self, region: u32) -> bool {
        self.regions
            .get(region as usize)
            .copied()
            .flatten()
            .is_some_and(|r| r.used == 0)
    }

    /// Removes an empty region (see [`Tlsf::region_is_empty`]); returns
    /// whether it was removed.
    pub fn remove_region(&mut self, region: u32) -> bool {
        if !self.region_is_empty(region) {
            return false;
        }
        let r = self.regions[region as usize].take().expect("checked live");
        // Empty: one free block per part.
        let mut n = r.first;
        while n != NIL {
            self.remove_free(n);
            self.spare_nodes.push(n);
            n = self.nodes[n as usize].next_phys;
        }
        self.region_bytes -= r.size;
        true
    }

    /// The ids of the empty regions.
    pub fn empty_regions(&self) -> Vec<u32> {
        (0..id(self.regions.len()))
            .filter(|&r| self.region_is_empty(r))
            .collect()
    }

    /// Hands out a block of at least `bytes` (rounded up to the granule),
    /// or `None` when no region has a free block that large. `bytes` 0 is
    /// served as one granule.
    #[inline]
    pub fn alloc(&mut self, bytes: u64) -> Option<Block> {
        let size = round_up(bytes.max(1), self.granule());
        let units = size >> self.granule_log2;
        // Round the request up to the next class boundary so that every
        // block in the class found fits ("good fit").
        let search = if units < SL_COUNT as u64 {
            Some(units)
        } else {
            let fl = 63 - units.leading_zeros();
            let step = 1u64 << (fl - SL_LOG2);
            units.checked_add(step - 1)
        };
        let found = search.and_then(|s| {
            let (mut fl, mut sl) = mapping(s);
            self.find_free(&mut fl, &mut sl)
        });
        // No block in a larger class: a block of the request's own class
        // may still be large enough (a region sized to the request).
        let n = match found {
            Some(n) => n,
            None => self.first_fit_in_class(units, size)?,
        };
        self.remove_free(n);
        // Split off the tail when it is at least one granule.
        let node = self.nodes[n as usize];
        debug_assert!(node.size >= size);
        if node.size > size {
            let rest = self.new_node(Node {
                region: node.region,
                offset: node.offset + size,
                size: node.size - size,
                free: true,
                prev_phys: n,
                next_phys: node.next_phys,
                prev_free: NIL,
                next_free: NIL,
            });
            if node.next_phys != NIL {
                self.nodes[node.next_phys as usize].prev_phys = rest;
            }
            let b = &mut self.nodes[n as usize];
            b.next_phys = rest;
            b.size = size;
            self.insert_free(rest);
        }
        let b = &mut self.nodes[n as usize];
        b.free = false;
        let region = b.region;
        self.used_bytes += size;
        if let Some(r) = self.regions[region as usize].as_mut() {
            r.used += 1;
        }
        let b = &self.nodes[n as usize];
        Some(Block {
            id: n,
            region: b.region,
            offset: b.offset,
            size,
        })
    }

    /// Takes back a block from [`Tlsf::alloc`], merging it with free
    /// neighbours.
    ///
    /// # Panics
    /// When `id` is not a block in use (a double free): the bookkeeping
    /// would otherwise be corrupted.
    #[inline]
    pub fn free(&mut self, id: u32) {
        let node = *self
            .nodes
            .get(id as usize)
            .expect("free of an unknown block");
        let region = self
            .regions
            .get_mut(node.region as usize)
            .and_then(Option::as_mut)
            .filter(|_| !node.free);
        let Some(region) = region else {
            panic!("double free of block {id}");
        };
        region.used -= 1;
        // No merge across a part boundary.
        let part = region.part;
        let boundary = |offset: u64| part != 0 && offset % part == 0;
        self.used_bytes -= node.size;
        let mut n = id;
        self.nodes[n as usize].free = true;
        let prev = node.prev_phys;
        if prev != NIL && self.nodes[prev as usize].free && !boundary(node.offset) {
            self.remove_free(prev);
            self.absorb_next(prev);
            n = prev;
        }
        let next = self.nodes[n as usize].next_phys;
        if next != NIL
            && self.nodes[next as usize].free
            && !boundary(self.nodes[next as usize].offset)
        {
            self.remove_free(next);
            self.absorb_next(n);
        }
        self.insert_free(n);
    }

    /// The region of block `id` (handed out by [`Tlsf::alloc`]).
    #[inline]
    pub fn block_region(&self, id: u32) -> u32 {
        self.nodes[id as usize].region
    }

    #[cfg(any(test, feature = "internals"))]
    /// The block in use starting at `offset` in `region`, if any (slow:
    /// walks the region; for checks and tests).
    pub fn block_at(&self, region: u32, offset: u64) -> Option<Block> {
        let r = self.regions.get(region as usize).copied().flatten()?;
        let mut n = r.first;
        while n != NIL {
            let b = self.nodes[n as usize];
            if b.offset == offset && !b.free {
                return Some(Block {
                    id: n,
                    region,
                    offset,
                    size: b.size,
                });
            }
            n = b.next_phys;
        }
        None
    }

    #[cfg(any(test, feature = "internals"))]
    /// Checks every invariant (slow; for tests): blocks tile each region
    /// in order, free neighbours are merged, free lists hold exactly the
    /// free blocks in the right class, and the byte counts add up.
    ///
    /// # Errors
    ///
    /// A sentence naming the first invariant that does not hold.
    pub fn check(&self) -> Result<(), String> {
        let mut used = 0;
        let mut total = 0;
        let mut free_blocks = 0;
        for (ri, r) in self.regions.iter().enumerate() {
            let Some(r) = r else { continue };
            total += r.size;
            let (mut n, mut prev, mut off, mut prev_free) = (r.first, NIL, 0, false);
            let mut used_blocks = 0u32;
            while n != NIL {
                let b = self.nodes[n as usize];
                if b.region as usize != ri || b.offset != off || b.prev_phys != prev {
                    return Err(format!("region {ri}: block {n} out of order"));
                }
                if b.size == 0 || b.size % self.granule() != 0 || b.offset % self.granule() != 0 {
                    return Err(format!("block {n}: size or offset off the granule"));
                }
                let boundary = r.part != 0 && b.offset % r.part == 0;
                if b.free && prev_free && !boundary {
                    return Err(format!(
                        "region {ri}: free blocks {prev} and {n} not merged"
                    ));
                }
                if r.part != 0 && b.offset / r.part != (b.offset + b.size - 1) / r.part {
                    return Err(format!("region {ri}: block {n} spans two parts"));
                }
                if b.free {
                    free_blocks += 1;
                } else {
                    used += b.size;
                    used_blocks += 1;
                }
                prev_free = b.free;
                off += b.size;
                prev = n;
                n = b.next_phys;
            }
            if off != r.size {
                return Err(format!(
                    "region {ri}: blocks cover {off} of {} bytes",
                    r.size
                ));
            }
            if used_blocks != r.used {
                return Err(format!(
                    "region {ri}: {used_blocks} blocks in use, counted {}",
                    r.used
                ));
            }
        }
        let mut listed = 0;
        for fl in 0..FL_COUNT {
            for sl in 0..SL_COUNT {
                let head = self.heads[fl * SL_COUNT + sl];
                let bit = self.sl_bitmap[fl] & (1 << sl) != 0;
                if bit != (head != NIL) {
                    return Err(format!("bitmap disagrees with list ({fl},{sl})"));
                }
                let mut n = head;
                while n != NIL {
                    let b = self.nodes[n as usize];
                    if !b.free || mapping(b.size >> self.granule_log2) != (fl, sl) {
                        return Err(format!("block {n} in the wrong list"));
                    }
                    listed += 1;
                    n = b.next_free;
                }
            }
            if (self.fl_bitmap & (1 << fl) != 0) != (self.sl_bitmap[fl] != 0) {
                return Err(format!("first-level bitmap wrong at {fl}"));
            }
        }
        if listed != free_blocks {
            return Err(format!("{listed} blocks listed, {free_blocks} free"));
        }
        if used != self.used_bytes || total != self.region_bytes {
            return Err("byte counts disagree".into());
        }
        Ok(())
    }

    #[inline]
    fn new_node(&mut self, node: Node) -> u32 {
        match self.spare_nodes.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                assert!(self.nodes.len() < NIL as usize, "too many blocks");
                id(self.nodes.len() - 1)
            }
        }
    }

    /// Merges `n`'s physical successor (free, off its list) into `n`.
    #[inline]
    fn absorb_next(&mut self, n: u32) {
        let next = self.nodes[n as usize].next_phys;
        let nb = self.nodes[next as usize];
        let b = &mut self.nodes[n as usize];
        b.size += nb.size;
        b.next_phys = nb.next_phys;
        if nb.next_phys != NIL {
            self.nodes[nb.next_phys as usize].prev_phys = n;
        }
        self.spare_nodes.push(next);
    }

    #[inline]
    fn find_free(&self, fl: &mut usize, sl: &mut usize) -> Option<u32> {
        if *fl >= FL_COUNT {
            return None;
        }
        let sl_map = self.sl_bitmap[*fl] & (!0u32).checked_shl(shift(*sl)).unwrap_or(0);
        if sl_map != 0 {
            *sl = sl_map.trailing_zeros() as usize;
        } else {
            let fl_map = self.fl_bitmap & (!0u64).checked_shl(shift(*fl + 1)).unwrap_or(0);
            if fl_map == 0 {
                return None;
            }
            *fl = fl_map.trailing_zeros() as usize;
            *sl = self.sl_bitmap[*fl].trailing_zeros() as usize;
        }
        let head = self.heads[*fl * SL_COUNT + *sl];
        (head != NIL).then_some(head)
    }

    /// The first free block of at least `size` bytes in the list of
    /// blocks of `units` granules' class.
    #[inline]
    fn first_fit_in_class(&self, units: u64, size: u64) -> Option<u32> {
        let (fl, sl) = mapping(units);
        let mut n = self.heads[fl * SL_COUNT + sl];
        while n != NIL {
            if self.nodes[n as usize].size >= size {
                return Some(n);
            }
            n = self.nodes[n as usize].next_free;
        }
        None
    }

    #[inline]
    fn insert_free(&mut self, n: u32) {
        let (fl, sl) = mapping(self.nodes[n as usize].size >> self.granule_log2);
        let slot = fl * SL_COUNT + sl;
        let head = self.heads[slot];
        {
            let b = &mut self.nodes[n as usize];
            b.free = true;
            b.prev_free = NIL;
            b.next_free = head;
        }
        if head != NIL {
            self.nodes[head as usize].prev_free = n;
        }
        self.heads[slot] = n;
        self.fl_bitmap |= 1 << fl;
        self.sl_bitmap[fl] |= 1 << sl;
    }

    #[inline]
    fn remove_free(&mut self, n: u32) {
        let b = self.nodes[n as usize];
        let (fl, sl) = mapping(b.size >> self.granule_log2);
        if b.prev_free != NIL {
            self.nodes[b.prev_free as usize].next_free = b.next_free;
        } else {
            self.heads[fl * SL_COUNT + sl] = b.next_free;
        }
        if b.next_free != NIL {
            self.nodes[b.next_free as usize].prev_free = b.prev_free;
        }
        if self.heads[fl * SL_COUNT + sl] == NIL {
            self.sl_bitmap[fl] &= !(1 << sl);
            if self.sl_bitmap[fl] == 0 {
                self.fl_bitmap &= !(1 << fl);
            }
        }
    }
}

/// A slab position as the `u32` ids blocks and regions are named by: the
/// block slab stays under [`NIL`] entries (asserted where blocks are made),
/// and every region holds at least one block.
#[inline]
fn id(i: usize) -> u32 {
    u32::try_from(i).expect("fewer than 2^32 blocks")
}

/// A list index as a shift count for `checked_shl` (one past `u32::MAX`
/// shifts every bit out, as a count past the width does).
#[inline]
fn shift(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(u32::MAX)
}

/// The (first, second) level list of a block of `units` granules. Sizes
/// under [`SL_COUNT`] granules get one list each in class 0.
#[inline]
fn mapping(units: u64) -> (usize, usize) {
    use crate::num::usize_from;
    debug_assert!(units > 0);
    if units < SL_COUNT as u64 {
        (0, usize_from(units))
    } else {
        let fl = 63 - units.leading_zeros();
        let sl = usize_from(units >> (fl - SL_LOG2)) & (SL_COUNT - 1);
        ((fl - SL_LOG2 + 1) as usize, sl)
    }
}

/// The size of the region to add when no region can serve a request of
/// `bytes`, given the configured region size `region_bytes` (a multiple of
/// 2 MiB): a request larger than half a region gets a region of its own
/// size rounded to 2 MiB (kept for reuse when the buffer is freed), and
/// anything smaller a standard region. Returns the size and whether the
/// region is *dedicated* (larger than a standard region: the arena keeps
/// only the last one emptied for reuse and gives the others back).
///
/// Sizing a region to a large request avoids stranding most of a
/// standard region behind one buffer just over half its size, which is
/// where a fixed region size loses most on random sizes.
pub fn region_size_for(bytes: u64, region_bytes: u64) -> (u64, bool) {
    const HUGE: u64 = 2 << 20;
    if bytes > region_bytes / 2 {
        let size = round_up(bytes, HUGE);
        (size, size > region_bytes)
    } else {
        (region_bytes, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K4: u64 = 4096;
    const M: u64 = 1 << 20;

    #[test]
    fn mapping_is_monotonic_and_tight() {
        let mut last = (0, 0);
        for units in 1..100_000u64 {
            let m = mapping(units);
            assert!(m >= last, "mapping goes down at {units}");
            last = m;
        }
    }

    #[test]
    fn a_region_in_parts_never_hands_out_a_block_across_parts() {
        let mut t = Tlsf::new(K4);
        // 10 granules in parts of 4: parts of 4, 4 and 2.
        let r = t.add_region_in_parts(10 * K4, 4 * K4);
        t.check().unwrap();
        assert!(t.alloc(5 * K4).is_none(), "5 granules fit in no part");
        let a = t.alloc(3 * K4).unwrap();
        let b = t.alloc(2 * K4).unwrap();
        let c = t.alloc(4 * K4).unwrap();
        assert_eq!(a.offset / (4 * K4), (a.offset + a.size - 1) / (4 * K4));
        assert_eq!(b.offset / (4 * K4), (b.offset + b.size - 1) / (4 * K4));
        assert_eq!(c.offset % (4 * K4), 0);
        t.check().unwrap();
        for x in [a, b, c] {
            assert!(!t.region_is_empty(r));
            t.free(x.id);
            t.check().unwrap();
        }
        // Empty again, as three free parts that did not merge: still no
        // room for 5 granules, room for three of 4, 4 and 2.
        assert!(t.region_is_empty(r));
        assert!(t.alloc(5 * K4).is_none());
        let ids: Vec<u32> = [4, 4, 2]
            .iter()
            .map(|&g| t.alloc(g * K4).unwrap().id)
            .collect();
        assert!(t.alloc(K4).is_none());
        for id in ids {
            t.free(id);
        }
        assert!(t.remove_region(r));
        assert_eq!((t.region_count(), t.region_bytes()), (0, 0));
        t.check().unwrap();
        // A part as large as the region is one piece.
        let r = t.add_region_in_parts(8 * K4, 8 * K4);
        assert_eq!(t.alloc(8 * K4).unwrap().region, r);
    }

    #[test]
    fn splits_and_merges() {
        let mut t = Tlsf::new(K4);
        let r = t.add_region(16 * K4);
        let a = t.alloc(K4).unwrap();
        let b = t.alloc(3 * K4 - 100).unwrap();
        let c = t.alloc(K4).unwrap();
        assert_eq!((a.offset, b.offset, c.offset), (0, K4, 4 * K4));
        assert_eq!(b.size, 3 * K4);
        assert_eq!(t.used_bytes(), 5 * K4);
        t.check().unwrap();
        t.free(b.id);
        t.check().unwrap();
        // The hole left by b is reused for a fitting request.
        let d = t.alloc(2 * K4).unwrap();
        assert_eq!(d.offset, K4);
        t.free(a.id);
        t.free(c.id);
        t.free(d.id);
        t.check().unwrap();
        assert!(t.region_is_empty(r));
        assert_eq!(t.used_bytes(), 0);
        assert!(t.alloc(16 * K4).is_some());
        assert!(!t.region_is_empty(r));
    }

    #[test]
    fn exhaustion_and_regions() {
        let mut t = Tlsf::new(K4);
        assert!(t.alloc(K4).is_none());
        let r0 = t.add_region(8 * K4);
        assert!(t.alloc(9 * K4).is_none());
        let a = t.alloc(8 * K4).unwrap();
        assert!(t.alloc(1).is_none());
        let r1 = t.add_region(4 * K4);
        let b = t.alloc(1).unwrap();
        assert_eq!(b.region, r1);
        assert!(!t.remove_region(r0));
        t.free(a.id);
        assert!(t.remove_region(r0));
        assert_eq!(t.region_count(), 1);
        assert_eq!(t.region_bytes(), 4 * K4);
        t.check().unwrap();
        // The id is reused.
        assert_eq!(t.add_region(2 * M), r0);
        t.free(b.id);
        assert_eq!(t.empty_regions(), vec![r0, r1]);
    }

    #[test]
    #[should_panic(expected = "double free")]
    fn double_free_is_caught() {
        let mut t = Tlsf::new(K4);
        t.add_region(4 * K4);
        let a = t.alloc(K4).unwrap();
        let _b = t.alloc(K4).unwrap();
        t.free(a.id);
        t.free(a.id);
    }

    #[test]
    fn large_granule_aligns() {
        let mut t = Tlsf::new(2 * M);
        t.add_region(64 * M);
        for _ in 0..5 {
            let b = t.alloc(K4).unwrap();
            assert_eq!(b.offset % (2 * M), 0);
            assert_eq!(b.size, 2 * M);
        }
    }

    #[test]
    fn region_sizing() {
        assert_eq!(region_size_for(K4, 256 * M), (256 * M, false));
        assert_eq!(region_size_for(128 * M, 256 * M), (256 * M, false));
        assert_eq!(region_size_for(130 * M + 1, 256 * M), (132 * M, false));
        assert_eq!(region_size_for(256 * M, 256 * M), (256 * M, false));
        assert_eq!(region_size_for(300 * M, 256 * M), (300 * M, true));
    }

    mod model {
        use super::super::*;
        use proptest::prelude::*;

        #[derive(Debug, Clone)]
        enum Op {
            /// A region of this many bytes, in parts of this many granules
            /// (0: one piece).
            Region(u64, u64),
            Alloc(u64),
            Free(usize),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                1 => (1u64..1024, prop_oneof![Just(0u64), 1u64..300]).prop_map(|(g, p)| Op::Region(g * 4096, p)),
                // Small sizes, and sizes of many granules, where classes
                // span several sizes.
                3 => (1u64..40 * 4096).prop_map(Op::Alloc),
                3 => (1u64..600 * 4096).prop_map(Op::Alloc),
                4 => any::<usize>().prop_map(Op::Free),
            ]
        }

        /// The largest run of free bytes inside one part of a region,
        /// from the model's live blocks (`regions`: id, size, part bytes
        /// or 0).
        fn largest_hole(regions: &[(u32, u64, u64)], live: &[Block]) -> u64 {
            let mut best = 0;
            for &(r, size, part) in regions {
                let step = if part == 0 { size } else { part };
                let mut start = 0;
                while start < size {
                    let end = (start + step).min(size);
                    let mut spans: Vec<(u64, u64)> = live
                        .iter()
                        .filter(|b| b.region == r && b.offset >= start && b.offset < end)
                        .map(|b| (b.offset, b.size))
                        .collect();
                    spans.sort();
                    let mut at = start;
                    for (o, s) in spans {
                        best = best.max(o - at);
                        at = o + s;
                    }
                    best = best.max(end - at);
                    start = end;
                }
            }
            best
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(if cfg!(miri) { 4 } else { 256 }))]
            /// Against a model: blocks are aligned, inside their region,
            /// never overlap, are as large as asked, are refused only when
            /// no hole is large enough, and the byte counts add up.
            #[test]
            fn behaves_like_the_model(granule_log2 in 12u32..15, ops in proptest::collection::vec(op(), 1..200)) {
                let g = 1u64 << granule_log2;
                let mut t = Tlsf::new(g);
                let mut regions: Vec<(u32, u64, u64)> = Vec::new();
                let mut live: Vec<Block> = Vec::new();
                for op in ops {
                    match op {
                        Op::Region(size, part) => {
                            let size = round_up(size, g);
                            let part = part * g;
                            let id = t.add_region_in_parts(size, part);
                            prop_assert!(regions.iter().all(|&(r, _, _)| r != id));
                            regions.push((id, size, if part >= size { 0 } else { part }));
                        }
                        Op::Alloc(bytes) => match t.alloc(bytes) {
                            Some(b) => {
                                prop_assert_eq!(b.size, round_up(bytes, g));
                                prop_assert_eq!(b.offset % g, 0);
                                let region = regions.iter().find(|&&(r, _, _)| r == b.region).copied();
                                prop_assert!(region.is_some_and(|(_, s, _)| b.offset + b.size <= s));
                                if let Some((_, _, part)) = region.filter(|r| r.2 != 0) {
                                    prop_assert_eq!(b.offset / part, (b.offset + b.size - 1) / part, "{:?} spans two parts of {}", b, part);
                                }
                                for o in live.iter().filter(|o| o.region == b.region) {
                                    prop_assert!(b.offset + b.size <= o.offset || o.offset + o.size <= b.offset, "{:?} overlaps {:?}", b, o);
                                }
                                live.push(b);
                            }
                            None => prop_assert!(largest_hole(&regions, &live) < round_up(bytes, g)),
                        },
                        Op::Free(i) => {
                            if !live.is_empty() {
                                let b = live.swap_remove(i % live.len());
                                t.free(b.id);
                            }
                        }
                    }
                    prop_assert_eq!(t.used_bytes(), live.iter().map(|b| b.size).sum::<u64>());
                    prop_assert_eq!(t.region_bytes(), regions.iter().map(|r| r.1).sum::<u64>());
                    for &(r, _, _) in &regions {
                        prop_assert_eq!(t.region_is_empty(r), live.iter().all(|b| b.region != r));
                    }
                    if let Err(e) = t.check() {
                        prop_assert!(false, "{}", e);
                    }
                }
                for b in live.drain(..) {
                    t.free(b.id);
                }
                for (r, _, _) in regions {
                    prop_assert!(t.region_is_empty(r));
                    prop_assert!(t.remove_region(r));
                }
                prop_assert_eq!(t.region_count(), 0);
            }
        }
    }
}
