// Tiled matmul C = A @ B, row-major f32, A: M x K, B: K x N, C: M x N.
//
// Each workgroup computes a BM x (4*BN4) block of C. Per step it stages a BM x TK slice of
// A (stored transposed, four rows per vec4) and a TK x (4*BN4) slice of B in workgroup
// memory; each thread then accumulates RM x (4*VN) outputs in registers from vec4 reads.
// Global loads are vec4 along K (A) and along N (B): the host pads K and N to multiples of
// 4 with zeros. M, N and K need not be multiples of the tile: edges are bounds-checked.
//
// The host rewrites the `const` lines below to pick other tile shapes (compute/kernels.py)
// and the `alias` line plus an `enable f16;` for half-precision inputs.

alias IN = vec4<f32>;

struct Dims {
    m: u32,   // rows of A and C
    k4: u32,  // padded K / 4
    n4: u32,  // padded N / 4
    pad: u32,
}

@group(0) @binding(0) var<storage, read> a: array<IN>;        // M x k4
@group(0) @binding(1) var<storage, read> b: array<IN>;        // (4*k4) x n4
@group(0) @binding(2) var<storage, read_write> c: array<vec4<f32>>;  // M x n4
@group(0) @binding(3) var<uniform> dims: Dims;

const WG_X: u32 = 16u;  // threads along N
const WG_Y: u32 = 16u;  // threads along M
const RM: u32 = 4u;     // rows of C per thread (multiple of 4)
const VN: u32 = 1u;     // vec4 columns of C per thread
const TK: u32 = 16u;    // K per step (multiple of 4)

const NT: u32 = WG_X * WG_Y;
const BM: u32 = WG_Y * RM;
const BM4: u32 = BM / 4u;
const BN4: u32 = WG_X * VN;
const TK4: u32 = TK / 4u;

var<workgroup> a_tile: array<vec4<f32>, TK * BM4>;  // [k][row / 4], rows packed by four
var<workgroup> b_tile: array<vec4<f32>, TK * BN4>;  // [k][col / 4]

@compute @workgroup_size(WG_X, WG_Y, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(workgroup_id) wid: vec3<u32>) {
    let tid = lid.y * WG_X + lid.x;
    let row0 = wid.y * BM;
    let col0 = wid.x * BN4;
    let m = dims.m;
    let k4 = dims.k4;
    let n4 = dims.n4;
    var acc: array<vec4<f32>, RM * VN>;

    let steps = (k4 + TK4 - 1u) / TK4;
    for (var s = 0u; s < steps; s++) {
        for (var i = tid; i < BM * TK4; i += NT) {
            let r = i / TK4;
            let q = i % TK4;
            let gk = s * TK4 + q;
            var v = vec4<f32>(0.0);
            if (row0 + r < m && gk < k4) {
                v = vec4<f32>(a[(row0 + r) * k4 + gk]);
            }
            let base = q * 4u * BM4 + r / 4u;
            let lane = r % 4u;
            a_tile[base][lane] = v.x;
            a_tile[base + BM4][lane] = v.y;
            a_tile[base + 2u * BM4][lane] = v.z;
            a_tile[base + 3u * BM4][lane] = v.w;
        }
        for (var i = tid; i < TK * BN4; i += NT) {
            let kk = i / BN4;
            let gk = s * TK + kk;
            let gc = col0 + i % BN4;
            var v = vec4<f32>(0.0);
            if (gk < 4u * k4 && gc < n4) {
                v = vec4<f32>(b[gk * n4 + gc]);
            }
            b_tile[i] = v;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < TK; kk++) {
            for (var q = 0u; q < RM / 4u; q++) {
                let av = a_tile[kk * BM4 + lid.y * (RM / 4u) + q];
                for (var v = 0u; v < VN; v++) {
                    let bv = b_tile[kk * BN4 + lid.x * VN + v];
                    let o = q * 4u * VN + v;
                    acc[o] = fma(vec4<f32>(av.x), bv, acc[o]);
                    acc[o + VN] = fma(vec4<f32>(av.y), bv, acc[o + VN]);
                    acc[o + 2u * VN] = fma(vec4<f32>(av.z), bv, acc[o + 2u * VN]);
                    acc[o + 3u * VN] = fma(vec4<f32>(av.w), bv, acc[o + 3u * VN]);
                }
            }
        }
        workgroupBarrier();
    }

    for (var i = 0u; i < RM; i++) {
        let gr = row0 + lid.y * RM + i;
        if (gr < m) {
            for (var v = 0u; v < VN; v++) {
                let gc = col0 + lid.x * VN + v;
                if (gc < n4) {
                    c[gr * n4 + gc] = acc[i * VN + v];
                }
            }
        }
    }
}
