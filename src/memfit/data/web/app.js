"use strict";
// The page asks the local memfit server (same estimate code as the CLI) and draws its answer as SVG.
const GiB = 2 ** 30;
const COLORS = ["#4c6ef5", "#15aabf", "#40c057", "#fab005", "#fd7e14", "#e64980", "#7950f2", "#868e96",
                "#12b886", "#be4bdb", "#228be6", "#82c91e", "#f76707", "#495057"];
const $ = (id) => document.getElementById(id);
let uploaded = null;
let schema = null;
// The options the Training box offers, in the options table's order (GET /api/schema).
const HIDDEN = new Set(["gpu", "memory", "mac", "mac_wired_limit", "host_ram"]);

function gib(bytes) { return (bytes / GiB).toFixed(2) + " GiB"; }

function defaultText(p) {
  if (p["x-recipe-default"] || p.default === undefined) return "recipe default";
  return "default " + (Array.isArray(p.default) ? p.default.join(",") : String(p.default));
}

function buildTraining() {
  // One control per setup option; blank means "the recipe's default", so the page sends only what the user set.
  let html = "";
  Object.entries(schema.properties).forEach(([name, p]) => {
    if (p["x-group"] !== "setup" || HIDDEN.has(name)) return;
    const label = esc(name.replace(/_/g, " "));
    const title = esc(p.description + (p["x-methods"] ? " (only with " + p["x-methods"].join(" or ") + ")" : ""));
    if (p.enum || p.type === "boolean") {
      const values = p.enum || ["true", "false"];
      html += `<label title="${title}">${label} <select id="opt-${name}" data-kind="${p.type === "boolean" ? "bool" : "text"}">` +
              `<option value="">(${esc(defaultText(p))})</option>` +
              values.map((v) => `<option value="${esc(v)}">${esc(p.type === "boolean" ? (v === "true" ? "on" : "off") : v)}</option>`).join("") +
              `</select></label>`;
    } else {
      const kind = p.type === "integer" ? "int" : (p.type === "number" ? "float" : "text");
      const type = kind === "text" ? "text" : "number";
      html += `<label title="${title}">${label} <input id="opt-${name}" type="${type}" data-kind="${kind}" ` +
              `placeholder="${esc(defaultText(p))}"${type === "number" ? ' step="any" min="0"' : ""}></label>`;
    }
  });
  $("training").insertAdjacentHTML("beforeend", html);
}

function options() {
  const o = {};
  document.querySelectorAll("#training [id^=opt-]").forEach((el) => {
    const value = el.value.trim();
    if (value === "") return;
    const name = el.id.slice(4);
    const kind = el.dataset.kind;
    o[name] = kind === "bool" ? value === "true" : (kind === "int" || kind === "float" ? Number(value) : value);
  });
  if (uploaded) o.config = uploaded; else o.model = $("model").value.trim();
  if ($("gpu").value) o.gpu = $("gpu").value;
  else if ($("memory").value.trim()) o.memory = $("memory").value.trim();
  else if ($("mac").value.trim()) o.mac = $("mac").value.trim();
  return o;
}

async function post(path, body) {
  const r = await fetch(path, { method: "POST", headers: { "Content-Type": "application/json" },
                                body: JSON.stringify(body) });
  const data = await r.json();
  if (!r.ok) throw new Error(data.error || ("HTTP " + r.status));
  return data;
}

function svg(width, height, inner) {
  return `<svg viewBox="0 0 ${width} ${height}" xmlns="http://www.w3.org/2000/svg" role="img">${inner}</svg>`;
}

function esc(text) { return String(text).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]); }

function drawBreakdown(data) {
  const W = 900, H = 90 + 18 * data.components.length;
  const usable = data.verdict ? data.verdict.usable_bytes : 0;
  const scale = (W - 40) / Math.max(data.device_bytes, usable || 0);
  let x = 20, bars = "", legend = "";
  data.components.forEach((c, i) => {
    const w = c.bytes * scale;
    bars += `<rect x="${x}" y="20" width="${w}" height="30" fill="${COLORS[i % COLORS.length]}"><title>${esc(c.name)}: ${gib(c.bytes)}</title></rect>`;
    legend += `<rect x="20" y="${70 + 18 * i}" width="12" height="12" fill="${COLORS[i % COLORS.length]}"/>` +
              `<text x="38" y="${80 + 18 * i}" font-size="12">${esc(c.name)}: ${gib(c.bytes)}</text>`;
    x += w;
  });
  let line = "";
  if (usable) {
    const ux = 20 + usable * scale;
    line = `<line x1="${ux}" x2="${ux}" y1="10" y2="60" stroke="#b3261e" stroke-width="2"/>` +
           `<text x="${ux - 4}" y="10" font-size="11" text-anchor="end" fill="#b3261e">usable ${gib(usable)}</text>`;
  }
  $("breakdown").innerHTML = svg(W, H, bars + line + legend);
}

function drawCurve(curve, usable) {
  const W = 900, H = 320, L = 60, B = 40, T = 20, R = 20;
  const all = Object.values(curve.methods).flatMap((m) => m.device_bytes).concat(usable ? [usable] : []);
  // A log axis: the curves span 100x (a 32B model at 256 and 32k tokens), and the usable line must stay readable.
  const ymax = Math.max(...all) * 1.1, ymin = Math.min(...all) / 1.1;
  const n = curve.lengths.length;
  const px = (i) => L + (W - L - R) * i / (n - 1);
  const py = (b) => H - B - (H - B - T) * Math.log(b / ymin) / Math.log(ymax / ymin);
  let out = `<line x1="${L}" y1="${H - B}" x2="${W - R}" y2="${H - B}" stroke="#333"/>` +
            `<line x1="${L}" y1="${T}" x2="${L}" y2="${H - B}" stroke="#333"/>` +
            `<text x="${(W + L) / 2}" y="${H - 5}" font-size="12" text-anchor="middle">max length (tokens)</text>` +
            `<text x="14" y="${(H - B) / 2}" font-size="12" transform="rotate(-90 14 ${(H - B) / 2})" text-anchor="middle">device memory (GiB, log scale)</text>`;
  curve.lengths.forEach((len, i) => { out += `<text x="${px(i)}" y="${H - B + 15}" font-size="11" text-anchor="middle">${len}</text>`; });
  for (let k = 0; k <= 4; k++) {
    const b = ymin * Math.pow(ymax / ymin, k / 4);
    out += `<text x="${L - 6}" y="${py(b) + 4}" font-size="11" text-anchor="end">${(b / GiB).toFixed(b < 10 * GiB ? 1 : 0)}</text>`;
  }
  if (usable) out += `<line x1="${L}" x2="${W - R}" y1="${py(usable)}" y2="${py(usable)}" stroke="#b3261e" stroke-dasharray="6 4"/>` +
                     `<text x="${W - R}" y="${py(usable) - 4}" font-size="11" text-anchor="end" fill="#b3261e">usable ${gib(usable)}</text>`;
  Object.entries(curve.methods).forEach(([name, m], j) => {
    const pts = m.device_bytes.map((b, i) => `${px(i)},${py(b)}`).join(" ");
    out += `<polyline points="${pts}" fill="none" stroke="${COLORS[j]}" stroke-width="2"/>` +
           `<text x="${W - R - 4}" y="${T + 14 * (j + 1)}" font-size="12" text-anchor="end" fill="${COLORS[j]}">${name}` +
           `${m.longest_fitting_length ? " fits up to " + m.longest_fitting_length : (usable ? " does not fit" : "")}</text>`;
  });
  $("curve").innerHTML = svg(W, H, out);
}

function show(data) {
  $("result").hidden = false;
  const s = data.setup;
  $("setup-line").textContent = "setup: " + ["method", "batch_size", "seq_len", "precision_resolved", "optimizer",
    "grad_ckpt", "attn", "recipe"].map((k) => `${k.replace(/_/g, " ")} ${s[k]}` +
    (s.explicit.includes(k) || k === "precision_resolved" ? "" : "*")).join(", ") + " (* = the recipe's default)";
  const v = data.verdict;
  const verdict = $("verdict");
  verdict.className = v ? v.status : "";
  verdict.textContent = v ? `${v.status.toUpperCase().replace(/-/g, " ")} on ${v.hardware.name}` : "Estimate";
  verdict.dataset.status = v ? v.status : "";
  $("totals").innerHTML = `device <strong id="device">${gib(data.device_bytes)}</strong>` +
    ` (peak allocated ${gib(data.peak_allocated_bytes)}, reserved ${gib(data.peak_reserved_bytes)}),` +
    ` range ${gib(data.range.low)} to ${gib(data.range.high)}; peak at ${esc(data.peak_phase)}` +
    (v ? `; usable ${gib(v.usable_bytes)}` : "");
  $("device") && ($("device").dataset.bytes = data.device_bytes);
  drawBreakdown(data);
  const fitting = (data.suggestions || []).filter((s) => s.fits);
  $("suggestions").innerHTML = fitting.map((s) =>
    `<li data-fits="${s.fits}"><strong>${esc(s.change)}</strong>: ${gib(s.device_bytes)}` +
    `<br>${esc(s.cost)}<br><code>${esc(s.command)}</code></li>`).join("") ||
    (v && v.status !== "fits" ? "<li>No change found that fits.</li>" : "<li>No change needed.</li>");
  $("warnings").innerHTML = data.warnings.map((w) => `<li>${esc(w.message)}</li>`).join("") || "<li>None.</li>";
  $("assumptions").innerHTML = data.assumptions.map((a) => `<li>${esc(a)}</li>`).join("");
}

let latest = 0;   // answers to an older request than the latest are dropped: they would show the wrong run

async function run(event) {
  if (event) event.preventDefault();
  const id = ++latest;
  $("error").hidden = true;
  document.body.dataset.ready = "";
  try {
    const o = options();
    const data = await post("/api/estimate", o);
    if (id !== latest) return;
    show(data);
    const curve = await post("/api/curve", o);
    if (id !== latest) return;
    drawCurve(curve, data.verdict ? data.verdict.usable_bytes : 0);
    document.body.dataset.ready = "1";
  } catch (err) {
    if (id !== latest) return;
    // An old answer next to a new error would be read as the answer to the new request.
    $("result").hidden = true;
    ["breakdown", "curve", "suggestions", "warnings", "assumptions"].forEach((id) => { $(id).innerHTML = ""; });
    $("error").textContent = err.message;
    $("error").hidden = false;
    document.body.dataset.ready = "1";
  }
}

async function init() {
  const [models, gpus, sch] = await Promise.all([fetch("/api/models").then((r) => r.json()),
                                                 fetch("/api/gpus").then((r) => r.json()),
                                                 fetch("/api/schema").then((r) => r.json())]);
  schema = sch;
  buildTraining();
  $("models").innerHTML = models.map((m) => `<option value="${esc(m.id)}">${esc(m.slug)}</option>`).join("");
  $("gpu").innerHTML += gpus.map((g) => `<option value="${esc(g.slug)}">${esc(g.name)} (${gib(g.memory_bytes)})</option>`).join("");
  $("gpu").value = "rtx-4090";
  $("config").addEventListener("change", async () => {
    const file = $("config").files[0];
    uploaded = file ? JSON.parse(await file.text()) : null;
  });
  $("setup").addEventListener("submit", run);
  document.querySelectorAll("#training select, #gpu").forEach((el) => el.addEventListener("change", run));
  run();
}
init();
