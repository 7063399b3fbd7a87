// The annotator page: lease one example at a time, label it (buttons or keys 1-9), skip it,
// keep the lease alive with heartbeats, show progress.
"use strict";

const A = { queue: "", labels: [], task: null, mine: 0, beat: null, poll: null, busy: false, leaseSeconds: 300 };

function showTask(t) {
  const box = document.getElementById("example");
  box.replaceChildren();
  A.task = t;
  if (!t) {
    box.appendChild(Sel.el("span", "No example is waiting. Checking again shortly…", "muted"));
    document.getElementById("meta").textContent = "";
    return;
  }
  if (t.text !== null && t.text !== undefined) {
    box.appendChild(Sel.el("span", t.text));
  } else {
    const table = Sel.el("table");
    for (const [k, v] of Object.entries(t.record || {})) {
      const tr = Sel.el("tr");
      tr.appendChild(Sel.el("td", k, "muted"));
      tr.appendChild(Sel.el("td", v));
      table.appendChild(tr);
    }
    box.appendChild(table);
  }
  document.getElementById("meta").textContent =
    "uncertainty " + t.uncertainty.toFixed(3) + " · task " + t.id;
}

async function progress() {
  try {
    const s = await Sel.api("GET", "/v1/queues/" + A.queue + "/stats");
    document.getElementById("progress").textContent =
      "You labelled " + A.mine + " this session · queue: " + s.labelled + " labelled of " +
      s.released + " released, " + s.in_pool + " waiting, " + s.leased + " leased";
  } catch (e) { /* progress is best effort */ }
}

async function next() {
  clearTimeout(A.poll);
  try {
    const r = await Sel.api("GET", "/v1/queues/" + A.queue + "/next?n=1");
    showTask(r.tasks[0] || null);
    Sel.status("");
    if (!A.task) A.poll = setTimeout(next, 3000);
  } catch (e) {
    Sel.status(e.message);
  }
  progress();
}

async function act(kind, label) {
  if (!A.task || A.busy) return;
  A.busy = true;
  const id = A.task.id;
  try {
    if (kind === "label") {
      await Sel.api("POST", "/v1/queues/" + A.queue + "/tasks/" + id + "/label", { label });
      A.mine += 1;
    } else {
      await Sel.api("POST", "/v1/queues/" + A.queue + "/tasks/" + id + "/skip");
    }
    await next();
  } catch (e) {
    Sel.status(e.message);
    if (e.message.startsWith("Conflict")) await next();
  } finally {
    A.busy = false;
  }
}

async function heartbeat() {
  if (!A.task) return;
  try {
    await Sel.api("POST", "/v1/queues/" + A.queue + "/tasks/" + A.task.id + "/heartbeat");
  } catch (e) {
    Sel.status(e.message);
  }
}

async function start() {
  A.queue = document.getElementById("queue").value.trim();
  Sel.setKey(document.getElementById("key").value.trim());
  try {
    const q = await Sel.api("GET", "/v1/queues/" + A.queue);
    A.labels = q.labels;
    A.leaseSeconds = q.lease_seconds;
  } catch (e) {
    Sel.status(e.message);
    return;
  }
  const box = document.getElementById("labels");
  box.replaceChildren();
  A.labels.forEach((lab, i) => {
    const b = Sel.el("button", (i < 9 ? (i + 1) + ": " : "") + lab);
    b.type = "button";
    b.dataset.label = lab;
    b.addEventListener("click", () => act("label", lab));
    box.appendChild(b);
  });
  document.getElementById("work").classList.remove("hidden");
  clearInterval(A.beat);
  A.beat = setInterval(heartbeat, Math.max(2, A.leaseSeconds / 3) * 1000);
  await next();
}

document.getElementById("start").addEventListener("click", start);
document.getElementById("skip").addEventListener("click", () => act("skip"));
document.addEventListener("keydown", (ev) => {
  if (ev.target instanceof HTMLInputElement) return;
  if (ev.key >= "1" && ev.key <= "9") {
    const lab = A.labels[Number(ev.key) - 1];
    if (lab !== undefined) act("label", lab);
  } else if (ev.key === "s") {
    act("skip");
  }
});
document.getElementById("queue").value = Sel.params.get("queue") || "";
document.getElementById("key").value = Sel.key();
