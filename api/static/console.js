"use strict";
// Shared by every console page: the token (kept in this tab's sessionStorage only, never in a URL
// or a cookie) sent with every request, a fetch helper for the REST API, the runs list's live
// refresh, and in token mode the page itself: a browser sends no header when it navigates, so the
// service answers a page asked for without a token with the locked page (no data); this asks for
// the same page again with the tab's token and puts it in place.
window.Actuator = (() => {
  const KEY = "actuator.adminToken";
  const token = () => sessionStorage.getItem(KEY);
  const withToken = (headers) => {
    const t = token();
    if (t) headers.Authorization = "Bearer " + t;
    return headers;
  };
  const tokenMode = () => document.body.dataset.auth === "token";

  // A read refused (401: no token or one the service does not know; 403: a token that does not
  // grant it, e.g. a run's token on another run): said at the top of the page.
  function refused(status, message) {
    const note = document.getElementById("auth-message");
    if (!note) return;
    const what = status === 401 ? (token() ? "The service did not accept this tab's token" : "This service needs a token to read")
      : "This tab's token does not grant this";
    note.dataset.status = String(status);
    note.textContent = `${what} (${status}): ${message}`;
    note.hidden = false;
  }

  async function api(method, path, body) {
    const headers = withToken({ Accept: "application/json" });
    const init = { method, headers, cache: "no-store", credentials: "omit" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const resp = await fetch(path, init);
    let data = null;
    try { data = await resp.json(); } catch (e) { data = null; }
    const r = { ok: resp.ok, status: resp.status, data };
    if ((r.status === 401 || r.status === 403) && method === "GET") refused(r.status, errorText(r));
    return r;
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
    if (state) {
      state.textContent = token() ? "token set (this tab)"
        : tokenMode() ? "no token: type a viewer or admin token" : "no token: read only";
    }
  }

  function initToken() {
    const form = document.getElementById("token-form");
    if (!form) return;
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const input = document.getElementById("admin-token");
      if (input.value) sessionStorage.setItem(KEY, input.value);
      input.value = "";
      document.getElementById("auth-message").hidden = true;
      showToken();
      if (document.body.dataset.page === "locked") unlock();
    });
    document.getElementById("token-forget").addEventListener("click", () => {
      sessionStorage.removeItem(KEY);
      showToken();
    });
    showToken();
  }

  // The page's own scripts start once the page is in place: at DOMContentLoaded, or once the
  // locked page has been replaced by the real one.
  const waiting = [];
  let isReady = false;
  function ready(fn) {
    if (isReady) fn(); else waiting.push(fn);
  }
  function start(swapped) {
    if (swapped !== true) initToken();
    if (document.body.dataset.page === "runs") initRuns();
    if (document.body.dataset.page === "locked") {
      if (token()) unlock();
      return;
    }
    isReady = true;
    for (const fn of waiting.splice(0)) fn();
  }

  function loadScript(src) {
    return new Promise((resolve, reject) => {
      const s = document.createElement("script");
      s.src = src;
      s.onload = resolve;
      s.onerror = () => reject(new Error("could not load " + src));
      document.head.append(s);
    });
  }

  // Token mode: the page again, with the tab's token; in place of the locked one.
  let unlocking = false;
  async function unlock() {
    if (unlocking) return;
    unlocking = true;
    const msg = document.getElementById("locked-message");
    try {
      if (msg) msg.textContent = "reading with this tab's token…";
      const resp = await fetch(location.pathname + location.search,
        { headers: withToken({ Accept: "text/html" }), cache: "no-store", credentials: "omit" });
      const doc = new DOMParser().parseFromString(await resp.text(), "text/html");
      if (doc.body.dataset.page === "locked" || !resp.ok && !doc.body.dataset.page) {
        const why = doc.getElementById("locked-message");
        const text = why ? why.textContent : "HTTP " + resp.status;
        if (msg) { msg.textContent = text; msg.dataset.status = String(resp.status); }
        refused(resp.status, text);
        return;
      }
      document.title = doc.title;
      for (const link of doc.head.querySelectorAll('link[rel="stylesheet"]')) {
        const href = link.getAttribute("href");
        if (![...document.querySelectorAll('link[rel="stylesheet"]')].some((l) => l.getAttribute("href") === href)) {
          document.head.append(document.importNode(link, true));
        }
      }
      document.body.replaceWith(document.importNode(doc.body, true));
      initToken();  // at once: the new token form must never submit on its own
      const loaded = new Set([...document.scripts].map((s) => s.getAttribute("src")));
      for (const s of doc.head.querySelectorAll("script[src]")) {
        const src = s.getAttribute("src");
        if (!loaded.has(src)) await loadScript(src);
      }
      start(true);
    } catch (e) {
      if (msg) msg.textContent = "the service could not be reached: " + e.message;
    } finally {
      unlocking = false;
    }
  }

  // The runs list: the server renders the rows; refresh them in place every 2 s.
  function initRuns() {
    const refresh = async () => {
      try {
        const resp = await fetch(location.pathname + location.search,
          { headers: withToken({ Accept: "text/html" }), cache: "no-store", credentials: "omit" });
        if (resp.status === 401 || resp.status === 403) {
          const doc = new DOMParser().parseFromString(await resp.text(), "text/html");
          const why = doc.getElementById("locked-message");
          refused(resp.status, why ? why.textContent : "HTTP " + resp.status);
          return;
        }
        if (!resp.ok) return;
        const doc = new DOMParser().parseFromString(await resp.text(), "text/html");
        const fresh = doc.querySelector("#runs tbody");
        const old = document.querySelector("#runs tbody");
        if (fresh && old) old.replaceWith(document.importNode(fresh, true));
      } catch (e) { /* the service is away: try again at the next tick */ }
    };
    setInterval(refresh, 2000);
  }

  document.addEventListener("DOMContentLoaded", start);
  return { api, errorText, el, fmt, token, tokenMode, ready, refused };
})();
