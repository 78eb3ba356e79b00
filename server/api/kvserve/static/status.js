// The server-state view: GET /v1/status every 1.5 s while it is shown; per model its
// state, slots, queue, sessions, cache tiers and two small charts (inline SVG).

import { getJson } from "./api.js";

const SVG = "http://www.w3.org/2000/svg";
const POLL_MS = 1500;

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = String(text);
  return node;
}

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i++;
  }
  return (i ? n.toFixed(1) : n) + " " + units[i];
}

function table(headings, rows, cls) {
  const t = el("table", cls);
  const head = el("tr");
  for (const h of headings) head.appendChild(el("th", null, h));
  t.appendChild(el("thead")).appendChild(head);
  const body = t.appendChild(el("tbody"));
  for (const row of rows) {
    const tr = el("tr");
    for (const cell of row) tr.appendChild(el("td", null, cell === null || cell === undefined ? "–" : cell));
    body.appendChild(tr);
  }
  return t;
}

// A line chart of `values` (null: no sample) over the window, with its latest and max.
function chart(title, values, unit, cls) {
  const w = 300;
  const h = 64;
  const box = el("figure", "chart " + cls);
  const max = Math.max(0, ...values.filter((v) => v !== null));
  const last = [...values].reverse().find((v) => v !== null);
  const caption = el("figcaption", null,
    title + ": now " + (last === undefined ? "–" : last.toFixed(unit === "s" ? 3 : 1) + " " + unit) +
    ", max " + (max ? max.toFixed(unit === "s" ? 3 : 1) : "0") + " " + unit);
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  svg.setAttribute("width", w);
  svg.setAttribute("height", h);
  const step = values.length > 1 ? w / (values.length - 1) : w;
  const y = (v) => (h - 2 - (max ? (v / max) * (h - 4) : 0)).toFixed(1);
  const points = values.map((v, i) => (v === null ? null : `${(i * step).toFixed(1)},${y(v)}`));
  const line = document.createElementNS(SVG, "polyline");
  line.setAttribute("points", points.map((p, i) => p || `${(i * step).toFixed(1)},${h - 2}`).join(" "));
  svg.appendChild(line);
  box.append(caption, svg);
  return box;
}

function cacheSection(cache) {
  const wrap = el("div", "cache");
  wrap.appendChild(el("h4", null, "Prefix cache" + (cache.enabled ? "" : " (off)")));
  if (cache.tiers) {
    const rows = Object.entries(cache.tiers).map(([tier, t]) => [
      tier, t.entries, bytes(t.bytes), t.hits, t.misses,
      t.hit_rate === null ? null : (t.hit_rate * 100).toFixed(0) + "%",
    ]);
    wrap.appendChild(table(["tier", "entries", "bytes", "hits", "misses", "hit rate"], rows, "tiers"));
  } else {
    wrap.appendChild(table(["your entries", "tokens"], [[cache.entries, cache.tokens]], "tiers"));
  }
  const kinds = Object.entries(cache.requests || {}).map(([k, n]) => k + " " + n).join(", ");
  wrap.appendChild(el("p", "note", "requests by how their prompt was found: " + (kinds || "none") +
    "; reused tokens " + (cache.reused_tokens || 0)));
  return wrap;
}

// What the load's probe found: architecture, memory kind, window, size, quantization.
function familyLine(f) {
  const parts = [f.architecture, f.memory.replace("_", " ") + " memory"];
  if (f.sliding_window) parts.push("window " + f.sliding_window);
  parts.push((f.parameters / 1e6).toFixed(0) + "M parameters", f.quantization,
             "trained on " + f.context_length_trained + " tokens");
  if (f.exact_reuse_rows) parts.push("exact reuse recomputes " + f.exact_reuse_rows + " rows");
  else if (f.warm_start_rows > 1) parts.push("a warm start recomputes up to " + f.warm_start_rows + " rows");
  const line = el("p", "family", parts.join(" · "));
  line.dataset.memory = f.memory;
  return line;
}

function modelCard(m) {
  const card = el("article", "model-card");
  card.dataset.model = m.id;
  const title = el("h3", null, m.id + " ");
  let state = m.state;
  if (m.state === "loading" && m.load_progress !== undefined) {
    state += " " + (m.load_progress * 100).toFixed(0) + "%" + (m.load_phase === "downloading" ? " (downloading)" : "");
  }
  const badge = el("span", "badge " + m.state, state);
  badge.dataset.state = m.state;
  title.appendChild(badge);
  card.appendChild(title);
  if (m.error) card.appendChild(el("p", "error", m.error));
  if (m.family) card.appendChild(familyLine(m.family));

  const samples = m.recent.samples;
  const requests = samples.reduce((n, s) => n + s.requests, 0);
  const summary = el("p", "summary");
  summary.append(
    el("span", "slots-busy", `slots ${m.slots_busy}/${m.slots_total} busy`), " · ",
    el("span", "queue", `queue ${m.queue}`), " · ",
    el("span", "sessions-total", `sessions ${m.sessions_total}`), " · ",
  );
  const count = el("span", "requests-total", `requests (5 min) ${requests}`);
  count.dataset.count = String(requests);
  summary.appendChild(count);
  card.appendChild(summary);

  const slots = el("div", "slots");
  for (const s of m.slots) {
    const box = el("div", "slot " + (s.busy ? "busy" : s.session ? "pinned" : "free"));
    box.title = s.busy ? "busy" : s.session ? "idle, pinned to its session" : "idle";
    box.append(el("b", null, "#" + s.index), el("span", null, s.session || (s.busy ? "busy" : "idle")));
    if (s.tokens !== null && s.tokens !== undefined) box.appendChild(el("small", null, s.tokens + " tok"));
    slots.appendChild(box);
  }
  card.appendChild(slots);

  const charts = el("div", "charts");
  charts.append(
    chart("throughput", samples.map((s) => s.tokens_per_s), "tok/s", "throughput"),
    chart("TTFT", samples.map((s) => s.ttft_s), "s", "ttft"),
  );
  card.appendChild(charts);

  card.appendChild(el("h4", null, "Sessions"));
  const now = Date.now() / 1000;
  const rows = m.sessions.map((s) => [
    s.id, s.tokens, s.resident ? "yes" : "no", s.in_flight ? "yes" : "no",
    Math.max(0, Math.round(now - s.last_used)) + " s ago",
  ]);
  card.appendChild(rows.length ? table(["id", "tokens", "in a slot", "in flight", "last used"], rows, "sessions")
    : el("p", "note", "no sessions"));
  card.appendChild(cacheSection(m.cache));
  return card;
}

export class StatusView {
  constructor() {
    this.timer = null;
  }

  async refresh() {
    try {
      const status = await getJson("/v1/status");
      document.getElementById("status-error").hidden = true;
      document.getElementById("status-scope").textContent =
        status.scope === "server" ? "whole server" : "your key's share";
      document.getElementById("status-updated").textContent =
        "· up " + status.uptime_s + " s · updated " + new Date(status.time * 1000).toLocaleTimeString();
      document.getElementById("models-status").replaceChildren(...status.models.map(modelCard));
    } catch (err) {
      const box = document.getElementById("status-error");
      box.textContent = err.message;
      box.hidden = false;
    }
  }

  start() {
    if (this.timer) return;
    this.refresh();
    this.timer = window.setInterval(() => this.refresh(), POLL_MS);
  }

  stop() {
    window.clearInterval(this.timer);
    this.timer = null;
  }
}
