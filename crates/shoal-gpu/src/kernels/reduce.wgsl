// Sums across a workgroup's threads in workgroup memory, with no subgroup operations (the subgroup
// width differs between GPUs: 8 on lavapipe, 32 on NVIDIA and Apple, 32 or 64 on AMD). Prepended
// to the kernels that reduce.

// Workgroup memory is sized for the largest workgroup the host allows.
const MAX_WG: u32 = 256u;

var<workgroup> partial: array<f32, MAX_WG>;

// The sum of `value` over each aligned group of `width` threads (a power of two), returned to all
// of the group's threads. Every thread of the workgroup must call it (it holds barriers).
fn group_sum(lid: u32, width: u32, value: f32) -> f32 {
    partial[lid] = value;
    workgroupBarrier();
    let t = lid % width;
    for (var s = width / 2u; s > 0u; s = s / 2u) {
        if (t < s) {
            partial[lid] += partial[lid + s];
        }
        workgroupBarrier();
    }
    return partial[lid - t];
}

// The maximum of `value` over each aligned group of `width` threads, as `group_sum`.
fn group_max(lid: u32, width: u32, value: f32) -> f32 {
    partial[lid] = value;
    workgroupBarrier();
    let t = lid % width;
    for (var s = width / 2u; s > 0u; s = s / 2u) {
        if (t < s) {
            partial[lid] = max(partial[lid], partial[lid + s]);
        }
        workgroupBarrier();
    }
    let m = partial[lid - t];
    workgroupBarrier();
    return m;
}
