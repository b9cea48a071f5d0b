// The training panel: the job's loss (per step) and accuracy (per epoch) curves, polled from
// /training.json each second and drawn on canvases.

import { curve } from "./curve.js";

const $ = (id) => document.getElementById(id);

async function refresh() {
  try {
    const s = await (await fetch("/training.json")).json();
    $("model").textContent = s.model + (s.done ? " (done)" : "");
    $("step").textContent = `${s.step} / ${s.steps}`;
    $("epoch").textContent = String(s.epoch);
    $("rate").textContent = String(s.samples_per_s);
    $("lr").textContent = String(s.lr);
    $("updated").textContent = new Date().toLocaleTimeString();
    const drawn = curve($("loss"), s.losses, "loss per step");
    const acc = curve($("accuracy"), s.epochs.map((e) => [e.epoch, e.accuracy]), "accuracy per epoch", 0, 1);
    document.body.dataset.points = `${drawn},${acc}`;
    $("ranks").querySelector("tbody").replaceChildren(...s.ranks.map((r) => {
      const tr = document.createElement("tr");
      for (const [text, cls] of [[r.peer.slice(0, 12)], [String(r.samples), "num"], [String(r.rejected), "num"], [String(r.failed), "num"]]) {
        const td = document.createElement("td"); td.textContent = text; if (cls) td.className = cls; tr.append(td);
      }
      return tr;
    }));
    document.body.dataset.state = s.done ? "done" : "live";
  } catch (err) {
    document.body.dataset.state = "error";
    $("updated").textContent = `cannot reach the trainer: ${err.message}`;
  }
}

refresh();
setInterval(refresh, 1000);
