// A conversation (an EpisodeRecord's messages) rendered as a chat, for both pages.
// Everything a record holds is put in the page as text (textContent, never innerHTML): a message
// holding markup shows its characters. Images are shown only from data: URLs (the page
// fetches nothing); any other URL is shown as text.
(function () {
  "use strict";
  const OG = (window.OG = window.OG || {});

  // The page's token, from the URL it was opened with (the printed one): sent with every request
  // to its server as a header, never kept in a cookie, which a browser would also send to every
  // other server on this host, whatever its port.
  OG.token = new URLSearchParams(location.search).get("token") || "";
  OG.authHeaders = function () {
    return OG.token ? { Authorization: "token " + OG.token } : {};
  };

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function num(x, digits) {
    if (typeof x !== "number" || !isFinite(x)) return x === null || x === undefined ? "" : String(x);
    const d = digits === undefined ? 4 : digits;
    return Number.isInteger(x) ? String(x) : String(Number(x.toPrecision(d)));
  }

  function signed(x) {
    if (typeof x !== "number" || !isFinite(x)) return "";
    return (x > 0 ? "+" : "") + num(x, 3);
  }

  // JSON arguments pretty-printed; a string that is not JSON is shown as it is, and said so.
  function prettyArgs(args) {
    if (typeof args === "string") {
      try {
        return { text: JSON.stringify(JSON.parse(args), null, 2), ok: true };
      } catch (e) {
        return { text: args, ok: false };
      }
    }
    if (args === undefined || args === null) return { text: "", ok: true };
    return { text: JSON.stringify(args, null, 2), ok: true };
  }

  const IMAGE = /^data:image\/(png|jpeg|gif|webp);base64,[A-Za-z0-9+/=]+$/;

  // Characters of one text drawn at first: a browser lays out a long unbroken run (a repeated
  // token, base64) in time that grows much faster than its length, so a megabyte of it froze the
  // page for minutes. The rest is one click away.
  const SHOWN = 20000;
  OG.SHOWN = SHOWN;
  function longText(tag, cls, text) {
    text = String(text);
    if (text.length <= SHOWN) return el(tag, cls, text);
    const box = el("div", "long");
    const node = el(tag, cls, text.slice(0, SHOWN));
    const more = el("button", "show-all", "show all " + text.length.toLocaleString("en-US") + " characters");
    more.type = "button";
    more.addEventListener("click", function () {
      node.textContent = text;
      more.remove();
    });
    box.append(node, more);
    return box;
  }
  OG.longText = longText;

  function contentNodes(content) {
    if (typeof content === "string") return [longText("div", "text", content)];
    if (!Array.isArray(content)) return content === null || content === undefined ? [] : [longText("pre", "json", JSON.stringify(content, null, 2))];
    return content.map(function (part) {
      if (part && typeof part.text === "string") return longText("div", "text", part.text);
      const image = part && part.image_url;
      const url = image && typeof image === "object" ? image.url : image;
      if (typeof url === "string") {
        if (IMAGE.test(url)) {
          const img = el("img", "image");
          img.alt = "image from the conversation";
          img.src = url;
          return img;
        }
        return el("div", "text muted", "[image not loaded: " + url.slice(0, 200) + "]");
      }
      return el("pre", "json", JSON.stringify(part, null, 2));
    });
  }

  function roleClass(role) {
    return "msg role-" + String(role).toLowerCase().replace(/[^a-z_]/g, "");
  }

  // Completion tokens coloured by logprob: green for likely, red for unlikely.
  function tokenView(ids, logprobs, texts) {
    const n = Math.max(Array.isArray(ids) ? ids.length : 0, Array.isArray(logprobs) ? logprobs.length : 0);
    const box = el("details", "tokens");
    box.append(el("summary", null, n + " completion tokens" + (Array.isArray(logprobs) ? ", coloured by logprob" : "")));
    const row = el("div", "token-row");
    for (let k = 0; k < n; k++) {
      const id = Array.isArray(ids) ? ids[k] : undefined;
      const lp = Array.isArray(logprobs) ? logprobs[k] : undefined;
      const label = texts && typeof texts[k] === "string" ? texts[k] : id === undefined ? "?" : String(id);
      const tok = el("span", "tok", label);
      if (typeof lp === "number" && isFinite(lp)) {
        const p = Math.exp(Math.min(0, lp));
        tok.style.backgroundColor = "hsl(" + Math.round(120 * p) + ", 70%, 82%)";
        tok.title = "id " + id + " · logprob " + lp.toFixed(3) + " · p " + p.toFixed(3);
      } else {
        tok.title = "id " + id + " · no logprob";
      }
      row.append(tok);
    }
    box.append(row);
    return box;
  }

  function at(list, k) {
    return Array.isArray(list) ? list[k] : undefined;
  }

  // opts.turnErrors: {turn: error} (play knows which step failed; a record lists errors per episode).
  function renderConversation(record, opts) {
    opts = opts || {};
    const root = el("div", "chat");
    const messages = Array.isArray(record.messages) ? record.messages : [];
    const rewards = Array.isArray(record.rewards) ? record.rewards : [];
    const callNames = {};
    let turn = -1;
    function endTurn() {
      if (turn < 0) return;
      const foot = el("div", "turn-end");
      const r = rewards[turn];
      foot.append(el("span", "badge reward" + (r > 0 ? " good" : ""), "turn " + (turn + 1) + " reward " + (r === undefined ? "–" : num(r))));
      const error = opts.turnErrors && opts.turnErrors[turn];
      if (error) foot.append(el("span", "badge error", errorText(error)));
      root.append(foot);
    }
    for (const m of messages) {
      if (!m || typeof m !== "object") {
        root.append(el("pre", "msg role-unknown", JSON.stringify(m)));
        continue;
      }
      const role = typeof m.role === "string" ? m.role : "unknown";
      if (role === "assistant") {
        endTurn();
        turn += 1;
      }
      const box = el("div", roleClass(role));
      const head = el("div", "msg-head");
      if (role === "tool") {
        const id = typeof m.tool_call_id === "string" ? m.tool_call_id : "";
        const name = typeof m.name === "string" ? m.name : callNames[id] || "";
        head.textContent = "tool result" + (name ? " · " + name : "") + (id ? " (" + id + ")" : "");
      } else {
        head.textContent = role + (role === "assistant" ? " · turn " + (turn + 1) : "");
      }
      box.append(head);
      for (const node of contentNodes(m.content)) box.append(node);
      if (Array.isArray(m.tool_calls)) {
        for (const call of m.tool_calls) box.append(callNode(call, callNames));
      }
      if (role === "assistant") {
        const ids = at(record.completion_token_ids, turn);
        const lps = at(record.logprobs, turn);
        const prompt = at(record.prompt_token_ids, turn);
        if (Array.isArray(prompt)) box.append(el("div", "muted small", "prompt: " + prompt.length + " tokens"));
        if (Array.isArray(ids) || Array.isArray(lps)) box.append(tokenView(ids, lps, at(opts.tokenTexts, turn)));
      }
      if (!box.querySelector(".text, .call, img, pre") && role !== "tool") box.append(el("div", "muted small", "(no content)"));
      root.append(box);
    }
    endTurn();
    return root;
  }

  function callNode(call, callNames) {
    const box = el("div", "call");
    const fn = call && typeof call === "object" ? call.function || {} : {};
    const name = typeof fn.name === "string" ? fn.name : "(no name)";
    const id = call && typeof call.id === "string" ? call.id : "";
    if (id) callNames[id] = name;
    const head = el("div", "call-head");
    head.append(el("span", "call-name", name), el("span", "muted small", id ? " (" + id + ")" : ""));
    box.append(head);
    const args = prettyArgs(fn.arguments);
    if (!args.ok) box.append(el("div", "badge error", "arguments are not valid JSON"));
    box.append(longText("pre", "args", args.text));
    return box;
  }

  function errorText(error) {
    if (error && typeof error === "object") {
      return (error.type ? error.type + ": " : "") + (error.message !== undefined ? error.message : JSON.stringify(error));
    }
    return String(error);
  }

  OG.el = el;
  OG.num = num;
  OG.signed = signed;
  OG.errorText = errorText;
  OG.prettyArgs = prettyArgs;
  OG.renderConversation = renderConversation;
})();
