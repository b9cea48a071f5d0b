// CPU fallback for tabs without WebGPU: a plain JavaScript matmul (row-major float32).

export function matmulCPU(a, m, k, b, n) {
  const c = new Float32Array(m * n);
  for (let i = 0; i < m; i++) {
    const row = i * n;
    for (let p = 0; p < k; p++) {
      const av = a[i * k + p];
      if (av === 0) continue;
      const brow = p * n;
      for (let j = 0; j < n; j++) c[row + j] += av * b[brow + j];
    }
  }
  return c;
}

export function cpuBackend() {
  return { name: "cpu", detail: "JavaScript", matmul: async (a, m, k, b, n) => matmulCPU(a, m, k, b, n) };
}
