// The frame of the kernels with two f32 inputs `a`, `b` and one output `y` (RMS norm, SwiGLU):
// bindings, parameters and the entry point, which calls the appended kernel's `run` with the
// workgroup's index in a 2-D dispatch (x up to the per-dimension limit, then y).
override WG: u32 = 256u;

struct Params {
    n: u32,     // row width (RMS norm) or value count (SwiGLU)
    rows: u32,  // rows (RMS norm)
    eps: f32,   // epsilon (RMS norm)
    _pad: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    run(wid.x + wid.y * nwg.x, lid);
}
