//! Two small hand-written PTX kernels for checking and measuring loaders on
//! a GPU, loaded with `cuModuleLoadData` (the driver JIT-compiles PTX 7.0
//! for `sm_70` and later, so Volta to Hopper):
//!
//! * `numapin_checksum` sums the 32-bit words of a buffer, each weighted by
//!   its position (`sum of w[j] * (2j + 1)`, wrapping at 2^64), into a
//!   64-bit counter with one atomic add per thread. The weights make a
//!   reordered, shifted or stale buffer give another sum.
//! * `numapin_spin` busy-waits a number of GPU clock cycles: a stand-in
//!   for a training step's compute, to show that copies overlap it.
//!
//! Batches filled with [`fill_pattern`] have a checksum known in closed
//! form ([`pattern_checksum`]), so every delivered byte is checked on the
//! device without the host reading it back.

use crate::gpu::CudaOrdinal;
use crate::platform::cuda::{self, CUdeviceptr, CUstream, CudaResult, Function, Module};

/// The PTX of both kernels.
pub const PTX: &str = r#"
.version 7.0
.target sm_70
.address_size 64

// out[0] += sum over j < words of data[j] * (2j + 1), wrapping at 2^64.
.visible .entry numapin_checksum(
    .param .u64 p_data,
    .param .u64 p_words,
    .param .u64 p_out
)
{
    .reg .pred %p;
    .reg .b32 %r<6>;
    .reg .b64 %rd<14>;

    ld.param.u64 %rd1, [p_data];
    ld.param.u64 %rd2, [p_words];
    ld.param.u64 %rd3, [p_out];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd3, %rd3;
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mov.u32 %r4, %nctaid.x;
    mul.wide.u32 %rd4, %r1, %r2;
    cvt.u64.u32 %rd5, %r3;
    add.u64 %rd4, %rd4, %rd5;
    mul.wide.u32 %rd6, %r4, %r2;
    mov.u64 %rd7, 0;
LOOP:
    setp.ge.u64 %p, %rd4, %rd2;
    @%p bra DONE;
    shl.b64 %rd8, %rd4, 2;
    add.u64 %rd9, %rd1, %rd8;
    ld.global.u32 %r5, [%rd9];
    cvt.u64.u32 %rd10, %r5;
    shl.b64 %rd11, %rd4, 1;
    add.u64 %rd11, %rd11, 1;
    mad.lo.u64 %rd7, %rd10, %rd11, %rd7;
    add.u64 %rd4, %rd4, %rd6;
    bra LOOP;
DONE:
    atom.global.add.u64 %rd12, [%rd3], %rd7;
    ret;
}

// Busy-waits p_cycles GPU clock cycles.
.visible .entry numapin_spin(
    .param .u64 p_cycles
)
{
    .reg .pred %p;
    .reg .b64 %rd<6>;

    ld.param.u64 %rd1, [p_cycles];
    mov.u64 %rd2, %clock64;
SPIN:
    mov.u64 %rd3, %clock64;
    sub.u64 %rd4, %rd3, %rd2;
    setp.lt.u64 %p, %rd4, %rd1;
    @%p bra SPIN;
    ret;
}
"#;

/// Threads per block of both kernels.
pub const BLOCK: u32 = 256;

/// The kernels, loaded on one GPU.
#[derive(Debug)]
pub struct Kernels {
    // Functions are valid while the module is loaded: keep it.
    _module: Module,
    checksum: Function,
    spin: Function,
    ordinal: CudaOrdinal,
    sms: u32,
    clock_khz: u32,
}

impl Kernels {
    /// Loads the kernels on GPU `ordinal`.
    ///
    /// # Errors
    ///
    /// [`CudaError::NoDriver`](crate::gpu::CudaError::NoDriver) without a usable driver (or with
    /// `NUMAPIN_NO_CUDA` set), [`CudaError::Call`](crate::gpu::CudaError::Call) naming the driver call that
    /// failed, with its `CUresult`.
    pub fn load(ordinal: CudaOrdinal) -> CudaResult<Kernels> {
        let module = Module::load_ptx(ordinal.0, PTX)?;
        let checksum = module.function("numapin_checksum")?;
        let spin = module.function("numapin_spin")?;
        let clock_khz = cuda::device_attribute(
            ordinal.0,
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CLOCK_RATE,
        )?;
        let clock_khz = u32::try_from(clock_khz).unwrap_or(0).max(1);
        Ok(Kernels {
            sms: cuda::multiprocessor_count(ordinal.0)?,
            _module: module,
            checksum,
            spin,
            ordinal,
            clock_khz,
        })
    }

    /// The GPU they are loaded on.
    pub fn ordinal(&self) -> CudaOrdinal {
        self.ordinal
    }

    /// Queues `*out += checksum of words u32 words at data` on `stream`.
    ///
    /// # Safety
    /// `data` must hold `words * 4` readable bytes and `out` one `u64` of
    /// device memory of this GPU, both valid until the kernel completes;
    /// `stream` must be a live stream of this GPU.
    ///
    /// # Errors
    ///
    /// [`CudaError::Call`](crate::gpu::CudaError::Call) when the launch fails.
    pub unsafe fn checksum_async(
        &self,
        data: CUdeviceptr,
        words: u64,
        out: CUdeviceptr,
        stream: CUstream,
    ) -> CudaResult<()> {
        let (mut d, mut w, mut o) = (data, words, out);
        let mut params = [
            (&mut d as *mut CUdeviceptr).cast(),
            (&mut w as *mut u64).cast(),
            (&mut o as *mut CUdeviceptr).cast(),
        ];
        // One wave of blocks, enough to stream memory at full speed.
        let wanted = words.div_ceil(u64::from(BLOCK)).max(1);
        let blocks = (self.sms * 4).min(u32::try_from(wanted).unwrap_or(u32::MAX));
        // SAFETY: three u64-sized parameters in the kernel's order; the
        // caller vouches for the memory and the stream.
        unsafe { self.checksum.launch(blocks, BLOCK, stream, &mut params) }
    }

    /// Queues a busy-wait of about `ms` milliseconds on `stream`, one
    /// block of [`BLOCK`] threads per `sm_fraction` of the SMs (at least
    /// one block): the rest of the GPU stays free for other streams.
    ///
    /// # Safety
    /// `stream` must be a live stream of this GPU.
    ///
    /// # Errors
    ///
    /// [`CudaError::Call`](crate::gpu::CudaError::Call) when the launch fails.
    pub unsafe fn spin_async(&self, ms: f64, sm_fraction: f64, stream: CUstream) -> CudaResult<()> {
        let mut cycles = crate::num::u64_saturating(ms * f64::from(self.clock_khz));
        let mut params = [(&mut cycles as *mut u64).cast()];
        let blocks = crate::num::u64_saturating(f64::from(self.sms) * sm_fraction);
        let blocks = u32::try_from(blocks).unwrap_or(u32::MAX).max(1);
        // SAFETY: one u64 parameter; the caller vouches for the stream.
        unsafe { self.spin.launch(blocks, BLOCK, stream, &mut params) }
    }
}

/// The checksum the kernel computes, on the host: `sum of w[j] * (2j + 1)`
/// over the little-endian u32 words of `bytes` (a tail shorter than a word
/// is left out), wrapping at 2^64.
pub fn checksum_host(bytes: &[u8]) -> u64 {
    bytes.chunks_exact(4).enumerate().fold(0u64, |acc, (j, w)| {
        let w = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        acc.wrapping_add(u64::from(w).wrapping_mul(2 * j as u64 + 1))
    })
}

/// The key of batch `index` in [`fill_pattern`]: a mix of the index below
/// 2^31, so `j + key` never wraps for buffers under 4 GiB.
#[allow(clippy::cast_possible_truncation)] // the mix's low 31 bits are the key
pub fn batch_key(index: u64) -> u32 {
    let mut x = index.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((x ^ (x >> 31)) as u32) & 0x7FFF_FFFF
}

/// Word `j` of the pattern of `key`: `j + key` modulo 2^32 (the pattern
/// counts words modulo 2^32, as the GPU's checksum kernel reads them).
#[allow(clippy::cast_possible_truncation)] // modulo 2^32 is the pattern
fn word(key: u32, j: u64) -> u32 {
    (j as u32).wrapping_add(key)
}

/// Fills `buf` with word `j` = `j + key` (little-endian u32); the bytes of
/// a tail shorter than a word are the low bytes of the next such word. A
/// memory-bound producer: one store per word.
pub fn fill_pattern(key: u32, buf: &mut [u8]) {
    fill_pattern_with(key, buf, Stores::Streaming);
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Stores {
    Streaming,
    Cached,
}

/// [`fill_pattern`] with ordinary stores only: what was written last stays
/// in the cache as far as it fits (where a DMA engine reading it soon after
/// finds it), at the price of reading each line before writing it.
pub fn fill_pattern_cached(key: u32, buf: &mut [u8]) {
    fill_pattern_with(key, buf, Stores::Cached);
}

fn fill_pattern_with(key: u32, buf: &mut [u8], stores: Stores) {
    // SAFETY: any byte pattern is a valid u32; align_to_mut only splits the
    // slice at alignment boundaries.
    let (head, words, _) = unsafe { buf.align_to_mut::<u32>() };
    if head.is_empty() {
        // The usual case (slots are page-aligned).
        let n = words.len();
        let done = match stores {
            Stores::Cached => 0,
            Stores::Streaming => fill_words_streaming(key, words),
        };
        for (j, w) in words.iter_mut().enumerate().skip(done) {
            *w = word(key, j as u64).to_le();
        }
        let tail = &mut buf[n * 4..];
        let next = word(key, n as u64).to_le_bytes();
        let t = tail.len();
        tail.copy_from_slice(&next[..t]);
        return;
    }
    let mut chunks = buf.chunks_exact_mut(4);
    let mut j = 0u32;
    for c in &mut chunks {
        c.copy_from_slice(&j.wrapping_add(key).to_le_bytes());
        j = j.wrapping_add(1);
    }
    let tail = chunks.into_remainder();
    let next = j.wrapping_add(key).to_le_bytes();
    let n = tail.len();
    tail.copy_from_slice(&next[..n]);
}

/// Fills the leading 16-byte-aligned part of `words` (when large) with
/// non-temporal stores: the data is bound for DMA, not for this core's
/// cache, and streaming stores skip the read-for-ownership that ordinary
/// stores cost, halving the memory traffic of a fill. Returns how many words
/// it wrote (0 when it did not apply).
#[cfg(target_arch = "x86_64")]
fn fill_words_streaming(key: u32, words: &mut [u32]) -> usize {
    use std::arch::x86_64::{
        _mm_add_epi32, _mm_set1_epi32, _mm_set_epi32, _mm_sfence, _mm_stream_si128,
    };
    const MIN_WORDS: usize = 64 << 10; // 256 KiB: below that, caches win
    if words.len() < MIN_WORDS || words.as_ptr() as usize % 16 != 0 {
        return 0;
    }
    let n = words.len() / 4 * 4;
    let k = crate::num::i32_bits(key);
    // SAFETY: SSE2 is part of x86_64; the pointer is 16-byte aligned (checked
    // above) and every store stays inside words[..n]; the sfence orders the
    // streaming stores before anything this thread does next (handing the
    // slot to the copy engine).
    unsafe {
        let mut v = _mm_set_epi32(k.wrapping_add(3), k.wrapping_add(2), k.wrapping_add(1), k);
        let step = _mm_set1_epi32(4);
        let p = words.as_mut_ptr().cast::<std::arch::x86_64::__m128i>();
        for i in 0..n / 4 {
            _mm_stream_si128(p.add(i), v);
            v = _mm_add_epi32(v, step);
        }
        _mm_sfence();
    }
    n
}

#[cfg(not(target_arch = "x86_64"))]
fn fill_words_streaming(_key: u32, _words: &mut [u32]) -> usize {
    0
}

/// The checksum of `words` words filled by [`fill_pattern`] with `key`
/// (closed form: `2 S2 + S1 + 2 key S1 + key n`, with `S1` the sum of `j`
/// and `S2` the sum of `j^2` below `n`), wrapping at 2^64.
#[allow(clippy::cast_possible_truncation)] // wraps at 2^64, as the GPU's sum does
pub fn pattern_checksum(key: u32, words: u64) -> u64 {
    let n = u128::from(words);
    let k = u128::from(key);
    let s1 = if n == 0 { 0 } else { n * (n - 1) / 2 };
    let s2 = if n == 0 {
        0
    } else {
        (n - 1) * n * (2 * n - 1) / 6
    };
    (2 * s2 + s1 + 2 * k * s1 + k * n) as u64
}

/// Whether every `stride`-th word of `bytes` (from the first, plus the
/// last whole word and the tail) is what [`fill_pattern`] wrote with
/// `key`: a check that reads one cache line per `4 * stride` bytes, for
/// measurements whose consumer must not be the bottleneck.
pub fn pattern_sample_ok(key: u32, bytes: &[u8], stride: usize) -> bool {
    let words = bytes.len() / 4;
    let word_ok = |j: usize| {
        let w = &bytes[j * 4..j * 4 + 4];
        u32::from_le_bytes([w[0], w[1], w[2], w[3]]) == word(key, j as u64)
    };
    (0..words).step_by(stride.max(1)).all(word_ok)
        && (words == 0 || word_ok(words - 1))
        && pattern_tail_ok(key, words as u64, &bytes[words * 4..])
}

/// Whether `tail` (the bytes after the last whole word of a pattern of
/// `words` words) is what [`fill_pattern`] wrote.
pub fn pattern_tail_ok(key: u32, words: u64, tail: &[u8]) -> bool {
    let next = word(key, words).to_le_bytes();
    tail.len() < 4 && tail == &next[..tail.len()]
}

#[cfg(test)]
mod tests {

    #[test]
    fn fill_pattern_is_the_same_aligned_or_not() {
        let reference = |key: u32, n: usize| -> Vec<u8> {
            (0..n)
                .map(|b| word(key, (b / 4) as u64).to_le_bytes()[b % 4])
                .collect()
        };
        let mut backing = vec![0u32; 300_000];
        // The first offset that is 64-byte aligned (streaming stores apply
        // from 16).
        let a = (64 - backing.as_ptr() as usize % 64) % 64;
        type Fill = fn(u32, &mut [u8]);
        let fills: [(&str, Fill); 2] =
            [("streaming", fill_pattern), ("cached", fill_pattern_cached)];
        for (name, fill) in fills {
            for (off, n) in [
                (a, 1_000_003),
                (a + 4, 1_100_000),
                (a + 64, 1 << 20),
                (0usize, 4096usize),
                (0, 4095),
                (1, 4001),
                (3, 7),
                (0, 0),
                (2, 2),
            ] {
                let bytes: &mut [u8] = unsafe_bytes(&mut backing);
                bytes.fill(0);
                let buf = &mut bytes[off..off + n];
                fill(0xdead_beef, buf);
                assert_eq!(
                    buf,
                    &reference(0xdead_beef, n)[..],
                    "{name}: offset {off}, {n} bytes"
                );
            }
        }
    }

    fn unsafe_bytes(v: &mut [u32]) -> &mut [u8] {
        // SAFETY: u8 has no alignment or validity requirement; the length
        // covers exactly the words' bytes.
        unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), v.len() * 4) }
    }

    use super::*;
    use crate::num::usize_from;
    use proptest::prelude::*;

    #[test]
    fn closed_form_matches_the_sum() {
        for words in [0u64, 1, 2, 3, 1000, 4097] {
            for key in [0u32, 1, 0x7FFF_FFFF, batch_key(7)] {
                let mut buf = vec![0u8; usize_from(words) * 4 + 3];
                fill_pattern(key, &mut buf);
                assert_eq!(
                    checksum_host(&buf),
                    pattern_checksum(key, words),
                    "words {words} key {key}"
                );
                assert!(pattern_tail_ok(key, words, &buf[usize_from(words) * 4..]));
            }
        }
    }

    #[test]
    fn swaps_shifts_and_other_batches_change_the_sum() {
        let mut a = vec![0u8; 4096];
        fill_pattern(batch_key(3), &mut a);
        let good = checksum_host(&a);
        let mut swapped = a.clone();
        swapped.swap(0, 4);
        swapped.swap(1, 5);
        swapped.swap(2, 6);
        swapped.swap(3, 7);
        assert_ne!(checksum_host(&swapped), good);
        let mut other = a.clone();
        fill_pattern(batch_key(4), &mut other);
        assert_ne!(checksum_host(&other), good);
        let shifted = [&a[4..], &a[..4]].concat();
        assert_ne!(checksum_host(&shifted), good);
    }

    #[test]
    fn a_sampled_check_sees_a_wrong_batch_and_a_wrong_sampled_word() {
        let mut buf = vec![0u8; (1 << 20) + 3];
        fill_pattern(batch_key(5), &mut buf);
        assert!(pattern_sample_ok(batch_key(5), &buf, 4096));
        assert!(!pattern_sample_ok(batch_key(6), &buf, 4096));
        buf[4096 * 4 * 3] ^= 1;
        assert!(!pattern_sample_ok(batch_key(5), &buf, 4096));
        buf[4096 * 4 * 3] ^= 1;
        let n = buf.len();
        buf[n - 1] ^= 1;
        assert!(!pattern_sample_ok(batch_key(5), &buf, 4096));
    }

    proptest! {
        #[test]
        fn closed_form_holds(words in 0u64..20_000, index in any::<u64>()) {
            let key = batch_key(index);
            prop_assert!(key < 1 << 31);
            let mut buf = vec![0u8; usize_from(words) * 4];
            fill_pattern(key, &mut buf);
            prop_assert_eq!(checksum_host(&buf), pattern_checksum(key, words));
        }

        #[test]
        fn one_flipped_bit_is_seen(words in 1u64..5000, bit in any::<u32>(), index in any::<u64>()) {
            let key = batch_key(index);
            let mut buf = vec![0u8; usize_from(words) * 4];
            fill_pattern(key, &mut buf);
            let at = bit as usize % (buf.len() * 8);
            buf[at / 8] ^= 1 << (at % 8);
            prop_assert_ne!(checksum_host(&buf), pattern_checksum(key, words));
        }
    }
}
