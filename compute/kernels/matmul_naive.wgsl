// Naive matmul C = A @ B (row-major f32): one invocation per output element, reading A and
// B straight from storage. Kept as the baseline the tiled kernel is measured against.

struct Dims {
    m: u32,
    k: u32,
    n: u32,
    pad: u32,
}

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
@group(0) @binding(3) var<uniform> dims: Dims;

@compute @workgroup_size(16, 16, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let row = gid.y;
    let col = gid.x;
    if (row >= dims.m || col >= dims.n) {
        return;
    }
    var sum = 0.0;
    for (var k = 0u; k < dims.k; k++) {
        sum = fma(a[row * dims.k + k], b[k * dims.n + col], sum);
    }
    c[row * dims.n + col] = sum;
}
