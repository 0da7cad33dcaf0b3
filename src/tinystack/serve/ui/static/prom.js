// The Prometheus text exposition format, read in the browser: samples, histograms, quantiles.
//
//   # HELP name text          (ignored)
//   # TYPE name counter|gauge|histogram|summary|untyped
//   name{label="value",...} 1.5 [timestamp]
//
// A histogram `h` is the samples h_bucket{le=...} (cumulative counts), h_sum and h_count.
// Series that differ in other labels (model, route, ...) are added together: the dashboard
// shows the whole server. Nothing here throws on odd input: bad lines are skipped.

const LINE = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?\s*$/;
const LABEL = /([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"/g;

/** "1.5", "+Inf", "-Inf", "NaN" -> a number (NaN when unreadable). */
export function parseValue(text) {
  if (text === "+Inf" || text === "Inf") return Infinity;
  if (text === "-Inf") return -Infinity;
  return Number(text);
}

function unescape(v) {
  return v.replace(/\\(.)/g, (_, c) => (c === "n" ? "\n" : c));
}

/** Exposition text -> {types: {family: type}, samples: [{name, labels, value}]}. */
export function parseMetrics(text) {
  const types = {}, samples = [];
  for (const raw of String(text).split("\n")) {
    const line = raw.trim();
    if (!line) continue;
    if (line.startsWith("#")) {
      const m = /^#\s*TYPE\s+(\S+)\s+(\S+)/.exec(line);
      if (m) types[m[1]] = m[2];
      continue;
    }
    const m = LINE.exec(line);
    if (!m) continue;
    const labels = {};
    if (m[2]) for (const [, k, v] of m[2].matchAll(LABEL)) labels[k] = unescape(v);
    samples.push({ name: m[1], labels, value: parseValue(m[3]) });
  }
  return { types, samples };
}

/** Is `name` exposed at all: a TYPE line (for a counter also under its name without _total,
 * as OpenMetrics writes it) or a sample? A labelled counter with no series yet has only the TYPE. */
export function hasMetric(metrics, name) {
  return name in metrics.types || name.replace(/_total$/, "") in metrics.types
    || metrics.samples.some((s) => s.name === name || s.name === `${name}_count`);
}

/** Sum of the samples called `name` (all label sets), or null when there is none. */
export function total(metrics, name) {
  let sum = null;
  for (const s of metrics.samples) if (s.name === name && !Number.isNaN(s.value)) sum = (sum || 0) + s.value;
  return sum;
}

/** {label value: sum} of the samples called `name`, split by `label`. */
export function byLabel(metrics, name, label) {
  const out = {};
  for (const s of metrics.samples) {
    if (s.name !== name || Number.isNaN(s.value)) continue;
    const key = s.labels[label] ?? "";
    out[key] = (out[key] || 0) + s.value;
  }
  return out;
}

/** The histogram `name` as {buckets: [[le, cumulative count], ...] sorted by le, sum, count}, or null. */
export function histogram(metrics, name) {
  const counts = new Map();
  for (const s of metrics.samples) {
    if (s.name !== `${name}_bucket` || !("le" in s.labels)) continue;
    const le = parseValue(s.labels.le);
    if (!Number.isNaN(le)) counts.set(le, (counts.get(le) || 0) + s.value);
  }
  const count = total(metrics, `${name}_count`);
  if (!counts.size && count === null) return null;
  const buckets = [...counts.entries()].sort((a, b) => a[0] - b[0]);
  return { buckets, sum: total(metrics, `${name}_sum`) || 0, count: count ?? (buckets.length ? buckets.at(-1)[1] : 0) };
}

/**
 * What was observed between two readings of a histogram: `cur` - `prev`, bucket by bucket.
 * Returns `cur` itself when there is no `prev`, when the buckets differ, or when a count went
 * down (the server restarted).
 */
export function histogramDelta(cur, prev) {
  if (!cur || !prev || cur.buckets.length !== prev.buckets.length) return cur;
  const buckets = cur.buckets.map(([le, c], i) => [le, c - prev.buckets[i][1]]);
  if (cur.buckets.some(([le], i) => le !== prev.buckets[i][0]) || buckets.some(([, c]) => c < 0)
      || cur.count < prev.count) return cur;
  return { buckets, sum: cur.sum - prev.sum, count: cur.count - prev.count };
}

/**
 * The q-quantile (0..1) estimated from cumulative buckets, as Prometheus' histogram_quantile does:
 * find the bucket holding rank q*count and interpolate linearly inside it (from 0 for the first
 * bucket); a rank in the +Inf bucket answers the highest finite bound. null when nothing was observed.
 */
export function quantile(q, hist) {
  if (!hist || !hist.buckets.length) return null;
  const buckets = hist.buckets;
  const count = buckets.at(-1)[1];
  if (!(count > 0)) return null;
  const rank = q * count;
  let i = buckets.findIndex(([, c]) => c >= rank);
  if (i < 0) i = buckets.length - 1;
  const [upper, cum] = buckets[i];
  if (upper === Infinity) return buckets.length > 1 ? buckets[buckets.length - 2][0] : null;
  const [lower, below] = i === 0 ? [0, 0] : buckets[i - 1];
  if (i === 0 && upper <= 0) return upper;
  const inBucket = cum - below;
  return inBucket > 0 ? lower + ((upper - lower) * (rank - below)) / inBucket : upper;
}
