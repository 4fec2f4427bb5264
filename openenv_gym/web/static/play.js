// The play page: the episode as the agent sees it, the env's tools as forms built from their
// JSON schemas, a text reply, a new episode by seed or by split and index, and Save.
// Each action waits for the env's answer without freezing the page (a ticker shows how long);
// the page holds a WebSocket to its server so the server knows when the last page has gone.
(function () {
  "use strict";
  const OG = window.OG;
  const el = OG.el;
  const boot = JSON.parse(document.getElementById("og-boot").textContent);
  const $ = (id) => document.getElementById(id);
  let state = null;
  let busy = false;
  let toolsKey = null;
  let leaving = false;
  let callCount = 0;  // tool calls made from this page: each gets its own id

  $("env-id").textContent = boot.env_id;
  document.title = boot.env_id + " · openenv-gym play";

  async function call(method, path, body) {
    const options = { method: method, credentials: "omit", headers: OG.authHeaders() };
    if (body !== undefined) {
      options.headers["Content-Type"] = "application/json";
      options.body = JSON.stringify(body);
    }
    const response = await fetch(path, options);
    try {
      return await response.json();
    } catch (e) {
      return { error: "the server answered " + response.status };
    }
  }

  function banner(text) {
    const box = $("banner");
    box.hidden = !text;
    box.textContent = text || "";
  }

  // Whether the episode on the page has ended: its tools and reply then wait for a new episode.
  function ended() {
    const r = state && state.record;
    return !!(r && (r.terminated || r.truncated));
  }
  function isStepButton(b) {
    return !!b.closest("#tools, #reply");
  }

  let ticker = null;
  function setBusy(on) {
    busy = on;
    for (const b of document.querySelectorAll("button")) b.disabled = on || (ended() && isStepButton(b));
    clearInterval(ticker);
    if (on) {
      const start = Date.now();
      const show = () => renderStatus("waiting for the env… " + ((Date.now() - start) / 1000).toFixed(0) + " s");
      show();
      ticker = setInterval(show, 500);
    } else {
      renderStatus();
    }
  }

  async function act(path, body) {
    if (busy) return;
    setBusy(true);
    let got;
    try {
      got = await call("POST", path, body);
    } catch (e) {
      got = { error: "no answer from the server (" + e.message + ")" };
    }
    setBusy(false);
    if (got.env_id) render(got);
    banner(got.error || "");
  }

  // -- rendering -------------------------------------------------------------------------------
  function render(s) {
    state = s;
    const split = $("r-split");
    if (split.options.length === 1) {
      for (const sp of s.splits) {
        const option = el("option", null, sp.name + (sp.num_tasks === null ? "" : " (" + sp.num_tasks + " tasks)"));
        option.value = sp.name;
        split.append(option);
      }
    }
    const chat = $("chat");
    chat.replaceChildren();
    if (s.record) {
      const turnErrors = {};
      for (const k of Object.keys(s.turn_errors)) turnErrors[Number(k)] = s.turn_errors[k];
      chat.append(OG.renderConversation(s.record, { turnErrors: turnErrors }));
      chat.scrollTop = chat.scrollHeight;
    }
    const tools = (s.record && s.record.tools) || [];
    const key = JSON.stringify(tools);
    if (key !== toolsKey) {
      toolsKey = key;
      $("tools").replaceChildren(...tools.map(toolForm));
      if (!tools.length) $("tools").append(el("p", "muted", "This env offers no tools: reply with text."));
    }
    $("saved").textContent = s.saved.count ? "saved " + s.saved.count + (s.saved.count === 1 ? " episode" : " episodes") + " to " + s.saved.path : "appends to " + s.saved.path;
    for (const b of document.querySelectorAll("button")) b.disabled = busy || (ended() && isStepButton(b));
    renderStatus();
  }

  function renderStatus(waiting) {
    const bar = $("status");
    bar.replaceChildren();
    const s = state;
    if (!s) return;
    const r = s.record;
    if (r) {
      const task = r.split !== null && r.index !== null ? r.split + "/" + r.index : r.task_id || "explicit task";
      bar.append(el("span", null, "task " + task + (r.task_id && r.task_id !== task ? " (" + r.task_id + ")" : "")));
      if (r.seed !== null) bar.append(el("span", "muted", "seed " + r.seed));
      bar.append(el("span", null, "turn " + r.rewards.length), el("span", "badge", "total reward " + OG.num(r.total_reward)));
      if (s.last) bar.append(el("span", "badge" + (s.last.reward > 0 ? " good" : ""), "last reward " + OG.num(s.last.reward)));
      if (r.terminated) bar.append(el("span", "ended", "episode ended: terminated"));
      else if (r.truncated) bar.append(el("span", "truncated", "episode ended: truncated"));
      if (r.terminated || r.truncated) bar.append(el("span", "muted", "New episode starts another"));
      if (s.last && s.last.error) bar.append(el("span", "badge error", OG.errorText(s.last.error)));
    }
    if (s.problem) bar.append(el("span", "badge error", s.problem + " (start a new episode)"));
    if (waiting) bar.append(el("span", "busy", waiting));
  }

  // -- tools as forms --------------------------------------------------------------------------
  function typeOf(schema) {
    if (!schema || typeof schema !== "object") return "json";
    if (Array.isArray(schema.enum)) return "enum";
    let t = schema.type;
    if (Array.isArray(t)) t = t.find((x) => x !== "null");
    if (!t && Array.isArray(schema.anyOf)) {
      const alt = schema.anyOf.find((a) => a && a.type && a.type !== "null");
      if (alt) return typeOf(alt);
    }
    return ["string", "integer", "number", "boolean"].includes(t) ? t : "json";
  }

  function field(name, schema, required) {
    const type = typeOf(schema);
    const box = el("label", "field");
    const title = el("span", null, name);
    if (required) title.append(el("span", "req", " *"));
    title.append(el("span", "muted", " " + type));
    box.append(title);
    let input;
    if (type === "enum" || type === "boolean") {
      input = el("select");
      const values = type === "enum" ? schema.enum : [true, false];
      if (!required) input.append(el("option", null, "(leave out)"));
      for (const v of values) input.append(el("option", null, JSON.stringify(v)));
      if (!required) input.options[0].value = "";
    } else if (type === "json") {
      input = el("textarea");
      input.placeholder = "JSON";
    } else {
      input = el("input");
      input.type = type === "string" ? "text" : "number";
      if (type === "integer") input.step = "1";
      if (type === "number") input.step = "any";
    }
    input.name = name;
    box.append(input);
    if (schema && typeof schema.description === "string") box.append(el("span", "muted small", schema.description));
    const problem = el("span", "field-error");
    box.append(problem);
    function read() {
      problem.textContent = "";
      const raw = input.value;
      if (raw === "" && !(type === "string" && required)) {
        if (required) problem.textContent = "required";
        return { ok: !required, omit: true };
      }
      if (type === "string") return { ok: true, value: raw };
      if (type === "integer" || type === "number") {
        const v = Number(raw);
        if (!Number.isFinite(v) || (type === "integer" && !Number.isInteger(v))) {
          problem.textContent = "not " + (type === "integer" ? "an integer" : "a number");
          return { ok: false };
        }
        return { ok: true, value: v };
      }
      try {
        return { ok: true, value: JSON.parse(raw) };
      } catch (e) {
        problem.textContent = "not valid JSON";
        return { ok: false };
      }
    }
    return { node: box, read: read };
  }

  function toolForm(tool) {
    const fn = (tool && tool.function) || tool || {};
    const name = typeof fn.name === "string" ? fn.name : "?";
    const params = fn.parameters && typeof fn.parameters === "object" ? fn.parameters : {};
    const form = el("form", "tool-form");
    form.dataset.tool = name;
    form.noValidate = true; // the fields say what is wrong themselves (the browser's check would block the submit)
    form.append(el("strong", "call-name", name));
    if (typeof fn.description === "string") form.append(el("div", "tool-desc", fn.description));
    const required = Array.isArray(params.required) ? params.required : [];
    const props = params.properties && typeof params.properties === "object" ? params.properties : {};
    const fields = Object.keys(props).map((key) => [key, field(key, props[key], required.includes(key))]);
    const raw = fields.length || params.type === "object" ? null : field("arguments", {}, false);
    for (const [, f] of fields) form.append(f.node);
    if (raw) form.append(raw.node);
    const submit = el("button", "primary", "Call " + name);
    submit.type = "submit";
    form.append(submit);
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      let args = {};
      let ok = true;
      if (raw) {
        const got = raw.read();
        ok = got.ok;
        args = got.omit ? {} : got.value;
      }
      for (const [key, f] of fields) {
        const got = f.read();
        ok = ok && got.ok;
        if (got.ok && !got.omit) args[key] = got.value;
      }
      if (!ok) return;
      // An id of its own per call: a record's calls and their answers pair up without doubt.
      callCount += 1;
      const id = "call_" + callCount;
      act("api/step", { action: { role: "assistant", content: null, tool_calls: [{ id: id, type: "function", function: { name: name, arguments: JSON.stringify(args) } }] } });
    });
    return form;
  }

  // -- controls --------------------------------------------------------------------------------
  $("reply").addEventListener("submit", function (event) {
    event.preventDefault();
    const text = $("reply-text").value;
    act("api/step", { action: text }).then(() => {
      if (!$("banner").textContent) $("reply-text").value = "";
    });
  });
  $("reset").addEventListener("submit", function (event) {
    event.preventDefault();
    const body = {};
    const seed = $("r-seed").value.trim();
    const split = $("r-split").value;
    const index = $("r-index").value.trim();
    if (seed !== "") body.seed = Number(seed);
    if (split !== "") body.split = split;
    if (index !== "") body.index = Number(index);
    for (const k of ["seed", "index"]) {
      if (k in body && !Number.isInteger(body[k])) return banner(k + " must be an integer");
    }
    act("api/reset", body);
  });
  $("save").addEventListener("click", () => act("api/save", {}));

  function connect() {
    // A WebSocket takes no headers: its token goes in its own URL, which no address bar shows.
    const ws = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/api/live?token=" +
                             encodeURIComponent(OG.token));
    ws.addEventListener("close", function () {
      if (!leaving) banner("The server has stopped: run openenv-gym play again to go on.");
    });
  }
  window.addEventListener("beforeunload", () => (leaving = true));

  call("GET", "api/state").then(function (s) {
    render(s);
    banner(s.error || "");
    connect();
    document.body.dataset.ready = "1";
  }, (e) => banner("no answer from the server (" + e.message + ")"));
})();
