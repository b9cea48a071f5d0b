// CPU fallback for tabs without (or with a slower) WebGPU: a plain JavaScript matmul
// (row-major float32), run in a Web Worker so the page and its link keepalives stay live.

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

let worker = null, calls = 0;
const waiting = new Map();

function inWorker(a, m, k, b, n) {
  if (!worker) {
    worker = new Worker("/static/cpu_worker.js", { type: "module" });
    worker.onmessage = (e) => { waiting.get(e.data.id)(e.data.c); waiting.delete(e.data.id); };
  }
  const id = ++calls;
  return new Promise((resolve) => {
    waiting.set(id, resolve);
    worker.postMessage({ id, a: a.slice(), m, k, b: b.slice(), n });
  });
}

export function cpuBackend() {
  return { name: "cpu", detail: "JavaScript in a Web Worker", matmul: inWorker };
}
