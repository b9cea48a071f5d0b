// The "mlp" actor's grad method in a tab: one block of an MLP's training step
// (models/mlp.py), its matrix products on the tab's backend (WebGPU or JavaScript), answered
// with the block's trace in the layout a native worker's has: every Z_l = A_l W_l (forward),
// then per layer dW_l = A_lᵀ dZ_l and, for l > 0, dA_l = dZ_l W_lᵀ. The trainer recomputes
// the non-linear steps itself and checks every product (Freivalds), so a tab's trace counts
// exactly as a native worker's does.

const MAX_LAYERS = 16, MAX_WIDTH = 1 << 16, MAX_BLOCK = 1024;

function transpose(a, rows, cols) {
  const t = new Float32Array(rows * cols);
  for (let i = 0; i < rows; i++) for (let j = 0; j < cols; j++) t[j * rows + i] = a[i * cols + j];
  return t;
}

export function checkSizes(sizes) {
  if (!Array.isArray(sizes) || sizes.length < 2 || sizes.length > MAX_LAYERS + 1
      || !sizes.every((n) => Number.isInteger(n) && n >= 1 && n <= MAX_WIDTH) || sizes.at(-1) < 2) {
    throw new Error(`sizes= must list 2..${MAX_LAYERS + 1} widths of 1..${MAX_WIDTH}`);
  }
  return sizes;
}

export function paramCount(sizes) {
  let n = 0;
  for (let l = 0; l + 1 < sizes.length; l++) n += sizes[l] * sizes[l + 1] + sizes[l + 1];
  return n;
}

// (x [rows, in], the flat parameters, sizes, labels) -> Float32Array trace
export async function mlpTrace(matmul, x, rows, flat, sizes, labels) {
  checkSizes(sizes);
  const L = sizes.length - 1;
  if (rows < 1 || rows > MAX_BLOCK || x.length !== rows * sizes[0]) throw new Error(`x must be [1..${MAX_BLOCK}, ${sizes[0]}]`);
  if (flat.length !== paramCount(sizes)) throw new Error(`the parameters must be [${paramCount(sizes)}]`);
  if (labels.length !== rows || !labels.every((v) => Number.isInteger(v) && v >= 0 && v < sizes[L])) {
    throw new Error(`labels= must list ${rows} class indices`);
  }
  const W = [], B = [];
  let at = 0;
  for (let l = 0; l < L; l++) {
    const i = sizes[l], o = sizes[l + 1];
    W.push(flat.subarray(at, at + i * o)); at += i * o;
    B.push(flat.subarray(at, at + o)); at += o;
  }
  // the trace's views, as models.mlp.trace_views lays them out
  let size = 0;
  for (let l = 0; l < L; l++) size += rows * sizes[l + 1];
  for (let l = 0; l < L; l++) size += sizes[l] * sizes[l + 1] + (l > 0 ? rows * sizes[l] : 0);
  const trace = new Float32Array(size);
  const Z = [], DW = [], DA = [];
  at = 0;
  for (let l = 0; l < L; l++) { Z.push(trace.subarray(at, at + rows * sizes[l + 1])); at += rows * sizes[l + 1]; }
  for (let l = 0; l < L; l++) {
    DW.push(trace.subarray(at, at + sizes[l] * sizes[l + 1])); at += sizes[l] * sizes[l + 1];
    DA.push(l > 0 ? trace.subarray(at, at + rows * sizes[l]) : null); if (l > 0) at += rows * sizes[l];
  }
  // forward: Z_l = A_l W_l; h = Z_l + b (float32); A_{l+1} = relu(h)
  const acts = [x], masks = [];
  let h = null;
  for (let l = 0; l < L; l++) {
    const o = sizes[l + 1];
    Z[l].set(await matmul(acts[l], rows, sizes[l], W[l], o));
    h = new Float32Array(rows * o);
    for (let r = 0; r < rows; r++) for (let j = 0; j < o; j++) h[r * o + j] = Z[l][r * o + j] + B[l][j];
    if (l < L - 1) {
      const mask = new Uint8Array(h.length), a = new Float32Array(h.length);
      for (let k = 0; k < h.length; k++) if (h[k] > 0) { mask[k] = 1; a[k] = h[k]; }
      masks.push(mask); acts.push(a);
    }
  }
  // softmax cross-entropy's gradient p - onehot: p in float64 (as models/mlp.py computes it),
  // rounded once to float32, so the trainer's own p is this one
  const C = sizes[L], dz0 = new Float32Array(rows * C), e = new Float64Array(C);
  for (let r = 0; r < rows; r++) {
    let max = -Infinity;
    for (let j = 0; j < C; j++) max = Math.max(max, h[r * C + j]);
    let s = 0;
    for (let j = 0; j < C; j++) { e[j] = Math.exp(h[r * C + j] - max); s += e[j]; }
    for (let j = 0; j < C; j++) dz0[r * C + j] = e[j] / s;
    dz0[r * C + labels[r]] -= 1;
  }
  // backward: dW_l = A_lᵀ dZ_l; dA_l = dZ_l W_lᵀ, times the ReLU mask before it
  let dz = dz0;
  for (let l = L - 1; l >= 0; l--) {
    const i = sizes[l], o = sizes[l + 1];
    DW[l].set(await matmul(transpose(acts[l], rows, i), i, rows, dz, o));
    if (l > 0) {
      DA[l].set(await matmul(dz, rows, o, transpose(W[l], i, o), i));
      const next = new Float32Array(rows * i), mask = masks[l - 1];
      for (let k = 0; k < next.length; k++) if (mask[k]) next[k] = DA[l][k];
      dz = next;
    }
  }
  return trace;
}
