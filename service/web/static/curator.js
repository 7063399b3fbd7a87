// The curator dashboard: stats, the queue's (ε, δ), the uncertainty distribution of the pool.
"use strict";

const C = { queue: "", timer: null };

function rows(table, pairs) {
  table.replaceChildren();
  for (const [k, v] of pairs) {
    const tr = Sel.el("tr");
    tr.appendChild(Sel.el("td", k, "muted"));
    tr.appendChild(Sel.el("td", v));
    table.appendChild(tr);
  }
}

async function refresh() {
  try {
    const [s, p] = await Promise.all([
      Sel.api("GET", "/v1/queues/" + C.queue + "/stats"),
      Sel.api("GET", "/v1/queues/" + C.queue + "/privacy"),
    ]);
    document.getElementById("privacy").textContent =
      "β = " + p.beta + ", k = " + p.k + ": (ε, δ) = (" + p.epsilon.toFixed(3) + ", " +
      p.delta.toExponential(2) + ")-differentially private releases, every " +
      p.release_seconds + " s. " + p.source;
    // the guarantee in words, with the warning first when δ is above the operator's ceiling
    const words = document.getElementById("guarantee");
    words.textContent = p.guarantee;
    words.className = p.above_ceiling ? "warning" : "";
    rows(document.getElementById("curve"),
      p.curve.map((c) => ["δ at ε = " + c.epsilon.toFixed(3), c.delta.toExponential(2)]));
    // nothing here depends on which candidates were sampled (docs/ARCHITECTURE.md, promise 5)
    rows(document.getElementById("stats"), [
      ["received", s.received], ["next release", new Date(s.next_release_at).toLocaleString()],
      ["released", s.released], ["waiting in pool", s.in_pool], ["leased", s.leased],
      ["labelled", s.labelled], ["skips", s.skipped],
      ["labels", Object.entries(s.label_counts).map(([k, v]) => k + ": " + v).join(", ") || "–"],
    ]);
    const hist = document.getElementById("histogram");
    hist.replaceChildren();
    const top = Math.max(1, ...s.uncertainty_histogram);
    s.uncertainty_histogram.forEach((n, i) => {
      const line = Sel.el("div");
      line.appendChild(Sel.el("span", (i / 10).toFixed(1) + "–" + ((i + 1) / 10).toFixed(1) + " ", "muted"));
      const bar = Sel.el("span", "", "bar");
      bar.style.width = (20 * n / top) + "rem";
      line.appendChild(bar);
      line.appendChild(Sel.el("span", " " + n));
      hist.appendChild(line);
    });
    document.getElementById("board").classList.remove("hidden");
    Sel.status("");
  } catch (e) {
    Sel.status(e.message);
  }
}

document.getElementById("show").addEventListener("click", () => {
  C.queue = document.getElementById("queue").value.trim();
  Sel.setKey(document.getElementById("key").value.trim());
  clearInterval(C.timer);
  refresh();
  C.timer = setInterval(refresh, 5000);
});
document.getElementById("queue").value = Sel.params.get("queue") || "";
document.getElementById("key").value = Sel.key();
