// The k-anonymisation page: source, QIs, weights (sliders or the iML game), run, download.
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  let rows = null;      // inline rows parsed from the CSV
  let columns = [];     // [{name, numeric}]
  let runId = null;

  $("key").value = Sel.key();
  document.querySelector(".pair").style.display = "flex";  // (style.css is shared)
  document.querySelector(".pair").style.gap = "2rem";
  $("key").addEventListener("change", () => Sel.setKey($("key").value));

  function parseCsv(text) {
    const lines = text.split(/\r?\n/).filter((l) => l.trim() !== "");
    if (lines.length < 2) throw new Error("the CSV needs a header line and rows");
    const head = lines[0].split(",").map((h) => h.trim());
    return lines.slice(1).map((line) => {
      const cells = line.split(",");
      const row = {};
      head.forEach((h, i) => {
        const v = (cells[i] || "").trim();
        row[h] = /^-?\d+(\.\d+)?$/.test(v) ? Number(v) : v;
      });
      return row;
    });
  }

  function source() {
    return $("src-stream").checked ? { stream: $("stream").value.trim() } : { rows };
  }

  async function load() {
    Sel.setKey($("key").value);
    Sel.status("");
    try {
      if ($("src-stream").checked) {
        const s = await Sel.api("GET", "/v1/streams/" + encodeURIComponent($("stream").value.trim()));
        columns = s.features.map((f) => ({ name: f.name, numeric: f.kind === "numeric" }));
        columns.push({ name: "label", numeric: false });
      } else {
        rows = parseCsv($("csv").value);
        columns = Object.keys(rows[0]).map((name) => ({
          name, numeric: rows.every((r) => typeof r[name] === "number"),
        }));
      }
    } catch (e) { Sel.status(e.message); return; }
    const table = $("columns");
    table.replaceChildren();
    const head = document.createElement("tr");
    ["column", "use", "weight"].forEach((t) => head.appendChild(Sel.el("th", t)));
    table.appendChild(head);
    for (const c of columns) {
      const tr = document.createElement("tr");
      tr.appendChild(Sel.el("td", c.name));
      const use = document.createElement("select");
      use.dataset.column = c.name;
      use.className = "use";
      for (const o of ["ignore", "range", "hierarchy", "keep"]) {
        const opt = Sel.el("option", o);
        opt.value = o;
        use.appendChild(opt);
      }
      use.value = c.numeric ? "range" : "hierarchy";
      const td = document.createElement("td");
      td.appendChild(use);
      tr.appendChild(td);
      const slider = document.createElement("input");
      slider.type = "range"; slider.min = "1"; slider.max = "100"; slider.value = "10";
      slider.className = "weight";
      slider.dataset.column = c.name;
      const out = Sel.el("span", "1.0", "muted");
      slider.addEventListener("input", () => { out.textContent = (slider.value / 10).toFixed(1); });
      const tw = document.createElement("td");
      tw.append(slider, " ", out);
      tr.appendChild(tw);
      table.appendChild(tr);
    }
    $("setup").classList.remove("hidden");
  }

  function choices() {
    const qis = [], keep = [], weights = {};
    for (const sel of document.querySelectorAll("select.use")) {
      const name = sel.dataset.column;
      if (sel.value === "range" || sel.value === "hierarchy") {
        qis.push({ name, kind: sel.value });
        const slider = document.querySelector(`input.weight[data-column="${CSS.escape(name)}"]`);
        weights[name] = slider.value / 10;
      } else if (sel.value === "keep") keep.push(name);
    }
    return { qis, keep, weights };
  }

  function setSliders(weights) {
    for (const [name, w] of Object.entries(weights)) {
      const slider = document.querySelector(`input.weight[data-column="${CSS.escape(name)}"]`);
      slider.value = String(Math.max(1, Math.min(100, Math.round(w * 10))));
      slider.dispatchEvent(new Event("input"));
    }
  }

  function fillTable(table, obj) {
    table.replaceChildren();
    for (const [k, v] of Object.entries(obj)) {
      const tr = document.createElement("tr");
      tr.append(Sel.el("td", k), Sel.el("td", v));
      table.appendChild(tr);
    }
  }

  let session = null;
  function showQuestion(out) {
    session = out.session;
    fillTable($("row"), out.question.row);
    out.question.clusters.forEach((c, i) => {
      fillTable($("cluster" + i), { ...c.values, "rows in cluster": c.size });
    });
    $("answered").textContent = "Answered: " + out.answered;
    const bars = $("weightbars");
    bars.replaceChildren();
    for (const [name, w] of Object.entries(out.weights)) {
      const line = Sel.el("div", name + " " + w.toFixed(2) + " ");
      const bar = Sel.el("span", "", "bar");
      bar.style.width = Math.min(20, w * 5) + "rem";
      bar.dataset.column = name;
      line.appendChild(bar);
      bars.appendChild(line);
    }
    setSliders(out.weights);
    $("game").classList.remove("hidden");
  }

  async function learn() {
    Sel.status("");
    const { qis } = choices();
    const k = Math.min(100, Number($("k").value));
    try {
      showQuestion(await Sel.api("POST", "/v1/anonymizations/weights",
        { source: source(), k, quasi_identifiers: qis }));
    } catch (e) { Sel.status(e.message); }
  }

  async function pick(choice) {
    try {
      showQuestion(await Sel.api("POST", "/v1/anonymizations/weights/" + session, { choice }));
    } catch (e) { Sel.status(e.message); }
  }

  async function poll() {
    let st;
    try { st = await Sel.api("GET", "/v1/anonymizations/" + runId); }
    catch (e) { Sel.status(e.message); return; }
    $("progress").value = st.progress;
    $("state").textContent = st.status + " " + Math.round(st.progress * 100) + "%";
    if (st.status === "running") { setTimeout(poll, 500); return; }
    if (st.status === "failed") { Sel.status("failed: " + st.error); return; }
    $("ngil").textContent = `NGIL ${st.ngil.toFixed(4)}: ${st.rows} rows in ${st.clusters} ` +
      `clusters of at least k = ${st.k}, in ${st.seconds} s`;
    const loss = {};
    for (const [name, v] of Object.entries(st.loss)) {
      loss[name] = `loss ${v.toFixed(4)} (weight ${st.weights[name].toFixed(2)})`;
    }
    fillTable($("loss"), loss);
    $("done").classList.remove("hidden");
  }

  async function run() {
    Sel.status("");
    const { qis, keep, weights } = choices();
    try {
      const out = await Sel.api("POST", "/v1/anonymizations", {
        source: source(), k: Number($("k").value), quasi_identifiers: qis, weights, keep,
      });
      runId = out.id;
    } catch (e) { Sel.status(e.message); return; }
    $("done").classList.add("hidden");
    $("running").classList.remove("hidden");
    poll();
  }

  async function download(format) {
    const r = await fetch(`/v1/anonymizations/${runId}/result?format=${format}`,
      { headers: { Authorization: "Bearer " + Sel.key() } });
    if (!r.ok) { Sel.status("download failed: " + r.status); return; }
    const url = URL.createObjectURL(await r.blob());
    const a = document.createElement("a");
    a.href = url;
    a.download = `${runId}.${format === "arrow" ? "arrows" : format}`;
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  }

  $("load").addEventListener("click", load);
  $("learn").addEventListener("click", learn);
  $("run").addEventListener("click", run);
  $("pick0").addEventListener("click", () => pick(0));
  $("pick1").addEventListener("click", () => pick(1));
  for (const b of document.querySelectorAll("button[data-format]")) {
    b.addEventListener("click", () => download(b.dataset.format));
  }
})();
