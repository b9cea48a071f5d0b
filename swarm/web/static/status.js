// The live status panel: what `swarm status` shows, polled from /status.json, with a
// per-peer throughput plot drawn on a canvas.

import { curve } from "./curve.js";

const $ = (id) => document.getElementById(id);
const COLORS = ["#1f6feb", "#d1242f", "#1a7f37", "#9a6700", "#8250df", "#bc4c00", "#0969da", "#57606a"];
const short = (p) => (p ? p.slice(0, 12) : "none");

function rows(table, items, cells) {
  const body = $(table).querySelector("tbody");
  if (!items.length) { // an empty table says so, not bare headers
    const td = document.createElement("td");
    td.textContent = "none"; td.className = "none";
    td.colSpan = $(table).querySelectorAll("thead th").length;
    const tr = document.createElement("tr"); tr.append(td);
    body.replaceChildren(tr);
    return;
  }
  body.replaceChildren(...items.map((item) => {
    const tr = document.createElement("tr");
    for (const [text, cls] of cells(item)) {
      const td = document.createElement("td");
      td.textContent = text; if (cls) td.className = cls;
      tr.append(td);
    }
    return tr;
  }));
}

function plot(history) {
  const canvas = $("plot"), ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, padL = 40, padB = 20;
  ctx.clearRect(0, 0, w, h);
  const peers = [...new Set(history.flatMap((s) => Object.keys(s.peers)))].sort();
  const max = Math.max(1, ...history.flatMap((s) => Object.values(s.peers).map((v) => v.shards)));
  ctx.strokeStyle = "#d0d7de"; ctx.fillStyle = "#57606a"; ctx.font = "11px sans-serif";
  for (let i = 0; i <= 4; i++) {
    const y = h - padB - ((h - padB - 10) * i) / 4;
    ctx.beginPath(); ctx.moveTo(padL, y); ctx.lineTo(w, y); ctx.stroke();
    ctx.fillText(((max * i) / 4).toFixed(1), 4, y + 4);
  }
  ctx.fillText("shards/s over the last samples", padL + 4, h - 5);
  const n = Math.max(2, history.length);
  peers.forEach((peer, k) => {
    ctx.strokeStyle = COLORS[k % COLORS.length]; ctx.lineWidth = 2; ctx.beginPath();
    history.forEach((s, i) => {
      const v = s.peers[peer] ? s.peers[peer].shards : 0;
      const x = padL + ((w - padL) * i) / (n - 1), y = h - padB - ((h - padB - 10) * v) / max;
      if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
    });
    ctx.stroke();
  });
  $("legend").replaceChildren(...peers.map((peer, k) => {
    const span = document.createElement("span"), dot = document.createElement("i");
    dot.style.background = COLORS[k % COLORS.length];
    span.append(dot, short(peer));
    return span;
  }));
}

// per model served: loss and accuracy against the seconds since its first point
function training(series) {
  $("training-none").hidden = series.length > 0;
  const box = $("training"), drawn = [];
  for (const [k, m] of series.entries()) {
    let part = box.children[k];
    if (!part) {
      part = document.createElement("section");
      const title = document.createElement("h3"), loss = document.createElement("canvas"),
        acc = document.createElement("canvas");
      for (const c of [loss, acc]) { c.width = 800; c.height = 200; }
      part.append(title, loss, acc);
      box.append(part);
    }
    const [title, loss, acc] = part.children, t0 = m.points.length ? m.points[0][0] : 0;
    title.textContent = `${m.model}: ${m.samples} samples in the last ${m.points.length} s with work`;
    const at = (i) => m.points.map((p) => [p[0] - t0, p[i]]);
    drawn.push(`${curve(loss, at(2), "loss, each second (x: seconds since the first block)")}:${curve(acc, at(3), "accuracy, each second", 0, 1)}`);
  }
  while (box.children.length > series.length) box.lastChild.remove();
  document.body.dataset.training = drawn.join(",");
}

function memory(m) {
  if (!m) return "-";
  const mib = (n) => (n / 1048576).toFixed(0);
  return `${mib(m.used)} / ${mib(m.offered)} MiB`;
}

async function refresh() {
  try {
    const s = await (await fetch("/status.json")).json();
    $("name").textContent = JSON.stringify(s.name);
    $("owner").textContent = `${s.owner.fingerprint.slice(0, 24)} ${s.owner.hardware_backed ? "(hardware-backed)" : "(NOT hardware-backed)"}`;
    $("coordinator").textContent = short(s.coordinator);
    $("term").textContent = String(s.term);
    $("running").textContent = String(s.running_tasks);
    $("updated").textContent = new Date().toLocaleTimeString();
    rows("members", s.members, (m) => [[short(m.peer_id)], [m.kind], [m.role], [m.tflops.toFixed(4), "num"],
      [String(m.tasks), "num"], [memory(m.memory), "num"], [m.link]]);
    rows("placements", s.placements.flatMap((p) => p.spans.map((sp) => ({ model: p.model, ...sp }))),
      (sp) => [[sp.model ? sp.model.slice(0, 12) : "unnamed"], [`${sp.blocks[0]}-${sp.blocks[1]}`], [short(sp.worker)]]);
    rows("jobs", s.jobs, (j) => [[short(j.requester)], [String(j.tasks), "num"], [j.workers.map(short).join(", ")]]);
    rows("blocked", s.blocked, (b) => [[short(b.peer_id)], [b.by], [b.reason || "-"]]);
    plot(s.throughput);
    training(s.training || []);
    document.body.dataset.state = "live";
  } catch (err) {
    document.body.dataset.state = "error";
    $("updated").textContent = `cannot reach the node: ${err.message}`;
  }
}

refresh();
setInterval(refresh, 1000);
