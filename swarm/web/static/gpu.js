// WebGPU matmul with the swarm's own tiled WGSL kernel (compute/kernels/matmul_tiled.wgsl,
// served by the node), a self-test against a known product, and a throughput measurement.

import { matmulCPU } from "./cpu.js";

const BM = 64, BN4 = 16; // the kernel's default tiles: WG_Y * RM rows, WG_X * VN vec4 columns

export async function gpuBackend(kernelUrl) {
  if (!navigator.gpu) return null;
  const adapter = await navigator.gpu.requestAdapter();
  if (!adapter) return null;
  const device = await adapter.requestDevice({
    requiredLimits: {
      maxStorageBufferBindingSize: adapter.limits.maxStorageBufferBindingSize,
      maxBufferSize: adapter.limits.maxBufferSize,
    },
  });
  const code = await (await fetch(kernelUrl)).text();
  const module = device.createShaderModule({ code });
  const pipeline = await device.createComputePipelineAsync({
    layout: "auto", compute: { module, entryPoint: "main" },
  });
  const info = adapter.info || {};
  const detail = [info.vendor, info.architecture, info.description].filter(Boolean).join(" ");

  async function matmul(a, m, k, b, n) {
    const k4 = Math.ceil(k / 4), n4 = Math.ceil(n / 4);
    const ap = pad(a, m, k, m, 4 * k4), bp = pad(b, k, n, 4 * k4, 4 * n4);
    const usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST;
    const bufA = upload(device, ap, usage), bufB = upload(device, bp, usage);
    const outBytes = m * n4 * 16;
    const bufC = device.createBuffer({ size: outBytes, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC });
    const dims = upload(device, new Uint32Array([m, k4, n4, 0]), GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST);
    const read = device.createBuffer({ size: outBytes, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
    const bind = device.createBindGroup({
      layout: pipeline.getBindGroupLayout(0),
      entries: [bufA, bufB, bufC, dims].map((buffer, binding) => ({ binding, resource: { buffer } })),
    });
    const enc = device.createCommandEncoder();
    const pass = enc.beginComputePass();
    pass.setPipeline(pipeline); pass.setBindGroup(0, bind);
    pass.dispatchWorkgroups(Math.ceil(n4 / BN4), Math.ceil(m / BM), 1);
    pass.end();
    enc.copyBufferToBuffer(bufC, 0, read, 0, outBytes);
    device.queue.submit([enc.finish()]);
    await read.mapAsync(GPUMapMode.READ);
    const padded = new Float32Array(read.getMappedRange().slice(0));
    read.unmap();
    for (const x of [bufA, bufB, bufC, dims, read]) x.destroy();
    return unpad(padded, m, 4 * n4, n);
  }
  return { name: "webgpu", detail, matmul };
}

function upload(device, data, usage) {
  const buf = device.createBuffer({ size: Math.max(16, data.byteLength), usage });
  device.queue.writeBuffer(buf, 0, data);
  return buf;
}

function pad(x, rows, cols, prow, pcol) {
  if (rows === prow && cols === pcol) return x;
  const out = new Float32Array(prow * pcol);
  for (let i = 0; i < rows; i++) out.set(x.subarray(i * cols, (i + 1) * cols), i * pcol);
  return out;
}

function unpad(x, rows, pcol, cols) {
  if (pcol === cols) return x;
  const out = new Float32Array(rows * cols);
  for (let i = 0; i < rows; i++) out.set(x.subarray(i * pcol, i * pcol + cols), i * cols);
  return out;
}

/** Check a backend on a known product (small integers: exact in float32). Throws why not. */
export async function selfTest(backend) {
  const m = 37, k = 29, n = 23;
  const a = Float32Array.from({ length: m * k }, (_, i) => ((i * 7) % 17) - 8);
  const b = Float32Array.from({ length: k * n }, (_, i) => ((i * 5) % 13) - 6);
  const want = matmulCPU(a, m, k, b, n);
  const got = await backend.matmul(a, m, k, b, n);
  if (got.length !== want.length) throw new Error("wrong result size");
  if (got.some((v) => !Number.isFinite(v))) throw new Error("the product holds NaN or infinity");
  if (got.every((v) => v === 0)) throw new Error("the product is all zeros");
  const bad = got.reduce((s, v, i) => s + (v !== want[i]), 0);
  if (bad) throw new Error(`the product is wrong in ${bad} of ${want.length} cells`);
}

/** Measured TFLOPS on square matmuls of `size`, within about `budgetMs`. */
export async function measure(backend, size = 256, budgetMs = 600) {
  const a = new Float32Array(size * size).fill(0.5), b = new Float32Array(size * size).fill(0.25);
  await backend.matmul(a, size, size, b, size); // warm-up (pipelines, buffers)
  let runs = 0;
  const t0 = performance.now();
  while (performance.now() - t0 < budgetMs || runs === 0) {
    await backend.matmul(a, size, size, b, size);
    runs++;
  }
  const s = (performance.now() - t0) / 1000;
  return (2 * size ** 3 * runs) / s / 1e12;
}
