// The tab's actor host: the built-in "matmul" actor's matmul method and the "mlp" actor's
// grad method (mlp.js) on the wire protocol (rt.put / rt.task -> rt.result / rt.failed), one
// task at a time, objects checked against their content address as a native worker checks them.

import { decode as mpDecode, Float } from "./msgpack.js";
import { WireArray } from "./wire.js";
import { WireLink } from "./link.js";
import { blake3 } from "./blake3.js";
import { mlpTrace } from "./mlp.js";

const DTYPE_STR = { float32: "<f4", float16: "<f2", bf16: "|V2", float64: "<f8", int32: "<i4", uint32: "<u4" };
const STORE_CAP = 512 << 20;
const te = new TextEncoder();

function objectId(arr) {
  const head = te.encode(`${DTYPE_STR[arr.dtype]}|${arr.shape.join(",")}|`);
  const buf = new Uint8Array(head.length + arr.bytes.length); // fresh: word-aligned
  buf.set(head); buf.set(arr.bytes, head.length);
  return blake3(buf);
}

const hex = (b) => Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");

export class TabHost {
  constructor(backend, onEvent = () => {}) {
    this.backend = backend; this.onEvent = onEvent;
    this.store = new Map(); this.stored = 0; this.queue = Promise.resolve();
    this.paused = null; this.busy = false; this.links = new Set(); this.stats = { tasks: 0, failed: 0 };
  }

  attach(channel) {
    const link = new WireLink(channel, (l, m) => this.onMessage(l, m), (l, why) => {
      this.links.delete(l); this.onEvent("link-closed", why);
    });
    this.links.add(link);
    return link;
  }

  onMessage(link, msg) {
    const f = msg.fields;
    if (msg.type === "rt.put") {
      this.queue = this.queue.then(() => this.put(f.get("oid"), f.get("array")));
    } else if (msg.type === "rt.task") {
      const task = f.get("task");
      if (this.paused) {
        link.send("rt.failed", { task, kind: "busy", message: `tab paused: ${this.paused}`, missing: [] });
        return;
      }
      this.queue = this.queue.then(() => this.run(link, f)).catch((err) => {
        this.stats.failed++;
        link.send("rt.failed", { task, kind: "error", message: String(err).slice(0, 500), missing: [] });
      });
    } else if (msg.type === "rt.cancel") {
      // a running task cannot be stopped; a queued one runs anyway (its answer is ignored)
    } else if (msg.type === "rt.verdict" && !f.get("accepted")) {
      // a tab signs no receipts: say so at once, so the requester need not wait for one
      link.send("rt.receipt", { task: f.get("task"), receipt: new Uint8Array(0) });
    }
  }

  async put(oid, arr) {
    const got = objectId(arr);
    if (hex(got) !== hex(oid)) return; // does not match its content: dropped, as natively
    const values = { shape: arr.shape, data: arr.toFloat32() };
    this.store.set(hex(oid), values);
    this.stored += values.data.byteLength;
    for (const [key, v] of this.store) { // oldest first
      if (this.stored <= STORE_CAP) break;
      this.store.delete(key); this.stored -= v.data.byteLength;
    }
  }

  async run(link, f) {
    const task = f.get("task");
    const what = `${f.get("actor")}.${f.get("method")}`;
    if (what !== "matmul.matmul" && what !== "mlp.grad") {
      return link.send("rt.failed", { task, kind: "invalid", message: "a browser tab runs only matmul.matmul and mlp.grad", missing: [] });
    }
    const args = [], missing = [];
    for (const arg of f.get("args")) {
      const arr = arg.get("array"), oid = arg.get("oid");
      if (arr) args.push({ shape: arr.shape, data: arr.toFloat32() });
      else if (oid && this.store.has(hex(oid))) args.push(this.store.get(hex(oid)));
      else if (oid) missing.push(oid);
      else throw new Error("a task argument needs an object id or an array");
    }
    if (missing.length) return link.send("rt.failed", { task, kind: "missing", message: "objects not held", missing });
    const params = f.get("params");
    const p = params && params.length ? mpDecode(params) : new Map();
    if (what === "mlp.grad") return this.grad(link, task, args, p);
    for (const key of p.keys()) if (key !== "precision") throw new Error(`matmul takes only precision=, got ${key}`);
    if (args.length !== 2) throw new Error("matmul takes 2 arrays");
    const [a, b] = args;
    if (a.shape.length !== 2 || b.shape.length !== 2 || a.shape[1] !== b.shape[0]) throw new Error("matmul shapes do not chain");
    const [m, k] = a.shape, n = b.shape[1];
    this.onEvent("task-start", { m, k, n });
    this.busy = true;
    const t0 = performance.now();
    const c = await this.backend.matmul(a.data, m, k, b.data, n).finally(() => { this.busy = false; });
    const seconds = (performance.now() - t0) / 1000;
    this.stats.tasks++;
    this.onEvent("task-done", { m, k, n, seconds });
    return link.send("rt.result", { task, outputs: [WireArray.float32([m, n], c)], seconds: new Float(seconds) });
  }

  // one block of an MLP's training step: (x, parameters), sizes=, labels= -> the block's trace
  async grad(link, task, args, p) {
    for (const key of p.keys()) {
      if (!["sizes", "labels", "precision"].includes(key)) throw new Error(`grad takes sizes=, labels=, precision=; got ${key}`);
    }
    if ((p.get("precision") ?? "f32") !== "f32") {
      return link.send("rt.failed", { task, kind: "invalid", message: "a browser tab traces in f32 only", missing: [] });
    }
    if (args.length !== 2) throw new Error("grad takes 2 arrays (x, parameters)");
    const [x, flat] = args, sizes = p.get("sizes") ?? [], labels = (p.get("labels") ?? []).map(Number);
    if (x.shape.length !== 2 || x.shape[1] !== sizes[0] || flat.shape.length !== 1) throw new Error("grad's arrays do not fit sizes=");
    const rows = x.shape[0];
    this.onEvent("task-start", { m: rows, k: sizes[0], n: sizes.at(-1) });
    this.busy = true;
    const t0 = performance.now();
    const trace = await mlpTrace((a, m, k, b, n) => this.backend.matmul(a, m, k, b, n), x.data, rows,
                                 flat.data, sizes.map(Number), labels).finally(() => { this.busy = false; });
    const seconds = (performance.now() - t0) / 1000;
    this.stats.tasks++;
    this.onEvent("task-done", { m: rows, k: sizes[0], n: sizes.at(-1), seconds });
    return link.send("rt.result", { task, outputs: [WireArray.float32([trace.length], trace)], seconds: new Float(seconds) });
  }
}
