// The playground: a chat (POST /v1/chat/completions: the system message, every earlier turn and the new
// message, so the server applies the model's chat template to the whole conversation) or a plain completion
// (POST /v1/completions), streamed; the text is shown as it arrives, then the request's timing bar. A turn
// joins the conversation only once its answer has arrived whole: a failed or stopped request leaves the
// conversation as it was and the message in the box, to send again.
//
// Structured outputs: the response-format box sends `response_format` (none, json_object, or json_schema with
// the schema typed below it); the tools box (chat) sends `tools`, and the answer's calls arrive as
// delta.tool_calls pieces, assembled and shown as calls ("name(arguments)"), never as text.
//
// The answer is server-sent events over a POST, so it is read with fetch + a stream reader
// (EventSource can only GET): events are separated by a blank line, each `data: <json>`, the
// last `data: [DONE]`. With stream_options.include_usage the final chunk (choices: []) carries
// the usage and, when the server provides it, the `timing` object (see timing.js).
import { authHeaders, errorMessage, fmtMs, setupKeyField } from "/ui/ui.js";
import { resolveTiming } from "/ui/timing.js";

const $ = (id) => document.getElementById(id);
let controller = null;  // AbortController of the request in flight
const history = [];  // the conversation so far: {role: "user" | "assistant", content[, tool_calls]}
let calls = [];  // the answer's tool calls so far: {id, type, function: {name, arguments}}

const chatMode = () => $("mode-chat").checked;

/** The messages of the next chat turn: the system message (if any), the conversation, the new message. */
function chatMessages(text) {
  const system = $("system").value.trim();
  return [...(system ? [{ role: "system", content: system }] : []), ...history, { role: "user", content: text }];
}

/** The request body: the message (chat) or prompt, and the form's parameters; numbers are sent as numbers
 * (the API is strict). */
function requestBody(chat, text) {
  const num = (id, parse) => { const v = $(id).value.trim(); return v === "" ? null : parse(v); };
  const body = {
    ...(chat ? { messages: chatMessages(text) } : { prompt: text }),
    max_tokens: num("max_tokens", (v) => parseInt(v, 10)),
    temperature: num("temperature", parseFloat),
    top_p: num("top_p", parseFloat),
    top_k: num("top_k", (v) => parseInt(v, 10)),
    seed: num("seed", (v) => parseInt(v, 10)),
    stream: true,
    stream_options: { include_usage: true },
    ...structuredFields(chat),
  };
  for (const k of Object.keys(body)) if (body[k] === null || Number.isNaN(body[k])) delete body[k];
  return body;
}

/** response_format and tools from their boxes (a JSON error is thrown, shown as the request's error). */
function structuredFields(chat) {
  const out = {};
  const format = $("response-format").value;
  if (format === "json_object") out.response_format = { type: "json_object" };
  if (format === "json_schema") {
    let schema;
    try { schema = JSON.parse($("json-schema").value); } catch (e) { throw new Error(`JSON Schema: ${e.message}`); }
    out.response_format = { type: "json_schema", json_schema: { name: "playground", schema } };
  }
  const tools = $("tools").value.trim();
  if (chat && tools) {
    try { out.tools = JSON.parse(tools); } catch (e) { throw new Error(`tools: ${e.message}`); }
  }
  return out;
}

/** Add a stream's delta.tool_calls pieces to `calls` (the first piece of a call has its id and name, the
 * next ones more of its arguments) and show every call. */
function addToolCalls(pieces) {
  for (const p of pieces) {
    if (!calls[p.index]) calls[p.index] = { id: p.id, type: "function", function: { name: p.function.name, arguments: "" } };
    calls[p.index].function.arguments += p.function.arguments || "";
  }
  $("tool-calls").hidden = calls.length === 0;
  $("tool-calls").replaceChildren(...calls.map((c) => {
    const div = document.createElement("div");
    div.className = "tool-call";
    div.dataset.name = c.function.name;
    div.textContent = `\u2192 ${c.function.name}(${c.function.arguments})`;
    return div;
  }));
}

function setState(state, text) {
  $("status").dataset.state = state;
  $("status").textContent = text;
  $("send").disabled = state === "streaming";
  $("stop").disabled = state !== "streaming";
}

function showError(message) {
  $("error").hidden = false;
  $("error").textContent = message;
}

/** Yield the parsed `data:` payloads of an SSE byte stream ("[DONE]" is yielded as the string). */
async function* sseEvents(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += value.replace(/\r\n?/g, "\n");
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      const data = event.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
      if (data) yield data === "[DONE]" ? data : JSON.parse(data);
    }
  }
}

function renderTiming(t) {
  const total = t.total_ms || 0;
  $("timing").hidden = false;
  $("timing-total").textContent = `total ${fmtMs(total)}` + (t.ttft_ms !== null ? ` \u00b7 first token ${fmtMs(t.ttft_ms)}` : "");
  $("timing-bar").replaceChildren(...t.segments.map((s) => {
    const span = document.createElement("span");
    span.className = `seg-${s.name}`;
    span.dataset.segment = s.name;
    span.dataset.ms = String(s.ms);
    span.style.width = `${total > 0 ? (100 * s.ms) / total : 0}%`;
    span.title = `${s.name} ${fmtMs(s.ms)}`;
    return span;
  }));
  $("timing-bar").dataset.totalMs = String(total);
  $("timing-legend").replaceChildren(...t.segments.map((s) => {
    const item = document.createElement("span");
    item.innerHTML = `<i class="seg-${s.name}"></i>`;
    item.append(`${s.name} ${fmtMs(s.ms)}`);
    return item;
  }));
  const used = [...new Set(Object.values(t.sources))];
  $("timing-source").textContent = `from: ${used.join(", ") || "nothing measured"}`;
}

function addTurn(role, content, toolCalls) {
  history.push(toolCalls && toolCalls.length ? { role, content: content || null, tool_calls: toolCalls } : { role, content });
  const div = document.createElement("div");
  div.className = `turn ${role}`;
  div.dataset.role = role;
  div.textContent = content + (toolCalls || []).map((c) => `\n\u2192 ${c.function.name}(${c.function.arguments})`).join("");
  $("conversation").append(div);
}

function newChat() {
  if (controller) return;
  history.length = 0;
  $("conversation").replaceChildren();
  $("output").textContent = "";
  addToolCalls((calls = []));
  $("error").hidden = true;
  $("timing").hidden = true;
  setState("idle", "");
}

function showMode() {
  $("chat-only").hidden = !chatMode();
  $("tools").hidden = !chatMode();
  $("new-chat").hidden = !chatMode();
  $("prompt").placeholder = chatMode() ? "Type a message, then Send (Ctrl+Enter)" : "Type a prompt, then Send (Ctrl+Enter)";
}

async function send(event) {
  event.preventDefault();
  if (controller) return;
  const chat = chatMode(), message = $("prompt").value;
  if (chat && !message.trim()) { showError("type a message first"); return; }
  controller = new AbortController();
  $("output").textContent = "";
  addToolCalls((calls = []));
  $("error").hidden = true;
  $("timing").hidden = true;
  setState("streaming", "streaming\u2026");
  const t0 = performance.now();
  let tFirst = null, timing = null, usage = null, headers = null, failed = false;
  try {
    const resp = await fetch(chat ? "/v1/chat/completions" : "/v1/completions", {
      method: "POST", signal: controller.signal,
      headers: authHeaders({ "Content-Type": "application/json", Accept: "text/event-stream" }),
      body: JSON.stringify(requestBody(chat, message)),
    });
    headers = resp.headers;
    if (!resp.ok) throw new Error(await errorMessage(resp));
    for await (const msg of sseEvents(resp.body)) {
      if (tFirst === null) tFirst = performance.now();
      if (msg === "[DONE]") break;
      if (msg.error) { failed = true; showError(msg.error.message || JSON.stringify(msg.error)); continue; }
      for (const c of msg.choices || []) {
        const text = chat ? c.delta && c.delta.content : c.text;
        if (text) $("output").append(text);
        if (chat && c.delta && c.delta.tool_calls) addToolCalls(c.delta.tool_calls);
      }
      if (msg.usage) usage = msg.usage;
      if (msg.timing) timing = msg.timing;
    }
  } catch (e) {
    failed = true;
    showError(e.name === "AbortError" ? "stopped" : String(e.message || e));
  } finally {
    controller = null;
  }
  const tEnd = performance.now();
  if (headers && (tFirst !== null || headers.get("x-total-time"))) {
    const client = { ttft_ms: tFirst === null ? null : tFirst - t0, total_ms: tEnd - t0 };
    renderTiming(resolveTiming(timing, headers, client));
  }
  const tokens = usage ? ` \u00b7 ${usage.prompt_tokens} prompt + ${usage.completion_tokens} generated tokens` : "";
  if (chat && !failed) {  // the turn is whole: it joins the conversation, the box is free for the next one
    addTurn("user", message);
    addTurn("assistant", $("output").textContent, calls);
    $("prompt").value = "";
  }
  setState(failed ? "error" : "done", (failed ? "failed" : "done") + tokens);
}

setupKeyField();
showMode();
for (const id of ["mode-chat", "mode-complete"]) $(id).addEventListener("change", showMode);
$("response-format").addEventListener("change", () => { $("json-schema").hidden = $("response-format").value !== "json_schema"; });
$("new-chat").addEventListener("click", newChat);
$("form").addEventListener("submit", send);
$("stop").addEventListener("click", () => controller && controller.abort());
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) $("form").requestSubmit();
});
