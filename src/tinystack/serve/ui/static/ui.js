// Shared by the playground and the dashboard: the API key field, and number formatting.
//
// The key is kept in localStorage (this browser only) so that both pages and a reload
// use it; it is sent as `Authorization: Bearer <key>` when the field is filled.

const KEY_STORAGE = "tinystack.apiKey";

/** Wire the page's #api-key input to localStorage. */
export function setupKeyField() {
  const input = document.getElementById("api-key");
  if (!input) return;
  try { input.value = localStorage.getItem(KEY_STORAGE) || ""; } catch (e) { /* storage disabled */ }
  input.addEventListener("input", () => {
    try { localStorage.setItem(KEY_STORAGE, input.value.trim()); } catch (e) { /* storage disabled */ }
  });
}

/** Headers for a call to the server: the Bearer key when one is typed in, plus `extra`. */
export function authHeaders(extra = {}) {
  const input = document.getElementById("api-key");
  const key = input ? input.value.trim() : "";
  return key ? { ...extra, Authorization: `Bearer ${key}` } : { ...extra };
}

export const DASH = "\u2014";  // what a value that is not known (yet) shows

/** A number with `digits` decimals, or the dash for null / NaN / infinite. */
export function fmt(x, digits = 1) {
  return x === null || x === undefined || !Number.isFinite(x) ? DASH : x.toFixed(digits);
}

/** Milliseconds for display: "0.42 ms", "12.3 ms", "1.52 s"; the dash when unknown. */
export function fmtMs(ms) {
  if (ms === null || ms === undefined || !Number.isFinite(ms)) return DASH;
  if (ms >= 1000) return `${(ms / 1000).toFixed(2)} s`;
  return `${ms.toFixed(ms < 10 ? 2 : 1)} ms`;
}

/** The message of an OpenAI-shaped error body, or the HTTP status text. */
export async function errorMessage(resp) {
  try {
    const body = await resp.json();
    if (body && body.error && body.error.message) return `${resp.status}: ${body.error.message}`;
  } catch (e) { /* not JSON */ }
  return `${resp.status} ${resp.statusText}`;
}
