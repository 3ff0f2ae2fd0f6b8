// The ragserve page: plain DOM, no framework. Server data is only ever inserted as text (never as HTML).
"use strict";

const $ = (id) => document.getElementById(id);
const KEY_STORE = "ragserve-api-key";

function headers(json) {
  const h = {};
  if (json) h["Content-Type"] = "application/json";
  const key = sessionStorage.getItem(KEY_STORE);
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

async function errorText(resp) {
  try {
    const body = await resp.json();
    const e = body.error || {};
    return `${resp.status}: ${e.message || resp.statusText}`;
  } catch (_) {
    return `${resp.status} ${resp.statusText}`;
  }
}

function el(tag, cls, text) {
  const n = document.createElement(tag);
  if (cls) n.className = cls;
  if (text !== undefined) n.textContent = text;
  return n;
}

function showError(id, message) {
  const box = $(id);
  box.textContent = message;
  box.hidden = !message;
}

let statusLine = "";  // the status line without the readiness note

function fmtCount(n) {
  return Number(n).toLocaleString("en-US");
}

function fmtSeconds(s) {
  return s < 1 ? `${(s * 1000).toFixed(1)} ms` : `${s.toFixed(2)} s`;
}

function renderHits(list, hits) {
  list.replaceChildren();
  for (const h of hits) {
    const li = el("li", "hit");
    const head = el("div", "hit-head", h.title || h.id);
    head.append(el("span", "hit-meta", `${h.id} · score ${Number(h.score).toFixed(4)}`));
    li.append(head, el("p", "hit-text", h.text.length > 600 ? h.text.slice(0, 600) + "…" : h.text));
    list.append(li);
  }
}

// -- status line and methods ------------------------------------------------------------------
async function loadInfo() {
  const resp = await fetch("/v1/info", { headers: headers(false) });
  if (resp.status === 401) {
    $("status").textContent = "This server needs an API key: enter it above.";
    $("auth").open = true;
    return;
  }
  if (!resp.ok) {
    $("status").textContent = "Cannot read /v1/info: " + (await errorText(resp));
    return;
  }
  const info = await resp.json();
  const stats = info.index.manifest.stats || {};
  const model = info.model ? info.model.name : "no generator loaded";
  statusLine = `${fmtCount(stats.num_docs)} passages · backend ${info.backend.name} · model: ${model}`;
  $("status").textContent = statusLine;
  for (const id of ["search-k", "ask-k"]) $(id).max = info.limits.max_k;
  const select = $("method");
  select.replaceChildren();
  for (const m of info.methods) select.append(el("option", "", m));
  if (info.model && info.model.default_method) select.value = info.model.default_method;
  const none = info.methods.length === 0;
  $("method-label").hidden = none;  // an empty list says nothing: the note below does
  $("ask-button").disabled = none;
  $("ask-note").hidden = !none;
  $("ask-note").textContent = none ? "No generator is loaded (start the server with --model PATH); search works." : "";
  watchReadiness();
}

// Until /readyz says ready (the server compiles its kernels and loads the model first), say so and look again.
async function watchReadiness() {
  const resp = await fetch("/readyz", { headers: headers(false) });
  if (resp.status !== 503) {
    $("status").textContent = statusLine;
    return;
  }
  const ready = await resp.json();
  const what = ready.model && ready.model.state === "loading" ? "loading the model" : "warming up";
  $("status").textContent = `${statusLine} · ${what}…`;
  setTimeout(() => watchReadiness().catch(() => {}), 1000);
}

// -- search -------------------------------------------------------------------------------------
$("search-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const button = $("search-button");
  button.disabled = true;
  showError("search-error", "");
  $("search-meta").textContent = "";  // no line of an earlier search may stay next to this one's error
  $("search-results").replaceChildren();
  try {
    const query = $("search-query").value;
    const body = { query: query, k: Number($("search-k").value) };
    const resp = await fetch("/v1/search", { method: "POST", headers: headers(true), body: JSON.stringify(body) });
    if (!resp.ok) {
      showError("search-error", await errorText(resp));
      return;
    }
    const data = await resp.json();
    const took = `in ${fmtSeconds(data.timing.total)} (${data.backend})`;
    $("search-meta").textContent = data.hits.length
      ? `${data.hits.length} hits ${took}`
      : `No passage matches “${query.trim()}” ${took}: none of its words is in the index (common words such as ` +
        `“the” are not indexed). Try other words, ${$("search-query").placeholder || "e.g. a name or a topic"}.`;
    renderHits($("search-results"), data.hits);
  } catch (e) {
    showError("search-error", "request failed: " + e);
  } finally {
    button.disabled = false;
  }
});

// -- ask (server-sent events over a POST, read from the fetch body) -------------------------------
function describeStep(step) {
  const kind = step.kind || step.type || step.stage || "step";
  const li = el("li");
  li.append(el("span", "step-kind", kind));
  const parts = [];
  if (step.query) parts.push("query: " + step.query);
  if (step.text) parts.push(String(step.text));
  if (Array.isArray(step.hits)) parts.push(`${step.hits.length} passages: ` + step.hits.map((h) => h.id).join(", "));
  if (step.trigger) {
    const fmt = (v) => (typeof v === "number" ? Number(v.toPrecision(3)) : JSON.stringify(v));
    parts.push("trigger: " + Object.entries(step.trigger).map(([k, v]) => `${k}=${fmt(v)}`).join(" · "));
  }
  if (step.times) {
    parts.push(Object.entries(step.times).map(([k, v]) => `${k} ${fmtSeconds(v)}`).join(" · "));
  } else if (typeof step.seconds === "number") {
    parts.push(fmtSeconds(step.seconds));
  }
  if (parts.length) li.append(el("span", "step-detail", parts.join("\n")));
  return li;
}

function showAnswer(result) {
  $("answer").textContent = result.answer;
  const t = result.timing || {};
  $("answer-meta").textContent = Object.entries(t).map(([k, v]) => `${k} ${fmtSeconds(v)}`).join(" · ");
  renderHits($("passages"), result.passages || []);
  const steps = $("steps");
  if (Array.isArray(result.trace) && steps.children.length !== result.trace.length) {
    steps.replaceChildren(...result.trace.map(describeStep));
  }
}

async function* sseEvents(resp) {
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      let name = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) name = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
      }
      if (data.length) yield { name, data: JSON.parse(data.join("\n")) };
    }
  }
}

$("ask-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const button = $("ask-button");
  button.disabled = true;
  showError("ask-error", "");
  $("ask-output").hidden = false;
  $("answer").textContent = "…";
  $("answer-meta").textContent = "";
  $("steps").replaceChildren();
  $("passages").replaceChildren();
  try {
    const body = { question: $("question").value, method: $("method").value, stream: true,
                   options: { k: Number($("ask-k").value) } };
    const resp = await fetch("/v1/answer", { method: "POST", headers: headers(true), body: JSON.stringify(body) });
    if (!resp.ok) {
      $("ask-output").hidden = true;
      showError("ask-error", await errorText(resp));
      return;
    }
    for await (const ev of sseEvents(resp)) {
      if (ev.name === "step") $("steps").append(describeStep(ev.data));
      else if (ev.name === "answer") showAnswer(ev.data);
      else if (ev.name === "error") showError("ask-error", `${ev.data.error.status}: ${ev.data.error.message}`);
    }
  } catch (e) {
    showError("ask-error", "request failed: " + e);
  } finally {
    button.disabled = false;
  }
});

// -- API key ----------------------------------------------------------------------------------------
$("api-key-save").addEventListener("click", () => {
  const key = $("api-key").value.trim();
  if (key) sessionStorage.setItem(KEY_STORE, key);
  else sessionStorage.removeItem(KEY_STORE);
  loadInfo();
});

loadInfo().catch((e) => { $("status").textContent = "Cannot reach the server: " + e; });
