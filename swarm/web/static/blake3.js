// BLAKE3 (hash mode, 32-byte digest): the content address of arrays, as
// swarm/runtime/objects.py computes it natively (the `blake3` package). Plain JS: no WebCrypto
// algorithm offers BLAKE3. Follows the reference implementation (github.com/BLAKE3-team/BLAKE3,
// reference_impl): 1 KiB chunks of 64-byte blocks, a stack of chaining values merged as
// chunks complete, ROOT set on the last compression.

const IV = new Uint32Array([0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
  0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19]);
const PERM = [2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8];
const CHUNK_START = 1, CHUNK_END = 2, PARENT = 4, ROOT = 8;
const CHUNK = 1024, BLOCK = 64;

// Compress one block (16 words at m[off..]) into out[0..8] (the chaining value). Unrolled
// into locals (generated): ~10x the speed of array-indexed state.
function compress(cv, m, off, counter, len, flags, out) {
  let m0 = m[off + 0], m1 = m[off + 1], m2 = m[off + 2], m3 = m[off + 3], m4 = m[off + 4], m5 = m[off + 5], m6 = m[off + 6], m7 = m[off + 7], m8 = m[off + 8], m9 = m[off + 9], m10 = m[off + 10], m11 = m[off + 11], m12 = m[off + 12], m13 = m[off + 13], m14 = m[off + 14], m15 = m[off + 15];
  let t0 = 0, t1 = 0, t2 = 0, t3 = 0, t4 = 0, t5 = 0, t6 = 0, t7 = 0, t8 = 0, t9 = 0, t10 = 0, t11 = 0, t12 = 0, t13 = 0, t14 = 0, t15 = 0;
  let v0 = cv[0], v1 = cv[1], v2 = cv[2], v3 = cv[3], v4 = cv[4], v5 = cv[5], v6 = cv[6], v7 = cv[7];
  let v8 = 0x6a09e667, v9 = 0xbb67ae85 | 0, v10 = 0x3c6ef372, v11 = 0xa54ff53a | 0;
  let v12 = counter | 0, v13 = Math.floor(counter / 0x100000000) | 0, v14 = len, v15 = flags;
  for (let r = 0; r < 7; r++) {
    v0 = (v0 + v4 + m0) | 0; v12 ^= v0; v12 = (v12 >>> 16) | (v12 << 16);
    v8 = (v8 + v12) | 0; v4 ^= v8; v4 = (v4 >>> 12) | (v4 << 20);
    v0 = (v0 + v4 + m1) | 0; v12 ^= v0; v12 = (v12 >>> 8) | (v12 << 24);
    v8 = (v8 + v12) | 0; v4 ^= v8; v4 = (v4 >>> 7) | (v4 << 25);
    v1 = (v1 + v5 + m2) | 0; v13 ^= v1; v13 = (v13 >>> 16) | (v13 << 16);
    v9 = (v9 + v13) | 0; v5 ^= v9; v5 = (v5 >>> 12) | (v5 << 20);
    v1 = (v1 + v5 + m3) | 0; v13 ^= v1; v13 = (v13 >>> 8) | (v13 << 24);
    v9 = (v9 + v13) | 0; v5 ^= v9; v5 = (v5 >>> 7) | (v5 << 25);
    v2 = (v2 + v6 + m4) | 0; v14 ^= v2; v14 = (v14 >>> 16) | (v14 << 16);
    v10 = (v10 + v14) | 0; v6 ^= v10; v6 = (v6 >>> 12) | (v6 << 20);
    v2 = (v2 + v6 + m5) | 0; v14 ^= v2; v14 = (v14 >>> 8) | (v14 << 24);
    v10 = (v10 + v14) | 0; v6 ^= v10; v6 = (v6 >>> 7) | (v6 << 25);
    v3 = (v3 + v7 + m6) | 0; v15 ^= v3; v15 = (v15 >>> 16) | (v15 << 16);
    v11 = (v11 + v15) | 0; v7 ^= v11; v7 = (v7 >>> 12) | (v7 << 20);
    v3 = (v3 + v7 + m7) | 0; v15 ^= v3; v15 = (v15 >>> 8) | (v15 << 24);
    v11 = (v11 + v15) | 0; v7 ^= v11; v7 = (v7 >>> 7) | (v7 << 25);
    v0 = (v0 + v5 + m8) | 0; v15 ^= v0; v15 = (v15 >>> 16) | (v15 << 16);
    v10 = (v10 + v15) | 0; v5 ^= v10; v5 = (v5 >>> 12) | (v5 << 20);
    v0 = (v0 + v5 + m9) | 0; v15 ^= v0; v15 = (v15 >>> 8) | (v15 << 24);
    v10 = (v10 + v15) | 0; v5 ^= v10; v5 = (v5 >>> 7) | (v5 << 25);
    v1 = (v1 + v6 + m10) | 0; v12 ^= v1; v12 = (v12 >>> 16) | (v12 << 16);
    v11 = (v11 + v12) | 0; v6 ^= v11; v6 = (v6 >>> 12) | (v6 << 20);
    v1 = (v1 + v6 + m11) | 0; v12 ^= v1; v12 = (v12 >>> 8) | (v12 << 24);
    v11 = (v11 + v12) | 0; v6 ^= v11; v6 = (v6 >>> 7) | (v6 << 25);
    v2 = (v2 + v7 + m12) | 0; v13 ^= v2; v13 = (v13 >>> 16) | (v13 << 16);
    v8 = (v8 + v13) | 0; v7 ^= v8; v7 = (v7 >>> 12) | (v7 << 20);
    v2 = (v2 + v7 + m13) | 0; v13 ^= v2; v13 = (v13 >>> 8) | (v13 << 24);
    v8 = (v8 + v13) | 0; v7 ^= v8; v7 = (v7 >>> 7) | (v7 << 25);
    v3 = (v3 + v4 + m14) | 0; v14 ^= v3; v14 = (v14 >>> 16) | (v14 << 16);
    v9 = (v9 + v14) | 0; v4 ^= v9; v4 = (v4 >>> 12) | (v4 << 20);
    v3 = (v3 + v4 + m15) | 0; v14 ^= v3; v14 = (v14 >>> 8) | (v14 << 24);
    v9 = (v9 + v14) | 0; v4 ^= v9; v4 = (v4 >>> 7) | (v4 << 25);
    if (r === 6) break;
    t0 = m2; t1 = m6; t2 = m3; t3 = m10; t4 = m7; t5 = m0; t6 = m4; t7 = m13; t8 = m1; t9 = m11; t10 = m12; t11 = m5; t12 = m9; t13 = m14; t14 = m15; t15 = m8;
    m0 = t0; m1 = t1; m2 = t2; m3 = t3; m4 = t4; m5 = t5; m6 = t6; m7 = t7; m8 = t8; m9 = t9; m10 = t10; m11 = t11; m12 = t12; m13 = t13; m14 = t14; m15 = t15;
  }
  out[0] = v0 ^ v8; out[1] = v1 ^ v9; out[2] = v2 ^ v10; out[3] = v3 ^ v11;
  out[4] = v4 ^ v12; out[5] = v5 ^ v13; out[6] = v6 ^ v14; out[7] = v7 ^ v15;
}

// Little-endian words of bytes[start, start + n) (n <= 64), zero-padded to 16 words.
const pad = new Uint32Array(16);
function words(bytes, start, n) {
  pad.fill(0);
  for (let i = 0; i < n; i++) pad[i >> 2] |= bytes[start + i] << (8 * (i & 3));
  return pad;
}

/** BLAKE3 of `bytes` (a Uint8Array): a 32-byte Uint8Array. */
export function blake3(bytes) {
  const whole = Math.floor(bytes.length / BLOCK);
  const aligned = bytes.byteOffset % 4 === 0;
  const m = aligned ? new Uint32Array(bytes.buffer, bytes.byteOffset, whole * 16) : null;
  const stack = [];
  const cv = new Uint32Array(8);
  const chunks = Math.max(1, Math.ceil(bytes.length / CHUNK));
  let last = null; // the final compression's inputs: [cv, words, counter, len, flags]
  for (let c = 0; c < chunks; c++) {
    cv.set(IV);
    const start = c * CHUNK, end = Math.min(bytes.length, start + CHUNK);
    const blocks = Math.max(1, Math.ceil((end - start) / BLOCK));
    for (let b = 0; b < blocks; b++) {
      const at = start + b * BLOCK, n = Math.min(BLOCK, end - at);
      let flags = (b === 0 ? CHUNK_START : 0) | (b === blocks - 1 ? CHUNK_END : 0);
      const full = n === BLOCK && aligned;
      const src = full ? m : words(bytes, at, n), off = full ? at / 4 : 0;
      if (c === chunks - 1 && b === blocks - 1) {
        last = [cv.slice(), src.slice(off, off + 16), c, n, flags];
      } else {
        compress(cv, src, off, c, n, flags, cv);
      }
    }
    if (c < chunks - 1) { // merge completed subtrees (the reference's add_chunk_chaining_value)
      let right = cv.slice();
      for (let total = c + 1; (total & 1) === 0; total >>= 1) right = parent(stack.pop(), right);
      stack.push(right);
    }
  }
  while (stack.length) { // the last chunk's output, then each subtree on the stack
    const [lcv, lm, counter, len, flags] = last;
    const right = new Uint32Array(8);
    compress(lcv, lm, 0, counter, len, flags, right);
    const block = new Uint32Array(16); block.set(stack.pop(), 0); block.set(right, 8);
    last = [IV.slice(), block, 0, BLOCK, PARENT];
  }
  const [lcv, lm, counter, len, flags] = last;
  const out = new Uint32Array(8);
  compress(lcv, lm, 0, counter, len, flags | ROOT, out);
  const digest = new Uint8Array(32);
  for (let i = 0; i < 32; i++) digest[i] = (out[i >> 2] >>> (8 * (i & 3))) & 0xff;
  return digest;
}

function parent(left, right) {
  const block = new Uint32Array(16); block.set(left, 0); block.set(right, 8);
  const out = new Uint32Array(8);
  compress(IV, block, 0, 0, BLOCK, PARENT, out);
  return out;
}
