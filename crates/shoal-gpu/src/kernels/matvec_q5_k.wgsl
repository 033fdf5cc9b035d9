// Q5_K weights, repacked at upload: per 256-value super-block its 128 nibble bytes (as Q4_K) then
// its 32 `qh` bytes (40 u32; bit `sub` of qh[l] is bit 4 of value l of sub-block `sub`), and a
// 5-u32 scale entry as Q4_K's. Values are d·sc·q - dmin·m per 32-value sub-block.
@group(0) @binding(3) var<storage, read> wq: array<u32>;
@group(0) @binding(4) var<storage, read> ws: array<u32>;

fn dequant4(unit: u32, j: u32) -> vec4<f32> {
    let sb = unit / 8u;
    let sub = unit % 8u;
    let lo = bytes4(wq[40u * sb + 8u * (sub / 2u) + j], 4u * (sub % 2u), 15u);
    let hi = bytes4(wq[40u * sb + 32u + j], sub, 1u);
    let dm = k4_dm(5u * sb, sub);
    return dm.x * vec4<f32>(lo | (hi << vec4<u32>(4u))) - vec4<f32>(dm.y);
}

fn block_dot(unit: u32, xb: u32) -> f32 {
    return dequant_dot(unit, xb);
}
