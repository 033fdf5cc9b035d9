// The entry point of the one-thread-per-item kernels (RoPE, KV write, embedding row): calls the
// appended kernel's `run` with the thread's index in a 2-D dispatch of WG-thread workgroups (x up
// to the per-dimension limit, then y).
override WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    run((wid.x + wid.y * nwg.x) * WG + lid);
}
