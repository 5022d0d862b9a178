// The statestore dashboard: draws the ring and refreshes from the node's JSON endpoints.
// No build step, no dependencies. A token, if the ring needs one, comes from #token=... .
"use strict";

const REFRESH_MS = 2000;
const SVG = "http://www.w3.org/2000/svg";
const token = new URLSearchParams(location.hash.slice(1)).get("token");

async function getJson(path) {
  const headers = token ? { Authorization: "Bearer " + token } : {};
  const resp = await fetch(path, { headers, cache: "no-store" });
  if (!resp.ok) {
    let msg = resp.status + " " + resp.statusText;
    try { msg = (await resp.json()).error.message; } catch (e) { /* not our error body */ }
    throw new Error(path + ": " + msg);
  }
  return resp.json();
}

function el(name, attrs, text) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

function cell(row, value, cls) {
  const td = row.insertCell();
  td.textContent = value === null || value === undefined ? "-" : String(value);
  if (cls) td.className = cls;
  return td;
}

function fillTable(id, rows, render) {
  const body = document.querySelector("#" + id + " tbody");
  body.replaceChildren();
  for (const r of rows) render(body.insertRow(), r);
  if (!rows.length) {
    const row = body.insertRow();
    const td = cell(row, "none");
    td.colSpan = document.querySelectorAll("#" + id + " th").length;
  }
}

// Members go round the circle in id order, each owning an arc as long as its token share;
// a member with no share (down) gets a small slot so that it is still drawn.
function layout(members) {
  const sorted = [...members].sort((a, b) => (a.id < b.id ? -1 : 1));
  const slot = 1 / (4 * Math.max(sorted.length, 1));
  const weights = sorted.map((m) => (m.share > 0 ? m.share : slot));
  const total = weights.reduce((a, b) => a + b, 0) || 1;
  let at = 0;
  return sorted.map((m, i) => {
    const start = at / total;
    at += weights[i];
    return { member: m, start, end: at / total };
  });
}

function point(cx, cy, r, frac) {
  const a = 2 * Math.PI * frac - Math.PI / 2;
  return [cx + r * Math.cos(a), cy + r * Math.sin(a)];
}

function drawRing(ring) {
  const svg = document.getElementById("ring");
  svg.replaceChildren();
  const cx = 200, cy = 200, r = 140;
  svg.appendChild(el("circle", { cx, cy, r, fill: "none", stroke: "#e3e6ea", "stroke-width": 14 }));
  const placed = layout(ring.members);
  for (const p of placed) {
    const [x1, y1] = point(cx, cy, r, p.start);
    const [x2, y2] = point(cx, cy, r, p.end - 0.002);
    const large = p.end - p.start > 0.5 ? 1 : 0;
    svg.appendChild(el("path", {
      d: `M ${x1} ${y1} A ${r} ${r} 0 ${large} 1 ${x2} ${y2}`,
      class: "arc " + p.member.status,
      "data-arc": p.member.id,
    }));
  }
  for (const p of placed) {
    const m = p.member;
    const [x, y] = point(cx, cy, r, (p.start + p.end) / 2);
    const dot = el("circle", {
      cx: x, cy: y, r: 11,
      class: "member " + m.status + (m.id === ring.self ? " self" : ""),
      "data-id": m.id,
      "data-address": m.address,
      "data-status": m.status,
      "data-share": m.share,
    });
    dot.appendChild(el("title", {}, `${m.id} ${m.address} ${m.status} ${(100 * m.share).toFixed(1)}%`));
    svg.appendChild(dot);
    const [lx, ly] = point(cx, cy, r + 36, (p.start + p.end) / 2);
    svg.appendChild(el("text", { x: lx, y: ly, class: "label" }, m.address));
  }
  svg.appendChild(el("text", { x: cx, y: cy - 6, class: "label" }, `epoch ${ring.epoch}`));
  svg.appendChild(el("text", { x: cx, y: cy + 12, class: "label" },
    `R=${ring.replicas} W=${ring.write_quorum}`));
  fillTable("members", placed.map((p) => p.member), (row, m) => {
    cell(row, m.id + (m.id === ring.self ? " (this node)" : ""));
    cell(row, m.address);
    cell(row, m.status, m.status);
    cell(row, m.zone || "-");
    cell(row, (100 * m.share).toFixed(1) + "%", "num");
  });
}

function drawActivity(act) {
  const ops = [];
  for (const n of act.nodes) for (const op of n.operations) ops.push({ node: n.address, ...op });
  fillTable("activity", ops, (row, op) => {
    cell(row, op.node); cell(row, op.kind); cell(row, op.store || "-");
    cell(row, op.peer); cell(row, op.seconds, "num");
  });
  fillTable("repair", act.nodes, (row, n) => {
    cell(row, n.address);
    cell(row, n.repair.backlog, "num"); cell(row, n.repair.repaired, "num");
    cell(row, n.repair.handed_off, "num"); cell(row, n.compaction.snapshots, "num");
    cell(row, n.compaction.gc, "num");
  });
}

function drawStores(inv) {
  fillTable("stores", inv.stores, (row, s) => {
    cell(row, s.store);
    cell(row, s.head ? s.head.version : null, "num");
    cell(row, s.head ? s.head.epoch : null, "num");
    cell(row, s.versions, "num");
    cell(row, s.holders.length + " node(s)");
  });
}

async function refresh() {
  const errors = [];
  const [ring, health, act, inv] = await Promise.all(
    ["/v1/ring", "/v1/health", "/v1/activity?scope=ring", "/v1/inventory?scope=ring"].map(
      (p) => getJson(p).catch((e) => { errors.push(e.message); return null; }),
    ),
  );
  if (ring) drawRing(ring);
  if (act) drawActivity(act);
  if (inv) drawStores(inv);
  if (ring && health) {
    const up = ring.members.filter((m) => m.status === "up").length;
    document.getElementById("summary").textContent =
      `node ${health.id} at ${health.address}: ${health.status}; ` +
      `${up} of ${ring.members.length} members up; epoch ${ring.epoch}`;
  }
  document.getElementById("error").textContent = errors.join("; ");
  if (ring && act && inv) document.body.dataset.ready = "1";
}

refresh();
setInterval(refresh, REFRESH_MS);
