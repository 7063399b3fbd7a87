// The console's shared part (every console*.html loads common.js, then this): sign in with an
// API key kept in this tab's sessionStorage only (as the annotation pages do), ask the server
// who the key is (GET /v1/whoami), say what its role may do, and hide the pages and sections
// it may not use (elements with data-roles="admin analyst"; admin may do everything).
"use strict";

const Console = {
  me: null,
  // what each role may do, in words (the API's require(...) of each router, service/api/)
  ROLES: {
    admin: [
      "read every stream: windows, count tables, models, the reference model's quality and " +
        "the privacy ledger",
      "approve unlock requests with a cold-store share, and close grants (break glass)",
      "read and verify the audit log",
      "create streams and API keys, force a roll (API)",
    ],
    analyst: [
      "read streams: windows, count tables and the privacy ledger",
      "file unlock requests, export under an open grant, close it (break glass)",
      "k-anonymise a data set (anonymise page)",
    ],
    model: [
      "read streams: windows, count tables, models, the reference model's quality and the " +
        "privacy ledger",
      "register models, featurize, read train sets and retrain events (API)",
    ],
    producer: [
      "read streams: windows, count tables and the privacy ledger",
      "ingest observations (API)",
    ],
    curator: [
      "read streams: windows, count tables and the privacy ledger",
      "create annotation queues and watch them (curate page)",
    ],
    annotator: [
      "read streams: windows, count tables and the privacy ledger",
      "label examples of an annotation queue (annotate page)",
    ],
  },
  // pages of the nav and the roles that may use them (absent: every role)
  PAGES: {
    "break-glass": ["analyst"],
    audit: [],
    annotate: ["annotator"],
    curate: ["curator"],
    anonymize: ["analyst"],
  },

  allowed(roles) {
    if (!Console.me) return false;
    if (Console.me.role === "admin") return true;
    return roles === undefined || roles.includes(Console.me.role);
  },

  // show or hide every element with data-roles, and the nav's links, for the signed-in role
  applyRoles() {
    for (const e of document.querySelectorAll("[data-roles]")) {
      const roles = e.dataset.roles.split(/\s+/).filter(Boolean);
      e.hidden = !Console.allowed(roles);
    }
    for (const a of document.querySelectorAll("nav.top a[data-page]")) {
      a.hidden = Console.me !== null && !Console.allowed(Console.PAGES[a.dataset.page]);
    }
  },

  render() {
    const who = document.getElementById("whoami");
    const may = document.getElementById("may");
    may.replaceChildren();
    if (!Console.me) {
      who.textContent = "Not signed in.";
    } else {
      const m = Console.me;
      who.textContent = "Signed in as " + (m.name || "(no name)") + " (key " + m.key_id +
        "), role " + m.role + ". This key may:";
      for (const s of Console.ROLES[m.role] || ["nothing this console knows of"]) {
        may.appendChild(Sel.el("li", s));
      }
    }
    document.getElementById("signout").hidden = !Console.me;
    Console.applyRoles();
  },

  async whoami() {
    try {
      Console.me = await Sel.api("GET", "/v1/whoami");
      Sel.status("");
    } catch (e) {
      Console.me = null;
      Sel.status(e.message);
    }
    Console.render();
    return Console.me;
  },

  // wire the sign-in form; onReady(me) runs after each successful sign-in
  init(onReady) {
    const form = document.getElementById("signin");
    const input = document.getElementById("key");
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      Sel.setKey(input.value.trim());
      input.value = "";
      if (await Console.whoami()) onReady(Console.me);
    });
    document.getElementById("signout").addEventListener("click", () => {
      sessionStorage.removeItem("selectivity.key");
      Console.me = null;
      Console.render();
      onReady(null);
    });
    Console.render();
    if (Sel.key()) {
      Console.whoami().then((me) => { if (me) onReady(me); });
    }
  },

  // -- formatting -------------------------------------------------------------------------

  // "2026-11-23 17:02:34 UTC"; "–" for null
  time(iso) {
    if (!iso) return "–";
    const d = new Date(iso);
    return d.toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
  },

  // "3 min ago" / "in 12 min"
  relative(iso, now) {
    if (!iso) return "";
    const s = Math.round((new Date(iso).getTime() - (now || Date.now())) / 1000);
    return s >= 0 ? "in " + Console.duration(s) : Console.duration(-s) + " ago";
  },

  duration(s) {
    s = Math.max(0, Math.floor(s));
    if (s < 60) return s + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s";
    if (s < 86400) return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
    return Math.floor(s / 86400) + " d " + Math.floor((s % 86400) / 3600) + " h";
  },

  num(x, digits) {
    if (x === null || x === undefined) return "–";
    if (typeof x !== "number") return String(x);
    if (x !== 0 && (Math.abs(x) < 1e-3 || Math.abs(x) >= 1e6)) return x.toExponential(2);
    return Number.isInteger(x) ? String(x) : x.toFixed(digits === undefined ? 3 : digits);
  },

  // a table: headers [text | [text, "num"]], rows of cells (text, number or a Node)
  table(headers, rows, caption) {
    const t = Sel.el("table", undefined, "grid");
    if (caption) t.appendChild(Sel.el("caption", caption, "muted"));
    const head = Sel.el("tr");
    for (const h of headers) {
      const [text, cls] = Array.isArray(h) ? h : [h, ""];
      const th = Sel.el("th", text, cls);
      th.scope = "col";
      head.appendChild(th);
    }
    const thead = Sel.el("thead");
    thead.appendChild(head);
    t.appendChild(thead);
    const body = Sel.el("tbody");
    for (const r of rows) {
      const tr = Sel.el("tr");
      r.forEach((c, i) => {
        const cls = Array.isArray(headers[i]) ? headers[i][1] : "";
        const td = Sel.el("td", undefined, cls);
        if (c instanceof Node) td.appendChild(c); else td.textContent = c === null || c === undefined ? "–" : String(c);
        tr.appendChild(td);
      });
      body.appendChild(tr);
    }
    t.appendChild(body);
    return t;
  },

  badge(text, cls) { return Sel.el("span", text, "badge " + (cls || text)); },
};
