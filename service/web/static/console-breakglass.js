// The console's break-glass page: unlock requests (pending, granted, closed) with their
// justification and approvals (M of N), approval by pasting a share, a countdown for open
// grants, export and close. Admins list every request; an analyst lists the requests it filed.
"use strict";

const B = { timer: null, tick: null };
const $ = (id) => document.getElementById(id);
function range(r) {
  if (r.from_window !== null) return "windows " + r.from_window + "–" + r.to_window;
  return Console.time(r.from_time) + " – " + Console.time(r.to_time);
}

async function load() {
  try {
    // an admin's key lists every request, an analyst's the requests it filed
    const [p, g, c] = await Promise.all(["pending", "granted", "closed"].map((s) =>
      Sel.api("GET", "/v1/admin/unlock-requests?status=" + s + "&limit=" +
        (s === "closed" ? 10 : 100))));
    const groups = { pending: p.requests, granted: g.requests, closed: c.requests };
    for (const [k, rs] of Object.entries(groups)) {
      const box = $(k);
      box.replaceChildren();
      if (!rs.length) box.appendChild(Sel.el("p", "None.", "muted"));
      for (const r of rs) box.appendChild(card(r));
    }
    $("refreshed").textContent = "as of " + Console.time(new Date().toISOString());
    $("lists").hidden = false;
    countdown();
  } catch (e) {
    Sel.status(e.message);
  }
}

function card(r) {
  const me = Console.me;
  const c = Sel.el("article", undefined, "card");
  c.dataset.request = r.id;
  c.dataset.status = r.status;
  const h = Sel.el("h3", "Request " + r.id + " on stream " + r.stream + " ");
  h.appendChild(Console.badge(r.status, r.status));
  c.appendChild(h);
  c.appendChild(Sel.el("p", "Filed by key " + r.requested_by + " at " +
    Console.time(r.created_at) + " for " + range(r) + "; a grant lasts " +
    Console.duration(r.ttl_seconds) + "."));
  c.appendChild(Sel.el("p", "Justification:", "muted"));
  c.appendChild(Sel.el("p", r.justification, "justification"));
  const ap = Sel.el("p", r.approvals + " of " + r.threshold + " approvals (cold-store key " +
    r.key_id + ": any " + r.threshold + " of its shares open it)", "approvals");
  c.appendChild(ap);
  if (r.note) c.appendChild(Sel.el("p", r.note, "warning"));
  if (r.status === "granted") {
    const p = Sel.el("p", "Granted at " + Console.time(r.granted_at) + "; closes at " +
      Console.time(r.expires_at) + ", in ");
    const cd = Sel.el("span", "", "countdown");
    cd.dataset.expires = r.expires_at;
    cd.setAttribute("role", "timer");
    p.appendChild(cd);
    c.appendChild(p);
  } else if (r.closed_at) {
    c.appendChild(Sel.el("p", (r.status === "expired" ? "Expired" : "Closed") + " at " +
      Console.time(r.closed_at) + ".", "muted"));
  }
  const actions = Sel.el("div", undefined, "actions");
  if (r.status === "pending" && me.role === "admin") {
    const id = "share-" + r.id;
    const label = Sel.el("label", "Your share (the SLIP-39 words; sent once, never stored " +
      "by this page)");
    label.htmlFor = id;
    const ta = Sel.el("textarea", undefined, "share");
    ta.id = id;
    ta.rows = 3;
    ta.maxLength = 1000;
    ta.autocomplete = "off";
    ta.spellcheck = false;
    const b = Sel.el("button", "Approve with this share");
    b.type = "button";
    b.className = "approve";
    b.addEventListener("click", () => approve(r.id, ta));
    actions.append(label, Sel.el("br"), ta, Sel.el("br"), b);
  }
  if (r.status === "granted" && r.requested_by === me.key_id) {
    for (const [fmt, text] of [["ndjson", "Export (NDJSON)"], ["arrow", "Export (Arrow)"]]) {
      const b = Sel.el("button", text);
      b.type = "button";
      b.dataset.format = fmt;
      b.addEventListener("click", () => exportRows(r.id, fmt));
      actions.appendChild(b);
    }
  }
  if ((r.status === "pending" || r.status === "granted") &&
      (me.role === "admin" || r.requested_by === me.key_id)) {
    const b = Sel.el("button", r.status === "granted" ? "Close the grant now" : "Withdraw");
    b.type = "button";
    b.className = "close";
    b.addEventListener("click", () => closeRequest(r.id));
    actions.appendChild(b);
  }
  c.appendChild(actions);
  return c;
}

async function approve(id, ta) {
  const share = ta.value.trim().replace(/\s+/g, " ");
  ta.value = "";  // the share leaves the page with this request, and nowhere else
  try {
    const r = await Sel.api("POST", "/v1/admin/unlock-requests/" + encodeURIComponent(id) +
      "/approve", { share });
    Sel.status("");
    $("done").textContent = "Approved request " + id + ": " + r.approvals + " of " +
      r.threshold + (r.status === "granted" ? "; the grant is open." : ".");
  } catch (e) {
    $("done").textContent = "";
    Sel.status(e.message);  // refused: the request is as it was
    return;
  }
  await load();
}

async function closeRequest(id) {
  try {
    await Sel.api("POST", "/v1/admin/unlock-requests/" + encodeURIComponent(id) + "/close");
    Sel.status("");
  } catch (e) {
    Sel.status(e.message);
  }
  await load();
}

async function exportRows(id, fmt) {
  const r = await fetch("/v1/admin/unlock-requests/" + encodeURIComponent(id) +
    "/export?format=" + fmt, { headers: { Authorization: "Bearer " + Sel.key() } });
  if (!r.ok) {
    const d = await r.json().catch(() => ({}));
    Sel.status("export failed: " + (d.error || r.status) + ": " + (d.detail || ""));
    return;
  }
  const url = URL.createObjectURL(await r.blob());
  const a = document.createElement("a");
  a.href = url;
  a.download = "unlock-" + id + (fmt === "arrow" ? ".arrows" : ".ndjson");
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

// every second: the time left of each open grant; at its end, the lists again
function countdown() {
  let ended = false;
  for (const e of document.querySelectorAll(".countdown")) {
    const left = (new Date(e.dataset.expires).getTime() - Date.now()) / 1000;
    if (left <= 0) {
      e.textContent = "0 s (expired)";
      ended = ended || !e.dataset.ended;
      e.dataset.ended = "1";
    } else {
      e.textContent = Console.duration(left);
    }
  }
  if (ended) load();
}

$("file").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  try {
    const r = await Sel.api("POST", "/v1/admin/unlock-requests", {
      stream: $("req-stream").value.trim(),
      from_window: Number($("req-from").value),
      to_window: Number($("req-to").value),
      ttl_seconds: Number($("req-ttl").value || 900),
      justification: $("req-why").value,
    });
    $("req-why").value = "";
    Sel.status("");
    $("done").textContent = "Filed request " + r.id + "; it waits for " + r.threshold +
      " approvals.";
  } catch (e) {
    Sel.status(e.message);
  }
  await load();
});

$("refresh").addEventListener("click", load);

Console.init((me) => {
  clearInterval(B.tick);
  clearInterval(B.timer);
  $("lists").hidden = true;
  if (!me) return;
  $("file-section").hidden = me.role !== "analyst";  // admins approve; analysts file
  if (!Console.allowed(Console.PAGES["break-glass"])) {
    Sel.status("A key with role " + me.role + " may not use break glass (admins approve, " +
      "analysts file and export).");
    return;
  }
  load();
  B.tick = setInterval(countdown, 1000);
  // the lists again every 15 s, unless someone is typing a share (a new list would drop it)
  B.timer = setInterval(() => {
    const typing = [...document.querySelectorAll("textarea.share")].some((t) => t.value) ||
      $("lists").contains(document.activeElement);
    if (!typing) load();
  }, 15000);
});
