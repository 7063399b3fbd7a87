// The console's streams page: the list; per stream its windows as a timeline, the count
// tables, the models and the reference model's quality (roles model and admin), and the
// privacy ledger in words and numbers with the latest re-identification audit.
"use strict";

const S = { stream: "" };
const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";

// -- the list ----------------------------------------------------------------------------

async function loadStreams() {
  const data = await Sel.api("GET", "/v1/streams");
  const list = $("streamlist");
  list.replaceChildren();
  for (const s of data.streams) {
    const b = Sel.el("button", s.name);
    b.type = "button";
    b.dataset.stream = s.name;
    b.setAttribute("aria-pressed", "false");
    b.title = "window " + s.epoch + ", " + s.privacy.mechanism;
    b.addEventListener("click", () => show(s.name));
    list.appendChild(b);
  }
  $("nostreams").hidden = data.streams.length > 0;
  $("streams-section").hidden = false;
  const wanted = Sel.params.get("stream") || S.stream;
  const pick = data.streams.find((s) => s.name === wanted) || data.streams[0];
  if (pick) await show(pick.name);
}

async function show(name) {
  S.stream = name;
  history.replaceState(null, "", "?stream=" + encodeURIComponent(name));  // a link to it
  for (const b of $("streamlist").querySelectorAll("button")) {
    b.setAttribute("aria-pressed", String(b.dataset.stream === name));
  }
  const enc = encodeURIComponent(name);
  const base = "/v1/streams/" + enc;
  const mayModels = Console.allowed(["model"]);
  try {
    const [stream, windows, tables, ledger, models, quality] = await Promise.all([
      Sel.api("GET", base),
      Sel.api("GET", base + "/windows?limit=200"),
      Sel.api("GET", base + "/tables"),
      Sel.api("GET", base + "/privacy"),
      // the models and the reference model are extras: the page shows the rest without them
      mayModels ? Sel.api("GET", base + "/models").catch((e) => ({ error: e.message })) : null,
      mayModels ? Sel.api("GET", base + "/quality").catch((e) => ({ error: e.message })) : null,
    ]);
    summary(stream, windows);
    timeline(windows);
    countTables(tables);
    if (mayModels) {
      modelTable(models);
      qualityPlot(quality);
    }
    renderLedger(ledger);
    $("detail").hidden = false;
    Sel.status("");
  } catch (e) {
    Sel.status(e.message);
  }
}

// -- summary and windows -----------------------------------------------------------------

// "windows 2–4", "window 3", "none yet" (a period before the stream's first windows)
function span(lo, hi) {
  lo = Math.max(lo, 1);
  if (hi < lo) return "none yet";
  return lo === hi ? "window " + lo : "windows " + lo + "–" + hi;
}

function summary(s, w) {
  $("stream-title").textContent = "Stream " + s.name;
  const p = s.privacy;
  $("stream-summary").textContent =
    "Window " + s.epoch + " open since " + Console.time(s.epoch_started_at) + "; windows of " +
    Console.duration(s.window_seconds) + ", " + s.hot_windows + " hot and " +
    s.retention_windows + " counted (the count period serves " +
    span(w.count_period[0], w.count_period[1]) + "; the hot period holds " +
    span(w.hot_period[0], w.hot_period[1]) + "). " + s.features.length + (s.features.length === 1 ? " feature" : " features") + ", labels " +
    s.labels.join(", ") + "; noise: " + p.mechanism +
    (p.epsilon !== null && p.epsilon !== undefined ? ", ε = " + p.epsilon : "") +
    (p.rho !== null && p.rho !== undefined ? ", ρ = " + p.rho : "") + " per window.";
}

function timeline(w) {
  const line = $("timeline");
  line.replaceChildren();
  const oldest = [...w.windows].sort((a, b) => a.epoch - b.epoch);
  for (const x of oldest) {
    const cls = ["open", "hot", "counted", "expired"].includes(x.state) ? x.state : "";
    const box = Sel.el("div", undefined, "win " + cls);
    box.setAttribute("role", "listitem");
    box.dataset.epoch = x.epoch;
    box.appendChild(Sel.el("div", "#" + x.epoch + " "));
    box.firstChild.appendChild(Sel.el("span", x.state, "state"));
    box.appendChild(Sel.el("div", "opened " + Console.time(x.opened_at).slice(5, 16)));
    if (x.cold_deleted_at) box.appendChild(Sel.el("div", "cold copy deleted"));
    else if (x.cold_sealed_at) box.appendChild(Sel.el("div", "sealed ✓"));
    if (x.observations !== null) box.appendChild(Sel.el("div", x.observations + " obs."));
    line.appendChild(box);
  }
  $("windows").replaceChildren(Console.table(
    ["Window", "State", ["Observations", "num"], "Opened", "Closed", "Sealed (cold store)",
      "Hot raw data deleted", "Cold copy deleted", "Expired"],
    w.windows.map((x) => [x.epoch, Console.badge(x.state, x.state), x.observations,
      Console.time(x.opened_at), Console.time(x.closed_at), Console.time(x.cold_sealed_at),
      Console.time(x.hot_deleted_at), Console.time(x.cold_deleted_at),
      Console.time(x.expired_at)]),
    "newest first; observations are counted exactly only while a window is hot",
  ));
}

function countTables(t) {
  const rows = t.tables.map((x) => [
    x.name, x.features.join(" × "),
    x.reason === "selected"
      ? "added by selection at window " + x.selected_epoch +
        (x.selection_rank ? " (rank " + x.selection_rank + ")" : "") +
        (x.extends ? ", extends " + x.extends : "")
      : "one per feature",
    x.first_epoch, Console.time(x.created_at),
    x.selection_epsilon === null ? "–" : Console.num(x.selection_epsilon),
  ]);
  const wrap = Sel.el("div");
  wrap.appendChild(Sel.el("p", t.tables.length + " of at most " + t.max_tables +
    " tables; selection adds a group of features when it pays (its exact gains are not " +
    "released).", "muted"));
  wrap.appendChild(Console.table(
    ["Table", "Features", "Why", ["Counts from window", "num"], "Added", ["Selection ε", "num"]],
    rows));
  $("tables").replaceChildren(wrap);
}

// -- models and the reference model ------------------------------------------------------

function modelTable(m) {
  if (m.error) {
    $("models").replaceChildren(Sel.el("p", "The models could not be read: " + m.error, "warning"));
    return;
  }
  if (!m.models.length) {
    $("models").replaceChildren(Sel.el("p", "No model is registered on this stream.", "muted"));
    return;
  }
  const now = Date.now();
  $("models").replaceChildren(Console.table(
    ["Model", "Id", "Status", ["Trained at window", "num"], "Trained", "Stale since",
      "Refused from"],
    m.models.map((x) => [x.name, x.id, Console.badge(x.status, x.status), x.trained_epoch,
      Console.time(x.trained_at), Console.time(x.stale_since),
      x.retrain_deadline ? Console.time(x.retrain_deadline) + " (" +
        Console.relative(x.retrain_deadline, now) + ")" : "–"]),
    "a model must retrain at the open window; past its deadline featurize refuses it",
  ));
}

function svg(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = String(text);
  return e;
}

// log-loss of the reference model and of the label prior per epoch, drawn here (no library)
function qualityPlot(q) {
  if (q.error) {
    $("quality-description").textContent = "";
    $("quality-plot").replaceChildren();
    $("quality").replaceChildren(Sel.el("p", "No quality to show: " + q.error, "muted"));
    return;
  }
  $("quality-description").textContent = q.description;
  const pts = q.epochs.filter((e) => e.trained && e.log_loss !== null)
    .sort((a, b) => a.epoch - b.epoch);
  const plot = $("quality-plot");
  plot.replaceChildren();
  $("quality").replaceChildren(Console.table(
    [["Window", "num"], ["Train rows", "num"], ["Held-out rows", "num"], ["Log-loss", "num"],
      ["Prior log-loss", "num"], ["AUC", "num"]],
    q.epochs.map((e) => [e.epoch, e.train_rows, e.eval_rows, Console.num(e.log_loss, 4),
      Console.num(e.prior_log_loss, 4), Console.num(e.auc, 3)]),
  ));
  if (!pts.length) {
    plot.appendChild(Sel.el("p", "No trained reference model yet (it is fitted at a roll, " +
      "on the hot period's closed windows).", "muted"));
    return;
  }
  const W = 560, H = 220, L = 56, R = 120, T = 14, B = 36;
  const xs = pts.map((p) => p.epoch);
  const ys = pts.flatMap((p) => [p.log_loss, p.prior_log_loss]).filter((y) => y !== null);
  const x0 = Math.min(...xs), x1 = Math.max(...xs);
  const y0 = Math.min(0, ...ys), y1 = Math.max(...ys) * 1.1 || 1;
  const X = (x) => L + (x1 === x0 ? (W - L - R) / 2 : (x - x0) / (x1 - x0) * (W - L - R));
  const Y = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  const s = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img",
    "aria-label": "reference model log-loss per window" });
  s.appendChild(svg("title", {}, "Reference model log-loss (lower is better) against the " +
    "label prior's, per window"));
  s.appendChild(svg("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#555" }));
  s.appendChild(svg("line", { x1: L, y1: T, x2: L, y2: H - B, stroke: "#555" }));
  for (let i = 0; i <= 4; i++) {
    const y = y0 + (y1 - y0) * i / 4;
    s.appendChild(svg("line", { x1: L - 4, y1: Y(y), x2: W - R, y2: Y(y), stroke: "#eee" }));
    s.appendChild(svg("text", { x: L - 6, y: Y(y) + 4, "text-anchor": "end", "font-size": 11 },
      y.toFixed(2)));
  }
  for (const x of [...new Set(xs)]) {
    s.appendChild(svg("text", { x: X(x), y: H - B + 16, "text-anchor": "middle",
      "font-size": 11 }, x));
  }
  s.appendChild(svg("text", { x: (L + W - R) / 2, y: H - 4, "text-anchor": "middle",
    "font-size": 12 }, "window (epoch)"));
  s.appendChild(svg("text", { x: 12, y: (T + H - B) / 2, "font-size": 12,
    transform: `rotate(-90 12 ${(T + H - B) / 2})`, "text-anchor": "middle" }, "log-loss"));
  const series = [
    ["model", "log_loss", "#1a4f8a", ""],
    ["label prior", "prior_log_loss", "#c0392b", "5 4"],
  ];
  series.forEach(([label, key, color, dash], i) => {
    const p = pts.filter((e) => e[key] !== null);
    if (p.length > 1) {
      s.appendChild(svg("polyline", { fill: "none", stroke: color, "stroke-width": 2,
        "stroke-dasharray": dash, points: p.map((e) => X(e.epoch) + "," + Y(e[key])).join(" ") }));
    }
    for (const e of p) {
      const c = svg("circle", { cx: X(e.epoch), cy: Y(e[key]), r: 4, fill: color,
        class: "point-" + key });
      c.appendChild(svg("title", {}, label + " at window " + e.epoch + ": " + e[key].toFixed(4)));
      s.appendChild(c);
    }
    s.appendChild(svg("line", { x1: W - R + 10, y1: T + 10 + i * 18, x2: W - R + 30,
      y2: T + 10 + i * 18, stroke: color, "stroke-width": 2, "stroke-dasharray": dash }));
    s.appendChild(svg("text", { x: W - R + 34, y: T + 14 + i * 18, "font-size": 11 }, label));
  });
  plot.appendChild(s);
}

// -- the privacy ledger ------------------------------------------------------------------

const PART_NAMES = {
  count_tables: "count tables",
  table_selection: "selection of tables",
};

function partName(n) {
  if (n.startsWith("annotation_queue:")) return "annotation queue " + n.slice(17);
  return PART_NAMES[n] || n;
}

function eps(x) { return x === null || x === undefined ? "∞ (no guarantee)" : Console.num(x, 4); }

// the ledger's observer is a sentence; its first words name it
function observerWords(o) {
  if (!o) return "";
  const head = o.split(":")[0];
  return head === "both" ? "a one-time compromise and a continual observer" : "a " + head;
}

function guaranteeWords(g, unit) {
  const against = g.observer ? " against " + observerWords(g.observer) : "";
  if (g.epsilon === null || g.epsilon === undefined) {
    const why = (g.unbounded || []).length ? g.unbounded.join("; ") :
      "a part has ε = ∞, e.g. the mechanism 'none'";
    return "Per " + unit + against + ": no bound (" + why + ").";
  }
  const factor = Math.exp(g.epsilon);
  return "Per " + unit + ": (ε = " + Console.num(g.epsilon, 4) + ", δ = " + Console.num(g.delta) +
    ")-differential privacy" + against + (g.neighbour ? " (neighbours: " + g.neighbour + ")" : "") +
    ". Whatever else an attacker knows, one " + unit + "'s data changes the probability of " +
    "anything in scope by at most a factor e^ε = " +
    (factor > 1e6 ? factor.toExponential(2) : factor.toFixed(2)) +
    (g.delta > 0 ? ", except with probability δ" : "") + ".";
}

function unitBlock(g, unit) {
  const box = Sel.el("div", undefined, "card");
  box.dataset.unit = unit;
  box.appendChild(Sel.el("p", guaranteeWords(g, unit), "big"));
  if (g.covers) box.appendChild(Sel.el("p", "Covers " + g.covers + ".", "muted"));
  box.appendChild(Sel.el("p", "Composition: " + g.composition +
    (g.rho !== null && g.rho !== undefined ? "; ρ = " + Console.num(g.rho, 4) + " (zCDP)" : ""),
    "muted"));
  box.appendChild(Console.table(
    ["Part", ["ε", "num"], ["δ", "num"], ["ρ", "num"], "Parameters", "Source"],
    g.parts.map((p) => [partName(p.name), eps(p.epsilon), Console.num(p.delta),
      Console.num(p.rho, 4), partParams(p), p.source]),
    "by part: the tables, the selection of tables, the annotation queues",
  ));
  return box;
}

function partParams(p) {
  const q = p.parameters || {};
  const keys = ["mechanism", "epsilon_per_round", "rounds", "group_size", "windows_composed",
    "max_contributions_per_window", "noise_scale", "beta", "k", "queue", "release_seconds"];
  return keys.filter((k) => q[k] !== undefined && q[k] !== null)
    .map((k) => k + " = " + (typeof q[k] === "number" ? Console.num(q[k]) : q[k])).join(", ");
}

function renderLedger(led) {
  const out = $("ledger");
  out.replaceChildren();
  out.appendChild(unitBlock(led.observation, "observation"));
  if (led.user) {
    out.appendChild(unitBlock(led.user, "user"));
    if (led.user_continual) {
      const c = led.user_continual;
      const box = Sel.el("div", undefined, "card");
      box.dataset.unit = "user_continual";
      box.appendChild(Sel.el("p", "Per user, against a continual observer: ε = " +
        Console.num(c.epsilon_per_active_window, 4) + " per window the user is active in, " +
        "plus " + Console.num(c.epsilon_selection_total, 4) + " for the selection rounds; " +
        "no lifetime bound.", "big"));
      if (c.formula) box.appendChild(Sel.el("p", c.formula, "muted"));
      out.appendChild(box);
    }
  } else {
    const p = Sel.el("p", "Per user: no guarantee is computed — the stream has no user key, " +
      "so a user with many observations is protected only per observation.");
    p.dataset.unit = "user";
    out.appendChild(p);
  }
  const tables = (led.observation.parts.find((p) => p.name === "count_tables") || {}).parameters;
  if (tables && tables.budget_split) {
    out.appendChild(Sel.el("h3", "The per-window budget across the tables"));
    out.appendChild(Console.table(
      ["Table", ["Slots", "num"], ["Weight", "num"], ["Share", "num"], ["ε", "num"], ["ρ", "num"],
        ["Noise scale", "num"]],
      tables.budget_split.map((b) => [b.table, b.slots, Console.num(b.weight),
        (100 * b.share).toFixed(1) + " %", Console.num(b.epsilon, 4), Console.num(b.rho, 4),
        Console.num(b.noise_scale)]),
    ));
  }
  if ((led.releases || []).length) {
    out.appendChild(Sel.el("h3", "Every release of this stream"));
    const releases = Console.table(
      ["Release", "Guarantee", ["ε", "num"], ["δ", "num"], "Neighbours", "Read by", "Lifetime"],
      led.releases.map((r) => [r.kind, r.guarantee, r.dp ? eps(r.epsilon) : "—",
        r.dp ? Console.num(r.delta) : "—", r.neighbour || "—", r.readers || "", r.lifetime || ""]),
      "each kind of release, differentially private or not, with whom it protects and for how long",
    );
    releases.dataset.ledger = "releases";
    out.appendChild(releases);
  }
  const notes = Sel.el("ul", undefined, "muted");
  for (const n of led.notes || []) notes.appendChild(Sel.el("li", n));
  out.appendChild(notes);
  renderReidentification(led.reidentification);
}

// the latest re-identification audit of the stream's releases (null until one ran)
function renderReidentification(r) {
  const box = $("reident");
  box.replaceChildren();
  if (!r) {
    box.appendChild(Sel.el("p", "No re-identification audit yet.", "muted"));
    return;
  }
  box.appendChild(Sel.el("p", r.summary, "big"));
  const rows = [
    ["audit", r.id], ["run at", Console.time(r.at)], ["release", r.release],
    ["ε of the release", eps(r.epsilon)], ["records attacked (n)", r.n],
  ];
  for (const [attack, frac] of Object.entries(r.accuracy || {})) {
    rows.push(["accuracy of attack " + attack, typeof frac === "number"
      ? (100 * frac).toFixed(1) + " %" : frac]);
  }
  box.appendChild(Console.table(["", "Value"], rows));
}

Console.init((me) => {
  $("detail").hidden = true;
  $("streams-section").hidden = true;
  if (me) loadStreams().catch((e) => Sel.status(e.message));
});
