// The swarm wire protocol (swarm/wire.py) in the browser: typed messages as msgpack header
// frames, large arrays as raw chunk frames. A message is {type, fields}; an array is a
// WireArray {dtype, shape, bytes}. The decoder enforces the same limits as a native peer.

import { encode as mpEncode, decode as mpDecode, Ext } from "./msgpack.js";

export const VERSION = 1, HEADER = 1, CHUNK = 2, EXT_ARRAY = 1;
export const MAX_FRAME = 256 * 1024;
const CHUNK_HEAD = 12; // u8 version | u8 kind | u32 msg id | u16 array | u32 chunk (LE)
export const CHUNK_SIZE = MAX_FRAME - CHUNK_HEAD;
const INLINE_MAX = 64 * 1024;
const ITEMSIZE = { float32: 4, float16: 2, bf16: 2, float64: 8, int32: 4, uint32: 4,
  int8: 1, uint8: 1, int16: 2, uint16: 2, int64: 8, uint64: 8, bool: 1 };
const MAX_ARRAY = 256 << 20, MAX_PENDING = 8;

export class WireArray {
  constructor(dtype, shape, bytes) {
    if (!(dtype in ITEMSIZE)) throw new Error(`dtype ${dtype} does not travel on the wire`);
    this.dtype = dtype; this.shape = shape; this.bytes = bytes;
  }
  get size() { return this.shape.reduce((a, b) => a * b, 1); }
  /** The values as a Float32Array (f32, f16 and bf16 widen exactly). */
  toFloat32() {
    const b = this.bytes, n = this.size;
    if (this.dtype === "float32") {
      return new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + 4 * n));
    }
    const u16 = new Uint16Array(b.buffer.slice(b.byteOffset, b.byteOffset + 2 * n));
    const out = new Float32Array(n);
    if (this.dtype === "bf16") {
      const bits = new Uint32Array(out.buffer);
      for (let i = 0; i < n; i++) bits[i] = u16[i] << 16;
      return out;
    }
    if (this.dtype === "float16") {
      for (let i = 0; i < n; i++) out[i] = halfToFloat(u16[i]);
      return out;
    }
    throw new Error(`cannot compute on ${this.dtype} arrays`);
  }
  static float32(shape, values) {
    return new WireArray("float32", shape, new Uint8Array(values.buffer, values.byteOffset, values.byteLength));
  }
}

function halfToFloat(h) {
  const s = h & 0x8000 ? -1 : 1, e = (h >> 10) & 0x1f, f = h & 0x3ff;
  if (e === 0) return s * f * 2 ** -24;
  if (e === 31) return f ? NaN : s * Infinity;
  return s * (1 + f / 1024) * 2 ** (e - 15);
}

/** Frames for one message; `fields` may hold WireArrays anywhere. */
export function encode(type, fields, msgId) {
  const chunked = [];
  let budget = INLINE_MAX, index = 0;
  const walk = (v) => {
    if (v instanceof WireArray) {
      const i = index++;
      let inline = null;
      if (v.bytes.length <= budget) { budget -= v.bytes.length; inline = v.bytes; }
      else chunked.push([i, v.bytes]);
      return new Ext(EXT_ARRAY, mpEncode([i, v.dtype, v.shape, inline]));
    }
    if (Array.isArray(v)) return v.map(walk);
    if (v && typeof v === "object" && !(v instanceof Uint8Array) && v.constructor === Object) {
      const o = {}; for (const k of Object.keys(v)) o[k] = walk(v[k]); return o;
    }
    return v;
  };
  const body = mpEncode([msgId, type, walk(fields)]);
  const header = new Uint8Array(2 + body.length);
  header[0] = VERSION; header[1] = HEADER; header.set(body, 2);
  if (header.length > MAX_FRAME) throw new Error(`${type}: header over ${MAX_FRAME} bytes`);
  const frames = [header];
  for (const [i, bytes] of chunked) {
    for (let c = 0, start = 0; start < bytes.length; c++, start += CHUNK_SIZE) {
      const part = bytes.subarray(start, start + CHUNK_SIZE);
      const f = new Uint8Array(CHUNK_HEAD + part.length);
      const dv = new DataView(f.buffer);
      dv.setUint8(0, VERSION); dv.setUint8(1, CHUNK); dv.setUint32(2, msgId, true);
      dv.setUint16(6, i, true); dv.setUint32(8, c, true); f.set(part, CHUNK_HEAD);
      frames.push(f);
    }
  }
  return frames;
}

/** Sans-IO decoder: feed(frame) -> completed messages [{type, fields}]. Throws on bad input. */
export class Decoder {
  constructor() { this.pending = new Map(); }

  feed(frame) {
    if (!(frame instanceof Uint8Array)) throw new Error("a frame is binary");
    if (frame.length > MAX_FRAME || frame.length < 2) throw new Error("bad frame size");
    if (frame[0] !== VERSION) throw new Error(`protocol version ${frame[0]}`);
    if (frame[1] === HEADER) return this.header(frame);
    if (frame[1] === CHUNK) return this.chunk(frame);
    throw new Error(`unknown frame kind ${frame[1]}`);
  }

  header(frame) {
    const refs = [];
    const decoded = mpDecode(frame.subarray(2), (type, data) => {
      if (type !== EXT_ARRAY) throw new Error(`unknown ext ${type}`);
      const meta = mpDecode(data);
      const [i, dtype, shape, inline] = meta;
      if (!(dtype in ITEMSIZE) || !Array.isArray(shape) || shape.length > 16) throw new Error("bad array header");
      const nbytes = shape.reduce((a, b) => a * b, 1) * ITEMSIZE[dtype];
      if (!Number.isSafeInteger(nbytes) || nbytes > MAX_ARRAY) throw new Error("array too large");
      if (inline !== null && inline.length !== nbytes) throw new Error("inline array size");
      const ref = { i, arr: new WireArray(dtype, shape, inline ?? new Uint8Array(nbytes)),
        chunks: inline === null ? Math.ceil(nbytes / CHUNK_SIZE) : 0, seen: new Set() };
      refs.push(ref);
      return ref.arr;
    });
    if (!Array.isArray(decoded) || decoded.length !== 3 || typeof decoded[1] !== "string") {
      throw new Error("header is not [msg_id, type, {fields}]");
    }
    const [msgId, type, fields] = decoded;
    refs.forEach((r, k) => { if (r.i !== k) throw new Error("array indices out of order"); });
    const missing = refs.reduce((a, r) => a + r.chunks, 0);
    const msg = { type, fields };
    if (missing === 0) return [msg];
    if (this.pending.size >= MAX_PENDING || this.pending.has(msgId)) throw new Error("too many messages in flight");
    this.pending.set(msgId, { msg, refs, missing });
    return [];
  }

  chunk(frame) {
    if (frame.length < CHUNK_HEAD) throw new Error("chunk frame too short");
    const dv = new DataView(frame.buffer, frame.byteOffset, frame.byteLength);
    const msgId = dv.getUint32(2, true), i = dv.getUint16(6, true), c = dv.getUint32(8, true);
    const p = this.pending.get(msgId);
    const ref = p && p.refs[i];
    if (!ref || ref.chunks === 0 || c >= ref.chunks || ref.seen.has(c)) throw new Error("unexpected chunk");
    const start = c * CHUNK_SIZE;
    const expect = Math.min(CHUNK_SIZE, ref.arr.bytes.length - start);
    if (frame.length - CHUNK_HEAD !== expect) throw new Error("chunk size");
    ref.arr.bytes.set(frame.subarray(CHUNK_HEAD), start);
    ref.seen.add(c);
    if (--p.missing > 0) return [];
    this.pending.delete(msgId);
    return [p.msg];
  }
}
