// trainplan's page: a client of the same HTTP API the schedulers call (no build step, no CDN).
// Every text from the API goes in through textContent; charts are SVG built here.
"use strict";

const GIB = 2 ** 30;
const COMPONENTS = ["parameters", "gradients", "optimizer_states", "activations", "buffers", "overhead"];
// Okabe-Ito colours: distinguishable with colour-vision deficiencies, readable against white
const COLOURS = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000",
  "#999999", "#882255"];
const SVG_NS = "http://www.w3.org/2000/svg";

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null) continue;
    if (key === "text") node.textContent = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child);
  return node;
}

function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  for (const child of children) node.append(child);
  return node;
}

class ApiError extends Error {
  constructor(status, problem) {
    super(problem.detail || `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }
}

// A service started with PLANNER_REQUIRE_AUTH=true answers 401: ask for an API key once, keep it
// for this tab only (sessionStorage), and send it as a Bearer token from then on.
const KEY_STORE = "trainplan-api-key";

async function api(method, path, body, retried = false) {
  const options = { method, headers: { Accept: "application/json" } };
  const key = sessionStorage.getItem(KEY_STORE);
  if (key) options.headers.Authorization = `Bearer ${key}`;
  if (body !== undefined) {
    options.headers["Content-Type"] = "application/json";
    options.body = JSON.stringify(body);
  }
  const response = await fetch(path, options);
  const text = await response.text();
  const data = text ? JSON.parse(text) : null;
  if (response.status === 401 && !retried) {
    // Several calls may meet the 401 at once: only the first asks, the others reuse its answer.
    let current = sessionStorage.getItem(KEY_STORE);
    if (!current || current === key) {
      const entered = window.prompt("This service needs an API key (trainplan keys create OWNER):");
      if (entered) {
        current = entered.trim();
        sessionStorage.setItem(KEY_STORE, current);
      }
    }
    if (current && current !== key) return api(method, path, body, true);
  }
  if (!response.ok) throw new ApiError(response.status, data || {});
  return data;
}

async function allPages(path) {
  let items = [];
  let cursor = null;
  do {
    const sep = path.includes("?") ? "&" : "?";
    const page = await api("GET", `${path}${sep}limit=200${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`);
    items = items.concat(page.items);
    cursor = page.next_cursor;
  } while (cursor);
  return items;
}

const fmt = {
  gib: (bytes) => `${(bytes / GIB).toFixed(1)} GiB`,
  int: (n) => Math.round(n).toLocaleString("en-US"),
  pct: (x) => `${(100 * x).toFixed(1)}%`,
  s: (x) => (x >= 86400 ? `${(x / 86400).toFixed(1)} d` : x >= 3600 ? `${(x / 3600).toFixed(1)} h` : `${x.toFixed(3)} s`),
};

function layoutText(layout) {
  const parts = [layout.framework];
  for (const key of ["dp", "tp", "pp", "cp", "ep"]) if ((layout[key] ?? 1) !== 1) parts.push(`${key}=${layout[key]}`);
  if (layout.etp != null) parts.push(`etp=${layout.etp}`);
  parts.push(`zero=${layout.zero_stage}`);
  if ((layout.virtual_pipeline_stages ?? 1) > 1) parts.push(`vpp=${layout.virtual_pipeline_stages}`);
  parts.push(`micro=${layout.micro_batch_size}`);
  if (layout.recompute && layout.recompute !== "none") {
    const modules = layout.recompute_modules ? `(${layout.recompute_modules.join(",")})` : "";
    parts.push(`recompute=${layout.recompute}${modules}`);
  }
  if (layout.torch_compile && layout.torch_compile !== "none") parts.push(`compile=${layout.torch_compile}`);
  if (layout.moe_a2a_overlap) parts.push("a2a_overlap");
  for (const key of ["offload_optimizer", "offload_params"]) if (layout[key] && layout[key] !== "none") parts.push(`${key}=${layout[key]}`);
  return parts.join(" ");
}

// ---------------------------------------------------------------- charts

function memoryChart(candidates) {
  // one stacked bar per layout: per-GPU memory by component against the card's capacity
  const width = 820, left = 320, right = 70, row = 30, top = 10;
  const capacity = candidates[0].estimate.memory.capacity_bytes;
  const most = Math.max(capacity, ...candidates.map((c) => c.estimate.memory.per_gpu.total)) * 1.05;
  const scale = (bytes) => ((width - left - right) * bytes) / most;
  const height = top + row * candidates.length + 50;
  const chart = svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", class: "chart memory-chart",
    "aria-label": `Per-GPU memory by component of ${candidates.length} layouts against ${fmt.gib(capacity)}` });
  candidates.forEach((candidate, index) => {
    const y = top + index * row;
    const label = svg("text", { x: left - 8, y: y + 18, "text-anchor": "end", class: "label" });
    label.textContent = candidate.label || `${index === 0 ? "★ " : ""}${layoutText(candidate.layout)}`;
    chart.append(label);
    let x = left;
    COMPONENTS.forEach((name, k) => {
      const bytes = candidate.estimate.memory.per_gpu[name];
      if (!bytes) return;
      const w = scale(bytes);
      const rect = svg("rect", { x, y: y + 4, width: Math.max(w, 0.5), height: row - 10, fill: COLOURS[k], class: `segment ${name}` });
      const title = svg("title");
      title.textContent = `${name}: ${fmt.gib(bytes)}`;
      rect.append(title);
      chart.append(rect);
      x += w;
    });
    const total = svg("text", { x: x + 4, y: y + 18, class: "value" });
    total.textContent = fmt.gib(candidate.estimate.memory.per_gpu.total);
    chart.append(total);
  });
  const cx = left + scale(capacity);
  chart.append(svg("line", { x1: cx, x2: cx, y1: top - 4, y2: top + row * candidates.length, class: "capacity" }));
  const capLabel = svg("text", { x: cx, y: top + row * candidates.length + 14, "text-anchor": "middle", class: "value" });
  capLabel.textContent = `card: ${fmt.gib(capacity)}`;
  chart.append(capLabel);
  COMPONENTS.forEach((name, k) => {
    const lx = left + (k % 3) * 170, ly = top + row * candidates.length + 24 + Math.floor(k / 3) * 14;
    chart.append(svg("rect", { x: lx, y: ly, width: 10, height: 10, fill: COLOURS[k] }));
    const text = svg("text", { x: lx + 14, y: ly + 9, class: "legend" });
    text.textContent = name.replace("_", " ");
    chart.append(text);
  });
  chart.setAttribute("viewBox", `0 0 ${width} ${height + 20}`);
  return chart;
}

function timeChart(estimate) {
  const parts = Object.entries(estimate.time.breakdown).filter(([, v]) => v > 0);
  const total = estimate.time.step_s;
  const width = 760, height = 40 + 16 * Math.ceil(parts.length / 3);
  const chart = svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", class: "chart time-chart",
    "aria-label": `Step time ${fmt.s(total)} by part` });
  let x = 0;
  parts.forEach(([name, seconds], k) => {
    const w = ((width - 20) * seconds) / total;
    const rect = svg("rect", { x, y: 4, width: Math.max(w, 0.5), height: 20, fill: COLOURS[k % COLOURS.length], class: `segment ${name}` });
    const title = svg("title");
    title.textContent = `${name.replace(/_s$/, "")}: ${seconds.toFixed(4)} s`;
    rect.append(title);
    chart.append(rect);
    x += w;
    const lx = (k % 3) * 250, ly = 34 + Math.floor(k / 3) * 16;
    chart.append(svg("rect", { x: lx, y: ly, width: 10, height: 10, fill: COLOURS[k % COLOURS.length] }));
    const text = svg("text", { x: lx + 14, y: ly + 9, class: "legend" });
    text.textContent = `${name.replace(/_s$/, "")} ${seconds.toFixed(3)} s`;
    chart.append(text);
  });
  return chart;
}

// ---------------------------------------------------------------- a plan

function list(items, className) {
  const ul = el("ul", { class: className });
  for (const item of items) ul.append(el("li", { text: item }));
  return ul;
}

function table(headers, rows, caption) {
  const t = el("table");
  if (caption) t.append(el("caption", { text: caption }));
  const head = el("tr");
  headers.forEach((h) => head.append(el("th", { scope: "col", text: h })));
  t.append(el("thead", {}, head));
  const body = el("tbody");
  rows.forEach((cells) => {
    const tr = el("tr");
    cells.forEach((c) => tr.append(el("td", { text: String(c) })));
    body.append(tr);
  });
  t.append(body);
  return t;
}

function renderPlan(plan, container) {
  container.replaceChildren();
  container.append(el("p", { class: `status ${plan.status}` },
    el("strong", { text: plan.status === "feasible" ? "Feasible" : "Infeasible" }),
    ` — ${plan.model}, plan `, el("a", { href: `#/plans/${plan.id}`, text: plan.id })));
  const chosen = Object.entries(plan.resolved_defaults || {});
  if (chosen.length) {
    container.append(el("p", { class: "note defaults", text: `Defaults for this GPU: ${chosen.map(([k, v]) => `${k} ${v}`).join(", ")}` }));
  }
  const rec = plan.recommended;
  if (rec) {
    const est = rec.estimate;
    container.append(el("h3", { text: `Recommended: ${layoutText(rec.layout)}` }));
    if (est.time) {
      container.append(el("p", { class: "headline", text:
        `${fmt.int(est.time.tokens_per_s)} tokens/s · ${est.time.tflops_per_gpu.toFixed(1)} TFLOP/s per GPU · ` +
        `MFU ${fmt.pct(est.time.mfu)} · step ${fmt.s(est.time.step_s)}` +
        (est.time_to_train_s ? ` · time to train ${fmt.s(est.time_to_train_s)}` : "") }));
    }
    container.append(el("h4", { text: "Memory per GPU (most-loaded rank)" }));
    container.append(memoryChart([rec, ...plan.alternatives]));
    const stages = est.memory.per_stage || [];
    if (stages.length > 1) {
      // uneven pipeline stages: one bar per evaluated pipeline rank of the recommended layout
      container.append(el("h4", { text: "Memory per pipeline rank (recommended layout)" }));
      container.append(memoryChart(stages.map((stage) => ({
        label: `pipeline rank ${stage.rank}`,
        estimate: { memory: { capacity_bytes: est.memory.capacity_bytes, per_gpu: stage } },
      }))));
    }
    if (est.time) {
      container.append(el("h4", { text: "Step time" }));
      container.append(timeChart(est));
    }
    container.append(el("h4", { text: "Why this layout" }), list(rec.rationale, "rationale"));
    if (plan.alternatives.length) {
      container.append(table(["layout", "memory", "tokens/s", "MFU"], plan.alternatives.map((a) => [
        layoutText(a.layout), fmt.gib(a.estimate.memory.per_gpu.total),
        a.estimate.time ? fmt.int(a.estimate.time.tokens_per_s) : "-",
        a.estimate.time ? fmt.pct(a.estimate.time.mfu) : "-"]), "Alternatives"));
    }
  }
  if (plan.rejected.length) {
    container.append(table(["reason", "layouts", "example"],
      plan.rejected.map((g) => [g.reason, g.count, g.detail || ""]), "Rejected layouts"));
  }
  if (plan.closest) {
    // infeasible: how far the layout that came closest is from fitting, component by component
    container.append(el("h4", { text: `Closest layout: ${layoutText(plan.closest.layout)}, ${fmt.gib(plan.closest.over_bytes)} over` }));
    container.append(memoryChart([{ ...plan.closest, label: layoutText(plan.closest.layout) }]));
  }
  if (plan.suggestions.length) {
    container.append(el("h4", { text: "What would make it fit" }), list(plan.suggestions.map((s) => s.detail || s.kind), "suggestions"));
  }
  if ((plan.suggestions_skipped || []).length) {
    container.append(el("h4", { text: "Not suggested" }),
      list(plan.suggestions_skipped.map((s) => `${s.kind}: ${s.reason}`), "suggestions-skipped"));
  }
  for (const [target, why] of Object.entries(plan.unsupported_targets || {})) {
    container.append(el("p", { class: "note", text: `${target}: ${why}` }));
  }
  if (plan.artifacts.length) {
    const files = el("ul", { class: "artifacts" });
    plan.artifacts.forEach((a) => files.append(el("li", {}, el("a", { href: a.url, download: a.name, text: a.name }),
      ` (${a.target}, ${fmt.int(a.size_bytes)} bytes)`)));
    files.append(el("li", {}, el("a", { href: `/v1/plans/${plan.id}/artifacts.zip`, download: `${plan.id}.zip`, text: "all files (zip)" })));
    container.append(el("h4", { text: "Launcher files" }), files);
  }
}

// ---------------------------------------------------------------- errors next to their fields

function clearErrors(form, summary) {
  summary.hidden = true;
  summary.replaceChildren();
  form.querySelectorAll(".field-error").forEach((n) => n.remove());
  form.querySelectorAll("[aria-invalid]").forEach((n) => { n.removeAttribute("aria-invalid"); n.removeAttribute("aria-describedby"); });
}

function fieldFor(form, field, prefix) {
  const name = `${prefix}${field}`;
  const candidates = [name, name.replace(/_bytes_per_s$/, "_gbps"), field];
  for (const id of candidates) {
    const node = document.getElementById(id);
    if (node && form.contains(node)) return node;
  }
  // a nested field (hf_config.num_hidden_layers): the closest input that holds it
  const parts = name.split(".");
  while (parts.length > 1) {
    parts.pop();
    const node = document.getElementById(parts.join("."));
    if (node && form.contains(node)) return node;
  }
  return null;
}

function showErrors(form, summary, error, prefix = "") {
  const problem = error.problem || {};
  const errors = problem.errors && problem.errors.length ? problem.errors : [{ message: error.message }];
  summary.append(el("p", { text: `${problem.title || "Error"}: ${problem.detail || error.message}` }));
  const items = el("ul");
  errors.forEach((e, i) => {
    const target = e.field ? fieldFor(form, e.field, prefix) : null;
    const message = e.message || problem.detail || "invalid";
    if (target) {
      const id = `err-${i}-${target.id}`.replace(/[^A-Za-z0-9_-]/g, "-");
      target.setAttribute("aria-invalid", "true");
      target.setAttribute("aria-describedby", id);
      target.insertAdjacentElement("afterend", el("p", { class: "field-error", id, text: message }));
      items.append(el("li", {}, el("a", { href: `#${target.id}`, text: `${e.field}: ${message}` })));
    } else {
      items.append(el("li", { text: e.field ? `${e.field}: ${message}` : message }));
    }
  });
  summary.append(items);
  summary.hidden = false;
  summary.setAttribute("tabindex", "-1");
  summary.focus();
}

// ---------------------------------------------------------------- the new-plan form

function value(id) { return document.getElementById(id).value.trim(); }
function number(id) { const v = value(id); return v === "" ? undefined : Number(v); }

function planBody() {
  const body = { training: {}, constraints: {}, launchers: [] };
  const modelSource = document.querySelector("input[name=model-source]:checked").value;
  if (modelSource === "preset") body.model = { preset: value("model.preset") };
  else {
    let config;
    try { config = JSON.parse(value("model.hf_config")); } catch (e) {
      throw new ApiError(422, { title: "Unprocessable", detail: "config.json is not valid JSON",
        errors: [{ field: "model.hf_config", message: `not valid JSON: ${e.message}` }] });
    }
    body.model = { hf_config: config };
  }
  if (document.querySelector("input[name=cluster-source]:checked").value === "stored") {
    body.cluster = { id: value("cluster.id") };
  } else {
    body.cluster = { gpu: value("cluster.gpu"), num_nodes: number("cluster.num_nodes"), gpus_per_node: number("cluster.gpus_per_node") };
    const gbps = number("cluster.inter_node_bandwidth_gbps");
    if (gbps !== undefined) body.cluster.inter_node_bandwidth_gbps = gbps;
  }
  body.training = { seq_len: number("training.seq_len"), global_batch_size: number("training.global_batch_size"),
    method: value("training.method") };
  // left empty, precision and attention resolve from the GPU (the answer names what they became)
  for (const name of ["precision", "attention"]) if (value(`training.${name}`)) body.training[name] = value(`training.${name}`);
  const tokens = number("training.tokens");
  if (tokens !== undefined) body.training.tokens = tokens;
  body.constraints = { objective: value("constraints.objective"), top_k: number("constraints.top_k") };
  body.launchers = [...document.getElementById("launchers").selectedOptions].map((o) => o.value);
  return body;
}

function toggleSources(name) {
  const chosen = document.querySelector(`input[name=${name}]:checked`).value;
  document.querySelectorAll(`input[name=${name}]`).forEach((radio) => {
    radio.closest("fieldset").querySelectorAll(`[data-source]`).forEach((node) => { node.hidden = node.dataset.source !== chosen; });
  });
}

async function submitPlan(event) {
  event.preventDefault();
  const form = event.target, summary = document.getElementById("form-errors"), result = document.getElementById("result");
  const busy = document.getElementById("busy"), button = document.getElementById("submit");
  clearErrors(form, summary);
  result.replaceChildren();
  button.disabled = true;
  busy.textContent = "Searching layouts…";
  try {
    const plan = await api("POST", "/v1/plans", planBody());
    renderPlan(plan, result);
    busy.textContent = `Plan ${plan.id}: ${plan.status}`;
    result.querySelector("h3, .status")?.setAttribute("tabindex", "-1");
  } catch (error) {
    busy.textContent = "";
    showErrors(form, summary, error);
  } finally {
    button.disabled = false;
  }
}

// ---------------------------------------------------------------- history and one plan

let nextCursor = null;

async function loadPlans(append = false) {
  const model = value("filter-model"), status = value("filter-status");
  const query = new URLSearchParams({ limit: "20" });
  if (model) query.set("model", model);
  if (status) query.set("status", status);
  if (append && nextCursor) query.set("cursor", nextCursor);
  const page = await api("GET", `/v1/plans?${query}`);
  const body = document.querySelector("#plans-table tbody");
  if (!append) body.replaceChildren();
  for (const plan of page.items) {
    const rec = plan.recommended;
    const tr = el("tr");
    tr.append(el("td", {}, el("a", { href: `#/plans/${plan.id}`, text: new Date(plan.created_at).toLocaleString() })));
    tr.append(el("td", { text: plan.model }), el("td", { text: plan.status }),
      el("td", { text: rec ? layoutText(rec.layout) : "-" }),
      el("td", { text: rec && rec.estimate.time ? fmt.int(rec.estimate.time.tokens_per_s) : "-" }));
    body.append(tr);
  }
  nextCursor = page.next_cursor;
  document.getElementById("more").hidden = !nextCursor;
}

async function showPlan(id) {
  const detail = document.getElementById("plan-detail");
  try {
    const plan = await api("GET", `/v1/plans/${encodeURIComponent(id)}`);
    document.getElementById("plan-title").textContent = `Plan ${plan.id}`;
    renderPlan(plan, detail);
    document.getElementById("run-form").dataset.plan = plan.id;
    await showRuns(plan.id);
  } catch (error) {
    detail.replaceChildren(el("p", { class: "field-error", role: "alert", text: error.message }));
  }
}

async function showRuns(planId) {
  const runs = await api("GET", `/v1/plans/${planId}/runs`);
  const box = document.getElementById("runs");
  box.replaceChildren();
  if (!runs.items.length) { box.append(el("p", { text: "No runs recorded yet." })); return; }
  box.append(table(["recorded", "step", "peak memory", "diagnosis", "calibration factors"], runs.items.map((r) => [
    new Date(r.created_at).toLocaleString(), r.step_s ? fmt.s(r.step_s) : "-",
    r.peak_memory_bytes_per_gpu ? fmt.gib(r.peak_memory_bytes_per_gpu) : (r.out_of_memory ? "out of memory" : "-"),
    Object.entries(r.diagnosis || {}).map(([k, v]) => `${k}: ${typeof v === "number" ? v.toFixed(3) : JSON.stringify(v)}`).join("; "),
    r.calibration ? Object.entries(r.calibration.factors || r.calibration).map(([k, v]) => `${k} ${typeof v === "number" ? v.toFixed(3) : JSON.stringify(v)}`).join(", ") : "-",
  ]), "Runs of this plan"));
}

async function submitRun(event) {
  event.preventDefault();
  const form = event.target, summary = document.getElementById("run-errors");
  clearErrors(form, summary);
  const body = { out_of_memory: document.getElementById("run.out_of_memory").checked };
  const step = number("run.step_s"), tps = number("run.tokens_per_s"), gib = number("run.peak_memory_gib");
  if (step !== undefined) body.step_s = step;
  if (tps !== undefined) body.tokens_per_s = tps;
  if (gib !== undefined) body.peak_memory_bytes_per_gpu = Math.round(gib * GIB);
  try {
    await api("POST", `/v1/plans/${form.dataset.plan}/runs`, body);
    form.reset();
    await showRuns(form.dataset.plan);
  } catch (error) {
    showErrors(form, summary, error, "run.");
  }
}

// ---------------------------------------------------------------- routing and start

function route() {
  const hash = location.hash || "#/";
  const views = { new: document.getElementById("view-new"), plans: document.getElementById("view-plans"), plan: document.getElementById("view-plan") };
  Object.values(views).forEach((v) => { v.hidden = true; });
  const match = hash.match(/^#\/plans\/([A-Za-z0-9]+)$/);
  if (match) { views.plan.hidden = false; showPlan(match[1]); }
  else if (hash.startsWith("#/plans")) { views.plans.hidden = false; loadPlans(); }
  else views.new.hidden = false;
}

async function start() {
  const [models, gpus, clusters] = await Promise.all([allPages("/v1/models"), allPages("/v1/gpus"), allPages("/v1/clusters")]);
  const presets = document.getElementById("model.preset");
  models.forEach((m) => presets.append(el("option", { value: m.name, text: `${m.name} (${(m.parameters_total / 1e9).toFixed(1)} B)` })));
  presets.value = models.some((m) => m.name === "llama-3.1-8b") ? "llama-3.1-8b" : models[0]?.name;
  const gpuSelect = document.getElementById("cluster.gpu");
  gpus.forEach((g) => gpuSelect.append(el("option", { value: g.name, text: `${g.name} (${(g.memory_bytes / GIB).toFixed(0)} GiB)` })));
  gpuSelect.value = gpus.some((g) => g.name === "h100-sxm-80gb") ? "h100-sxm-80gb" : gpus[0]?.name;
  const stored = document.getElementById("cluster.id");
  clusters.forEach((c) => stored.append(el("option", { value: c.id, text: `${c.name} (${c.world_size} GPUs)` })));
  document.querySelectorAll("input[name=model-source]").forEach((r) => r.addEventListener("change", () => toggleSources("model-source")));
  document.querySelectorAll("input[name=cluster-source]").forEach((r) => r.addEventListener("change", () => toggleSources("cluster-source")));
  document.getElementById("plan-form").addEventListener("submit", submitPlan);
  document.getElementById("filters").addEventListener("submit", (e) => { e.preventDefault(); loadPlans(); });
  document.getElementById("more").addEventListener("click", () => loadPlans(true));
  document.getElementById("run-form").addEventListener("submit", submitRun);
  window.addEventListener("hashchange", route);
  route();
  document.body.dataset.ready = "true";
}

document.addEventListener("DOMContentLoaded", start);
