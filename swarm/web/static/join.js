// The join page: consent, the tab's checks, signed signaling, the WebRTC link, the host.

import { loadIdentity, verifier, fromHex } from "./identity.js";
import { gpuBackend, selfTest, measure } from "./gpu.js";
import { cpuBackend } from "./cpu.js";
import { TabHost } from "./host.js";

const DOMAIN = new TextEncoder().encode("swarm web signal v1\0");
const ANNOUNCE_PREFIX = new TextEncoder().encode("swarm-dht-announce\0");
const MEMBERS_TOPIC = new TextEncoder().encode("swarm/members/");
const $ = (id) => document.getElementById(id);

function setState(state, text) {
  document.body.dataset.state = state;
  $("state").textContent = text;
}

function concat(a, b) { const o = new Uint8Array(a.length + b.length); o.set(a); o.set(b, a.length); return o; }
const b64 = (bytes) => btoa(String.fromCharCode(...bytes));
const unb64 = (text) => Uint8Array.from(atob(text), (c) => c.charCodeAt(0));

async function main() {
  const config = await (await fetch("/config.json")).json();
  $("name").textContent = JSON.stringify(config.name);
  $("swarm").textContent = config.swarm;
  $("owner").textContent = config.owner.slice(0, 24);
  $("hw").textContent = config.hardware_backed ? "(hardware-backed)" : "(software key, not hardware-backed)";
  $("server").textContent = config.server_id;
  $("runs").textContent = config.runs;
  const remembered = `swarm-consent:${config.swarm}`;
  const go = () => { $("consent").hidden = true; start(config).catch((e) => setState("failed", `Failed: ${e.message}`)); };
  $("always").onclick = () => { localStorage.setItem(remembered, "always"); go(); };
  $("once").onclick = go;
  $("notnow").onclick = () => { $("consent").hidden = true; setState("declined", "Not joined: nothing runs in this tab."); };
  if (localStorage.getItem(remembered) === "always") { setState("remembered", "You chose Always for this swarm."); go(); }
  else setState("asking", "Waiting for your answer.");
}

/** The faster of the validated backends, as native `auto` picks (SwiftShader's WebGPU is
 * slower than plain JavaScript); `?backend=webgpu|cpu` forces one. A WebGPU that fails its
 * check is not papered over with the CPU: the tab declines. Returns [backend, TFLOPS]. */
async function pickBackend() {
  setState("checking", "Checking this tab's GPU…");
  const forced = new URLSearchParams(location.search).get("backend");
  const gpu = forced === "cpu" ? null : await gpuBackend("/kernel/matmul_tiled.wgsl").catch(() => null);
  if (forced === "webgpu" && !gpu) throw Object.assign(new Error("this tab has no WebGPU; not joining"), { declined: true });
  const options = forced === "webgpu" ? [gpu] : forced === "cpu" ? [cpuBackend()] : [gpu, cpuBackend()].filter(Boolean);
  let best = null;
  for (const backend of options) {
    try {
      await selfTest(backend);
    } catch (err) {
      throw Object.assign(new Error(`this tab's ${backend.name} failed its check (${err.message}); not joining`), { declined: true });
    }
    const tflops = await measure(backend, 128, 300);
    if (!best || tflops > best[1]) best = [backend, tflops];
  }
  return best;
}

async function start(config) {
  let backend, tflops;
  try {
    [backend, tflops] = await pickBackend();
  } catch (err) {
    setState("declined-gpu", err.message);
    return;
  }
  const me = await loadIdentity();
  $("me").hidden = false;
  $("peer").textContent = me.peerId;
  $("backend").textContent = `${backend.name}${backend.detail ? ` (${backend.detail})` : ""}`;
  $("speed").textContent = `${(tflops * 1000).toFixed(2)} GFLOPS measured`;
  // Tasks run before "joined" are the node's check of this tab, not shards of any job.
  let checkTasks = null;
  const showDone = () => { $("done").textContent = String(checkTasks === null ? 0 : host.stats.tasks - checkTasks); };
  const host = new TabHost(backend, (event) => { if (event === "task-done") showDone(); });
  window.swarmTab = { peer: me.peerId, host, backend: backend.name, tflops };
  watchPause(host);
  const verify = await verifier(fromHex(config.server));
  setState("connecting", "Connecting to the swarm…");
  const ws = new WebSocket(`ws://${location.host}/ws`);
  let nonce = null, pc = null;
  const send = async (body) => {
    const text = JSON.stringify({ ...body, nonce });
    const sig = await me.sign(concat(DOMAIN, new TextEncoder().encode(text)));
    ws.send(JSON.stringify({ b: text, s: b64(sig) }));
  };
  ws.onmessage = async (event) => {
    const outer = JSON.parse(event.data);
    const ok = await verify(unb64(outer.s), concat(DOMAIN, new TextEncoder().encode(outer.b)));
    if (!ok) { setState("failed", "The node's signature did not verify; leaving."); ws.close(); return; }
    const body = JSON.parse(outer.b);
    if (nonce !== null && body.nonce !== nonce) return;
    if (body.t === "hello") {
      nonce = body.nonce;
      pc = new RTCPeerConnection();
      host.attach(pc.createDataChannel("swarm", { ordered: true }));
      pc.onconnectionstatechange = () => {
        if (["failed", "closed"].includes(pc.connectionState)) setState("left", "Disconnected from the swarm.");
      };
      await pc.setLocalDescription(await pc.createOffer());
      await gathered(pc);
      await send({ t: "join", peer: me.hex, offer: pc.localDescription.sdp, tflops, backend: backend.name });
    } else if (body.t === "answer") {
      setState("validating", "Connected; the node is checking this tab's results…");
      await pc.setRemoteDescription({ type: "answer", sdp: body.sdp });
    } else if (body.t === "sign") {
      const buf = unb64(body.buf);
      const topicAt = ANNOUNCE_PREFIX.length + 1;
      const okPrefix = ANNOUNCE_PREFIX.every((x, i) => buf[i] === x)
        && MEMBERS_TOPIC.every((x, i) => buf[topicAt + i] === x);
      if (!okPrefix) { setState("failed", "The node asked to sign something that is not a member record."); ws.close(); return; }
      await send({ t: "signed", sig: b64(await me.sign(buf)) });
    } else if (body.t === "open") { // one channel per requester, labelled by the node
      if (typeof body.label === "string" && body.label.length < 200) {
        host.attach(pc.createDataChannel(body.label, { ordered: true }));
      }
    } else if (body.t === "joined") {
      window.swarmTab.checkSeconds = body.check_seconds;
      checkTasks = host.stats.tasks; showDone();
      setState("joined", `Joined as ${me.peerId.slice(0, 12)}: computing for the swarm.`);
    } else if (body.t === "refused") {
      setState("refused", `Refused by the node: ${body.reason}`);
      ws.close();
    }
  };
  ws.onclose = () => {
    if (!["refused", "failed"].includes(document.body.dataset.state)) setState("left", "Left the swarm.");
    if (pc) pc.close();
  };
}

function gathered(pc) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    pc.addEventListener("icegatheringstatechange", () => pc.iceGatheringState === "complete" && resolve());
    setTimeout(resolve, 3000);
  });
}

function watchPause(host) {
  let battery = null;
  const update = () => {
    const low = battery && !battery.charging && battery.level < 0.2;
    host.paused = document.hidden ? "hidden" : low ? "low battery" : null;
  };
  document.addEventListener("visibilitychange", update);
  if (navigator.getBattery) {
    navigator.getBattery().then((b) => { battery = b; b.onlevelchange = b.onchargingchange = update; update(); }).catch(() => {});
  }
  update();
}

main();
