"use strict";
// One run, live: the report's history, then the run's Server-Sent Events stream. Charts are
// uPlot (vendored); every number shown comes from the REST reads and the stream, read with the
// tab's token (console.js); in token mode the stream opens with a short-lived ticket (EventSource
// sends no header).
(() => {
  const A = window.Actuator;
  const runId = document.body.dataset.run;
  const base = "/v1/runs/" + encodeURIComponent(runId);
  const $ = (id) => document.getElementById(id);
  // States a run never leaves (halted, finished): the page is then a record, not live, no actions.
  const finalStates = (document.body.dataset.finalStates || "").split(" ");
  let ended = finalStates.includes($("run-state").textContent);

  const raw = {};        // probe -> Map(step -> value)
  const filtered = {};   // probe -> Map(step -> filtered value the controller acted on)
  const setpoint = {};   // probe -> Map(step -> setpoint)
  const inForce = {};    // probe -> Map(step -> the setpoint in force on a controller's ramp)
  const threshold = {};  // probe -> number
  const knobs = {};      // knob -> Map(step -> value in effect)
  const bounds = {};     // knob -> [min, max]
  const eventSteps = new Set();  // steps of the audit events: the x range covers them
  const decided = new Map();  // decision number -> {step, knob}: the chart marks (the report's latest 1,000 and on)
  const rewinds = new Map();  // event id -> {step, to}: a rollback at step, back to the last healthy step "to"
  const listed = new Set();   // decision numbers in the table
  let explained = 0;     // decisions fetched in full (for the explain column) up to this number
  let lastEvent = 0;     // audit events listed up to this id
  const charts = {};     // chart key -> {plot, box, n, log}
  const logKnobs = new Set();  // knobs whose scale is "log"

  const put = (table, name, step, value) => {
    if (value === null || value === undefined || !Number.isFinite(value)) return;
    (table[name] = table[name] || new Map()).set(step, value);
  };

  // ---- charts -------------------------------------------------------------------------------
  function decisionMarks(knob) {
    return (u) => {
      const ctx = u.ctx;
      ctx.save();
      ctx.setLineDash([]);
      ctx.strokeStyle = "rgba(220,38,38,0.45)";
      ctx.lineWidth = 1;
      for (const d of decided.values()) {
        if (knob && d.knob !== knob) continue;
        const x = Math.round(u.valToPos(d.step, "x", true));
        if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
        ctx.beginPath();
        ctx.moveTo(x, u.bbox.top);
        ctx.lineTo(x, u.bbox.top + u.bbox.height);
        ctx.stroke();
      }
      ctx.restore();
      rewindMarks(u);
    };
  }

  // Rewinds on every chart: a purple line at the breach that ordered the rollback, and a band back
  // to the last step at which every guardrail held (the stretch undone). The chart's box lists what
  // it drew (data-rewinds: step, to, canvas x), for readers and tests.
  function rewindMarks(u) {
    const ctx = u.ctx, drawn = [];
    const left = u.bbox.left, right = u.bbox.left + u.bbox.width;
    ctx.save();
    for (const r of rewinds.values()) {
      const x = Math.round(u.valToPos(r.step, "x", true));
      if (x < left || x > right) continue;
      if (Number.isFinite(r.to)) {
        const x0 = Math.max(left, Math.round(u.valToPos(r.to, "x", true)));
        ctx.fillStyle = "rgba(124,58,237,0.12)";
        ctx.fillRect(x0, u.bbox.top, x - x0, u.bbox.height);
      }
      ctx.strokeStyle = "rgb(124,58,237)";
      ctx.lineWidth = 3;
      ctx.beginPath();
      ctx.moveTo(x, u.bbox.top);
      ctx.lineTo(x, u.bbox.top + u.bbox.height);
      ctx.stroke();
      drawn.push({ step: r.step, to: Number.isFinite(r.to) ? r.to : null, x });
    }
    ctx.restore();
    if (u.root.parentNode) u.root.parentNode.dataset.rewinds = JSON.stringify(drawn);
  }

  function aligned(maps) {
    const steps = new Set();
    for (const m of maps) if (m) for (const s of m.keys()) steps.add(s);
    const xs = [...steps].sort((a, b) => a - b);
    return [xs, ...maps.map((m) => xs.map((s) => (m && m.has(s) ? m.get(s) : null)))];
  }

  // The x range: every step with data, a decision or an audit event (a decision at the step after
  // the last observation is drawn, not cut off).
  function xRange(xs) {
    const steps = [...xs, ...[...decided.values()].map((d) => d.step), ...eventSteps];
    if (!steps.length) return [0, 1];
    const lo = Math.min(...steps), hi = Math.max(...steps);
    return lo === hi ? [lo - 1, hi + 1] : [lo, hi];
  }

  // The y range: the readings, and the lines near them (a setpoint, a guardrail threshold) that a
  // far one would squash flat; a line off the range is named in the chart's title instead.
  // ``fixed``: a knob's bounds, always inside the range.
  function yRange(values, lines, fixed, log) {
    const ok = (v) => Number.isFinite(v) && (!log || v > 0);
    const vs = values.filter(ok);
    const shown = [...vs, ...(fixed || []).filter(ok)];
    const off = [];
    if (vs.length) {
      const lo = Math.min(...vs), hi = Math.max(...vs);
      const reach = Math.max(hi - lo, Math.abs(hi), Math.abs(lo), 1e-12) * 3;
      for (const [label, v] of lines) {
        if (!ok(v)) continue;
        if (log ? (v <= hi * 1000 && v >= lo / 1000) : (v <= hi + reach && v >= lo - reach)) shown.push(v);
        else off.push(`${label} ${A.fmt(v)} ${v > hi ? "above" : "below"}`);
      }
    } else {
      for (const [, v] of lines) if (ok(v)) shown.push(v);
    }
    if (!shown.length) return { range: log ? [1e-6, 1] : [0, 1], off };
    const lo = Math.min(...shown), hi = Math.max(...shown);
    if (fixed && lo < hi) return { range: [lo, hi], off };  // a knob: its bounds are the frame
    if (log) return { range: lo === hi ? [lo / 2, hi * 2] : [lo / 1.1, hi * 1.1], off };
    const pad = lo === hi ? Math.max(Math.abs(hi) * 0.1, 1e-9) : (hi - lo) * 0.05;
    return { range: [lo - pad, hi + pad], off };
  }

  function chart(key, title, series, data, marks, log, y) {
    let c = charts[key];
    const caption = title + (y.off.length ? ` (off the chart: ${y.off.join(", ")})` : "");
    const show = (box) => {
      const x = xRange(data[0]);
      box.querySelector("h3").textContent = caption;
      Object.assign(box.dataset, { xMin: String(x[0]), xMax: String(x[1]), yMin: String(y.range[0]),
        yMax: String(y.range[1]) });
    };
    if (c && c.n === series.length && c.log === log) {
      c.y = y;
      show(c.box);
      c.plot.setData(data);
      return;
    }
    if (c) c.plot.destroy();  // a series was added (a guardrail threshold became known)
    const box = c ? c.box : A.el("div", { class: "chart", data: { chart: key } }, A.el("h3", {}, caption));
    if (!c) $("charts").append(box);
    show(box);
    const entry = { box, n: series.length, log, y };
    const plot = new window.uPlot({
      width: Math.max(360, box.clientWidth - 12), height: 200, series: [{ label: "step" }, ...series],
      scales: { x: { time: false, range: (u) => xRange(u.data[0]) },
        y: { ...(log ? { distr: 3 } : {}), range: () => entry.y.range } },
      legend: { live: true }, hooks: { draw: [marks] },
      axes: [{}, log ? { size: 60, values: (u, ticks) => ticks.map((v) => (v === null ? "" : v.toExponential(0))) } : { size: 60 }],
    }, data, box);
    entry.plot = plot;
    charts[key] = entry;
  }

  let drawPending = false;
  function redraw() {
    if (drawPending) return;
    drawPending = true;
    setTimeout(() => {
      drawPending = false;
      for (const probe of Object.keys(raw).sort()) {
        const thr = threshold[probe];
        const [xs, r, f, sp, ramp] = aligned([raw[probe], filtered[probe], setpoint[probe], inForce[probe]]);
        const data = [xs, r, f, sp];
        const series = [
          // one line through the probe's readings: steps where only the filtered value or the
          // setpoint is known are not gaps in it
          { label: probe + " (raw)", stroke: "#2563eb", width: 1, points: { show: true, size: 4 }, spanGaps: true },
          { label: "filtered", stroke: "#f59e0b", width: 2, spanGaps: true },
          // held until the next known value (an operator's change is a step)
          { label: "setpoint", stroke: "#111", dash: [6, 4], width: 1, spanGaps: true,
            paths: window.uPlot.paths.stepped({ align: 1 }) },
        ];
        const lines = sp.map((v) => ["setpoint", v]);
        if (inForce[probe]) {
          // the setpoint the law held on its ramp, where it differs from the final one
          data.push(ramp);
          series.push({ label: "setpoint in force (ramp)", stroke: "#7c3aed", dash: [3, 3], width: 1, spanGaps: true,
            points: { show: true, size: 3 } });
          lines.push(...ramp.map((v) => ["setpoint in force", v]));
        }
        if (thr !== undefined) {
          data.push(xs.map(() => thr));
          series.push({ label: "guardrail", stroke: "#dc2626", dash: [2, 3], width: 1 });
          lines.push(["guardrail", thr]);
        }
        const y = yRange([...r, ...f], lines.filter(([, v]) => v !== null), null, false);
        chart("probe:" + probe, probe, series, data, decisionMarks(null), false, y);
      }
      for (const knob of Object.keys(knobs).sort()) {
        // a multiplicative knob (log scale in the run's knobs) is drawn on a log axis
        const log = logKnobs.has(knob) && [...knobs[knob].values()].every((v) => v > 0);
        // the axis spans the values in effect and the knob's bounds, whatever uPlot would pick
        const y = yRange([...knobs[knob].values()], [], bounds[knob], log);
        chart("knob:" + knob, "knob " + knob + " (in effect)" + (log ? ", log axis" : ""),
          [{ label: knob, stroke: "#16a34a", width: 2, paths: window.uPlot.paths.stepped({ align: 1 }) }],
          aligned([knobs[knob]]), decisionMarks(knob), log, y);
      }
    }, 100);
  }

  // ---- tables -------------------------------------------------------------------------------
  function explain(d) {
    const i = d.inputs || {}, c = d.components || {};
    if (i.override) return "operator override" + (i.note ? ": " + i.note : "");
    const parts = [];
    if (i.probe !== undefined) parts.push(`${i.probe} raw ${A.fmt(i.raw)}, filtered ${A.fmt(i.filtered)}, setpoint ${A.fmt(i.setpoint)}`);
    // what the law compared instead: the projected reading, the setpoint in force on its ramp
    const law = [["projected", "projected"], ["setpoint_in_force", "setpoint in force (ramp)"]]
      .filter(([k]) => i[k] !== undefined && i[k] !== null).map(([k, label]) => `${label} ${A.fmt(i[k])}`);
    if (law.length) parts.push("the law acted on " + law.join(", "));
    // the terms' levels (the reason gives this decision's moves of them: ΔP, ΔI, ΔD)
    const pid = ["p", "i", "d"].filter((k) => c[k] !== undefined && c[k] !== null).map((k) => `${k.toUpperCase()} ${A.fmt(c[k])}`);
    if (pid.length) parts.push("levels after this decision: " + pid.join(" "));
    if (i.limited_by && i.limited_by.length) parts.push("limited by " + i.limited_by.join(", "));
    return parts.join(" · ") || (d.controller ? "controller " + d.controller : "guardrail");
  }

  function addDecision(d, full) {
    decided.set(d.number, { step: d.step, knob: d.knob });
    if (!listed.has(d.number)) {
      listed.add(d.number);
      const row = A.el("tr", { data: { number: String(d.number), seenAt: String(Date.now()) } },
        A.el("td", { class: "num" }, d.number), A.el("td", { class: "num" }, d.step), A.el("td", {}, d.knob),
        A.el("td", {}, `${A.fmt(d.old_value)} → ${A.fmt(d.new_value)}`), A.el("td", {}, d.reason),
        A.el("td", { class: "explain" }, full ? explain(d) : "…"));
      const body = document.querySelector("#decisions tbody");
      const after = [...body.rows].find((r) => Number(r.dataset.number) < d.number);
      body.insertBefore(row, after || null);
      while (body.rows.length > 500) body.deleteRow(-1);
      redraw();
    } else if (full) {
      const row = document.querySelector(`#decisions tr[data-number="${d.number}"] td.explain`);
      if (row) row.textContent = explain(d);
    }
    if (full) {
      const i = d.inputs || {};
      if (i.probe !== undefined) {
        // A controller's decision applies from the step after the observation it was computed
        // on: its inputs belong to that observation's step.
        put(filtered, i.probe, d.step - 1, i.filtered);
        put(setpoint, i.probe, d.step - 1, i.setpoint);
        put(inForce, i.probe, d.step - 1, i.setpoint_in_force);
      }
    }
  }

  function eventText(e) {
    const p = e.payload || {};
    return Object.entries(p).map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : A.fmt(v)}`).join(" ");
  }

  async function loadEvents() {
    for (let page = 0; page < 20; page++) {
      const r = await A.api("GET", `${base}/events?limit=1000&after=${lastEvent}`);
      if (!r.ok || !r.data.length) return;
      const body = document.querySelector("#events tbody");
      for (const e of r.data) {
        lastEvent = Math.max(lastEvent, e.id);
        if (Number.isFinite(e.step)) eventSteps.add(e.step);
        if (e.kind === "guardrail_breach" && (e.payload || {}).action === "rollback") {
          rewinds.set(e.id, { step: e.step, to: e.payload.healthy_step });
          if (Number.isFinite(e.payload.healthy_step)) eventSteps.add(e.payload.healthy_step);
        }
        body.prepend(A.el("tr", { class: e.kind.startsWith("guardrail") ? "guardrail" : "", data: { kind: e.kind } },
          A.el("td", { class: "num" }, e.id), A.el("td", { class: "num" }, e.step ?? "–"),
          A.el("td", {}, e.kind), A.el("td", {}, eventText(e))));
      }
      while (body.rows.length > 500) body.deleteRow(-1);
      redraw();
      if (r.data.length < 1000) return;
    }
  }

  async function loadDecisions() {
    for (let page = 0; page < 20; page++) {
      const r = await A.api("GET", `${base}/decisions?limit=1000&after=${explained}`);
      if (!r.ok || !r.data.items.length) break;
      for (const d of r.data.items) {
        addDecision(d, true);
        explained = Math.max(explained, d.number);
      }
      if (r.data.items.length < 1000) break;
    }
    redraw();
  }

  async function loadReport() {
    const r = await A.api("GET", base + "/report");
    if (!r.ok) return;
    const rep = r.data;
    for (const [k, pts] of Object.entries(rep.probes)) for (const [s, v] of pts) put(raw, k, s, v);
    for (const [k, pts] of Object.entries(rep.knobs)) for (const [s, v] of pts) put(knobs, k, s, v);
    for (const [k, v] of Object.entries(rep.thresholds)) threshold[k] = v;
    for (const d of rep.decisions) decided.set(d.number, { step: d.step, knob: d.knob });
    for (const [k, sp] of Object.entries(rep.setpoints)) {
      const first = raw[k] ? Math.min(...raw[k].keys()) : 0;
      if (typeof sp === "number") put(setpoint, k, first, sp);
      else if (Array.isArray(sp)) for (const [s, v] of sp) put(setpoint, k, s, v);
    }
  }

  function cell(v) { return A.el("td", {}, A.fmt(v)); }

  function showStream(text) {
    if (!ended) $("stream-state").textContent = text;
  }

  // What the budget's skipping cost each controller, counted: the readings of the probe the
  // service received, not a guess that there were none.
  function showStarved(names, readings, controllers) {
    const note = $("starved");
    note.hidden = !names.length;
    note.textContent = names.map((name) => {
      const n = (readings || {})[name];
      const users = Object.entries(controllers).filter(([, c]) => c.probe === name).map(([c]) => c);
      const got = n === undefined ? "" : n === 0 ? ": no reading of it reached the service"
        : `: the service received ${n} reading${n === 1 ? "" : "s"} of it`;
      const fed = users.length ? `, controller ${users.join(", ")} ${n === 0 ? "has none to act on" : "acts on " + (n === 1 ? "that one" : "those")}` : "";
      return `starved: ${name} skipped for the probe-time budget in the latest probe report${got}${fed}`;
    }).join("; ");
  }

  // The policy's rewind section as the agent reported it: which step's checkpoint keep-best keeps
  // and why, the rewinds, and what the saves cost (like probe time).
  function showKept(k, m) {
    const note = $("kept"), parts = [];
    m = m || {};
    const has = (v) => v !== null && v !== undefined;
    if (k) {
      const best = k.mode === "min" ? "lowest" : k.mode === "max" ? "highest" : "best";
      parts.push(`keep-best: step ${k.step} kept: ${k.probe || "the keep-best probe"} ${A.fmt(k.value)} there is ` +
        `the ${best} reading; ` + (k.loaded ? "loaded into the model at the end of training"
          : "kept on disk (the model is the last step's, or training goes on)"));
      note.dataset.step = String(k.step);
    }
    if (has(m["rewind.count"])) {
      parts.push(`${m["rewind.count"]} rewind${m["rewind.count"] === 1 ? "" : "s"} (the last at step ` +
        `${m["rewind.at_step"]}, back to the checkpoint of step ${m["rewind.to_step"]})`);
    }
    if (has(m["checkpoint.saves"])) {
      parts.push(`${m["checkpoint.saves"]} rewind/keep-best saves` +
        (has(m["checkpoint.save_seconds_total"]) ? `, ${A.fmt(m["checkpoint.save_seconds_total"])} s in all` : ""));
    }
    note.hidden = !parts.length;
    note.textContent = parts.join("; ");
  }

  async function loadState() {
    const r = await A.api("GET", base);
    if (!r.ok) return;
    const s = r.data;
    const state = $("run-state");
    state.textContent = s.state;
    state.className = "state state-" + s.state;
    ended = finalStates.includes(s.state);
    if (ended) $("stream-state").textContent = "ended";
    $("actions").hidden = ended;
    showStarved(s.starved || [], s.starved_readings, s.controllers);
    showKept(s.kept, s.latest_metrics);
    $("run-step").textContent = A.fmt(s.last_step);
    $("run-decisions").textContent = s.decisions;
    // Operator decisions (overrides) come with their own event kinds, not as "decision" events.
    if (s.decisions > explained) refreshDecisions();
    for (const [name, k] of Object.entries(s.knobs)) {
      if (k.scale === "log") logKnobs.add(name);
      bounds[name] = [k.min, k.max];
    }
    const ctl = document.querySelector("#controllers tbody");
    ctl.replaceChildren(...Object.entries(s.controllers).map(([name, c]) => {
      const knob = s.knobs[c.knob] || {};
      if (c.probe !== undefined && c.last_step !== undefined) {
        put(filtered, c.probe, c.last_step, c.filtered);
        put(setpoint, c.probe, c.last_step, c.setpoint);
        put(inForce, c.probe, c.last_step, (c.components || {}).setpoint_in_force);
      }
      // A reading older than the run's last step (controllers stop on a halt; a guardrail went on
      // reading): shown with its step, not as the current one.
      const stale = c.last_step !== undefined && s.last_step !== null && c.last_step < s.last_step;
      const at = (v) => A.el("td", stale ? { class: "stale" } : {}, A.fmt(v) + (stale ? ` (step ${c.last_step})` : ""));
      return A.el("tr", { data: { controller: name, stale: stale ? "1" : "" } }, A.el("td", {}, name), cell(c.probe),
        at(c.raw), at(c.filtered), cell(c.setpoint_override ?? c.setpoint), cell(c.knob), cell(knob.value),
        cell(s.knobs_in_effect[c.knob]));
    }));
    const gr = document.querySelector("#guardrails tbody");
    gr.replaceChildren(...Object.entries(s.guardrails).map(([name, g]) => {
      if (g.probe !== undefined && g.threshold !== undefined) threshold[g.probe] = g.threshold;
      return A.el("tr", { data: { guardrail: name } }, A.el("td", {}, name), cell(g.probe), cell(g.value),
        cell(g.threshold), cell(g.breaches), cell(g.fired ?? 0), cell(g.active ? "yes" : "no"));
    }));
    redraw();
  }

  // Several events in a burst need one read of each kind.
  function debounced(fn, ms) {
    let timer = null;
    return () => { if (timer === null) timer = setTimeout(() => { timer = null; fn(); }, ms); };
  }
  const refreshState = debounced(loadState, 200);
  const refreshDecisions = debounced(loadDecisions, 200);
  const refreshEvents = debounced(loadEvents, 200);
  // A gap event: the stream skipped events (trimmed away, or the live state lost its numbering and
  // what happened meanwhile is unknown to it). Everything shown is re-read from the durable REST
  // reads, so nothing the stream missed stays missing.
  let resyncs = 0;
  const resync = debounced(async () => {
    await loadReport();
    await loadState();
    await Promise.all([loadDecisions(), loadEvents()]);
    document.body.dataset.resyncs = String(++resyncs);
  }, 200);

  // ---- live stream --------------------------------------------------------------------------
  async function follow() {
    let url = base + "/stream";
    if (A.tokenMode()) {
      const t = await A.api("POST", base + "/stream/ticket");
      if (!t.ok) {
        showStream(`no live stream (${t.status})`);
        A.refused(t.status, A.errorText(t));
        return;
      }
      url += "?ticket=" + encodeURIComponent(t.data.ticket);
    }
    const source = new EventSource(url);
    source.addEventListener("open", () => { showStream("live"); document.body.dataset.stream = "open"; });
    source.addEventListener("error", () => {
      showStream("reconnecting");
      document.body.dataset.stream = "closed";
      // Refused on reconnecting (a ticket lasts a minute; a 503): EventSource gives up. Open a
      // new stream (a new ticket) and re-read what it may have missed.
      if (source.readyState === EventSource.CLOSED && !ended) {
        setTimeout(() => { follow(); resync(); }, 2000);
      }
    });
    source.addEventListener("observation", (m) => {
      const o = JSON.parse(m.data);
      for (const [k, v] of Object.entries(o.probes || {})) put(raw, k, o.step, v);
      for (const [k, v] of Object.entries(o.knobs || {})) put(knobs, k, o.step, v);
      redraw();
      refreshState();
    });
    source.addEventListener("decision", (m) => {
      addDecision(JSON.parse(m.data), false);
      refreshDecisions();
      refreshState();
    });
    // "acknowledged": the agent applied a decision, maybe with no newer observation: the knobs in
    // effect change with it.
    for (const kind of ["guardrail_breach", "guardrail_cleared", "state", "override", "override_released", "setpoint",
      "control_paused", "control_resumed", "policy_moved", "controller_unusable", "acknowledged"]) {
      source.addEventListener(kind, () => { refreshEvents(); refreshState(); });
    }
    source.addEventListener("gap", resync);
  }

  // ---- operator actions ---------------------------------------------------------------------
  async function act(label, method, path, body) {
    const status = $("action-status");
    status.className = "";
    status.textContent = label + "…";
    const r = await A.api(method, path, body);
    status.className = r.ok ? "ok" : "err";
    status.dataset.status = String(r.status);
    status.textContent = r.ok ? `${label}: done` : `${label} refused (${r.status}): ${A.errorText(r)}`;
    refreshState();
    refreshEvents();
  }
  // A number, or the text as typed: the service names the field of a bad value (422).
  const number = (text) => (text.trim() !== "" && Number.isFinite(Number(text)) ? Number(text) : text);

  function initActions() {
    for (const b of document.querySelectorAll("button[data-action]")) {
      b.addEventListener("click", () => act(b.dataset.action, "POST", `${base}/${b.dataset.action}`));
    }
    $("override-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const knob = $("override-knob").value;
      act(`override ${knob}`, "POST", `${base}/knobs/${encodeURIComponent(knob)}/override`,
        { value: number($("override-value").value) });
    });
    $("override-release").addEventListener("click", () => {
      const knob = $("override-knob").value;
      act(`release ${knob}`, "DELETE", `${base}/knobs/${encodeURIComponent(knob)}/override`);
    });
    $("setpoint-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const c = $("setpoint-controller").value;
      act(`setpoint of ${c}`, "PUT", `${base}/controllers/${encodeURIComponent(c)}/setpoint`,
        { setpoint: number($("setpoint-value").value) });
    });
  }

  async function start() {
    initActions();
    await loadReport();
    await loadState();
    // The table lists the latest 500 decisions (GET /v1/runs/{id}/decisions pages through all).
    explained = Math.max(0, Number($("run-decisions").textContent) - 500);
    await Promise.all([loadDecisions(), loadEvents()]);
    follow();
    document.body.dataset.ready = "1";
  }
  A.ready(start);
})();
