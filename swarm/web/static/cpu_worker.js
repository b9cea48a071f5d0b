// The CPU fallback's worker thread: one matmul per message, answered with the product.
import { matmulCPU } from "./cpu.js";

self.onmessage = (e) => {
  const { id, a, m, k, b, n } = e.data;
  const c = matmulCPU(a, m, k, b, n);
  self.postMessage({ id, c }, [c.buffer]);
};
