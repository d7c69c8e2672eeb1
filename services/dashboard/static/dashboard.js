// mvlog lag dashboard: polls /api/status (every sample interval) and /api/history, renders with plain
// DOM and inline SVG. No framework, no build step.
"use strict";

const STATUS_COLOURS = { ok: "#22c55e", lagging: "#f59e0b", stalled: "#ef4444", stopped: "#a855f7", unknown: "#64748b" };
const SERIES_COLOURS = ["#38bdf8", "#f472b6", "#a3e635", "#fb923c", "#c084fc", "#2dd4bf", "#facc15", "#f87171"];
const SVG_NS = "http://www.w3.org/2000/svg";
let metric = 1;  // index into a history point: 1 epochs, 2 seconds, 3 records
let lastHistory = {};
let viewOrder = [];

const $ = (id) => document.getElementById(id);

function svg(tag, attrs, text) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  if (text !== undefined) el.textContent = text;
  return el;
}

function fmtSeconds(s) {
  if (s === null || s === undefined) return "-";
  if (s < 60) return s.toFixed(1) + "s";
  if (s < 3600) return (s / 60).toFixed(1) + "m";
  return (s / 3600).toFixed(1) + "h";
}

function fmtCount(n) {
  if (n === null || n === undefined) return "-";
  const units = [["G", 1e9], ["M", 1e6], ["k", 1e3]];
  for (const [u, size] of units) if (Math.abs(n) >= size) return (n / size).toFixed(1) + u;
  return String(Math.round(n * 100) / 100);
}

function age(tsMs, nowMs) {
  if (!tsMs) return "-";
  const s = Math.max(0, (nowMs - tsMs) / 1000);
  return s < 120 ? s.toFixed(1) + "s ago" : s < 7200 ? (s / 60).toFixed(0) + "m ago" : (s / 3600).toFixed(1) + "h ago";
}

function statusOf(v) { return v.status ? v.status.status : (v.kind === "table" ? null : "unknown"); }

function seriesColour(name) {
  const i = viewOrder.indexOf(name);
  return SERIES_COLOURS[(i < 0 ? 0 : i) % SERIES_COLOURS.length];
}

// ------------------------------------------------------------------------------------------ summary

function renderSummary(views) {
  const counts = { ok: 0, lagging: 0, stalled: 0, stopped: 0, unknown: 0 };
  for (const v of views) { const s = statusOf(v); if (s) counts[s] += 1; }
  const tables = views.filter((v) => v.kind === "table").length;
  const box = $("summary");
  box.replaceChildren();
  const cards = [["tables", tables, "#94a3b8"], ...Object.entries(counts).map(([k, n]) => [k, n, STATUS_COLOURS[k]])];
  for (const [label, n, colour] of cards) {
    const card = document.createElement("div");
    card.className = "pill-card";
    card.dataset.summary = label;
    card.innerHTML = `<div class="n" style="color:${colour}">${n}</div><div class="l">${label}</div>`;
    box.appendChild(card);
  }
}

// --------------------------------------------------------------------------------------------- graph

function layers(views) {
  const byName = Object.fromEntries(views.map((v) => [v.name, v]));
  const depth = {};
  const visit = (name, seen) => {
    if (depth[name] !== undefined) return depth[name];
    const v = byName[name];
    if (!v || !v.sources.length || seen.has(name)) return (depth[name] = 0);
    seen.add(name);
    depth[name] = 1 + Math.max(...v.sources.map((s) => visit(s, seen)));
    return depth[name];
  };
  views.forEach((v) => visit(v.name, new Set()));
  const columns = [];
  for (const v of views) (columns[depth[v.name]] ||= []).push(v);
  return columns;
}

function renderGraph(views, edges) {
  const el = $("graph");
  el.replaceChildren();
  const width = el.clientWidth || 600, height = el.clientHeight || 280;
  const columns = layers(views);
  const nodeW = 128, nodeH = 46;
  const pos = {};
  const colGap = columns.length > 1 ? (width - nodeW - 20) / (columns.length - 1) : 0;
  columns.forEach((col, c) => {
    const rowGap = height / (col.length + 1);
    col.forEach((v, r) => { pos[v.name] = { x: 10 + c * colGap, y: rowGap * (r + 1) - nodeH / 2 }; });
  });
  for (const [from, to] of edges) {
    const a = pos[from], b = pos[to];
    if (!a || !b) continue;
    const x1 = a.x + nodeW, y1 = a.y + nodeH / 2, x2 = b.x, y2 = b.y + nodeH / 2, mx = (x1 + x2) / 2;
    el.appendChild(svg("path", { class: "edge", d: `M${x1},${y1} C${mx},${y1} ${mx},${y2} ${x2},${y2}`,
                                 "marker-end": "url(#arrow)" }));
  }
  const defs = svg("defs");
  const marker = svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 6, markerHeight: 6,
                                 orient: "auto-start-reverse" });
  marker.appendChild(svg("path", { d: "M0,0 L10,5 L0,10 z", fill: "#3b4d70" }));
  defs.appendChild(marker);
  el.appendChild(defs);
  for (const v of views) {
    const p = pos[v.name];
    const s = statusOf(v);
    const colour = s ? STATUS_COLOURS[s] : "#94a3b8";
    const g = svg("g", { class: "node", transform: `translate(${p.x},${p.y})`, "data-node": v.name });
    g.appendChild(svg("rect", { width: nodeW, height: nodeH, fill: "#0b1224", stroke: colour }));
    g.appendChild(svg("circle", { cx: 12, cy: 15, r: 5, fill: colour }));
    g.appendChild(svg("text", { x: 24, y: 19, "font-weight": 600 }, v.name));
    const sub = v.kind === "table" ? `table · ${v.state || "-"}` :
      `${v.lag ? v.lag.epochs + " ep · " + fmtSeconds(v.lag.seconds) : "-"}`;
    g.appendChild(svg("text", { x: 12, y: 36, class: "sub" }, sub));
    const title = svg("title", {}, `${v.name}: ${v.state || "-"}${s ? " · " + s : ""}${v.status ? " (" + v.status.reason + ")" : ""}`);
    g.appendChild(title);
    el.appendChild(g);
  }
}

// --------------------------------------------------------------------------------------------- table

function progressCell(fraction, text) {
  if (fraction === null || fraction === undefined) return `<span>${text}</span>`;
  return `<span class="bar"><span style="width:${(fraction * 100).toFixed(1)}%"></span></span>${text}`;
}

function backfillText(b) {
  if (!b) return "<span class='dim'>-</span>";
  const eta = b.eta_seconds !== null ? ` · ETA ${fmtSeconds(b.eta_seconds)}` : "";
  const text = b.fraction !== null ? `${(b.fraction * 100).toFixed(0)}% (${fmtCount(b.rows_done)}/${fmtCount(b.rows_total)})${eta}`
    : `${fmtCount(b.rows_done)} rows`;
  return progressCell(b.fraction, text);
}

function cacheText(cache) {
  if (!cache) return "<span class='dim'>-</span>";
  return Object.entries(cache).map(([up, c]) =>
    progressCell(c.fraction, `${up} ${fmtCount(c.bytes)}B${c.epochs !== null ? " · " + fmtCount(c.epochs) + " ep" : ""}`)).join("<br>");
}

function backpressureText(bp) {
  if (!bp) return "<span class='dim'>-</span>";
  const bound = bp.max_epoch_lag !== null ? `max ${bp.max_epoch_lag} epochs` : "no bound";
  return bp.holding ? `${bound} · <b style="color:var(--lagging)">holding upstream</b>` : bound;
}

function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

// A source table: its topic, dead letters and problems (its lag behind the topic fills the lag cells).
function sourceText(src) {
  if (!src) return "";
  const dead = src.dead_letters
    ? ` <span class="tag" title="${escapeHtml(src.dead_letter_topic)}" data-field="dead-letters">${src.dead_letters} dead-lettered</span>` : "";
  const problems = (src.problems || []).map((p) =>
    ` <span class="tag" style="color:var(--stalled)" data-field="source-problem" title="${escapeHtml(p)}">source stopped: ${escapeHtml(p)}</span>`).join("");
  return dead + problems;
}

function renderTable(doc) {
  const body = document.querySelector("#views tbody");
  body.replaceChildren();
  if (!doc.views.length) {
    body.innerHTML = `<tr><td colspan="12" class="dim">No tables or views under prefix ${doc.prefix} yet
      (mvlog create-table, mvlog create-view).</td></tr>`;
    return;
  }
  for (const v of doc.views) {
    const tr = document.createElement("tr");
    const s = statusOf(v);
    tr.dataset.view = v.name;
    tr.dataset.status = s || "";
    const lag = v.lag;
    if (lag) {
      tr.dataset.sampleTs = lag.ts_ms;
      tr.dataset.lagMce = lag.mce ?? "";
      tr.dataset.upstreams = JSON.stringify(lag.upstreams);
    }
    const srcLag = !lag && v.source ? v.source.lag : null;  // a source table behind its topic
    const lagTitle = lag ? lag.upstreams.map((u) =>
      `${u.upstream} (MCE ${u.upstream_mce}): ${u.epochs} epochs, ${fmtSeconds(u.seconds)}, ${u.records} records`).join("\n")
      : srcLag ? `behind topic ${srcLag.topic}: ${srcLag.records} records, oldest waiting ${fmtSeconds(srcLag.seconds)}` : "";
    const replacing = v.replacement_summary ? ` <span class="tag" title="replacement">replacement: ${v.replacement_summary}</span>` : "";
    const state = (v.state || "-") + (v.reason ? ` (${v.reason})` : "") + replacing + sourceText(v.source);
    const statusCell = s ? `<span class="status ${s}" title="${(v.status && v.status.reason) || ""}">${s}</span>`
      : "<span class='dim'>-</span>";
    tr.innerHTML = `
      <td class="name">${v.name}<small>${v.source ? "table ← topic " + escapeHtml(v.source.topic) : v.kind === "table" ? "table" : "← " + v.sources.join(", ")}</small></td>
      <td data-field="state">${state}</td>
      <td class="num" data-field="mce" title="${v.mce_ms ? new Date(v.mce_ms).toISOString() : ""}">${v.mce ?? "-"}</td>
      <td class="num" data-field="committed">${age(v.mce_committed_ts_ms, doc.ts_ms)}</td>
      <td class="num" data-field="lag-epochs" title="${lagTitle}">${lag ? lag.epochs : "-"}</td>
      <td class="num" data-field="lag-seconds" title="${lagTitle}">${lag ? fmtSeconds(lag.seconds) : srcLag ? fmtSeconds(srcLag.seconds) : "-"}</td>
      <td class="num" data-field="lag-records" title="${lagTitle}">${lag ? lag.records : srcLag ? srcLag.records : "-"}</td>
      <td data-field="status">${statusCell}</td>
      <td data-field="backfill">${backfillText(v.backfill)}</td>
      <td data-field="cache">${cacheText(v.cache)}</td>
      <td data-field="backpressure">${backpressureText(v.backpressure)}</td>
      <td class="num" data-field="rows">${v.rows}</td>`;
    body.appendChild(tr);
  }
}

// --------------------------------------------------------------------------------------------- chart

function niceMax(value) {
  if (value <= 0) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(value)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= value) return m * p;
  return 10 * p;
}

function renderChart() {
  const el = $("chart");
  el.replaceChildren();
  const width = el.clientWidth || 700, height = el.clientHeight || 280;
  const left = 52, right = 12, top = 10, bottom = 24;
  const series = Object.entries(lastHistory).filter(([, pts]) => pts.length);
  let tMin = Infinity, tMax = -Infinity, yMax = 0;
  for (const [, pts] of series) for (const p of pts) {
    tMin = Math.min(tMin, p[0]); tMax = Math.max(tMax, p[0]); yMax = Math.max(yMax, p[metric] ?? 0);
  }
  const legend = $("legend");
  legend.replaceChildren();
  if (!series.length) {
    el.appendChild(svg("text", { x: width / 2, y: height / 2, "text-anchor": "middle", fill: "#8da2c0" },
                       "no lag samples yet"));
    return;
  }
  if (tMax === tMin) tMax = tMin + 1000;
  yMax = niceMax(yMax);
  const x = (t) => left + (t - tMin) / (tMax - tMin) * (width - left - right);
  const y = (v) => top + (1 - v / yMax) * (height - top - bottom);
  const axis = svg("g", { class: "axis" });
  for (let i = 0; i <= 4; i++) {
    const v = yMax * i / 4;
    axis.appendChild(svg("line", { class: "grid-line", x1: left, x2: width - right, y1: y(v), y2: y(v) }));
    const label = metric === 2 ? fmtSeconds(v) : fmtCount(v);
    axis.appendChild(svg("text", { x: left - 6, y: y(v) + 4, "text-anchor": "end" }, label));
  }
  for (let i = 0; i <= 4; i++) {
    const t = tMin + (tMax - tMin) * i / 4;
    const d = new Date(t);
    const anchor = i === 0 ? "start" : i === 4 ? "end" : "middle";
    axis.appendChild(svg("text", { x: x(t), y: height - 6, "text-anchor": anchor },
                         d.toLocaleTimeString([], { hour12: false })));
  }
  el.appendChild(axis);
  for (const [name, pts] of series) {
    const colour = seriesColour(name);
    const d = pts.map((p, i) => `${i ? "L" : "M"}${x(p[0]).toFixed(1)},${y(p[metric] ?? 0).toFixed(1)}`).join(" ");
    el.appendChild(svg("path", { d, fill: "none", stroke: colour, "stroke-width": 2, "data-series": name }));
    const item = document.createElement("span");
    item.innerHTML = `<i style="background:${colour}"></i>${name}`;
    legend.appendChild(item);
  }
}

// ------------------------------------------------------------------------------------------- polling

function setConnection(ok, text) {
  const el = $("connection");
  el.className = "conn " + (ok ? "live" : "down");
  el.textContent = text;
}

async function pollStatus() {
  let delay = 1000;
  try {
    const response = await fetch("/api/status", { cache: "no-store" });
    const doc = await response.json();
    if (!response.ok) throw new Error(doc.error || response.statusText);
    delay = doc.sample_interval_ms || 1000;
    viewOrder = doc.views.filter((v) => v.kind === "view").map((v) => v.name);
    $("prefix").textContent = doc.prefix;
    $("sampler").textContent = doc.sampler || "none";
    $("updated").textContent = new Date(doc.ts_ms).toLocaleTimeString([], { hour12: false });
    renderSummary(doc.views);
    renderGraph(doc.views, doc.edges);
    renderTable(doc);
    document.body.dataset.updated = doc.ts_ms;
    if (doc.broker && doc.broker !== "ok") setConnection(false, "Kafka broker " + doc.broker);
    else setConnection(true, "live");
  } catch (error) {
    setConnection(false, "disconnected: " + error.message);
  }
  setTimeout(pollStatus, delay);
}

async function pollHistory() {
  try {
    const response = await fetch("/api/history?points=300", { cache: "no-store" });
    if (response.ok) { lastHistory = await response.json(); renderChart(); }
  } catch (error) { /* the status poll reports the connection */ }
  setTimeout(pollHistory, 2000);
}

for (const button of document.querySelectorAll("#metric-tabs button")) {
  button.addEventListener("click", () => {
    metric = Number(button.dataset.metric);
    document.querySelectorAll("#metric-tabs button").forEach((b) => b.classList.toggle("active", b === button));
    renderChart();
  });
}
window.addEventListener("resize", renderChart);
pollStatus();
pollHistory();
