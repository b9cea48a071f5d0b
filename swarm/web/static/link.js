// A swarm link over one RTCDataChannel, as swarm/links/webrtc.py speaks it: wire frames,
// a credit window in both directions (link.credit), pings answered, goodbye honoured.

import { encode, Decoder } from "./wire.js";

const WINDOW = 16 << 20, HIGH_WATER = 4 << 20;

export class WireLink {
  /** `onMessage(link, msg)` gets every message that is not link housekeeping. */
  constructor(channel, onMessage, onClose) {
    this.channel = channel; this.onMessage = onMessage; this.onClose = onClose;
    this.decoder = new Decoder(); this.ids = 1; this.credit = WINDOW; this.consumed = 0;
    this.waiters = []; this.queue = Promise.resolve(); this.closed = null;
    channel.binaryType = "arraybuffer";
    channel.bufferedAmountLowThreshold = 1 << 20;
    channel.onmessage = (e) => this.receive(e.data);
    channel.onclose = () => this.close("data channel closed", false);
  }

  receive(data) {
    if (this.closed) return;
    try {
      if (!(data instanceof ArrayBuffer)) throw new Error("text frame on a swarm link");
      const frame = new Uint8Array(data);
      this.consumed += frame.length;
      if (this.consumed >= WINDOW / 4 && this.channel.readyState === "open") {
        const [grant] = encode("link.credit", { nbytes: this.consumed }, 0);
        this.channel.send(grant); this.credit -= grant.length; this.consumed = 0;
      }
      for (const msg of this.decoder.feed(frame)) this.dispatch(msg);
    } catch (err) {
      console.warn(`swarm link ${this.channel.label}: ${err.stack}`);
      this.send("link.goodbye", { reason: `protocol error: ${err.message}`.slice(0, 200) });
      this.close(`protocol error: ${err.message}`, false);
    }
  }

  dispatch(msg) {
    const f = msg.fields;
    switch (msg.type) {
      case "link.ping": this.send("link.pong", { seq: f.get("seq") }); return;
      case "link.pong": return;
      case "link.credit":
        this.credit += f.get("nbytes");
        this.wake(); return;
      case "link.goodbye": this.close(`closed by peer: ${f.get("reason")}`, false); return;
      default: this.onMessage(this, msg);
    }
  }

  wake() { const w = this.waiters; this.waiters = []; w.forEach((r) => r()); }

  /** Send one message; messages leave in call order (a promise chain). */
  send(type, fields) {
    const frames = encode(type, fields, this.ids++ >>> 0 || 1);
    const run = async () => {
      for (const frame of frames) {
        while (this.credit < frame.length && !this.closed) {
          await new Promise((r) => this.waiters.push(r));
        }
        if (this.closed || this.channel.readyState !== "open") return;
        this.credit -= frame.length;
        this.channel.send(frame);
        if (this.channel.bufferedAmount > HIGH_WATER) {
          await new Promise((r) => { this.channel.onbufferedamountlow = r; });
        }
      }
    };
    this.queue = this.queue.then(run, run);
    return this.queue;
  }

  close(reason, local = true) {
    if (this.closed) return;
    this.closed = reason;
    this.wake();
    if (local && this.channel.readyState === "open") {
      this.send("link.goodbye", { reason: reason.slice(0, 200) });
    }
    setTimeout(() => this.channel.close(), local ? 200 : 0);
    if (this.onClose) this.onClose(this, reason);
  }
}
