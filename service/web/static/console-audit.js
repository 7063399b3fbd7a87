// The console's audit page (admins): the chain's verification and its head to note outside
// the database; the entries newest first, filtered by action and actor, page by page.
"use strict";

const A = { before: null, actions: new Set() };
const $ = (id) => document.getElementById(id);

async function verify() {
  const box = $("verdict");
  box.replaceChildren(Sel.el("p", "Verifying…", "muted"));
  const expect = $("expect").value.trim();
  try {
    const v = await Sel.api("GET", "/v1/admin/audit/verify" +
      (expect ? "?expect_head=" + encodeURIComponent(expect) : ""));
    box.replaceChildren();
    const head = v.head_seq + ":" + v.head_hash;
    const verdict = Sel.el("p", undefined, "big");
    verdict.id = "verdict-text";
    if (v.ok) {
      verdict.appendChild(Console.badge("intact", "ok"));
      verdict.appendChild(document.createTextNode(" The chain is intact: " + v.entries +
        " entries, and it matches the anchor" + (expect ? " and the expected head" : "") +
        "."));
    } else {
      verdict.appendChild(Console.badge("FAILED", "bad"));
      verdict.appendChild(document.createTextNode(" " + (v.first_bad_seq
        ? "Entry " + v.first_bad_seq + ": " : "") + v.problem + " The chain checks out up " +
        "to entry " + v.head_seq + "."));
    }
    box.appendChild(verdict);
    const p = Sel.el("p", "Head to note outside the database: ");
    const code = Sel.el("code", head);
    code.id = "head";
    p.appendChild(code);
    box.appendChild(p);
    const rows = [
      ["keyed (HMAC-SHA256) from entry", v.keyed_from],
      ["audit key id", v.key_id],
      ["anchor", v.anchor ? "entry " + v.anchor.seq + ", hash " + v.anchor.hash : "none"],
    ];
    box.appendChild(Console.table(["", "Value"], rows));
    for (const n of v.notes) box.appendChild(Sel.el("p", n, "muted"));
    Sel.status("");
  } catch (e) {
    box.replaceChildren();
    Sel.status(e.message);
  }
}

async function entries(more) {
  const q = new URLSearchParams({ limit: "50" });
  const action = $("action").value.trim();
  const actor = $("actor").value.trim();
  if (action) q.set("action", action);
  if (actor) q.set("actor", actor);
  if (more && A.before) q.set("before", String(A.before));
  try {
    const page = await Sel.api("GET", "/v1/admin/audit/recent?" + q.toString());
    const rows = page.entries.map((e) => {
      A.actions.add(e.action);
      const detail = Sel.el("code", Object.keys(e.detail).length ? JSON.stringify(e.detail) : "");
      return [e.seq, Console.time(e.ts), e.actor, e.action, e.target, detail];
    });
    const t = Console.table([["Seq", "num"], ["Time", "nowrap"], "Actor", "Action", "Target", "Detail"],
      rows, rows.length ? undefined : "no entry matches");
    if (more) {
      $("entries").querySelector("tbody").append(...t.querySelector("tbody").children);
    } else {
      $("entries").replaceChildren(t);
    }
    A.before = page.next_before;
    $("older").hidden = page.next_before === null;
    const list = $("actions");
    list.replaceChildren();
    for (const a of [...A.actions].sort()) {
      const o = document.createElement("option");
      o.value = a;
      list.appendChild(o);
    }
    Sel.status("");
  } catch (e) {
    Sel.status(e.message);
  }
}

$("verify-form").addEventListener("submit", (ev) => { ev.preventDefault(); verify(); });
$("filter").addEventListener("submit", (ev) => { ev.preventDefault(); entries(false); });
$("clear").addEventListener("click", () => {
  $("action").value = "";
  $("actor").value = "";
  entries(false);
});
$("older").addEventListener("click", () => entries(true));

Console.init((me) => {
  if (!me) return;
  if (me.role !== "admin") {
    Sel.status("The audit log is for admins; a key with role " + me.role + " may not read it.");
    return;
  }
  verify();
  entries(false);
});
