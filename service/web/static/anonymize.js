// The k-anonymisation page: source, QIs, weights (sliders or the iML game), run, download.
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  let rows = null;      // inline rows parsed from the CSV
  let columns = [];     // [{name, numeric}]
  let runId = null;
  let examples = null;  // {dataset: {attribute: tree}} from /v1/anonymizations/example-hierarchies

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
        // only the columns the stream's operator marked releasable (never its user key)
        const s = await Sel.api("GET", "/v1/streams/" + encodeURIComponent($("stream").value.trim()));
        const releasable = new Set(s.releasable || []);
        columns = s.features.filter((f) => releasable.has(f.name))
          .map((f) => ({ name: f.name, numeric: f.kind === "numeric" }));
        if (releasable.has("label")) columns.push({ name: "label", numeric: false });
        if (columns.length === 0) {
          Sel.status("stream " + s.name + " marks no column releasable (its 'releasable' setting)");
          return;
        }
      } else {
        rows = parseCsv($("csv").value);
        columns = Object.keys(rows[0]).map((name) => ({
          name, numeric: rows.every((r) => typeof r[name] === "number"),
        }));
      }
      if (examples === null) {
        examples = await Sel.api("GET", "/v1/anonymizations/example-hierarchies");
      }
    } catch (e) { Sel.status(e.message); return; }
    const table = $("columns");
    table.replaceChildren();
    const head = document.createElement("tr");
    ["column", "use", "weight", "generalisation tree"].forEach(
      (t) => head.appendChild(Sel.el("th", t)));
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
      tr.appendChild(treeCell(c.name, use));
      table.appendChild(tr);
    }
    $("setup").classList.remove("hidden");
  }

  // The tree of a hierarchy column: flat (value -> "*"), a shipped example, or custom JSON
  // (pasted, or read from a local file into the text box; nothing is uploaded but the run).
  function treeCell(name, use) {
    const td = document.createElement("td");
    const pick = document.createElement("select");
    pick.className = "tree";
    pick.dataset.column = name;
    const flat = Sel.el("option", "flat (value → *)");
    flat.value = "flat";
    pick.appendChild(flat);
    for (const [dataset, trees] of Object.entries(examples || {})) {
      for (const attr of Object.keys(trees)) {
        const opt = Sel.el("option", `${dataset} example: ${attr}`);
        opt.value = `example:${dataset}:${attr}`;
        pick.appendChild(opt);
      }
    }
    const custom = Sel.el("option", "custom JSON…");
    custom.value = "custom";
    pick.appendChild(custom);
    const box = document.createElement("div");
    box.className = "hidden";
    const text = document.createElement("textarea");
    text.className = "tree-json";
    text.dataset.column = name;
    text.rows = 4;
    text.cols = 50;
    text.placeholder = '{"value": "*", "children": [{"value": "a"}, {"value": "b"}]}';
    const file = document.createElement("input");
    file.type = "file";
    file.accept = ".json,application/json";
    file.className = "tree-file";
    file.dataset.column = name;
    file.addEventListener("change", async () => {
      if (file.files.length) text.value = await file.files[0].text();
    });
    box.append(text, file);
    const sync = () => {
      pick.disabled = use.value !== "hierarchy";
      box.classList.toggle("hidden", pick.disabled || pick.value !== "custom");
    };
    pick.addEventListener("change", sync);
    use.addEventListener("change", sync);
    sync();
    td.append(pick, box);
    return td;
  }

  function hierarchyOf(name) {
    const pick = document.querySelector(`select.tree[data-column="${CSS.escape(name)}"]`);
    if (pick.value === "flat") return undefined;
    if (pick.value.startsWith("example:")) {
      const [, dataset, attr] = pick.value.split(":");
      return examples[dataset][attr];
    }
    const text = document.querySelector(`textarea.tree-json[data-column="${CSS.escape(name)}"]`);
    try {
      return JSON.parse(text.value);
    } catch (e) {
      throw new Error(`${name}: the generalisation tree is not valid JSON (${e.message})`);
    }
  }

  function choices() {
    const qis = [], keep = [], weights = {};
    for (const sel of document.querySelectorAll("select.use")) {
      const name = sel.dataset.column;
      if (sel.value === "range" || sel.value === "hierarchy") {
        const qi = { name, kind: sel.value };
        if (sel.value === "hierarchy") {
          const tree = hierarchyOf(name);
          if (tree !== undefined) qi.hierarchy = tree;
        }
        qis.push(qi);
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
    const k = Math.min(100, Number($("k").value));
    try {
      const { qis } = choices();
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
    try {
      const { qis, keep, weights } = choices();
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
