// Shared by the pages: the API key lives in this tab's sessionStorage only.
"use strict";

const Sel = {
  params: new URLSearchParams(window.location.search),
  key() { return sessionStorage.getItem("selectivity.key") || ""; },
  setKey(k) { sessionStorage.setItem("selectivity.key", k); },
  async api(method, path, body) {
    const opts = { method, headers: { Authorization: "Bearer " + Sel.key() } };
    if (body !== undefined) {
      opts.headers["Content-Type"] = "application/json";
      opts.body = JSON.stringify(body);
    }
    const r = await fetch(path, opts);
    const data = await r.json().catch(() => ({}));
    if (!r.ok) {
      throw new Error((data.error || r.status) + ": " + (data.detail || r.statusText));
    }
    return data;
  },
  el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  },
  status(msg) { document.getElementById("status").textContent = msg || ""; },
};
