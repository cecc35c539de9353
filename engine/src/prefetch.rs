//! A cache-line prefetch hint, for loops whose loads miss one after
//! another, such as a message's recipients in `apply`.

/// Asks the CPU to start loading the cache line at `p` and returns at
/// once: a hint, so that misses which would follow one another overlap.
/// It reads nothing the program can see and never faults, whatever the
/// address; where the target has no such instruction it does nothing.
#[inline(always)]
pub(crate) fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 has no architectural effect and does not fault
    // on any address, mapped or not; SSE is in the x86_64 baseline.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
