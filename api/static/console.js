"use strict";
// Shared by every console page: the admin token (kept in this tab's sessionStorage only, never
// in a URL or a cookie), a fetch helper for the REST API, and the runs list's live refresh.
window.Actuator = (() => {
  const KEY = "actuator.adminToken";
  const token = () => sessionStorage.getItem(KEY);

  async function api(method, path, body) {
    const headers = { Accept: "application/json" };
    const t = token();
    if (t) headers.Authorization = "Bearer " + t;
    const init = { method, headers, cache: "no-store", credentials: "omit" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const resp = await fetch(path, init);
    let data = null;
    try { data = await resp.json(); } catch (e) { data = null; }
    return { ok: resp.ok, status: resp.status, data };
  }

  // The service's error envelope: {"detail": {"message": ..., "errors": [...]}}
  function errorText(r) {
    const d = r.data && r.data.detail;
    if (d && typeof d === "object") return d.message || JSON.stringify(d.errors || d);
    return typeof d === "string" ? d : "HTTP " + r.status;
  }

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (k === "class") node.className = v;
      else if (k === "data") Object.assign(node.dataset, v);
      else node.setAttribute(k, v);
    }
    for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return node;
  }

  const fmt = (v) => (v === null || v === undefined ? "–" : typeof v === "number" ? Number(v.toPrecision(4)).toString() : String(v));

  function showToken() {
    const state = document.getElementById("token-state");
    if (state) state.textContent = token() ? "token set (this tab)" : "no token: read only";
  }

  function initToken() {
    const form = document.getElementById("token-form");
    if (!form) return;
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const input = document.getElementById("admin-token");
      if (input.value) sessionStorage.setItem(KEY, input.value);
      input.value = "";
      showToken();
    });
    document.getElementById("token-forget").addEventListener("click", () => {
      sessionStorage.removeItem(KEY);
      showToken();
    });
    showToken();
  }

  // The runs list: the server renders the rows; refresh them in place every 2 s.
  function initRuns() {
    const refresh = async () => {
      try {
        const resp = await fetch(location.pathname + location.search, { headers: { Accept: "text/html" }, cache: "no-store" });
        if (!resp.ok) return;
        const doc = new DOMParser().parseFromString(await resp.text(), "text/html");
        const fresh = doc.querySelector("#runs tbody");
        const old = document.querySelector("#runs tbody");
        if (fresh && old) old.replaceWith(document.importNode(fresh, true));
      } catch (e) { /* the service is away: try again at the next tick */ }
    };
    setInterval(refresh, 2000);
  }

  document.addEventListener("DOMContentLoaded", () => {
    initToken();
    if (document.body.dataset.page === "runs") initRuns();
  });
  return { api, errorText, el, fmt, token };
})();
