//! Pinning the calling thread to one CPU, so the two sides of a run stay on their own cores.

/// Pins the calling thread to CPU `cpu`. Returns false (and leaves the thread free) when that
/// CPU does not exist or the kernel refuses, so a run on a smaller machine still completes;
/// the report says whether it was pinned.
///
/// Call it only on threads made for the run: the mask is inherited by threads spawned later.
pub fn to_cpu(cpu: usize) -> bool {
    core_affinity::set_for_current(core_affinity::CoreId { id: cpu })
}
