//! How files made of parts become writes: each file is cut into chunks of
//! at most a slot at offsets that are multiples of the slot size (so every
//! chunk but a file's last is whole aligned blocks), and each chunk is
//! filled from the parts it overlaps.

use crate::num::usize_from;

/// One write: `len` bytes of file `file` at `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Chunk {
    pub(crate) file: usize,
    pub(crate) offset: u64,
    pub(crate) len: usize,
}

/// Where each part of a file starts (`starts[i]`; the last entry is the
/// file's length).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layout {
    starts: Vec<u64>,
}

impl Layout {
    /// The layout of parts of `lens` bytes laid one after another.
    pub(crate) fn new(lens: impl Iterator<Item = u64>) -> Layout {
        let mut starts = vec![0u64];
        let mut at = 0u64;
        for l in lens {
            at += l;
            starts.push(at);
        }
        Layout { starts }
    }

    /// The pieces of parts in `offset..offset + len`: `(part, offset in
    /// the part, offset in the chunk, length)`, empty parts skipped.
    pub(crate) fn segments(&self, offset: u64, len: usize) -> Vec<(usize, u64, usize, usize)> {
        let end = offset + len as u64;
        let parts = self.starts.len() - 1;
        // The first part that ends after `offset`.
        let mut i = self.starts[1..].partition_point(|&e| e <= offset);
        let mut out = Vec::new();
        while i < parts && self.starts[i] < end {
            let (s, e) = (self.starts[i], self.starts[i + 1]);
            let from = s.max(offset);
            let to = e.min(end);
            if to > from {
                out.push((
                    i,
                    from - s,
                    usize_from(from - offset),
                    usize_from(to - from),
                ));
            }
            i += 1;
        }
        out
    }
}

/// The chunks of files of `lens` bytes, `chunk` bytes each (a file's
/// last may be shorter), in file order.
pub(crate) fn chunks(lens: &[u64], chunk: usize) -> Vec<Chunk> {
    let mut out = Vec::new();
    for (file, &len) in lens.iter().enumerate() {
        let mut at = 0u64;
        while at < len {
            let n = usize_from((len - at).min(chunk as u64));
            out.push(Chunk {
                file,
                offset: at,
                len: n,
            });
            at += n as u64;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn chunks_cover_each_file_at_multiples_of_the_chunk() {
        let c = chunks(&[10, 0, 4], 4);
        let got: Vec<(usize, u64, usize)> = c.iter().map(|c| (c.file, c.offset, c.len)).collect();
        assert_eq!(got, vec![(0, 0, 4), (0, 4, 4), (0, 8, 2), (2, 0, 4)]);
    }

    #[test]
    fn segments_name_the_parts_a_chunk_overlaps() {
        let l = Layout::new([3u64, 0, 5, 2].into_iter());
        assert_eq!(l.segments(0, 4), vec![(0, 0, 0, 3), (2, 0, 3, 1)]);
        assert_eq!(l.segments(4, 6), vec![(2, 1, 0, 4), (3, 0, 4, 2)]);
        assert_eq!(Layout::new(std::iter::empty()).segments(0, 0), vec![]);
    }

    proptest! {
        #[test]
        fn every_byte_of_every_part_lands_once_in_place(
            lens in proptest::collection::vec(0u64..5000, 0..8),
            chunk in 1usize..3000,
        ) {
            let layout = Layout::new(lens.iter().copied());
            let total = *layout.starts.last().expect("an end");
            let mut seen = vec![0u8; usize_from(total)];
            for c in chunks(&[total], chunk) {
                prop_assert!(c.offset % chunk as u64 == 0);
                let mut filled = 0;
                for (part, in_part, in_chunk, n) in layout.segments(c.offset, c.len) {
                    prop_assert_eq!(in_chunk, filled);
                    prop_assert!(in_part + n as u64 <= lens[part]);
                    let file_off = layout.starts[part] + in_part;
                    prop_assert_eq!(file_off, c.offset + in_chunk as u64);
                    for b in &mut seen[usize_from(file_off)..usize_from(file_off) + n] {
                        *b += 1;
                    }
                    filled += n;
                }
                prop_assert_eq!(filled, c.len);
            }
            prop_assert!(seen.iter().all(|&b| b == 1));
        }
    }
}
