// trainplan's page: a client of the same HTTP API the schedulers call (no build step, no CDN).
// Every text from the API goes in through textContent; charts are SVG built here.
"use strict";

const GIB = 2 ** 30;
// The per-GPU components, from what PyTorch allocates (the first five) to what nvidia-smi shows: the
// allocator's fragmentation makes the peak reserved, the CUDA context, NCCL's buffers and Transformer
// Engine's userbuffers (Megatron's TP overlap) the device used.
const COMPONENTS = ["parameters", "gradients", "optimizer_states", "activations", "buffers",
  "fragmentation", "cuda_context", "nccl_buffers", "tp_comm_buffers"];
// A plan stored before the statistics were named has one overhead in place of the last four.
const OLD_COMPONENTS = ["parameters", "gradients", "optimizer_states", "activations", "buffers", "overhead"];
// The three statistics the answer names; the fit compares the last with the card's capacity.
const STATISTICS = [["peak_allocated_bytes", "peak allocated"], ["peak_reserved_bytes", "peak reserved"],
  ["device_used_bytes", "device used (fit)"]];
const componentsOf = (perGpu) => (perGpu.fragmentation === undefined || perGpu.fragmentation === null
  ? OLD_COMPONENTS : COMPONENTS);
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
  const data = parseBody(response, text);
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

// The answer's JSON; a body that is not JSON (a proxy's 502 page, a bare 500) becomes a problem that
// keeps the HTTP status and the start of the text, so the reader sees what answered, not a parser's message.
function parseBody(response, text) {
  if (!text) return null;
  try {
    return JSON.parse(text);
  } catch {
    const detail = `HTTP ${response.status}${response.statusText ? ` ${response.statusText}` : ""}: ${text.slice(0, 200)}`;
    if (response.ok) throw new ApiError(response.status, { title: "Not JSON", detail });
    return { title: `HTTP ${response.status}`, detail };
  }
}

// A file's text (an artifact's preview), sent with the API key like every other call.
async function apiText(path) {
  const headers = {};
  const key = sessionStorage.getItem(KEY_STORE);
  if (key) headers.Authorization = `Bearer ${key}`;
  const response = await fetch(path, { headers });
  const text = await response.text();
  if (!response.ok) {
    let problem = {};
    try { problem = JSON.parse(text); } catch { /* not a problem document */ }
    throw new ApiError(response.status, problem);
  }
  return text;
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
  // what is left on the card: a shortfall under 0.05 GiB in MiB, not "-0.0 GiB" beside "does not fit"
  left: (bytes) => (bytes < 0 && -bytes < 0.05 * GIB ? `-${(-bytes / 2 ** 20).toFixed(1)} MiB` : fmt.gib(bytes)),
  int: (n) => Math.round(n).toLocaleString("en-US"),
  pct: (x) => `${(100 * x).toFixed(1)}%`,
  num: (x) => x.toLocaleString("en-US", Number.isInteger(x) ? {} : { maximumSignificantDigits: 4 }),
  s: (x) => (x >= 86400 ? `${(x / 86400).toFixed(1)} d` : x >= 3600 ? `${(x / 3600).toFixed(1)} h`
    : `${x.toLocaleString("en-US", { minimumFractionDigits: 3, maximumFractionDigits: 3 })} s`),
};

// The switches a plan may set beside the degrees, as service/cli.py's layout_text prints them (an estimate
// of a label without them resolves each to the framework's default); tri-state ones printed either way.
// Read from the OpenAPI document (applyApiFields): the fields LayoutIn marks "x-label", in its order.
let labelSwitches = [];
let labelTriState = new Set();

function readLabelSwitches(doc) {
  const fields = Object.entries(doc.components?.schemas?.LayoutIn?.properties || {}).filter(([, f]) => f["x-label"]);
  labelSwitches = fields.map(([name]) => name);
  labelTriState = new Set(fields.filter(([, f]) => f["x-label"] === "tri-state").map(([name]) => name));
}

function layoutText(layout) {
  const parts = [layout.framework];
  for (const key of ["dp", "tp", "pp", "cp", "ep"]) if ((layout[key] ?? 1) !== 1) parts.push(`${key}=${layout[key]}`);
  parts.push(`zero=${layout.zero_stage}`);
  if ((layout.virtual_pipeline_stages ?? 1) > 1) parts.push(`vpp=${layout.virtual_pipeline_stages}`);
  parts.push(`micro=${layout.micro_batch_size}`);
  if (layout.recompute && layout.recompute !== "none") {
    const modules = layout.recompute_modules ? `(${layout.recompute_modules.join(",")})` : "";
    parts.push(`recompute=${layout.recompute}${modules}`);
  }
  for (const key of ["offload_optimizer", "offload_params"]) if (layout[key] && layout[key] !== "none") parts.push(`${key}=${layout[key]}`);
  for (const key of labelSwitches) {
    const value = layout[key];
    if (value == null || value === "none" || (value === false && !labelTriState.has(key))) continue;
    parts.push(`${key}=${String(value).toLowerCase()}`);
  }
  if (layout.moe_dispatcher && layout.moe_dispatcher !== "alltoall") parts.push(`moe_dispatcher=${layout.moe_dispatcher}`);
  const overlapTp = layout.tp_comm_overlap;
  const shown = overlapTp === true || (overlapTp === false && layout.framework === "megatron");
  if ((layout.tp ?? 1) > 1 && shown) parts.push(`tp_comm_overlap=${overlapTp}`);
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
    componentsOf(candidate.estimate.memory.per_gpu).forEach((name, k) => {
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
  componentsOf(candidates[0].estimate.memory.per_gpu).forEach((name, k) => {
    // a component no candidate holds (TP userbuffers outside Megatron's TP overlap) gets no legend
    if (!candidates.some((c) => c.estimate.memory.per_gpu[name])) return;
    const lx = left + (k % 3) * 170, ly = top + row * candidates.length + 24 + Math.floor(k / 3) * 14;
    chart.append(svg("rect", { x: lx, y: ly, width: 10, height: 10, fill: COLOURS[k] }));
    const text = svg("text", { x: lx + 14, y: ly + 9, class: "legend" });
    text.textContent = name.replaceAll("_", " ");
    chart.append(text);
  });
  chart.setAttribute("viewBox", `0 0 ${width} ${height + 20}`);
  return chart;
}

// The chart's numbers as a table: for screen readers (the SVG is one image to them) and narrow screens.
function memoryTable(candidates, caption) {
  const capacity = candidates[0].estimate.memory.capacity_bytes;
  // a component no candidate holds (TP userbuffers outside Megatron's TP overlap) gets no column, as the
  // chart gives it no segment and the CLI no row
  const components = componentsOf(candidates[0].estimate.memory.per_gpu)
    .filter((name) => name !== "tp_comm_buffers" || candidates.some((c) => c.estimate.memory.per_gpu[name]));
  const rows = candidates.map((candidate, index) => {
    const m = candidate.estimate.memory.per_gpu;
    const statistics = STATISTICS.map(([key]) => (m[key] === undefined || m[key] === null ? "-" : fmt.gib(m[key])));
    return [candidate.label || `${index === 0 ? "★ " : ""}${layoutText(candidate.layout)}`,
      ...components.map((name) => fmt.gib(m[name] || 0)), ...statistics, fmt.left(capacity - m.total)];
  });
  const headers = ["layout", ...components.map((n) => n.replaceAll("_", " ")), ...STATISTICS.map(([, name]) => name),
    "left on the card"];
  const t = table(headers, rows, caption);
  t.classList.add("memory-table", "numbers");
  return el("div", { class: "scroll" }, t);
}

function memoryFigure(candidates, caption) {
  const figure = document.createDocumentFragment();
  figure.append(memoryChart(candidates), memoryTable(candidates, caption));
  return figure;
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
    cells.forEach((c) => tr.append(c instanceof Node ? el("td", {}, c) : el("td", { text: String(c) })));
    body.append(tr);
  });
  t.append(body);
  return t;
}

// ---------------------------------------------------------------- calibration

const FACTORS = {
  memory_dynamic: "activations, buffers and overhead",
  step_time: "every part of the step time, as applied (capped where the step would beat the GPU's dense peak)",
  step_time_learned: "the step time the runs say, before that cap",
  step_time_hardware: "what every framework's runs on this GPU say",
  step_time_framework: "what this framework's own runs add to the hardware's",
};

function plural(n, one, many = `${one}s`) { return `${fmt.int(n)} ${n === 1 ? one : many}`; }

function calibrationSummary(c) {
  if (!c || c.runs === 0) return "not calibrated";
  const f = c.factors;
  return `step ×${f.step_time.toFixed(3)}, memory ×${f.memory_dynamic.toFixed(3)} (${plural(c.runs, "run")})`;
}

// The runs behind the factors, each with its weight for this job, and the runs set aside with why.
function evidenceTable(c, planId) {
  const box = el("div", { class: "evidence" });
  const runLink = (r) => r.plan_id && r.plan_id !== planId
    ? el("a", { href: `#/plans/${r.plan_id}`, text: r.run_id, title: `a run of plan ${r.plan_id}` })
    : r.run_id;
  if (c.evidence && c.evidence.length) {
    const t = table(["run", "framework", "weight", "moves", "weighted because"], c.evidence.map((r) => [
      runLink(r), r.framework, r.weight.toFixed(3), r.factors.join(", "),
      r.weighted_because.length ? r.weighted_because.join("; ") : "the same job, today, this estimator"]),
    "Runs behind the factors");
    t.classList.add("evidence-runs");
    box.append(t);
  }
  if (c.set_aside && c.set_aside.length) {
    const t = table(["run", "set aside because"], c.set_aside.map((r) => [runLink(r), r.reasons.join("; ")]),
      "Runs set aside");
    t.classList.add("set-aside-runs");
    box.append(t);
  }
  return box;
}

// Whether an estimate was calibrated, by which runs, with which factors, and its figures without them.
function calibrationBlock(estimate, planId) {
  const c = estimate.calibration;
  const box = el("div", { class: "calibration" });
  if (!c || c.runs === 0) {
    box.append(el("h4", { text: "Not calibrated" }));
    const why = c && c.implausible_runs
      ? `No run on this hardware (GPU, node shape and links) and framework counts yet: ${plural(c.implausible_runs, "run")} set aside as implausible (each run's diagnosis says why). `
      : "No run has been recorded on this hardware (the same GPU, node shape and links) yet: the figures are the model's alone. ";
    box.append(el("p", { class: "note" }, why, "Record a run (a pasted log will do) on ",
      el("a", { href: `#/plans/${planId}`, text: "the plan's page" }), "; later plans on this hardware use it."));
    return box;
  }
  const f = c.factors;
  box.append(el("h4", { text: `Calibrated by ${plural(c.runs, "observed run")}` }));
  const parts = [`${fmt.int(c.time_runs)} gave a step time`, `${fmt.int(c.memory_runs)} a peak memory`];
  if (c.out_of_memory_runs) parts.push(`${fmt.int(c.out_of_memory_runs)} ran out of memory`);
  let text = `Runs of plans on this hardware (step time from every framework's, the rest from this framework's): ${parts.join(", ")}`;
  if (c.implausible_runs) text += `; ${plural(c.implausible_runs, "run")} set aside as implausible`;
  box.append(el("p", { class: "calibration-runs", text: `${text}.` }));
  const known = Object.keys(FACTORS).filter((k) => f[k] !== undefined && f[k] !== null);
  const others = Object.keys(f).filter((k) => !(k in FACTORS));
  const factors = table(["factor", "value", "scales"], [...known, ...others].map((k) => [k, `×${Number(f[k]).toFixed(3)}`, FACTORS[k] || ""]),
    "Factors applied");
  factors.classList.add("factors");
  box.append(factors);
  box.append(evidenceTable(c, planId));
  const rows = [];
  const u = c.uncalibrated;
  if (u) {
    // the API's own figures without the factors (answers since runs were weighed)
    if (estimate.time && u.step_s != null) {
      rows.push(["step time", fmt.s(estimate.time.step_s), fmt.s(u.step_s)]);
      rows.push(["tokens/s", fmt.int(estimate.time.tokens_per_s), fmt.int(u.tokens_per_s)]);
    }
    rows.push(["memory per GPU", fmt.gib(estimate.memory.per_gpu.total), fmt.gib(u.memory_per_gpu_bytes)]);
    rows.push(["fits", estimate.fits ? "yes" : "no", u.fits ? "yes" : "no"]);
  } else {
    // a plan stored before the API quoted them: the calibrated figure with the factor divided out
    if (estimate.time && f.step_time) {
      rows.push(["step time", fmt.s(estimate.time.step_s), fmt.s(estimate.time.step_s / f.step_time)]);
      rows.push(["tokens/s", fmt.int(estimate.time.tokens_per_s), fmt.int(estimate.time.tokens_per_s * f.step_time)]);
    }
    const m = estimate.memory.per_gpu;
    if (f.memory_dynamic) {
      const dynamic = m.activations + m.buffers + m.overhead;
      rows.push(["memory per GPU", fmt.gib(m.total), `≈ ${fmt.gib(m.total - dynamic + dynamic / f.memory_dynamic)}`]);
    }
  }
  const figures = table(["figure", "calibrated", "without calibration"], rows, "Calibrated and uncalibrated figures");
  figures.classList.add("uncalibrated");
  box.append(figures);
  if (!u) {
    box.append(el("p", { class: "note", text:
      "Without calibration: the calibrated figure with the factor divided out (memory approximately: the factor scales activations, buffers and overhead)." }));
  }
  return box;
}

// ---------------------------------------------------------------- launcher targets and file previews

function launcherBlock(plan, container) {
  const requested = (plan.request && plan.request.launchers) || [];
  const unsupported = plan.unsupported_targets || {};
  const byTarget = {};
  plan.artifacts.forEach((a) => { (byTarget[a.target] ||= []).push(a.name); });
  const rows = requested.map((target) => {
    if (unsupported[target]) return [target, "no", unsupported[target]];
    if (byTarget[target]) return [target, "yes", byTarget[target].join(", ")];
    return [target, "no", plan.recommended ? "nothing rendered for this target" : "no layout fits: nothing to render"];
  });
  Object.keys(byTarget).filter((t) => !requested.includes(t)).forEach((t) => rows.push([t, "yes", byTarget[t].join(", ")]));
  container.append(el("h4", { text: "Launcher files" }));
  if (rows.length) {
    const t = table(["target", "renders this layout", "files, or why not"], rows, "Which targets render the recommendation");
    t.classList.add("targets-table");
    container.append(t);
  } else {
    container.append(el("p", { class: "note", text: "No launcher target was requested." }));
  }
  const rendering = rows.filter((r) => r[1] === "yes").map((r) => r[0]);
  const not = rows.filter((r) => r[1] === "no").map((r) => r[0]);
  const note = document.getElementById("launchers-note");
  if (note && container.id === "result") {
    note.textContent = `Plan ${plan.id}: ${rendering.length ? `${rendering.join(", ")} render it` : "no target renders it"}` +
      `${not.length ? `; ${not.join(", ")} cannot (reasons under Launcher files)` : ""}.`;
    [...document.getElementById("launchers").options].forEach((o) => {
      if (unsupported[o.value]) o.title = unsupported[o.value]; else o.removeAttribute("title");
    });
  }
  if (!plan.artifacts.length) return;
  const preview = el("div", { class: "preview", role: "region", "aria-label": "File preview", tabindex: "-1", hidden: "" });
  const files = el("ul", { class: "artifacts" });
  plan.artifacts.forEach((a) => {
    const button = el("button", { type: "button", class: "small", "aria-expanded": "false", text: "Preview" });
    button.setAttribute("aria-label", `Preview ${a.name}`);
    button.addEventListener("click", () => previewArtifact(a, button, preview, files));
    files.append(el("li", {}, downloadLink(a.url, a.name, a.name, preview),
      ` (${a.target}, ${fmt.int(a.size_bytes)} bytes) `, button));
  });
  files.append(el("li", {}, downloadLink(`/v1/plans/${plan.id}/artifacts.zip`, `${plan.id}.zip`, "all files (zip)", preview)));
  container.append(files, preview);
}

// A file's download link. A link the browser follows sends no Authorization header, so where the tab
// holds an API key (PLANNER_REQUIRE_AUTH=true) the click fetches the file with it, as the preview does,
// and saves what came back: the plain link was a 401 there (a multi-tenant review).
function downloadLink(href, name, text, preview) {
  const link = el("a", { href, download: name, text });
  link.addEventListener("click", async (event) => {
    const key = sessionStorage.getItem(KEY_STORE);
    if (!key) return; // no key: the browser's own download
    event.preventDefault();
    try {
      const response = await fetch(href, { headers: { Authorization: `Bearer ${key}` } });
      if (!response.ok) {
        let problem = {};
        try { problem = await response.json(); } catch { /* not a problem document */ }
        throw new ApiError(response.status, problem);
      }
      const url = URL.createObjectURL(await response.blob());
      const save = el("a", { href: url, download: name });
      document.body.append(save);
      save.click();
      save.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
    } catch (error) {
      const said = el("pre", { tabindex: "0", class: "field-error", text: `Could not download ${name}: ${error.message}` });
      preview.replaceChildren(said);
      preview.hidden = false;
      said.focus();
    }
  });
  return link;
}

async function previewArtifact(artifact, button, preview, files) {
  const open = button.getAttribute("aria-expanded") === "true";
  files.querySelectorAll("button[aria-expanded]").forEach((b) => b.setAttribute("aria-expanded", "false"));
  if (open) { preview.hidden = true; preview.replaceChildren(); return; }
  button.setAttribute("aria-expanded", "true");
  const pre = el("pre", { tabindex: "0", text: "Loading…" });
  preview.replaceChildren(el("h5", { text: `${artifact.name} (${artifact.media_type})` }), pre);
  preview.hidden = false;
  try {
    pre.textContent = await apiText(artifact.url);
  } catch (error) {
    pre.textContent = `Could not load ${artifact.name}: ${error.message}`;
    pre.classList.add("field-error");
  }
  preview.focus();
}

// ---------------------------------------------------------------- a plan

// What the estimate warns of (outside the validated range, head_dim alignment, ...), as the CLI prints it.
function warningsBlock(estimate, container) {
  const warnings = estimate?.warnings || [];
  if (warnings.length) container.append(el("h4", { text: "Warnings" }), list(warnings, "warnings"));
}

// What an estimate's figures rest on (its peaks, efficiencies, statistics), as the API and the CLI say
// them: folded, since every estimate has several.
function assumptionsBlock(estimate, container) {
  const assumptions = estimate?.assumptions || [];
  if (!assumptions.length) return;
  const box = el("details", { class: "assumptions" });
  box.append(el("summary", { text: `Assumptions (${assumptions.length})` }), list(assumptions, "assumptions"));
  container.append(box);
}

// What a plan's score counts (recommender.rank.score; the OpenAPI document's CandidateOut.score).
function scoreUnit(plan) {
  const constraints = plan.request?.constraints || {}, tokens = plan.request?.training?.tokens;
  switch (constraints.objective) {
    case "fewest_gpus": return "GPUs";
    case "cost": return constraints.gpu_hour_cost != null ? "per million tokens (price × GPU-hours)" : "GPU-hours per million tokens";
    case "time_to_train": return tokens ? "s to train" : "tokens/s";
    default: return "tokens/s";
  }
}

// The score as the figure it is shown beside (tokens/s in whole tokens: "79,997 tokens/s · score 80,000
// tokens/s" read as two numbers; a UI review), other units to four figures.
function scoreText(score, plan) {
  return scoreUnit(plan) === "tokens/s" || scoreUnit(plan) === "GPUs" ? fmt.int(score) : fmt.num(score);
}

// A resolved default in the page's units: bandwidths in GB/s, byte counts in GiB (the API's are bytes).
function defaultText(key, value) {
  const n = Number(value);
  if (value === "" || !Number.isFinite(n)) return value;
  if (key.endsWith("_bytes_per_s")) return `${fmt.num(n / 1e9)} GB/s`;
  if (key.endsWith("_bytes") || key.endsWith("_bytes_per_node")) return fmt.gib(n);
  return value;
}

// The largest micro-batch and sequence the layout holds (limits; 0: none, null: not computed), in the CLI's words.
function limitsText(estimate) {
  const limits = estimate.limits || {};
  const said = [];
  const micro = limits.max_micro_batch_size, seq = limits.max_seq_len;
  if (micro != null) said.push(micro ? `micro-batch up to ${fmt.int(micro)}` : "no micro-batch the global batch allows");
  if (seq != null) said.push(seq ? `sequence up to ${fmt.int(seq)} tokens` : "no sequence length");
  return said.join(", ");
}

// Host RAM and NVMe per node an estimate needs (offloaded states and activations), or "" where none.
function hostText(memory) {
  const parts = [];
  if (memory.cpu_per_node_bytes) parts.push(`host RAM ${fmt.gib(memory.cpu_per_node_bytes)}`);
  if (memory.nvme_per_node_bytes) parts.push(`NVMe ${fmt.gib(memory.nvme_per_node_bytes)}`);
  return parts.length ? `${parts.join(", ")} per node` : "";
}

function renderPlan(plan, container) {
  container.replaceChildren();
  container.append(el("p", { class: `status ${plan.status}` },
    el("strong", { text: plan.status === "feasible" ? "Feasible" : "Infeasible" }),
    ` — ${plan.model}, plan `, el("a", { href: `#/plans/${plan.id}`, text: plan.id }),
    ` · ${calibrationSummary((plan.recommended || plan.closest || {}).estimate?.calibration)}`));
  if (plan.search?.truncated) {
    // the search stopped before it saw every layout: a better one may exist
    container.append(el("p", { class: "note truncated", role: "note", text:
      `The search stopped early (${plan.search.truncated_by || "its budget"}) after ${fmt.int(plan.search.memory_evaluations + plan.search.time_evaluations)} ` +
      "evaluations: a layout it did not reach may be better." }));
  }
  const chosen = Object.entries(plan.resolved_defaults || {});
  if (chosen.length) {
    container.append(el("p", { class: "note defaults", text: `Chosen for what the request left out: ${chosen.map(([k, v]) => `${k} ${defaultText(k, v)}`).join(", ")}` }));
  }
  const rec = plan.recommended;
  if (rec) {
    const est = rec.estimate;
    container.append(el("h3", { text: `Recommended: ${layoutText(rec.layout)}` }));
    if (est.time) {
      container.append(el("p", { class: "headline", text:
        `${fmt.int(est.time.tokens_per_s)} tokens/s · ${est.time.tflops_per_gpu.toFixed(1)} TFLOP/s per GPU · ` +
        `MFU ${fmt.pct(est.time.mfu)} · step ${fmt.s(est.time.step_s)}` +
        (est.time_to_train_s ? ` · time to train ${fmt.s(est.time_to_train_s)}` : "") +
        (est.cost_to_train != null ? ` · cost to train ${fmt.num(est.cost_to_train)} (at the GPU-hour price given)` : "") +
        ` · ranked by ${LABELS[plan.request?.constraints?.objective] || plan.request?.constraints?.objective || "throughput"}: ` +
        `score ${scoreText(rec.score, plan)} ${scoreUnit(plan)}` }));
    }
    container.append(calibrationBlock(est, plan.id));
    warningsBlock(est, container);
    assumptionsBlock(est, container);
    container.append(el("h4", { text: "Memory per GPU (most-loaded rank)" }));
    container.append(el("p", { class: "note memory-statistics", text:
      `The fit compares ${est.memory.fit_statistic === "device_used" || !est.memory.fit_statistic
        ? "device used (as nvidia-smi shows it: the caching allocator's reserve, the CUDA context and NCCL's buffers)"
        : est.memory.fit_statistic} with the card's ${fmt.gib(est.memory.capacity_bytes)}; the search keeps ` +
      `${fmt.pct(plan.request?.constraints?.min_headroom_fraction ?? 0.05)} of it free (min_headroom_fraction, or ` +
      "more where this hardware's runs measured more memory), so a " +
      "layout it rejects may still fit the card (its estimate then warns of thin headroom). Peak allocated is " +
      "PyTorch's max_memory_allocated, peak reserved its max_memory_reserved: compare a run's figure with the " +
      "statistic it reports." }));
    container.append(memoryFigure([rec, ...plan.alternatives], `Memory per GPU in GiB, card ${fmt.gib(est.memory.capacity_bytes)}`));
    if (hostText(est.memory)) container.append(el("p", { class: "note host-needs", text: `Offload needs ${hostText(est.memory)}.` }));
    // the headroom and the limits, as the CLI prints them beside its memory table
    const limits = limitsText(est);
    container.append(el("p", { class: "note headroom", text:
      `Headroom ${fmt.gib(est.memory.headroom_bytes)} of ${fmt.gib(est.memory.capacity_bytes)} per GPU` +
      (limits ? `; fits at this layout: ${limits}.` : ".") }));
    const stages = est.memory.per_stage || [];
    if (stages.length > 1) {
      // uneven pipeline stages: one bar per evaluated pipeline rank of the recommended layout
      container.append(el("h4", { text: "Memory per pipeline rank (recommended layout)" }));
      container.append(memoryFigure(stages.map((stage) => ({
        label: `pipeline rank ${stage.rank}`,
        estimate: { memory: { capacity_bytes: est.memory.capacity_bytes, per_gpu: stage } },
      })), "Memory per pipeline rank in GiB"));
    }
    if (est.time) {
      container.append(el("h4", { text: "Step time" }));
      container.append(timeChart(est));
    }
    container.append(el("h4", { text: "Why this layout" }), list(rec.rationale, "rationale"));
    if (plan.alternatives.length) {
      // with total tokens each one's time, and with a price its cost, to train, as the CLI shows them: a
      // layout twice as fast on twice the GPUs read as strictly better beside a cost objective's pick
      // (a surfaces review)
      const timed = plan.alternatives.some((a) => a.estimate.time_to_train_s != null);
      const priced = plan.alternatives.some((a) => a.estimate.cost_to_train != null);
      const head = ["layout", "GPUs", "memory", "host / NVMe", "tokens/s", "MFU",
        ...(timed ? ["time to train"] : []), ...(priced ? ["cost"] : []), "calibration", "warnings"];
      container.append(table(head, plan.alternatives.map((a) => [
        layoutText(a.layout), fmt.int(a.layout.dp * a.layout.tp * a.layout.pp * a.layout.cp),
        fmt.gib(a.estimate.memory.per_gpu.total), hostText(a.estimate.memory) || "-",
        a.estimate.time ? fmt.int(a.estimate.time.tokens_per_s) : "-",
        a.estimate.time ? fmt.pct(a.estimate.time.mfu) : "-",
        ...(timed ? [a.estimate.time_to_train_s != null ? fmt.s(a.estimate.time_to_train_s) : "-"] : []),
        ...(priced ? [a.estimate.cost_to_train != null ? fmt.num(a.estimate.cost_to_train) : "-"] : []),
        calibrationSummary(a.estimate.calibration),
        (a.estimate.warnings || []).join("; ") || "-"]), "Alternatives"));
    }
  }
  if (plan.rejected.length) {
    container.append(table(["reason", "layouts", "example", "detail"],
      plan.rejected.map((g) => [g.reason, g.count, g.example ? layoutText(g.example) : "", g.detail && g.detail !== g.reason ? g.detail : ""]),
      "Rejected layouts"));
  }
  if (plan.closest) {
    // infeasible: how far the layout that came closest is from fitting, component by component
    container.append(el("h4", { text: `Closest layout: ${layoutText(plan.closest.layout)}, ${fmt.gib(plan.closest.over_bytes)} over what the search allows (the card less its headroom)` }));
    // which figure that is (a bound's states alone, or the whole layout) and what else it misses, as the
    // API's detail says it (a surfaces review: neither surface showed it)
    if (plan.closest.detail) container.append(el("p", { class: "closest-detail", text: plan.closest.detail }));
    container.append(memoryFigure([{ ...plan.closest, label: layoutText(plan.closest.layout) }], "Memory of the closest layout in GiB"));
    container.append(calibrationBlock(plan.closest.estimate, plan.id));
    warningsBlock(plan.closest.estimate, container);
    assumptionsBlock(plan.closest.estimate, container);
  }
  if (plan.suggestions.length) {
    container.append(el("h4", { text: "What would make it fit" }), list(plan.suggestions.map((s) => s.detail || s.kind), "suggestions"));
  }
  if ((plan.suggestions_skipped || []).length) {
    container.append(el("h4", { text: "Not suggested" }),
      list(plan.suggestions_skipped.map((s) => `${s.kind}: ${s.reason}`), "suggestions-skipped"));
  }
  launcherBlock(plan, container);
}

// ---------------------------------------------------------------- errors next to their fields

function clearErrors(form, summary) {
  summary.hidden = true;
  summary.replaceChildren();
  form.querySelectorAll(".field-error").forEach((n) => n.remove());
  form.querySelectorAll("[aria-invalid]").forEach((n) => {
    n.removeAttribute("aria-invalid");
    // the field's own help (its unit, its note) again: an error had been named beside it
    if (n.dataset.describedby) n.setAttribute("aria-describedby", n.dataset.describedby);
    else n.removeAttribute("aria-describedby");
    delete n.dataset.describedby;
  });
}

function fieldFor(form, field, prefix) {
  const name = `${prefix}${field}`;
  // a field the page asks for in its own unit (GB/s, GiB): the control whose data-field names it
  const inUnit = [...form.querySelectorAll("[data-field]")].find((node) => node.dataset.field === field);
  if (inUnit) return inUnit;
  // a field inside a JSON a control holds (the custom GPU's cluster.gpu.memory_bytes), while it is shown
  const holder = [...form.querySelectorAll("[data-holds]")].find((node) => !node.closest("[hidden]") &&
    (field === node.dataset.holds || field.startsWith(`${node.dataset.holds}.`)));
  if (holder) return holder;
  for (const id of [name, field]) {
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

// An error's numbers in the unit its control is typed in (host RAM in GiB: the API quotes bytes).
function inPageUnit(control, message) {
  const scale = control && UNITS[control.dataset.unit];
  if (!scale) return message;
  return message.replace(/\b\d{7,}\b/g, (n) => `${fmt.num(Number(n) / scale)} ${control.dataset.unit}`);
}

function showErrors(form, summary, error, prefix = "") {
  const problem = error.problem || {};
  const errors = problem.errors && problem.errors.length ? problem.errors : [{ message: error.message }];
  // one field's error: its numbers in that control's unit here too (host RAM's detail quoted bytes above
  // the field's GiB line; a UI review)
  const only = errors.length === 1 && errors[0].field ? fieldFor(form, errors[0].field, prefix) : null;
  summary.append(el("p", { text: `${problem.title || "Error"}: ${inPageUnit(only, problem.detail || error.message)}` }));
  const items = el("ul");
  errors.forEach((e, i) => {
    const target = e.field ? fieldFor(form, e.field, prefix) : null;
    const message = inPageUnit(target, e.message || problem.detail || "invalid");
    if (target) {
      const id = `err-${i}-${target.id}`.replace(/[^A-Za-z0-9_-]/g, "-");
      target.setAttribute("aria-invalid", "true");
      // the error and the field's own help both (the help was cut off until a reload)
      const own = target.dataset.describedby ?? target.getAttribute("aria-describedby") ?? "";
      target.dataset.describedby = own;
      target.setAttribute("aria-describedby", [id, own].filter(Boolean).join(" "));
      target.insertAdjacentElement("afterend", el("p", { class: "field-error", id, text: message }));
      const link = el("a", { href: `#${target.id}`, text: `${e.field}: ${message}` });
      // to the field without following the fragment: the address routes the page (a run form's link
      // left the plan for the new-plan form)
      link.addEventListener("click", (event) => { event.preventDefault(); target.focus(); });
      items.append(el("li", {}, link));
    } else {
      items.append(el("li", { text: e.field ? `${e.field}: ${message}` : message }));
    }
  });
  summary.append(items);
  summary.hidden = false;
  summary.setAttribute("tabindex", "-1");
  summary.focus();
}

// ---------------------------------------------------------------- the forms' fields, as the API states them

// The OpenAPI document the service serves (FastAPI's default openapi_url): the forms' options,
// limits and help come from the request schemas in it, so a value or a limit the API adds or
// changes reaches the page without a second list here.
const OPENAPI_URL = "/openapi.json";
// Each form and the operation whose request body it sends; its controls' ids are the body's field
// paths after the prefix (or the path in data-field, where the page asks in its own unit).
const FORMS = [["plan-form", "/v1/plans", ""], ["run-form", "/v1/plans/{plan_id}/runs", "run."]];
// The page's units (data-unit) in the API's: host memory is typed in GiB (bandwidth in GB/s is sent as
// the API's own *_gbps fields).
const UNITS = { GiB: GIB };
// The page's words for some of the API's values; the set of values is the document's.
const LABELS = { fewest_gpus: "fewest GPUs", time_to_train: "time to train", auto: "detect", deepspeed: "DeepSpeed",
  accelerate: "Accelerate", hf_trainer: "HF Trainer", megatron: "Megatron-LM", slurm: "Slurm", kubernetes: "Kubernetes",
  allocated: "peak allocated (torch.cuda.max_memory_allocated)", reserved: "peak reserved (torch.cuda.max_memory_reserved)",
  device_used: "device used (nvidia-smi)" };

// A schema with $ref followed and allOf merged (the referring schema's own keys, such as a
// default or a description, win), anyOf/oneOf without a null branch (nullable says there was one)
// and a single branch left merged in.
function resolveSchema(doc, schema) {
  const { $ref, allOf, anyOf, oneOf, ...own } = schema;
  let merged = {};
  if ($ref) merged = resolveSchema(doc, $ref.split("/").slice(1).reduce((node, key) => node[key], doc));
  for (const part of allOf || []) merged = { ...merged, ...resolveSchema(doc, part) };
  const all = anyOf || oneOf || [];
  const branches = all.filter((b) => b.type !== "null").map((b) => resolveSchema(doc, b));
  if (branches.length === 1) merged = { ...merged, ...branches[0] };
  else if (branches.length) merged.anyOf = branches;
  if (branches.length < all.length) merged.nullable = true;
  return { ...merged, ...own };
}

// The schema of the field at `path` (["training", "precision"]) under a request body's schema,
// with whether its object requires it; null where the document has no such field.
function fieldSchema(doc, body, path) {
  let node = resolveSchema(doc, body), required = false;
  for (const name of path) {
    const owner = (node.anyOf || [node]).find((branch) => branch.properties && name in branch.properties);
    if (!owner) return null;
    required = (owner.required || []).includes(name);
    node = resolveSchema(doc, owner.properties[name]);
  }
  // a list's items too (the launcher targets' enum is a $ref)
  return { ...node, items: node.items && resolveSchema(doc, node.items), required };
}

// One control from its field's schema: a select's options from the enum (of the field, or of its
// items for a list), after the page's own empty option ("from the GPU") where the field may be
// left out with that meaning (nullable, not a list, without a default of its own: a null the API
// reads as the default, training.method's, is no choice of its own); a number's min, max and step in the
// control's unit; required; the description as its help.
function leftToTheApi(field) {
  return Boolean(field.nullable) && field.type !== "array" && field.default == null;
}

// Kubernetes' PyTorchJob runs torchrun entry points only: asked for beside others, it keeps the search to
// the layouts those run (planning.plans.runner_targets), so the page's default plan, with every target
// chosen, was slower than the API's and CLI's for the same job (a surfaces review). It starts unchosen.
const NARROWS_THE_SEARCH = new Set(["kubernetes"]);

function applyField(control, field) {
  const values = field.enum || field.items?.enum;
  if (values && control.tagName === "SELECT") {
    const own = leftToTheApi(field) ? [...control.options].filter((o) => o.value === "") : [];
    // a list (the launcher targets) starts with every value chosen but those that narrow the search;
    // otherwise the API's default
    const chosen = (v) => (control.multiple ? !NARROWS_THE_SEARCH.has(v) : !own.length && v === field.default);
    control.replaceChildren(...own, ...values.map((v) => el("option", { value: v, text: LABELS[v] || v, selected: chosen(v) ? "" : null })));
  }
  if (control.type === "number") {
    const scale = UNITS[control.dataset.unit] || 1;
    const whole = field.type === "integer" && scale === 1;
    // an exclusive minimum of an integer is the next integer; of a number, HTML cannot say "above"
    const min = field.minimum ?? (field.exclusiveMinimum === undefined ? undefined : field.exclusiveMinimum + (whole ? 1 : 0));
    if (min !== undefined) control.min = min / scale;
    if (field.maximum !== undefined) control.max = field.maximum / scale;
    control.step = field.multipleOf ? field.multipleOf / scale : whole ? "1" : "any";
  }
  if ("required" in control) control.required = field.required;
  if (field.description) control.title = field.description;
}

// Every control of the forms that sends an API field, and the layout label's switches, from the
// document. Without the document the page keeps what its HTML states: an enum's select offers only its
// empty option, which sends nothing (the service's default applies), no launcher target is offered,
// the limits are the service's to report on submit, and a layout's label names its degrees alone.
async function applyApiFields() {
  try {
    const doc = await api("GET", OPENAPI_URL);
    readLabelSwitches(doc);
    for (const [formId, path, prefix] of FORMS) {
      const body = doc.paths[path]?.post?.requestBody?.content?.["application/json"]?.schema;
      if (!body) continue;
      for (const control of document.getElementById(formId).querySelectorAll("[id]")) {
        if (!control.id.startsWith(prefix)) continue;
        const field = fieldSchema(doc, body, (control.dataset.field || control.id.slice(prefix.length)).split("."));
        if (field) applyField(control, field);
      }
    }
  } catch (error) {
    console.warn(`${OPENAPI_URL} could not be read: the forms offer the service's defaults`, error);
  }
}

// ---------------------------------------------------------------- the new-plan form

function value(id) { return document.getElementById(id).value.trim(); }
function number(id) { const v = value(id); return v === "" ? undefined : Number(v); }

// The inline cluster's GPU: the catalog part chosen, or a datasheet pasted as a custom GPU object.
function chosenGpu() {
  if (!document.getElementById("custom-gpu-toggle").checked) return value("cluster.gpu");
  try { return JSON.parse(value("custom-gpu")); } catch (e) {
    throw new ApiError(422, { title: "Unprocessable", detail: "the GPU's datasheet is not valid JSON",
      errors: [{ field: "cluster.gpu", message: `not valid JSON: ${e.message}` }] });
  }
}

// The form's cluster: a stored one, or one described (its GPU, nodes, links, host RAM and NVMe).
function clusterBody() {
  if (document.querySelector("input[name=cluster-source]:checked").value === "stored") return { id: value("cluster.id") };
  const cluster = { gpu: chosenGpu(), num_nodes: number("cluster.num_nodes"), gpus_per_node: number("cluster.gpus_per_node") };
  // the network and the measured bus bandwidths, typed and sent in GB/s (the API's *_gbps twins)
  for (const field of ["inter_node_bandwidth_gbps", "measured_intra_node_bus_bandwidth_gbps", "measured_inter_node_bus_bandwidth_gbps"]) {
    const gbps = number(`cluster.${field}`);
    if (gbps !== undefined) cluster[field] = gbps;
  }
  // host RAM and NVMe per node, typed in GiB, sent in bytes: offload layouts need them
  for (const [input, field] of [["cluster.cpu_memory_gib_per_node", "cpu_memory_bytes_per_node"], ["cluster.nvme_gib_per_node", "nvme_bytes_per_node"]]) {
    const gib = number(input);
    if (gib !== undefined) cluster[field] = Number.isFinite(gib) ? Math.round(gib * GIB) : gib;
  }
  return cluster;
}

function planBody(withCluster = true) {
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
  // capacity places the model on each catalog GPU: it reads no cluster from the form
  if (withCluster) body.cluster = clusterBody();
  body.training = { seq_len: number("training.seq_len"), global_batch_size: number("training.global_batch_size") };
  // left empty, precision and attention resolve from the GPU (the answer names what they became);
  // an empty method (the API's document unread) is the service's default
  for (const name of ["precision", "attention", "method"]) if (value(`training.${name}`)) body.training[name] = value(`training.${name}`);
  if (!fullTraining()) {
    const rank = number("training.lora_rank");
    if (rank !== undefined) body.training.lora_rank = rank;
    // the frozen base's dtype is LoRA's (QLoRA quantises it)
    if (value("training.method") === "lora" && value("training.base_dtype")) body.training.base_dtype = value("training.base_dtype");
    const targets = [...document.querySelectorAll("input[name=lora-target]:checked")].map((c) => c.value);
    const all = document.querySelectorAll("input[name=lora-target]").length;
    body.training.lora_targets = targets.length === all ? "all-linear" : targets;
  }
  const tokens = number("training.tokens");
  if (tokens !== undefined) body.training.tokens = tokens;
  body.constraints = { top_k: number("constraints.top_k") };
  if (value("constraints.objective")) body.constraints.objective = value("constraints.objective");
  if (number("constraints.gpu_hour_cost") !== undefined) body.constraints.gpu_hour_cost = number("constraints.gpu_hour_cost");
  body.launchers = [...document.getElementById("launchers").selectedOptions].map((o) => o.value);
  return body;
}

// empty: the service's default method, full training
function fullTraining() { return ["", "full"].includes(value("training.method")); }

function toggleLora() {
  document.getElementById("lora-fields").hidden = fullTraining();
  // the frozen base's dtype is LoRA's: QLoRA quantises it (planBody sends it for lora alone)
  document.getElementById("training.base_dtype").closest(".field").hidden = value("training.method") !== "lora";
}

function toggleSources(name) {
  const chosen = document.querySelector(`input[name=${name}]:checked`).value;
  document.querySelectorAll(`input[name=${name}]`).forEach((radio) => {
    radio.closest("fieldset").querySelectorAll(`[data-source]`).forEach((node) => { node.hidden = node.dataset.source !== chosen; });
  });
}

// The launcher note and each target's "why not" describe the plan shown: back to the form's own text
// when a new answer (or an error) replaces it.
const LAUNCHERS_NOTE = document.getElementById("launchers-note")?.textContent;
function resetLaunchersNote() {
  const note = document.getElementById("launchers-note");
  if (note && LAUNCHERS_NOTE !== undefined) note.textContent = LAUNCHERS_NOTE;
  [...(document.getElementById("launchers")?.options || [])].forEach((o) => o.removeAttribute("title"));
}

async function submitPlan(event) {
  event.preventDefault();
  const form = event.target, summary = document.getElementById("form-errors"), result = document.getElementById("result");
  const busy = document.getElementById("busy"), button = document.getElementById("submit");
  clearErrors(form, summary);
  result.replaceChildren();
  resetLaunchersNote();
  button.disabled = true;
  busy.textContent = "Searching layouts…";
  try {
    const plan = await api("POST", "/v1/plans", planBody());
    renderPlan(plan, result);
    busy.textContent = `Plan ${plan.id}: ${plan.status}`;
    result.focus();  // keyboard and screen-reader users land on the answer, its region named
  } catch (error) {
    busy.textContent = "";
    showErrors(form, summary, error);
  } finally {
    button.disabled = false;
  }
}

// ---------------------------------------------------------------- capacity across GPU types

// The capacity request of the form's model and training: each catalog GPU in its own reference node
// (the form's cluster, constraints and launchers are a plan's; capacity asks for the fewest GPUs).
function capacityBody() {
  const plan = planBody(false);
  const body = { model: plan.model, training: plan.training };
  // the form's price prices each GPU type's option (a capacity request's own gpu_hour_cost): it was
  // dropped, and the page had no cost column where the CLI's --gpu-hour-cost gives one (a surfaces review)
  if (plan.constraints?.gpu_hour_cost != null) body.gpu_hour_cost = plan.constraints.gpu_hour_cost;
  return body;
}

// The GPUs of a capacity option and the nodes they take: part of one node where fewer than a node's
// (2 of a node of 8 read as "2 (1 × 8)", eight; a surfaces review).
function fewestText(o) {
  if (!o.min_gpus) return "-";
  const whole = o.min_nodes * o.gpus_per_node;
  return o.min_gpus < whole ? `${fmt.int(o.min_gpus)} (of 1 node of ${o.gpus_per_node})`
    : `${fmt.int(o.min_gpus)} (${fmt.int(o.min_nodes)} × ${o.gpus_per_node})`;
}

function renderCapacity(answer, container) {
  container.replaceChildren(el("h3", { text: "GPU types compared" }));
  const rows = answer.options.map((o) => [
    o.gpu, o.fits === null ? "unknown (search cut)" : (o.fits ? "yes" : "no"),
    fewestText(o),
    o.inter_node_bandwidth_bytes_per_s ? `${fmt.num(o.inter_node_bandwidth_bytes_per_s / 1e9)} GB/s` : "-",
    o.layout ? layoutText(o.layout) : "-",
    o.tokens_per_s ? fmt.int(o.tokens_per_s) : "-",
    o.num_gpus && o.num_gpus !== o.min_gpus ? fmt.int(o.num_gpus) : (o.min_gpus ? fmt.int(o.min_gpus) : "-"),
    o.time_to_train_s ? fmt.s(o.time_to_train_s) : "-",
    o.gpu_hours ? fmt.num(o.gpu_hours) : "-", // four figures: 0.66 GPU-hours was "1", as the CLI's amount
    o.cost != null ? fmt.num(o.cost) : "-",
    `${o.note}${o.truncated ? " (search cut by the budget)" : ""}`,
  ]);
  const t = table(["GPU", "fits", "fewest GPUs", "network per GPU", "layout", "tokens/s", "timed on", "time to train", "GPU-hours", "cost", "notes"],
    rows, "Capacity by GPU type");
  t.classList.add("capacity");
  container.append(t);
  warningsBlock(answer, container); // what the model's config states that no figure reads, as an estimate says it
}

async function submitCapacity() {
  const form = document.getElementById("plan-form"), summary = document.getElementById("form-errors");
  const result = document.getElementById("result"), busy = document.getElementById("busy");
  const button = document.getElementById("compare");
  clearErrors(form, summary);
  result.replaceChildren();
  resetLaunchersNote();
  button.disabled = true;
  busy.textContent = "Comparing GPU types…";
  try {
    const answer = await api("POST", "/v1/capacity", capacityBody());
    renderCapacity(answer, result);
    const unknown = answer.options.filter((o) => o.fits === null).length;
    busy.textContent = `${answer.options.filter((o) => o.fits).length} of ${answer.options.length} GPU types fit`
      + (unknown ? ` (${unknown} unknown: the search was cut before a fit)` : "");
    result.focus();
  } catch (error) {
    busy.textContent = "";
    showErrors(form, summary, error);
  } finally {
    button.disabled = false;
  }
}

// ---------------------------------------------------------------- history and one plan

let nextCursor = null;

// A stored plan's cluster as its snapshot states it: GPUs x part (nodes x GPUs per node).
function clusterText(cluster) {
  if (!cluster || !cluster.gpu) return "-";
  const nodes = cluster.num_nodes ?? 1, per = cluster.gpus_per_node ?? 1;
  return `${fmt.int(nodes * per)} × ${cluster.gpu.name}${nodes > 1 ? ` (${nodes} × ${per})` : ""}`;
}

async function loadPlans(append = false) {
  const model = value("filter-model"), status = value("filter-status");
  const query = new URLSearchParams({ limit: "20" });
  if (model) query.set("model", model);
  if (status) query.set("status", status);
  if (append && nextCursor) query.set("cursor", nextCursor);
  const box = document.getElementById("plans-errors");
  box.hidden = true;
  let page;
  try {
    page = await api("GET", `/v1/plans?${query}`);
  } catch (error) {
    box.replaceChildren(el("p", { text: `The plans could not be listed: ${error.message}` }));
    box.hidden = false;
    return;
  }
  const body = document.querySelector("#plans-table tbody");
  if (!append) body.replaceChildren();
  if (!append && !page.items.length) {
    body.append(el("tr", {}, el("td", { colspan: "6", text: model || status ? "No plan matches these filters." : "No plans stored yet." })));
  }
  for (const plan of page.items) {
    const rec = plan.recommended;
    const tr = el("tr");
    tr.append(el("td", {}, el("a", { href: `#/plans/${plan.id}`, text: new Date(plan.created_at).toLocaleString() })));
    tr.append(el("td", { text: plan.model }), el("td", { text: clusterText(plan.cluster) }), el("td", { text: plan.status }),
      el("td", { text: rec ? layoutText(rec.layout) : "-" }),
      el("td", { text: rec && rec.estimate.time ? fmt.int(rec.estimate.time.tokens_per_s) : "-" }));
    body.append(tr);
  }
  nextCursor = page.next_cursor;
  document.getElementById("more").hidden = !nextCursor;
}

// The plan the page shows now: an answer for another one (the reader moved on while it loaded) is dropped.
let shownPlan = null;

async function showPlan(id) {
  const detail = document.getElementById("plan-detail");
  const form = document.getElementById("run-form");
  // the plan shown before is cleared at once, runs and run form included: under a new address the
  // page never shows the old plan, nor posts a run to it
  shownPlan = id;
  document.getElementById("plan-title").textContent = `Plan ${id}`;
  detail.replaceChildren(el("p", { class: "note", text: "Loading the plan..." }));
  document.getElementById("runs").replaceChildren();
  document.getElementById("run-result").replaceChildren();
  // nor the run form's errors and values typed for the plan before (they stayed, and could be posted here)
  clearErrors(form, document.getElementById("run-errors"));
  form.reset();
  toggleSources("run-source");
  delete form.dataset.plan;
  form.hidden = true;  // shown once the plan has loaded: no run is recorded on a plan that is not there
  try {
    const plan = await api("GET", `/v1/plans/${encodeURIComponent(id)}`);
    if (shownPlan !== id) return;
    document.getElementById("plan-title").textContent = `Plan ${plan.id}`;
    renderPlan(plan, detail);
    // the runs recorded since: the same request planned again picks up their calibration
    const again = el("button", { type: "button", class: "secondary", text: "Plan it again with the runs recorded" });
    again.addEventListener("click", async () => {
      again.disabled = true;
      try {
        const fresh = await api("POST", "/v1/plans", plan.request);
        location.hash = `#/plans/${fresh.id}`;
      } catch (error) {
        again.after(el("p", { class: "field-error", role: "alert", text: error.message }));
      } finally {
        again.disabled = false;
      }
    });
    detail.append(again);
    const title = document.getElementById("plan-title");
    title.setAttribute("tabindex", "-1");
    title.focus();  // the link that opened the plan is hidden now
    if (plan.status === "infeasible") {
      // the API refuses a run of a plan without a layout (409): no form to fill in vain
      detail.append(el("p", { class: "note", text: "An infeasible plan has no layout a run could measure: no run is recorded on it." }));
    } else {
      form.dataset.plan = plan.id;
      form.hidden = false;
    }
    await showRuns(plan.id);
  } catch (error) {
    if (shownPlan === id) detail.replaceChildren(el("p", { class: "field-error", role: "alert", text: error.message }));
  }
}

async function showRuns(planId) {
  const runs = await allPages(`/v1/plans/${planId}/runs`);  // paged as every list (50 a page)
  if (shownPlan !== planId) return;  // the page has moved to another plan
  const box = document.getElementById("runs");
  box.replaceChildren();
  if (!runs.length) { box.append(el("p", { text: "No runs recorded yet." })); return; }
  box.append(table(["recorded", "read from", "step", "tokens/s", "peak memory", "diagnosis"], runs.map((r) => [
    new Date(r.created_at).toLocaleString(), r.source ? `${r.source.format} log` : "typed figures", r.step_s ? fmt.s(r.step_s) : "-",
    r.tokens_per_s ? fmt.int(r.tokens_per_s) : "-",
    r.peak_memory_bytes_per_gpu ? `${fmt.gib(r.peak_memory_bytes_per_gpu)}${r.memory_statistic ? ` (${r.memory_statistic})` : ""}` : (r.out_of_memory ? "out of memory" : "-"),
    Object.entries(r.diagnosis || {}).filter(([, v]) => v != null && !(Array.isArray(v) && !v.length))
      .map(([k, v]) => `${k}: ${diagnosisText(k, v)}`).join("; "),
  ]), "Runs of this plan"));
}

async function submitRun(event) {
  event.preventDefault();
  const form = event.target, summary = document.getElementById("run-errors");
  clearErrors(form, summary);
  document.getElementById("run-result").replaceChildren();  // an earlier run's answer is not this one's
  let body;
  if (document.querySelector("input[name=run-source]:checked").value === "log") {
    // the log as the framework printed it: the service reads it (RunOut.source says what it read)
    body = { log: document.getElementById("run.log").value };
    if (value("run.format")) body.format = value("run.format");
  } else {
    body = { out_of_memory: document.getElementById("run.out_of_memory").checked };
    const step = number("run.step_s"), tps = number("run.tokens_per_s"), gib = number("run.peak_memory_gib");
    if (step !== undefined) body.step_s = step;
    if (tps !== undefined) body.tokens_per_s = tps;
    if (gib !== undefined) body.peak_memory_bytes_per_gpu = Math.round(gib * GIB);
    // which statistic the peak is (left empty, the service takes device used and says so); sent as
    // chosen, so a statistic without a peak is the service's error next to this field
    if (value("run.memory_statistic")) body.memory_statistic = value("run.memory_statistic");
  }
  const planId = form.dataset.plan;  // unset while a plan loads: nothing to record the run on yet
  if (!planId) return;
  const button = form.querySelector("button[type=submit]");
  button.disabled = true;
  try {
    const run = await api("POST", `/v1/plans/${planId}/runs`, body);
    if (shownPlan !== planId) return;  // recorded; the page has moved to another plan since
    form.reset();
    toggleSources("run-source");
    await showRuns(planId);
    const result = document.getElementById("run-result");
    renderRun(run, result);
    result.focus();
  } catch (error) {
    showErrors(form, summary, error, "run.");
  } finally {
    button.disabled = false;
  }
}

// A diagnosis entry in its unit, by the API's naming: bytes in GiB, seconds as times, errors in percent.
function diagnosisText(key, v) {
  if (typeof v === "number") {
    if (key.endsWith("_bytes") || key.endsWith("_bytes_per_gpu")) return fmt.gib(v);
    if (key.endsWith("_s")) return fmt.s(v);
    if (key.endsWith("_error")) return `${v >= 0 ? "+" : ""}${fmt.pct(v)}`;
    return numberText(v);
  }
  return Array.isArray(v) ? v.join("; ") : String(v);
}

function numberText(v) { return typeof v === "number" ? (Number.isInteger(v) ? fmt.int(v) : v.toFixed(3)) : JSON.stringify(v); }

// A figure read from a log as the CLI's _figure_text prints it: a fraction as a percentage, other
// units to four figures ("6639.500 tokens/s" and "mfu 0.389 fraction" where the CLI said 6,640 and
// 38.9%: a surfaces review).
function figureText(f) {
  if (f.unit === "bytes") return fmt.gib(f.value);
  if (f.unit === "s") return fmt.s(f.value);
  if (f.unit === "fraction") return fmt.pct(f.value);
  const value = typeof f.value === "number" ? fmt.num(Number(f.value.toPrecision(4))) : numberText(f.value);
  return `${value}${f.unit ? ` ${f.unit}` : ""}`;
}

// What the service read from a pasted log (RunOut.source), how it judged the run (diagnosis) and
// the factors later estimates on this hardware apply (calibration).
function renderRun(run, box) {
  box.replaceChildren(el("h4", { text: `Run ${run.id} recorded` }));
  const src = run.source;
  if (src) {
    box.append(el("p", { class: "run-read", text:
      `Read as ${src.format === "unknown" ? "a log of no known framework" : `a ${src.format} log`}: ${plural(src.lines ?? 0, "line")}` +
      (src.memory_statistic ? `, memory statistic ${src.memory_statistic}` : "") +
      (src.global_batch_size ? `, global batch ${fmt.int(src.global_batch_size)}` : "") + "." }));
    if (src.warmup) box.append(el("p", { class: "note", text: `Warm-up: ${src.warmup}` }));
    const figures = src.figures || [];
    if (figures.length) {
      const t = table(["figure", "value", "how", "lines"], figures.map((f) => [f.name, figureText(f), f.how || "", (f.lines || []).join(", ")]),
        "What was read");
      t.classList.add("source-figures");
      box.append(t);
    }
    if (src.out_of_memory) {
      const oom = Object.entries(src.out_of_memory).filter(([, v]) => v != null)
        .map(([k, v]) => `${k.replace(/_bytes$/, "").replace(/_/g, " ")} ${k.endsWith("_bytes") ? fmt.gib(v) : numberText(v)}`);
      box.append(el("p", { class: "field-error out-of-memory", text: `Out of memory: ${oom.join(", ")}` }));
    }
    const notes = [...(src.notes || []), ...(src.conversions || [])];
    if (notes.length) box.append(el("h5", { text: "Notes on the log" }), list(notes, "source-notes"));
    if ((src.excerpts || []).length) {
      box.append(el("h5", { text: "Lines it came from" }));
      box.append(el("pre", { class: "excerpts", tabindex: "0", text: src.excerpts.map((x) => `${String(x.line).padStart(5)}${x.rank != null ? ` [rank ${x.rank}]` : ""}  ${x.text}`).join("\n") }));
    }
  }
  const d = run.diagnosis || {};
  box.append(el("h5", { text: "Diagnosis" }));
  if (d.implausible) {
    box.append(el("p", { class: "field-error diagnosis-verdict", text: "Implausible for this plan: stored, but it moves no calibration factor." }));
  } else {
    box.append(el("p", { class: "diagnosis-verdict", text: "Counted: it moves the calibration factors of this hardware." }));
  }
  const rows = [];
  if (d.measured_step_s != null || d.estimated_step_s != null) {
    rows.push(["step time", d.measured_step_s != null ? fmt.s(d.measured_step_s) : "-", d.estimated_step_s != null ? fmt.s(d.estimated_step_s) : "-",
      d.step_time_error != null ? `${d.step_time_error >= 0 ? "+" : ""}${fmt.pct(d.step_time_error)}` : "-"]);
  }
  if (run.peak_memory_bytes_per_gpu != null || d.estimated_peak_memory_bytes_per_gpu != null) {
    // the statistic both peaks are compared as, and whether the run said it or it was assumed
    const statistic = d.memory_statistic ? ` (${d.memory_statistic}${d.memory_statistic_assumed ? ", assumed" : ""})` : "";
    rows.push([`peak memory per GPU${statistic}`, run.peak_memory_bytes_per_gpu != null ? fmt.gib(run.peak_memory_bytes_per_gpu) : (run.out_of_memory ? "out of memory" : "-"),
      d.estimated_peak_memory_bytes_per_gpu != null ? fmt.gib(d.estimated_peak_memory_bytes_per_gpu) : "-",
      d.memory_error != null ? `${d.memory_error >= 0 ? "+" : ""}${fmt.pct(d.memory_error)}` : "-"]);
  }
  if (rows.length) {
    const t = table(["figure", "measured", "estimated", "off by"], rows, "Measured against the plan's estimate");
    t.classList.add("diagnosis");
    box.append(t);
  }
  const advice = [...new Set([...(d.implausible_reasons || []), ...(d.advice || [])])];
  if (advice.length) box.append(list(advice, "advice"));
  if (run.calibration) {
    box.append(el("p", { class: "note", text: `Estimates on this hardware and framework now apply: ${calibrationSummary(run.calibration)}` +
      (run.calibration.implausible_runs ? `; ${plural(run.calibration.implausible_runs, "run")} set aside` : "") +
      ". Plan it again to see them applied." }));
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
  // the controls work before (and whatever) the lists load: a list that fails is said, not fatal
  document.querySelectorAll("input[name=model-source]").forEach((r) => r.addEventListener("change", () => toggleSources("model-source")));
  document.querySelectorAll("input[name=cluster-source]").forEach((r) => r.addEventListener("change", () => toggleSources("cluster-source")));
  document.getElementById("custom-gpu-toggle").addEventListener("change", (event) => {
    document.getElementById("custom-gpu-field").hidden = !event.target.checked;
    document.getElementById("catalog-gpu-field").hidden = event.target.checked;
  });
  document.querySelectorAll("input[name=run-source]").forEach((r) => r.addEventListener("change", () => toggleSources("run-source")));
  document.getElementById("training.method").addEventListener("change", toggleLora);
  document.getElementById("plan-form").addEventListener("submit", submitPlan);
  document.getElementById("compare").addEventListener("click", submitCapacity);
  document.getElementById("filters").addEventListener("submit", (e) => { e.preventDefault(); loadPlans(); });
  document.getElementById("more").addEventListener("click", () => loadPlans(true));
  document.getElementById("run-form").addEventListener("submit", submitRun);
  window.addEventListener("hashchange", route);
  const failed = [];
  const load = (what, path) => allPages(path).catch((error) => { failed.push(`${what}: ${error.message}`); return []; });
  const [models, gpus, clusters] = await Promise.all([load("model presets", "/v1/models"), load("GPU types", "/v1/gpus"),
    load("stored clusters", "/v1/clusters"), applyApiFields()]);
  const presets = document.getElementById("model.preset");
  models.forEach((m) => presets.append(el("option", { value: m.name, text: `${m.name} (${(m.parameters_total / 1e9).toFixed(1)} B)` })));
  presets.value = models.some((m) => m.name === "llama-3.1-8b") ? "llama-3.1-8b" : models[0]?.name;
  const gpuSelect = document.getElementById("cluster.gpu");
  gpus.forEach((g) => gpuSelect.append(el("option", { value: g.name, text: `${g.name} (${fmt.gib(g.memory_bytes)})` })));
  gpuSelect.value = gpus.some((g) => g.name === "h100-sxm-80gb") ? "h100-sxm-80gb" : gpus[0]?.name;
  const stored = document.getElementById("cluster.id");
  clusters.forEach((c) => stored.append(el("option", { value: c.id, text: `${c.name} (${c.world_size} GPUs)` })));
  if (failed.length) {
    const box = document.getElementById("load-errors");
    box.replaceChildren(el("p", { text: "Some lists could not be loaded (reload the page to try again); the form still plans what it can:" }),
      list(failed, "load-failures"));
    box.hidden = false;
  }
  toggleLora();
  route();
  document.body.dataset.ready = "true";
}

document.addEventListener("DOMContentLoaded", start);
