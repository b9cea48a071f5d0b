// One curve on a canvas, shared by the training panel (training.js) and the node's status
// panel (status.js).

// points: [[x, y], ...]; y null (not finite) is skipped; returns how many were drawn
export function curve(canvas, points, label, yMin = null, yMax = null) {
  const ctx = canvas.getContext("2d"), w = canvas.width, h = canvas.height, padL = 48, padB = 20;
  ctx.clearRect(0, 0, w, h);
  const pts = points.filter((p) => p[1] !== null);
  const ys = pts.map((p) => p[1]);
  const lo = yMin ?? Math.min(0, ...ys), hi = yMax ?? Math.max(1e-9, ...ys);
  const xMax = Math.max(1, ...pts.map((p) => p[0]));
  ctx.strokeStyle = "#d0d7de"; ctx.fillStyle = "#57606a"; ctx.font = "11px sans-serif";
  for (let i = 0; i <= 4; i++) {
    const y = h - padB - ((h - padB - 10) * i) / 4;
    ctx.beginPath(); ctx.moveTo(padL, y); ctx.lineTo(w, y); ctx.stroke();
    ctx.fillText((lo + ((hi - lo) * i) / 4).toFixed(3), 4, y + 4);
  }
  ctx.fillText(label, padL + 4, h - 5);
  ctx.strokeStyle = "#1f6feb"; ctx.lineWidth = 2; ctx.beginPath();
  pts.forEach(([x, v], i) => {
    const px = padL + ((w - padL) * x) / xMax, py = h - padB - ((h - padB - 10) * (v - lo)) / (hi - lo || 1);
    if (i === 0) ctx.moveTo(px, py); else ctx.lineTo(px, py);
  });
  ctx.stroke();
  return pts.length;
}
