// Minimal MessagePack codec for the swarm wire protocol (swarm/wire.py): nil, bool, int,
// float64, str, bin, array, map and ext. Byte strings are Uint8Array; ext values are
// {ext: type, data: Uint8Array}. Decoding is strict: trailing bytes or truncation throw.

const te = new TextEncoder();
const td = new TextDecoder("utf-8", { fatal: true });

export class Ext {
  constructor(type, data) { this.type = type; this.data = data; }
}

/** A number that must travel as a msgpack float (e.g. `seconds`). */
export class Float {
  constructor(value) { this.value = value; }
}

export function encode(value) {
  const out = new Writer();
  write(out, value);
  return out.bytes();
}

class Writer {
  constructor() { this.buf = new Uint8Array(256); this.view = new DataView(this.buf.buffer); this.n = 0; }
  need(k) {
    if (this.n + k <= this.buf.length) return;
    let size = this.buf.length * 2;
    while (size < this.n + k) size *= 2;
    const b = new Uint8Array(size); b.set(this.buf.subarray(0, this.n));
    this.buf = b; this.view = new DataView(b.buffer);
  }
  u8(x) { this.need(1); this.buf[this.n++] = x; }
  u16(x) { this.need(2); this.view.setUint16(this.n, x); this.n += 2; }
  u32(x) { this.need(4); this.view.setUint32(this.n, x); this.n += 4; }
  f64(x) { this.need(8); this.view.setFloat64(this.n, x); this.n += 8; }
  raw(b) { this.need(b.length); this.buf.set(b, this.n); this.n += b.length; }
  bytes() { return this.buf.slice(0, this.n); }
}

function write(w, v) {
  if (v === null || v === undefined) return w.u8(0xc0);
  if (v === false) return w.u8(0xc2);
  if (v === true) return w.u8(0xc3);
  if (v instanceof Float) { w.u8(0xcb); return w.f64(v.value); }
  if (typeof v === "number") {
    if (Number.isInteger(v)) return writeInt(w, v);
    w.u8(0xcb); return w.f64(v);
  }
  if (typeof v === "string") {
    const b = te.encode(v);
    if (b.length < 32) w.u8(0xa0 | b.length);
    else if (b.length < 256) { w.u8(0xd9); w.u8(b.length); }
    else if (b.length < 65536) { w.u8(0xda); w.u16(b.length); }
    else { w.u8(0xdb); w.u32(b.length); }
    return w.raw(b);
  }
  if (v instanceof Uint8Array) {
    if (v.length < 256) { w.u8(0xc4); w.u8(v.length); }
    else if (v.length < 65536) { w.u8(0xc5); w.u16(v.length); }
    else { w.u8(0xc6); w.u32(v.length); }
    return w.raw(v);
  }
  if (v instanceof Ext) {
    const n = v.data.length;
    if (n < 256) { w.u8(0xc7); w.u8(n); } else if (n < 65536) { w.u8(0xc8); w.u16(n); }
    else { w.u8(0xc9); w.u32(n); }
    w.u8(v.type); return w.raw(v.data);
  }
  if (Array.isArray(v)) {
    if (v.length < 16) w.u8(0x90 | v.length);
    else if (v.length < 65536) { w.u8(0xdc); w.u16(v.length); }
    else { w.u8(0xdd); w.u32(v.length); }
    for (const x of v) write(w, x);
    return;
  }
  if (typeof v === "object") {
    const keys = Object.keys(v);
    if (keys.length < 16) w.u8(0x80 | keys.length);
    else { w.u8(0xde); w.u16(keys.length); }
    for (const k of keys) { write(w, k); write(w, v[k]); }
    return;
  }
  throw new TypeError(`msgpack: cannot encode ${typeof v}`);
}

function writeInt(w, v) {
  if (v >= 0) {
    if (v < 128) return w.u8(v);
    if (v < 256) { w.u8(0xcc); return w.u8(v); }
    if (v < 65536) { w.u8(0xcd); return w.u16(v); }
    if (v < 2 ** 32) { w.u8(0xce); return w.u32(v); }
    w.u8(0xcf); w.u32(Math.floor(v / 2 ** 32)); return w.u32(v >>> 0);
  }
  if (v >= -32) return w.u8(v & 0xff);
  if (v >= -128) { w.u8(0xd0); return w.u8(v & 0xff); }
  if (v >= -32768) { w.u8(0xd1); return w.u16(v & 0xffff); }
  if (v >= -(2 ** 31)) { w.u8(0xd2); return w.u32(v >>> 0); }
  w.u8(0xd3); w.u32(Math.floor(v / 2 ** 32) >>> 0); return w.u32(v >>> 0);
}

export function decode(bytes, extHook = (t, d) => new Ext(t, d)) {
  const r = { b: bytes, v: new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength), i: 0, extHook };
  const value = read(r, 0);
  if (r.i !== bytes.length) throw new Error("msgpack: trailing bytes");
  return value;
}

function take(r, n) {
  if (r.i + n > r.b.length) throw new Error("msgpack: truncated");
  const s = r.b.subarray(r.i, r.i + n); r.i += n; return s;
}
function u8(r) { take(r, 1); return r.v.getUint8(r.i - 1); }
function u16(r) { take(r, 2); return r.v.getUint16(r.i - 2); }
function u32(r) { take(r, 4); return r.v.getUint32(r.i - 4); }

function read(r, depth) {
  if (depth > 32) throw new Error("msgpack: nested too deep");
  const t = u8(r);
  if (t < 0x80) return t;
  if (t >= 0xe0) return t - 256;
  if ((t & 0xf0) === 0x80) return readMap(r, t & 0x0f, depth);
  if ((t & 0xf0) === 0x90) return readArray(r, t & 0x0f, depth);
  if ((t & 0xe0) === 0xa0) return td.decode(take(r, t & 0x1f));
  switch (t) {
    case 0xc0: return null;
    case 0xc2: return false;
    case 0xc3: return true;
    case 0xc4: return take(r, u8(r)).slice();
    case 0xc5: return take(r, u16(r)).slice();
    case 0xc6: return take(r, u32(r)).slice();
    case 0xc7: { const n = u8(r); const ty = u8(r); return r.extHook(ty, take(r, n)); }
    case 0xc8: { const n = u16(r); const ty = u8(r); return r.extHook(ty, take(r, n)); }
    case 0xc9: { const n = u32(r); const ty = u8(r); return r.extHook(ty, take(r, n)); }
    case 0xca: take(r, 4); return r.v.getFloat32(r.i - 4);
    case 0xcb: take(r, 8); return r.v.getFloat64(r.i - 8);
    case 0xcc: return u8(r);
    case 0xcd: return u16(r);
    case 0xce: return u32(r);
    case 0xcf: { const hi = u32(r); return hi * 2 ** 32 + u32(r); }
    case 0xd0: take(r, 1); return r.v.getInt8(r.i - 1);
    case 0xd1: take(r, 2); return r.v.getInt16(r.i - 2);
    case 0xd2: take(r, 4); return r.v.getInt32(r.i - 4);
    case 0xd3: { take(r, 8); return Number(r.v.getBigInt64(r.i - 8)); }
    case 0xd4: { const ty = u8(r); return r.extHook(ty, take(r, 1)); }
    case 0xd5: { const ty = u8(r); return r.extHook(ty, take(r, 2)); }
    case 0xd6: { const ty = u8(r); return r.extHook(ty, take(r, 4)); }
    case 0xd7: { const ty = u8(r); return r.extHook(ty, take(r, 8)); }
    case 0xd8: { const ty = u8(r); return r.extHook(ty, take(r, 16)); }
    case 0xd9: return td.decode(take(r, u8(r)));
    case 0xda: return td.decode(take(r, u16(r)));
    case 0xdb: return td.decode(take(r, u32(r)));
    case 0xdc: return readArray(r, u16(r), depth);
    case 0xdd: return readArray(r, u32(r), depth);
    case 0xde: return readMap(r, u16(r), depth);
    case 0xdf: return readMap(r, u32(r), depth);
  }
  throw new Error(`msgpack: unknown type byte 0x${t.toString(16)}`);
}

function readArray(r, n, depth) {
  if (n > r.b.length - r.i) throw new Error("msgpack: array longer than its message");
  const out = new Array(n);
  for (let k = 0; k < n; k++) out[k] = read(r, depth + 1);
  return out;
}

function readMap(r, n, depth) {
  if (n > r.b.length - r.i) throw new Error("msgpack: map longer than its message");
  const out = new Map();
  for (let k = 0; k < n; k++) { const key = read(r, depth + 1); out.set(key, read(r, depth + 1)); }
  return out;
}
