//! How requested file ranges become reads: for a GPU, reads of at most a
//! slot each (neighbouring ranges of one file share a read, large ones are
//! split), each with the copies out of its slot; for host memory, pieces
//! of each range cut at aligned file offsets, read in place.

use crate::num::usize_from;

/// A range to read: `len` bytes of source `source` at `offset`; its
/// copies name it by its index in the request list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Req {
    pub source: usize,
    pub offset: u64,
    pub len: usize,
}

/// One read into a slot: `need` bytes of `source` from `start` (aligned
/// to the source's alignment), and the copies out of the slot
/// (`segments[segs]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Piece {
    pub source: usize,
    pub start: u64,
    pub need: usize,
    pub segs: std::ops::Range<usize>,
    /// The highest request its copies serve: the destinations a worker
    /// needs known before them.
    pub last_req: usize,
}

/// A copy out of a slot: `len` bytes at `slot_off` to byte `at` of
/// request `req` (its index in the request list).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Segment {
    pub slot_off: usize,
    pub len: usize,
    pub at: usize,
    pub req: usize,
}

/// The reads of a request list.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    pub pieces: Vec<Piece>,
    pub segments: Vec<Segment>,
}

/// Reads of at most `slot` bytes (a multiple of every source's alignment)
/// covering `reqs`: ranges of one source closer than `max_gap` bytes share
/// a read; empty ranges are dropped. `align(source)` is a source's
/// alignment (a power of two dividing `slot`).
pub(crate) fn pieces(
    reqs: &[Req],
    align: impl Fn(usize) -> u64,
    slot: usize,
    max_gap: u64,
) -> Plan {
    let mut order: Vec<(usize, &Req)> = reqs.iter().enumerate().filter(|r| r.1.len > 0).collect();
    order.sort_by_key(|(_, r)| (r.source, r.offset));
    let mut plan = Plan::default();
    let slot64 = slot as u64;
    for (req, r) in order {
        let (mut off, mut left, mut at) = (r.offset, r.len as u64, 0);
        while left > 0 {
            let joins = plan.pieces.last().is_some_and(|p| {
                p.source == r.source
                    && off >= p.start
                    && off < p.start + slot64
                    && off <= p.start + p.need as u64 + max_gap
            });
            if !joins {
                let a = align(r.source);
                let start = off / a * a;
                let n = plan.segments.len();
                plan.pieces.push(Piece {
                    source: r.source,
                    start,
                    need: 0,
                    segs: n..n,
                    last_req: req,
                });
            }
            let p = plan.pieces.last_mut().expect("a piece was just ensured");
            let take = left.min(p.start + slot64 - off);
            let slot_off = usize_from(off - p.start);
            plan.segments.push(Segment {
                slot_off,
                len: usize_from(take),
                at,
                req,
            });
            p.segs.end = plan.segments.len();
            p.last_req = p.last_req.max(req);
            p.need = p.need.max(slot_off + usize_from(take));
            off += take;
            at += usize_from(take);
            left -= take;
        }
    }
    plan
}

/// Pieces of a host range of `len` bytes at file offset `offset`, cut
/// where the file offset is a multiple of `align` and at most about
/// `chunk` bytes apart: `(file offset, offset in the range, length)`.
pub(crate) fn host_pieces(
    offset: u64,
    len: usize,
    align: u64,
    chunk: usize,
) -> Vec<(u64, usize, usize)> {
    let mut out = Vec::new();
    let end = offset + len as u64;
    let mut at = offset;
    while at < end {
        let cut = (at + chunk as u64) / align * align;
        let next = if cut > at {
            cut.min(end)
        } else {
            (at + chunk as u64).min(end)
        };
        out.push((at, usize_from(at - offset), usize_from(next - at)));
        at = next;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn check(reqs: &[Req], slot: usize, align: u64) {
        let plan = pieces(reqs, |_| align, slot, 64 << 10);
        // Every byte of every request arrives once, from the right place.
        // (source, file off, request, offset in it)
        let mut want: Vec<(usize, u64, usize, usize)> = Vec::new();
        for (k, r) in reqs.iter().enumerate() {
            for i in 0..r.len {
                want.push((r.source, r.offset + i as u64, k, i));
            }
        }
        let mut got = Vec::new();
        for p in &plan.pieces {
            assert_eq!(p.start % align, 0, "aligned start");
            assert!(p.need <= slot && (p.need as u64).div_ceil(align) * align <= slot as u64);
            assert!(p.need > 0);
            let segs = &plan.segments[p.segs.clone()];
            assert_eq!(Some(p.last_req), segs.iter().map(|s| s.req).max());
            for s in segs {
                assert!(s.slot_off + s.len <= p.need);
                for i in 0..s.len {
                    got.push((p.source, p.start + (s.slot_off + i) as u64, s.req, s.at + i));
                }
            }
        }
        want.sort_unstable();
        got.sort_unstable();
        assert_eq!(got, want);
    }

    #[test]
    fn neighbours_share_a_read_and_large_ranges_split() {
        let r = |source, offset, len| Req {
            source,
            offset,
            len,
        };
        let plan = pieces(
            &[r(0, 100, 10), r(0, 110, 5), r(0, 5000, 20_000), r(1, 0, 0)],
            |_| 4096,
            16384,
            64 << 10,
        );
        // One read for the two small ranges and the start of the large
        // one, then the rest of it.
        assert_eq!(plan.pieces.len(), 2);
        assert_eq!((plan.pieces[0].start, plan.pieces[0].need), (0, 16384));
        assert_eq!(
            (plan.pieces[1].start, plan.pieces[1].need),
            (16384, 5000 + 20_000 - 16384)
        );
        check(
            &[r(0, 100, 10), r(0, 110, 5), r(0, 5000, 20_000)],
            16384,
            4096,
        );
    }

    #[test]
    fn host_pieces_cut_at_aligned_offsets() {
        assert_eq!(
            host_pieces(100, 10_000, 4096, 4096),
            vec![(100, 0, 3996), (4096, 3996, 4096), (8192, 8092, 1908)]
        );
        assert_eq!(host_pieces(0, 0, 4096, 4096), vec![]);
        // A chunk smaller than the alignment still advances.
        assert_eq!(
            host_pieces(1, 10, 4096, 4),
            vec![(1, 0, 4), (5, 4, 4), (9, 8, 2)]
        );
    }

    proptest! {
        #[test]
        fn every_requested_byte_is_read_once_into_place(
            reqs in proptest::collection::vec((0usize..3, 0u64..40_000, 0usize..20_000), 0..12),
            slot_blocks in 1usize..5,
        ) {
            let reqs: Vec<Req> = reqs.into_iter().map(|(source, offset, len)| Req { source, offset, len }).collect();
            check(&reqs, slot_blocks * 4096, 4096);
        }

        #[test]
        fn host_pieces_tile_the_range(offset in 0u64..100_000, len in 0usize..100_000, chunk in 1usize..20_000) {
            let p = host_pieces(offset, len, 4096, chunk);
            let mut at = 0;
            for (i, &(o, rel, n)) in p.iter().enumerate() {
                prop_assert_eq!(rel, at);
                prop_assert_eq!(o, offset + rel as u64);
                prop_assert!(n > 0);
                if i > 0 && chunk >= 4096 {
                    prop_assert_eq!(o % 4096, 0);
                }
                at += n;
            }
            prop_assert_eq!(at, len);
        }
    }
}
