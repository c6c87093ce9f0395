"use strict";
// Validate a pasted policy: YAML (or JSON) parsed here, checked by POST /v1/policies/validate.
window.Actuator.ready(() => {
  const A = window.Actuator;
  const form = document.getElementById("validate-form");
  const out = document.getElementById("validate-result");
  const say = (cls, ...nodes) => { out.className = cls; out.replaceChildren(...nodes); };
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    let doc;
    try {
      doc = window.jsyaml.load(document.getElementById("validate-text").value);
    } catch (e) {
      say("err", "not valid YAML: " + e.message);
      return;
    }
    if (doc === null || typeof doc !== "object" || Array.isArray(doc)) {
      say("err", "a policy document is a mapping (name:, controllers:, guardrails:)");
      return;
    }
    const r = await A.api("POST", "/v1/policies/validate", doc);
    if (!r.ok) { say("err", `refused (${r.status}): ${A.errorText(r)}`); return; }
    if (r.data.valid) { say("ok", "valid"); return; }
    say("err", "invalid:", A.el("ul", {}, ...r.data.errors.map((e) => A.el("li", {}, A.el("code", {}, e.loc), ": " + e.msg))));
  });
});
