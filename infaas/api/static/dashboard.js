// infaas admin dashboard: plain JavaScript and hand-built SVG, no libraries, no network beyond this
// server. The admin key lives in this tab's sessionStorage and travels only in the Authorization header.
"use strict";

(function () {
  const KEY_NAME = "infaas.adminKey";
  const REFRESH_MS = 5000;
  const SVG_NS = "http://www.w3.org/2000/svg";
  const PALETTE = ["#2f6fde", "#e07a2f", "#2a9d5c", "#c8372d", "#8a5cd6", "#1f9bb4", "#c4a21b", "#d6549a",
    "#5b6b82", "#7fb02b"];

  let timer = null;
  let inFlight = false;

  const $ = (id) => document.getElementById(id);

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  // Costs per query are ~1e-10 USD: fixed decimals would show zeros, so small amounts use exponents.
  function fmtUsd(x) {
    if (x === 0) return "$0";
    if (x >= 1) return "$" + x.toFixed(2);
    if (x >= 1e-4) return "$" + x.toPrecision(4);
    return "$" + x.toExponential(3);
  }
  const fmtMs = (x) => (x === null || x === undefined ? "–" : x.toFixed(x < 10 ? 2 : 1) + " ms");
  const fmtPct = (x) => (x === null || x === undefined ? "–" : (100 * x).toFixed(1) + " %");
  const fmtMb = (x) => (x >= 1024 ? (x / 1024).toFixed(2) + " GiB" : x.toFixed(1) + " MiB");
  const fmtTime = (s) => new Date(s * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });

  function colorFor(names) {
    const map = new Map();
    names.forEach((n, i) => map.set(n, PALETTE[i % PALETTE.length]));
    return map;
  }

  function setStatus(text, isError) {
    const s = $("status");
    s.textContent = text;
    s.classList.toggle("error", Boolean(isError));
  }

  // ---- key handling ------------------------------------------------------------------------
  function showLogin(message) {
    stop();
    $("main").hidden = true;
    $("controls").hidden = true;
    $("login").hidden = false;
    $("login-error").textContent = message || "";
    $("admin-key").focus();
  }

  function showMain() {
    $("login").hidden = true;
    $("main").hidden = false;
    $("controls").hidden = false;
  }

  function login() {
    const key = $("admin-key").value.trim();
    if (!key) {
      $("login-error").textContent = "enter the admin key";
      return;
    }
    sessionStorage.setItem(KEY_NAME, key);
    $("admin-key").value = "";
    showMain();
    refresh();
  }

  function logout() {
    sessionStorage.removeItem(KEY_NAME);
    showLogin("key forgotten");
  }

  class AuthProblem extends Error {}

  async function api(path) {
    const key = sessionStorage.getItem(KEY_NAME);
    if (!key) throw new AuthProblem("");
    const resp = await fetch(path, { headers: { Authorization: "Bearer " + key }, cache: "no-store" });
    if (resp.status === 401) throw new AuthProblem("the key was not accepted (unknown or revoked)");
    if (resp.status === 403) throw new AuthProblem("that is a tenant key: the dashboard needs the admin key");
    const body = await resp.json();
    if (!resp.ok) throw new Error((body && body.detail) || resp.statusText);
    return body;
  }

  // ---- charts -----------------------------------------------------------------------------
  function stackedCostChart(report) {
    const box = $("cost-chart");
    box.replaceChildren();
    const W = 900, H = 240, L = 70, R = 10, T = 10, B = 28;
    const tenants = report.tenants.map((t) => t.tenant);
    const colors = colorFor(tenants);
    const n = report.buckets.length;
    // Each tenant's charged cost, then (lighter) the reserved cost attributed to it.
    const reservedOf = (s) => Math.max(s.reserved_usd || 0, 0);
    const stacks = report.buckets.map((_, i) =>
      report.tenants.reduce((sum, t) => sum + t.series[i].stats.cost_usd + reservedOf(t.series[i].stats), 0));
    const top = Math.max(...stacks, 0);
    const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "cost per tenant over time" });
    root.appendChild(svg("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, class: "axis" }));
    root.appendChild(svg("line", { x1: L, y1: T, x2: L, y2: H - B, class: "axis" }));
    const yScale = (v) => (top > 0 ? (v / top) * (H - T - B) : 0);
    for (const frac of [0, 0.5, 1]) {
      const y = H - B - frac * (H - T - B);
      root.appendChild(svg("text", { x: L - 6, y: y + 4, "text-anchor": "end" }, fmtUsd(frac * top)));
      if (frac > 0) root.appendChild(svg("line", { x1: L, y1: y, x2: W - R, y2: y, class: "axis" }));
    }
    const slot = (W - L - R) / Math.max(n, 1);
    const barW = Math.max(slot * 0.8, 1);
    report.buckets.forEach((start, i) => {
      let base = 0;
      for (const t of report.tenants) {
        const s = t.series[i].stats;
        for (const [kind, v] of [["used", s.cost_usd], ["reserved", reservedOf(s)]]) {
          if (v <= 0) continue;
          const h = yScale(v);
          const rect = svg("rect", {
            x: L + i * slot + (slot - barW) / 2, y: H - B - yScale(base) - h, width: barW,
            height: Math.max(h, 0.5), fill: colors.get(t.tenant), "data-tenant": t.tenant, "data-kind": kind,
            "fill-opacity": kind === "used" ? 1 : 0.4,
          });
          rect.appendChild(svg("title", {}, `${t.tenant} at ${fmtTime(start)}: ${fmtUsd(v)} ${kind}` +
            (kind === "used" ? `, ${s.queries} queries` : " (the fleet's cost beyond charges)")));
          root.appendChild(rect);
          base += v;
        }
      }
    });
    const labelEvery = Math.max(1, Math.ceil(n / 8));
    report.buckets.forEach((start, i) => {
      if (i % labelEvery === 0) {
        root.appendChild(svg("text", { x: L + i * slot + slot / 2, y: H - 8, "text-anchor": "middle" }, fmtTime(start)));
      }
    });
    if (top === 0) {
      root.appendChild(svg("text", { x: (L + W) / 2, y: H / 2, "text-anchor": "middle" }, "no usage in this window"));
    }
    box.appendChild(root);
    $("cost-chart-hint").textContent = `(${n} buckets of ${report.step_s / 60} min)`;
    const legend = $("cost-legend");
    legend.replaceChildren(...tenants.map((name) => {
      const item = el("span", {}, name);
      item.style.setProperty("--swatch", colors.get(name));
      return item;
    }));
  }

  // A line per tenant: its share of queries answered in time, bucket by bucket.
  function sloChart(report) {
    const box = $("slo-chart");
    box.replaceChildren();
    const W = 900, H = 200, L = 50, R = 10, T = 10, B = 28;
    const colors = colorFor(report.tenants.map((t) => t.tenant));
    const n = report.buckets.length;
    const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "SLO attainment per tenant over time" });
    root.appendChild(svg("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, class: "axis" }));
    root.appendChild(svg("line", { x1: L, y1: T, x2: L, y2: H - B, class: "axis" }));
    const x = (i) => L + ((i + 0.5) * (W - L - R)) / Math.max(n, 1);
    const y = (v) => H - B - v * (H - T - B);
    for (const frac of [0, 0.5, 0.9, 1]) {
      root.appendChild(svg("text", { x: L - 6, y: y(frac) + 4, "text-anchor": "end" }, `${Math.round(frac * 100)} %`));
      if (frac > 0) root.appendChild(svg("line", { x1: L, y1: y(frac), x2: W - R, y2: y(frac), class: "axis" }));
    }
    let drawn = 0;
    for (const t of report.tenants) {
      const pts = t.series.map((p, i) => [i, p.stats.slo_attainment]).filter(([, v]) => v !== null && v !== undefined);
      if (pts.length === 0) continue;
      const line = svg("polyline", { points: pts.map(([i, v]) => `${x(i)},${y(v)}`).join(" "), fill: "none",
        stroke: colors.get(t.tenant), "stroke-width": 2, "data-tenant": t.tenant });
      line.appendChild(svg("title", {}, `${t.tenant}: ${fmtPct(t.totals.slo_attainment)} in SLO over the window`));
      root.appendChild(line);
      for (const [i, v] of pts) {
        root.appendChild(svg("circle", { cx: x(i), cy: y(v), r: 2.5, fill: colors.get(t.tenant), "data-tenant": t.tenant }));
      }
      drawn += 1;
    }
    if (drawn === 0) {
      root.appendChild(svg("text", { x: (L + W) / 2, y: H / 2, "text-anchor": "middle" }, "no queries in this window"));
    }
    box.appendChild(root);
  }

  // The what-if frontier of one tenant: what its recent queries would have been charged at
  // other latency targets (x, log scale), at its accuracy floors and 0.02 below.
  function adviceChart(advice) {
    const box = $("advice-chart");
    box.replaceChildren();
    $("advice-summary").textContent = advice ? `${advice.tenant}: ${advice.summary}` : "no tenant has traffic yet";
    if (!advice || advice.points.length === 0) return;
    const W = 900, H = 220, L = 80, R = 20, T = 12, B = 30;
    const factors = [...new Set(advice.points.map((p) => p.latency_factor))].sort((a, b) => a - b);
    const lo = Math.log(factors[0]), hi = Math.log(factors[factors.length - 1]);
    const top = Math.max(...advice.points.map((p) => p.charged_usd), 0);
    const x = (f) => L + ((Math.log(f) - lo) / Math.max(hi - lo, 1e-9)) * (W - L - R);
    const y = (v) => H - B - (top > 0 ? (v / top) * (H - T - B) : 0);
    const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "cost against the latency target" });
    root.appendChild(svg("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, class: "axis" }));
    root.appendChild(svg("line", { x1: L, y1: T, x2: L, y2: H - B, class: "axis" }));
    for (const frac of [0, 0.5, 1]) {
      root.appendChild(svg("text", { x: L - 6, y: y(frac * top) + 4, "text-anchor": "end" }, fmtUsd(frac * top)));
    }
    const median = advice.points.find((p) => p.latency_factor === 1 && p.accuracy_delta === 0);
    for (const f of factors) {
      const ms = median ? ` (${fmtMs(median.median_latency_ms * f)})` : "";
      root.appendChild(svg("text", { x: x(f), y: H - 10, "text-anchor": "middle" }, `${f}×${ms}`));
    }
    const deltas = [...new Set(advice.points.map((p) => p.accuracy_delta))].sort((a, b) => b - a);
    deltas.forEach((delta, k) => {
      const pts = advice.points.filter((p) => p.accuracy_delta === delta).sort((a, b) => a.latency_factor - b.latency_factor);
      const color = PALETTE[k % PALETTE.length];
      root.appendChild(svg("polyline", { points: pts.map((p) => `${x(p.latency_factor)},${y(p.charged_usd)}`).join(" "),
        fill: "none", stroke: color, "stroke-width": 2, "data-accuracy-delta": delta }));
      for (const p of pts) {
        const dot = svg("circle", { cx: x(p.latency_factor), cy: y(p.charged_usd), r: 4, fill: color,
          "data-factor": p.latency_factor, "data-accuracy-delta": delta });
        dot.appendChild(svg("title", {}, `${p.latency_factor}× the latency target, accuracy ${delta === 0 ? "as sent" : delta}: ` +
          `${fmtUsd(p.charged_usd)}, ${fmtPct(p.in_slo_share)} in SLO`));
        root.appendChild(dot);
      }
    });
    box.appendChild(root);
  }

  function variantChart(report) {
    const box = $("variant-chart");
    box.replaceChildren();
    const rows = report.by_variant.filter((v) => v.stats.cost_usd > 0).slice(0, 10);
    if (rows.length === 0) {
      box.appendChild(el("p", { class: "empty" }, "no cost in this window"));
      return;
    }
    const W = 600, rowH = 22, L = 230, R = 80;
    const H = rows.length * rowH + 6;
    const top = Math.max(...rows.map((v) => v.stats.cost_usd));
    const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "cost by variant" });
    rows.forEach((v, i) => {
      const y = 3 + i * rowH;
      const w = Math.max(((W - L - R) * v.stats.cost_usd) / top, 1);
      const label = v.variant.length > 34 ? v.variant.slice(0, 33) + "…" : v.variant;
      root.appendChild(svg("text", { x: L - 6, y: y + 14, "text-anchor": "end" }, label));
      const rect = svg("rect", { x: L, y: y + 3, width: w, height: rowH - 8, fill: PALETTE[i % PALETTE.length] });
      rect.appendChild(svg("title", {}, `${v.variant} (${v.task}): ${fmtUsd(v.stats.cost_usd)}`));
      root.appendChild(rect);
      root.appendChild(svg("text", { x: L + w + 4, y: y + 14 }, fmtUsd(v.stats.cost_usd)));
    });
    box.appendChild(root);
  }

  // ---- tables -----------------------------------------------------------------------------
  function totalsBox(target, items) {
    target.replaceChildren(...items.map(([k, v]) => {
      const d = el("div");
      d.appendChild(el("span", { class: "k" }, k));
      d.appendChild(el("span", { class: "v" }, v));
      return d;
    }));
  }

  function emptyRow(tbody, cols, text) {
    const tr = el("tr");
    tr.appendChild(el("td", { colspan: cols, class: "empty" }, text));
    tbody.appendChild(tr);
  }

  function tenantsTable(report) {
    const tbody = $("tenants-table").querySelector("tbody");
    tbody.replaceChildren();
    for (const t of report.tenants) {
      const s = t.totals;
      const tr = el("tr", { "data-tenant": t.tenant });
      tr.appendChild(el("td", { class: "tenant" }, t.tenant));
      const share = t.share || { weight: 1, rate_qps: null };
      tr.appendChild(el("td", { class: "num share", "data-weight": share.weight,
        title: "weight against the other tenants under contention; quota in queries/s" },
        share.rate_qps == null ? `${share.weight}` : `${share.weight} · ≤${share.rate_qps}/s`));
      tr.appendChild(el("td", { class: "num queries", "data-queries": s.queries }, s.queries));
      tr.appendChild(el("td", { class: "num cost", "data-cost-usd": s.cost_usd, title: s.cost_usd + " USD" },
        fmtUsd(s.cost_usd)));
      tr.appendChild(el("td", { class: "num reserved", "data-reserved-usd": s.reserved_usd,
        title: s.reserved_usd + " USD" }, fmtUsd(s.reserved_usd)));
      for (const k of ["slo_met", "slo_missed", "refused", "failed"]) {
        tr.appendChild(el("td", { class: `num ${k}`, [`data-${k.replace("_", "-")}`]: s[k] }, s[k]));
      }
      tr.appendChild(el("td", { class: "num slo" }, fmtPct(s.slo_attainment)));
      tr.appendChild(el("td", { class: "num p50" }, fmtMs(s.p50_ms)));
      tr.appendChild(el("td", { class: "num p99" }, fmtMs(s.p99_ms)));
      tbody.appendChild(tr);
    }
    if (report.tenants.length === 0) emptyRow(tbody, 12, "no tenants yet");
    const s = report.totals;
    totalsBox($("totals"), [["queries", s.queries], ["cost", fmtUsd(s.cost_usd)],
      ["reserved", fmtUsd(s.reserved_usd)],
      ["refused", s.refused], ["failed", s.failed],
      ["SLO attainment", fmtPct(s.slo_attainment)], ["p99", fmtMs(s.p99_ms)]]);
  }

  function variantsTable(report) {
    const tbody = $("variants-table").querySelector("tbody");
    tbody.replaceChildren();
    for (const v of report.by_variant) {
      const tr = el("tr", { "data-variant": v.variant });
      tr.appendChild(el("td", {}, v.variant));
      tr.appendChild(el("td", {}, v.task));
      tr.appendChild(el("td", { class: "num" }, v.stats.queries));
      tr.appendChild(el("td", { class: "num" }, fmtUsd(v.stats.cost_usd)));
      tr.appendChild(el("td", { class: "num" }, fmtMs(v.stats.p99_ms)));
      tbody.appendChild(tr);
    }
    if (report.by_variant.length === 0) emptyRow(tbody, 5, "no queries in this window");
  }

  function fleetView(fleet) {
    totalsBox($("fleet-totals"), [["workers", fleet.workers.length], ["loaded replicas", fleet.loaded_variants],
      ["memory", `${fmtMb(fleet.memory_used_mb)} / ${fmtMb(fleet.memory_budget_mb)}`],
      ["waiting", Object.values(fleet.queue_depths).reduce((a, b) => a + b, 0)],
      ["fleet cost / hour", fmtUsd(fleet.cost.usd_per_hour)], ["fleet cost so far", fmtUsd(fleet.cost.total_usd)]]);
    const replicas = $("replicas-table").querySelector("tbody");
    replicas.replaceChildren();
    const names = new Set([...Object.keys(fleet.replicas), ...Object.keys(fleet.cost.by_variant)]);
    for (const name of [...names].sort()) {
      const c = fleet.cost.by_variant[name] || { usd: 0, usd_per_hour: 0 };
      const tr = el("tr", { "data-variant": name });
      tr.appendChild(el("td", {}, name));
      tr.appendChild(el("td", { class: "num replicas" }, fleet.replicas[name] || 0));
      tr.appendChild(el("td", { class: "num" }, fmtUsd(c.usd_per_hour)));
      tr.appendChild(el("td", { class: "num" }, fmtUsd(c.usd)));
      replicas.appendChild(tr);
    }
    if (names.size === 0) emptyRow(replicas, 4, "nothing loaded");
    const workers = $("workers-table").querySelector("tbody");
    workers.replaceChildren();
    for (const w of fleet.workers) {
      const tr = el("tr", { "data-worker": w.worker_id });
      tr.appendChild(el("td", {}, w.worker_id));
      tr.appendChild(el("td", {}, w.family));
      tr.appendChild(el("td", { class: w.alive ? "alive" : "dead" }, w.alive ? "yes" : "no"));
      tr.appendChild(el("td", {}, w.loaded.length ? w.loaded.join(", ") : "–"));
      const mem = el("td");
      const frac = w.memory_budget_mb > 0 ? Math.min(w.memory_used_mb / w.memory_budget_mb, 1) : 0;
      const bar = el("span", { class: frac > 0.9 ? "membar hot" : "membar" });
      const fill = el("div");
      fill.style.width = (100 * frac).toFixed(1) + "%";
      bar.appendChild(fill);
      mem.appendChild(bar);
      mem.appendChild(document.createTextNode(`${fmtMb(w.memory_used_mb)} / ${fmtMb(w.memory_budget_mb)}`));
      tr.appendChild(mem);
      tr.appendChild(el("td", { class: "num" }, w.queue_depth));
      workers.appendChild(tr);
    }
    if (fleet.workers.length === 0) emptyRow(workers, 6, "no workers started yet");
    const lines = $("versions-table").querySelector("tbody");
    lines.replaceChildren();
    for (const line of fleet.versions) {
      const tr = el("tr", { "data-architecture": line.architecture });
      tr.appendChild(el("td", {}, line.architecture));
      tr.appendChild(el("td", { class: "num" }, `v${line.stable}`));
      tr.appendChild(el("td", {}, line.canary ? `v${line.canary} at ${(100 * line.canary_share).toFixed(1)} %` : "–"));
      const seen = line.observed_canary_share;
      tr.appendChild(el("td", { class: "num canary-seen" },
        seen === null ? "–" : `${(100 * seen).toFixed(1)} % of ${line.observed_queries}`));
      tr.appendChild(el("td", {}, Object.entries(line.versions).map(([v, state]) => `v${v} ${state}`).join(", ")));
      lines.appendChild(tr);
    }
    if (fleet.versions.length === 0) emptyRow(lines, 5, "no architectures");
    const queues = $("queues-table").querySelector("tbody");
    queues.replaceChildren();
    for (const [variant, depth] of Object.entries(fleet.queue_depths)) {
      const tr = el("tr");
      tr.appendChild(el("td", {}, variant));
      tr.appendChild(el("td", { class: "num" }, depth));
      queues.appendChild(tr);
    }
    if (Object.keys(fleet.queue_depths).length === 0) emptyRow(queues, 2, "no queues");
    const events = $("events-table").querySelector("tbody");
    events.replaceChildren();
    for (const e of fleet.events.slice(0, 30)) {
      const tr = el("tr", { "data-kind": e.kind });
      tr.appendChild(el("td", {}, new Date(e.at_s * 1000).toLocaleTimeString()));
      tr.appendChild(el("td", {}, e.kind));
      tr.appendChild(el("td", {}, e.variant));
      tr.appendChild(el("td", {}, e.worker_id || "–"));
      tr.appendChild(el("td", { class: "reason" }, e.reason));
      events.appendChild(tr);
    }
    if (fleet.events.length === 0) emptyRow(events, 5, "no decisions yet");
  }

  // ---- refresh loop -----------------------------------------------------------------------
  function stop() {
    if (timer !== null) clearTimeout(timer);
    timer = null;
  }

  async function refresh() {
    stop();
    if (inFlight) return;
    inFlight = true;
    try {
      const range = encodeURIComponent($("range").value);
      const [report, fleet] = await Promise.all([api(`/v1/admin/usage?from=${range}`), api("/v1/admin/fleet")]);
      // The frontier of the tenant charged most in the window (the server caches it for a minute).
      const busiest = [...report.tenants].sort((a, b) => b.totals.cost_usd - a.totals.cost_usd)[0];
      const advice = busiest && busiest.totals.queries > 0
        ? await api(`/v1/usage/advice?tenant=${encodeURIComponent(busiest.tenant)}`) : null;
      stackedCostChart(report);
      sloChart(report);
      adviceChart(advice);
      tenantsTable(report);
      variantChart(report);
      variantsTable(report);
      fleetView(fleet);
      document.body.dataset.loaded = "true";
      setStatus(`updated ${new Date().toLocaleTimeString()} · refreshes every ${REFRESH_MS / 1000} s`, false);
    } catch (err) {
      if (err instanceof AuthProblem) {
        sessionStorage.removeItem(KEY_NAME);
        inFlight = false;
        showLogin(err.message);
        return;
      }
      setStatus(`refresh failed: ${err.message} (retrying)`, true);
    } finally {
      inFlight = false;
    }
    timer = setTimeout(refresh, REFRESH_MS);
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("login-button").addEventListener("click", login);
    $("admin-key").addEventListener("keydown", (e) => { if (e.key === "Enter") login(); });
    $("logout").addEventListener("click", logout);
    $("refresh").addEventListener("click", refresh);
    $("range").addEventListener("change", refresh);
    if (sessionStorage.getItem(KEY_NAME)) {
      showMain();
      refresh();
    } else {
      showLogin("");
    }
  });
})();
