"""The page served at /llmload/live: the LLM tab's figures with charts over time.

Self-contained (inline CSS, JS and SVG; nothing fetched from elsewhere). It polls
`live.json` every POLL_MS and draws TTFT and TPOT p50/p99 and output tokens/s.
"""

from __future__ import annotations

POLL_MS = 2000

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><link rel="icon" href="data:,"><title>llmload live</title>
<style>
body { font: 14px system-ui, sans-serif; margin: 1rem 2rem; color: #222; }
table { border-collapse: collapse; margin: .5rem 0 1rem; }
th, td { border-bottom: 1px solid #ddd; padding: .25rem .6rem; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.now { background: #eef6ff; }
.sim { color: #b00; font-weight: bold; }
.charts { display: flex; flex-wrap: wrap; gap: 1rem; }
figure { margin: 0; } figcaption { font-weight: bold; }
svg text { font-size: 11px; fill: #555; }
.note { color: #666; }
</style></head>
<body>
<h1>llmload: live statistics</h1>
<p id="sim" class="sim" hidden>SIMULATED target: these figures are not inference performance.</p>
<p id="current">waiting for data…</p>
<p>Report: <span id="report">built when the run stops</span></p>
<p class="note" id="accuracy"></p>
<table id="steps"><thead><tr><th>step</th><th>concurrency (or rate) target / actual in flight</th>
<th>requests</th><th>failed</th><th>failures by kind</th><th>TTFT ms p50 / p90 / p99</th>
<th>TPOT ms p50 / p90 / p99</th><th>ITL ms p50 / p90 / p99</th><th>E2E s p50 / p90 / p99</th>
<th>output tok/s</th><th>req/s</th></tr></thead><tbody></tbody></table>
<div class="charts">
<figure><figcaption>TTFT (ms)</figcaption><svg id="chart-ttft" width="420" height="200"></svg></figure>
<figure><figcaption>TPOT (ms)</figcaption><svg id="chart-tpot" width="420" height="200"></svg></figure>
<figure><figcaption>output tokens/s</figcaption><svg id="chart-tokens" width="420" height="200"></svg></figure>
</div>
<script>
"use strict";
const NS = "http://www.w3.org/2000/svg";
const COLORS = ["#1f77b4", "#d62728"];
function el(tag, attrs, text) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}
function fmt(v, scale, digits) {
  return v === null || v === undefined ? "–" : (v * scale).toFixed(digits);
}
function pcts(d, scale, digits) {
  if (!d) return "–";
  return ["p50", "p90", "p99"].map((p) => fmt(d[p], scale, digits)).join(" / ");
}
function chart(id, series, names) {
  const svg = document.getElementById(id);
  svg.replaceChildren();
  const W = 420, H = 200, L = 50, B = 20;
  const pts = series.flatMap((s) => s.filter((p) => p[1] !== null));
  svg.appendChild(el("rect", {x: L, y: 0, width: W - L, height: H - B, fill: "none", stroke: "#ccc"}));
  if (!pts.length) { svg.appendChild(el("text", {x: L + 10, y: 20}, "no data yet")); return; }
  const t0 = Math.min(...pts.map((p) => p[0])), t1 = Math.max(...pts.map((p) => p[0]));
  const vmax = Math.max(...pts.map((p) => p[1])) * 1.1 || 1;
  const x = (t) => L + (t1 > t0 ? (t - t0) / (t1 - t0) : 0) * (W - L - 5);
  const y = (v) => (H - B) - (v / vmax) * (H - B - 5);
  svg.appendChild(el("text", {x: 2, y: 12}, vmax.toPrecision(3)));
  svg.appendChild(el("text", {x: 2, y: H - B}, "0"));
  svg.appendChild(el("text", {x: L, y: H - 4}, "0 s"));
  svg.appendChild(el("text", {x: W - 40, y: H - 4}, Math.round(t1 - t0) + " s"));
  series.forEach((s, i) => {
    const line = s.filter((p) => p[1] !== null).map((p) => x(p[0]) + "," + y(p[1])).join(" ");
    svg.appendChild(el("polyline", {points: line, fill: "none", stroke: COLORS[i], "stroke-width": 1.5}));
    svg.appendChild(el("text", {x: L + 8 + 60 * i, y: 14, fill: COLORS[i]}, names[i]));
  });
}
function render(data) {
  const snap = data.snapshot || {steps: [], series: [], current: {}};
  document.getElementById("sim").hidden = !data.simulated;
  const acc = snap.relative_accuracy;
  document.getElementById("accuracy").textContent = data.live === false
    ? "No live statistics on this master."
    : "Live figures from merged sketches (relative accuracy " + (acc === undefined ? "?" : acc * 100) +
      "%); the report has the exact numbers.";
  const c = snap.current || {};
  document.getElementById("current").textContent = c.step === null || c.step === undefined
    ? (c.cold ? "now: cold phase at concurrency " + c.concurrency : "no step running")
    : "now: step " + c.step + (c.rate === null || c.rate === undefined
        ? " at concurrency " + c.concurrency : " at " + c.rate + " requests/s") +
      (c.time_left_s === null || c.time_left_s === undefined ? "" : ", " + Math.round(c.time_left_s) + " s left") +
      ", workers: " + snap.workers;
  const rep = document.getElementById("report");
  rep.replaceChildren();
  if (data.report) {
    const r = data.report;
    if (r.status === "done") {
      const a = document.createElement("a");
      a.href = "report?run=" + encodeURIComponent(r.run_id);
      a.id = "report-link";
      a.textContent = "open the report of run " + r.run_id;
      rep.appendChild(a);
    } else {
      rep.textContent = r.status + (r.elapsed_s !== null ? " (" + r.elapsed_s + " s)" : "") +
        (r.error ? ": " + r.error : "") + " — " + r.command;
    }
  } else { rep.textContent = "built when the run stops"; }
  const body = document.querySelector("#steps tbody");
  body.replaceChildren();
  for (const s of snap.steps || []) {
    const tr = document.createElement("tr");
    const now = (s.group === "cold" && c.cold) || (s.group !== "cold" && s.step === c.step && !c.cold);
    if (now) tr.className = "now";
    const kinds = Object.entries(s.errors || {}).map(([k, v]) => k + " " + v).join(", ");
    const cells = [s.group === "cold" ? "cold" : "step " + s.step,
      (s.rate === null || s.rate === undefined ? s.concurrency : s.rate + "/s") + " / " +
        fmt(s.actual_concurrency, 1, 2), s.requests, s.failed, kinds || "–",
      pcts(s.ttft, 1000, 1), pcts(s.tpot, 1000, 2), pcts(s.itl, 1000, 2), pcts(s.e2e, 1, 3),
      fmt(s.output_tokens_per_s, 1, 1), fmt(s.requests_per_s, 1, 2)];
    for (const v of cells) { const td = document.createElement("td"); td.textContent = v; tr.appendChild(td); }
    body.appendChild(tr);
  }
  const ser = snap.series || [];
  const pick = (k, scale) => ser.map((p) => [p.t, p[k] === null || p[k] === undefined ? null : p[k] * scale]);
  chart("chart-ttft", [pick("ttft_p50", 1000), pick("ttft_p99", 1000)], ["p50", "p99"]);
  chart("chart-tpot", [pick("tpot_p50", 1000), pick("tpot_p99", 1000)], ["p50", "p99"]);
  chart("chart-tokens", [pick("output_tokens_per_s", 1)], ["tok/s"]);
}
async function poll() {
  try {
    const resp = await fetch("live.json", {cache: "no-store"});
    if (resp.ok) render(await resp.json());
  } catch (e) { document.getElementById("current").textContent = "master not reachable"; }
  setTimeout(poll, __POLL_MS__);
}
poll();
</script>
</body></html>
""".replace("__POLL_MS__", str(POLL_MS))
