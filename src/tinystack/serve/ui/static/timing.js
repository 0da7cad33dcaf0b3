// Where one request's time went: queue / prefill / decode (+ other), from the best source at hand.
//
// Sources, best first, field by field:
//   1. "server"   the `timing` object of the final streamed chunk (milliseconds):
//                 {queue_ms, prefill_ms, decode_ms, ttft_ms, total_ms}
//   2. "headers"  x-queue-time, x-time-to-first-token, x-inference-time, x-total-time
//                 (seconds as decimal strings, e.g. "0.0123")
//   3. "client"   measured in the browser: time to the first chunk, and to the end of the stream
//                 (includes the network; the queue is not visible from here)
// Missing parts are derived: prefill = ttft - queue, decode = inference - prefill (or total - ttft).
// Every segment is clamped at 0; "other" is the rest of the total (validation, detokenising,
// the network for client-side numbers), so the segments always add up to the total.

const HEADER_SECONDS = {
  queue_ms: "x-queue-time",
  ttft_ms: "x-time-to-first-token",
  inference_ms: "x-inference-time",
  total_ms: "x-total-time",
};
const SERVER_FIELDS = ["queue_ms", "prefill_ms", "decode_ms", "inference_ms", "ttft_ms", "total_ms"];

const isNum = (x) => typeof x === "number" && Number.isFinite(x);

/** Header name -> milliseconds, or null when the header is absent or not a number. */
function headerMs(headers, name) {
  const raw = headers && typeof headers.get === "function" ? headers.get(name) : null;
  if (raw === null || raw === undefined || String(raw).trim() === "") return null;
  const seconds = Number(raw);
  return Number.isFinite(seconds) ? seconds * 1000 : null;
}

/**
 * chunkTiming: the final chunk's `timing` object or null; headers: a fetch `Headers` (or anything
 * with get(name)) or null; client: {ttft_ms, total_ms} measured here.
 * Returns {segments: [{name, ms}], total_ms, ttft_ms, sources: {field: source}}; segment ms are >= 0
 * and sum to total_ms.
 */
export function resolveTiming(chunkTiming, headers, client) {
  const known = {}, sources = {};
  const take = (source, values) => {
    for (const [field, v] of Object.entries(values)) {
      if (isNum(v) && !(field in known)) { known[field] = v; sources[field] = source; }
    }
  };
  if (chunkTiming && typeof chunkTiming === "object") {
    take("server", Object.fromEntries(SERVER_FIELDS.map((f) => [f, chunkTiming[f]])));
  }
  take("headers", Object.fromEntries(Object.entries(HEADER_SECONDS).map(([f, h]) => [f, headerMs(headers, h)])));
  take("client", { ttft_ms: client && client.ttft_ms, total_ms: client && client.total_ms });

  const pos = (x) => Math.max(0, x);
  const queue = isNum(known.queue_ms) ? pos(known.queue_ms) : null;
  let prefill = isNum(known.prefill_ms) ? pos(known.prefill_ms) : null;
  if (prefill === null && isNum(known.ttft_ms)) prefill = pos(known.ttft_ms - (queue || 0));
  let decode = isNum(known.decode_ms) ? pos(known.decode_ms) : null;
  if (decode === null && isNum(known.inference_ms) && prefill !== null) decode = pos(known.inference_ms - prefill);
  else if (decode === null && isNum(known.total_ms) && isNum(known.ttft_ms)) decode = pos(known.total_ms - known.ttft_ms);

  const segments = [["queue", queue], ["prefill", prefill], ["decode", decode]]
    .filter(([, ms]) => ms !== null).map(([name, ms]) => ({ name, ms }));
  const parts = segments.reduce((s, seg) => s + seg.ms, 0);
  const total = Math.max(isNum(known.total_ms) ? known.total_ms : 0, parts);
  if (total - parts > 0.005) segments.push({ name: "other", ms: total - parts });
  return { segments, total_ms: total, ttft_ms: isNum(known.ttft_ms) ? known.ttft_ms : null, sources };
}
