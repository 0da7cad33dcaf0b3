// The live dashboard: reads GET /metrics (Prometheus text) every POLL_MS and shows the server's state.
//
// Gauges are shown as read. Rates and distributions are computed between two readings:
// tokens/s from the counter's increase over the elapsed time; batch size and latency
// percentiles from the histogram's increase (what was observed since the last poll), or from
// the whole histogram while nothing new was observed. A metric the server does not expose
// shows a dash; a failed poll keeps the last figures and says so.
import { DASH, authHeaders, errorMessage, fmt, fmtMs, setupKeyField } from "/ui/ui.js";
import { byLabel, hasMetric, histogram, histogramDelta, parseMetrics, quantile, total } from "/ui/prom.js";

// --- The contract with the server's /metrics: family name and Prometheus type. -----------------
// (tests/serve/test_serve_ui.py reads this block and checks every name against the real /metrics.)
export const METRICS = {
  running: { name: "tinystack_num_requests_running", type: "gauge" },
  waiting: { name: "tinystack_num_requests_waiting", type: "gauge" },
  kvUsage: { name: "tinystack_kv_cache_usage", type: "gauge" },
  batchSize: { name: "tinystack_batch_size", type: "histogram" },
  e2eLatency: { name: "tinystack_e2e_request_latency_seconds", type: "histogram" },
  ttft: { name: "tinystack_time_to_first_token_seconds", type: "histogram" },
  generationTokens: { name: "tinystack_generation_tokens_total", type: "counter" },
  failures: { name: "tinystack_request_failures_total", type: "counter" },
};
// -------------------------------------------------------------------------------------------------

const POLL_MS = 1000;
const HISTORY = 120;  // points kept for the sparklines (two minutes)
const $ = (id) => document.getElementById(id);
const history = { tps: [], load: [], p50: [] };
let prev = null;  // the last reading: {t, tokens, hists: {key: histogram}}

/** The histogram's observations since `before` when there are any, else all of them. */
function recent(hist, before) {
  if (!hist) return { hist: null, scope: "" };
  const delta = histogramDelta(hist, before);
  if (before && delta !== hist && delta.count > 0) return { hist: delta, scope: "last poll" };
  return { hist, scope: "since start" };
}

function set(id, text) { $(id).textContent = text; }

function push(series, value) {
  series.push(value);
  if (series.length > HISTORY) series.shift();
}

/** Draw `series` (nulls are skipped) into the <svg viewBox="0 0 120 60"> `id`. */
function sparkline(id, series, label) {
  const svg = $(id);
  const vals = series.filter((v) => v !== null && Number.isFinite(v));
  const max = Math.max(1e-9, ...vals);
  const pts = [];
  series.forEach((v, i) => {
    if (v === null || !Number.isFinite(v)) return;
    pts.push(`${(120 * (i + HISTORY - series.length)) / (HISTORY - 1)},${58 - (56 * v) / max}`);
  });
  const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  line.setAttribute("points", pts.join(" "));
  svg.replaceChildren(line);
  $(`${id}-last`).textContent = vals.length ? `${label(vals.at(-1))} (max ${label(max)})` : "";
}

function update(m, now) {
  const gauge = (key) => total(m, METRICS[key].name);
  const running = gauge("running"), waiting = gauge("waiting");
  const kvs = Object.values(byLabel(m, METRICS.kvUsage.name, "replica"));  // one per replica, or one
  const kv = kvs.length ? kvs.reduce((a, b) => a + b, 0) / kvs.length : null;
  set("running", fmt(running, 0));
  set("waiting", fmt(waiting, 0));
  set("kv", kv === null ? DASH : fmt(100 * kv, 1));
  replicas(m);

  const hists = Object.fromEntries(["batchSize", "e2eLatency", "ttft"].map((k) => [k, histogram(m, METRICS[k].name)]));
  const batch = recent(hists.batchSize, prev && prev.hists.batchSize);
  set("batch", batch.hist && batch.hist.count > 0 ? fmt(batch.hist.sum / batch.hist.count, 2) : DASH);
  set("batch-note", batch.hist && batch.hist.count > 0 ? `mean per engine step, ${batch.scope}` : "");

  const e2e = recent(hists.e2eLatency, prev && prev.hists.e2eLatency);
  const ttft = recent(hists.ttft, prev && prev.hists.ttft);
  const ms = (q, r) => { const s = quantile(q, r.hist); return s === null ? null : 1000 * s; };
  for (const q of [50, 90, 99]) {
    set(`e2e-p${q}`, fmtMs(ms(q / 100, e2e)));
    set(`ttft-p${q}`, fmtMs(ms(q / 100, ttft)));
  }
  set("latency-note", e2e.hist && e2e.hist.count > 0 ? `(${e2e.hist.count} requests, ${e2e.scope})` : "");

  const tokens = total(m, METRICS.generationTokens.name);
  let tps = null;
  if (prev && tokens !== null && prev.tokens !== null && tokens >= prev.tokens && now > prev.t) {
    tps = (tokens - prev.tokens) / ((now - prev.t) / 1000);
  }
  set("tps", fmt(tps, 1));

  if (hasMetric(m, METRICS.failures.name)) {
    const reasons = byLabel(m, METRICS.failures.name, "reason");
    set("errors", fmt(total(m, METRICS.failures.name) || 0, 0));
    set("errors-note", Object.entries(reasons).filter(([, n]) => n > 0).map(([r, n]) => `${r} ${n}`).join(" \u00b7 "));
  } else {
    set("errors", DASH);
  }

  push(history.tps, tps);
  push(history.load, running === null && waiting === null ? null : (running || 0) + (waiting || 0));
  push(history.p50, ms(0.5, e2e));
  sparkline("spark-tps", history.tps, (v) => fmt(v, 1));
  sparkline("spark-load", history.load, (v) => fmt(v, 0));
  sparkline("spark-p50", history.p50, fmtMs);
  prev = { t: now, tokens, hists };
  return Object.values(METRICS).filter((d) => hasMetric(m, d.name)).length;  // how many are exposed
}

/** Behind the gateway (serve/replicas) the engine gauges carry a `replica` label: one row per replica. */
function replicas(m) {
  const run = byLabel(m, METRICS.running.name, "replica");
  const ids = Object.keys(run).filter((id) => id !== "").sort();
  $("replicas").hidden = ids.length === 0;
  if (!ids.length) return;
  const wait = byLabel(m, METRICS.waiting.name, "replica"), kv = byLabel(m, METRICS.kvUsage.name, "replica");
  const cell = (text) => { const td = document.createElement("td"); td.textContent = text; return td; };
  $("replicas-rows").replaceChildren(...ids.map((id) => {
    const tr = document.createElement("tr");
    tr.append(cell(id), cell(fmt(run[id], 0)), cell(fmt(wait[id] ?? null, 0)),
              cell(kv[id] === undefined ? DASH : `${fmt(100 * kv[id], 1)} %`));
    return tr;
  }));
  set("replicas-note", `${ids.length} up \u00b7 load = running + waiting`);
}

function status(state, text) {
  $("poll-status").dataset.state = state;
  $("poll-status").textContent = text;
}

async function poll() {
  try {
    const resp = await fetch("/metrics", { headers: authHeaders({ Accept: "text/plain" }), cache: "no-store" });
    if (!resp.ok) throw new Error(await errorMessage(resp));
    const known = update(parseMetrics(await resp.text()), performance.now());
    const wanted = Object.keys(METRICS).length;
    status(known ? "ok" : "empty", known ? `updated ${new Date().toLocaleTimeString()} \u00b7 ${known}/${wanted} metrics exposed`
      : "/metrics answered, but with none of the tinystack metrics this page shows");
  } catch (e) {
    status("error", `cannot read /metrics: ${e.message || e} (showing the last figures)`);
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

setupKeyField();
poll();
