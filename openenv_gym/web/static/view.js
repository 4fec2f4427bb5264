// The view page: a summary, a sortable and filterable list of every episode, the selected
// episode as a chat, a group's episodes side by side, and a game's seats side by side.
// The list is drawn lazily: a spacer as tall as every row, and only the rows in sight (a pool of
// a few dozen elements, reused as the list scrolls), so 100,000 episodes scroll like 100.
// Episodes and searches come from the page's server, or from the blocks a file embeds.
(function () {
  "use strict";
  const OG = window.OG;
  const el = OG.el;
  const data = JSON.parse(document.getElementById("og-index").textContent);
  const C = data.columns;
  const n = C.reward.length;
  const ROW = 26;

  function column(values, make, missing) {
    const out = new make(n);
    for (let i = 0; i < n; i++) out[i] = values[i] === null || values[i] === undefined ? missing : values[i];
    return out;
  }
  const reward = column(C.reward, Float64Array, NaN);
  const adv = column(C.advantage, Float64Array, NaN);
  const turns = column(C.turns, Int32Array, 0);
  const errors = column(C.errors, Int32Array, 0);
  const group = column(C.group, Float64Array, NaN);
  const gep = column(C.group_episode, Float64Array, NaN);
  const envc = column(C.env, Int32Array, 0);
  const filec = column(C.file, Int32Array, 0);
  const term = column(C.terminated, Uint8Array, 0);
  const trunc = column(C.truncated, Uint8Array, 0);

  // -- where episodes and searches come from --------------------------------------------------
  function lines(id) {
    const text = document.getElementById(id).textContent;
    const starts = [0];
    for (let p = text.indexOf("\n"); p >= 0; p = text.indexOf("\n", p + 1)) starts.push(p + 1);
    starts.push(text.length + 1);
    return function (i) {
      return text.slice(starts[i], starts[i + 1] - 1);
    };
  }
  function normalize(q) {
    return q.replace(/\s+/g, " ").trim().toLowerCase();
  }
  function fileSource() {
    let record = null;
    let texts = null;
    return {
      episode: async function (i) {
        record = record || lines("og-records");
        const got = JSON.parse(record(i));
        if (got.record && typeof got.tools === "number") got.record.tools = data.tools[got.tools];
        return got;
      },
      search: async function (q) {
        if (!texts) {
          const line = lines("og-texts");
          texts = new Array(n);
          for (let i = 0; i < n; i++) texts[i] = JSON.parse(line(i)).toLowerCase();
        }
        const needle = normalize(q);
        const out = [];
        for (let i = 0; i < n; i++) if (texts[i].includes(needle)) out.push(i);
        return out;
      },
    };
  }
  async function getJSON(url) {
    const response = await fetch(url, { credentials: "omit", headers: OG.authHeaders() });
    const body = await response.json().catch(function () {
      return { error: "the server answered " + response.status };
    });
    if (!response.ok && !body.error) body.error = "the server answered " + response.status;
    return body;
  }
  function servedSource() {
    return {
      episode: function (i) {
        return getJSON("api/episode/" + i);
      },
      search: async function (q) {
        const got = await getJSON("api/search?q=" + encodeURIComponent(q));
        if (got.error) throw new Error(got.error);
        return got.matches;
      },
    };
  }
  const source = data.mode === "file" ? fileSource() : servedSource();

  // -- header, notes, summary ----------------------------------------------------------------
  document.getElementById("files").textContent = data.files.join(", ");
  if (data.title) document.title = data.title + " · openenv-gym view";
  if (data.notes.length) {
    const box = document.getElementById("notes");
    box.hidden = false;
    box.append(el("strong", null, data.skipped + (data.skipped === 1 ? " line skipped" : " lines skipped")));
    const ul = el("ul");
    for (const note of data.notes) ul.append(el("li", null, note));
    if (data.skipped > data.notes.length) ul.append(el("li", "muted", "and " + (data.skipped - data.notes.length) + " more"));
    box.append(ul);
  }

  function card(label, value, title) {
    const box = el("div", "card");
    box.append(el("div", "card-value", value), el("div", "card-label", label));
    if (title) box.title = title;
    return box;
  }
  function pct(x) {
    return typeof x === "number" ? (100 * x).toFixed(1) + " %" : "–";
  }
  function renderSummary() {
    const s = data.summary;
    const root = document.getElementById("summary");
    const cards = el("div", "cards");
    cards.append(card("episodes", s.episodes.toLocaleString("en-US")), card("mean reward", s.mean_reward === null ? "–" : OG.num(s.mean_reward)),
      card("reward > 0", pct(s.success)), card("terminated", s.terminated.toLocaleString("en-US")),
      card("truncated", s.truncated.toLocaleString("en-US")), card("with errors", s.with_errors.toLocaleString("en-US")));
    if (s.groups) {
      const k = s.groups.k;
      const sizes = s.groups.sizes.length > 1 ? "group sizes " + s.groups.sizes.join(", ") : "";
      cards.append(card("groups of " + k, s.groups.count.toLocaleString("en-US"), sizes),
        card("mean@" + k, OG.num(s.groups.mean_at_k)), card("pass@" + k, pct(s.groups.pass_at_k)));
    }
    const hist = el("div", "histogram");
    hist.append(el("div", "card-label", "reward histogram"));
    const bars = el("div", "bars");
    const top = Math.max(1, ...s.histogram.counts);
    s.histogram.labels.forEach(function (label, k) {
      const count = s.histogram.counts[k];
      const bar = el("div", "bar");
      const fill = el("div", "bar-fill");
      fill.style.height = Math.max(count ? 2 : 0, Math.round((100 * count) / top)) + "%";
      bar.append(el("div", "bar-count", count.toLocaleString("en-US")), fill, el("div", "bar-label", label));
      bar.title = "reward " + label + ": " + count + (count === 1 ? " episode" : " episodes");
      bars.append(bar);
    });
    hist.append(bars);
    const table = el("table", "envs");
    const head = el("tr");
    for (const h of ["env", "episodes", "mean reward", "reward > 0", "mean turns", "with errors", "terminated", "truncated"]) head.append(el("th", null, h));
    table.append(head);
    for (const e of s.envs) {
      const tr = el("tr");
      for (const v of [e.env || "(no id)", e.episodes.toLocaleString("en-US"), OG.num(e.mean_reward), pct(e.success), OG.num(e.mean_turns, 3),
        e.with_errors, e.terminated, e.truncated]) tr.append(el("td", null, v));
      table.append(tr);
    }
    root.append(cards, hist, table);
  }
  renderSummary();

  // -- the list ------------------------------------------------------------------------------
  function cmpNum(a, b) {
    // NaN (no value) sorts last whichever the direction.
    return a === b ? 0 : isNaN(a) ? 1 : isNaN(b) ? -1 : a < b ? -1 : 1;
  }
  function endText(i) {
    return term[i] ? "terminated" : trunc[i] ? "truncated" : "–";
  }
  // Every count on the page is written one way: 1,489.
  const count = (x) => x.toLocaleString("en-US");
  const COLS = [
    { key: "n", label: "#", text: (i) => count(i + 1), num: (i) => i },
    { key: "env", label: "env", text: (i) => data.envs[envc[i]], str: (i) => data.envs[envc[i]] },
    { key: "task", label: "task", text: (i) => C.task[i] + (C.seat && C.seat[i] !== null ? " · " + C.seat[i] : ""), str: (i) => C.task[i] },
    { key: "group", label: "group", text: (i) => (isNaN(group[i]) ? "" : group[i] + "/" + gep[i]), num: (i) => group[i] * 1e6 + gep[i] },
    { key: "advantage", label: "adv.", text: (i) => OG.signed(adv[i]), num: (i) => adv[i] },
    { key: "reward", label: "reward", text: (i) => OG.num(reward[i]), num: (i) => reward[i] },
    { key: "turns", label: "turns", text: (i) => count(turns[i]), num: (i) => turns[i] },
    { key: "errors", label: "errors", text: (i) => (errors[i] ? count(errors[i]) : ""), num: (i) => errors[i] },
    { key: "end", label: "end", text: endText, str: endText },
  ];
  const state = { sort: "n", desc: false, env: "", min: NaN, max: NaN, errors: "", end: "", group: null, text: "", matches: null };
  let order = new Int32Array(n).map((_, i) => i);
  let view = order;
  let selected = -1;

  const head = document.getElementById("list-head");
  for (const col of COLS) {
    const button = el("button", "cell c-" + col.key, col.label);
    button.type = "button";
    button.dataset.key = col.key;
    button.setAttribute("role", "columnheader");
    button.addEventListener("click", function () {
      state.desc = state.sort === col.key ? !state.desc : col.key === "reward" || col.key === "advantage" || col.key === "errors";
      state.sort = col.key;
      resort();
    });
    head.append(button);
  }
  function markSort() {
    for (const b of head.children) {
      const on = b.dataset.key === state.sort;
      b.setAttribute("aria-sort", on ? (state.desc ? "descending" : "ascending") : "none");
      b.classList.toggle("sorted", on);
      b.classList.toggle("desc", on && state.desc);
    }
  }
  function resort() {
    const col = COLS.find((c) => c.key === state.sort);
    const all = new Int32Array(n).map((_, i) => i);
    const sign = state.desc ? -1 : 1;
    if (col.num) {
      const key = new Float64Array(n);
      for (let i = 0; i < n; i++) key[i] = col.num(i);
      all.sort(function (a, b) {
        const na = isNaN(key[a]), nb = isNaN(key[b]);
        if (na || nb) return na === nb ? a - b : na ? 1 : -1;
        return sign * cmpNum(key[a], key[b]) || a - b;
      });
    } else {
      const key = new Array(n);
      for (let i = 0; i < n; i++) key[i] = col.str(i) || "";
      all.sort((a, b) => sign * (key[a] < key[b] ? -1 : key[a] > key[b] ? 1 : 0) || a - b);
    }
    order = all;
    markSort();
    refilter();
  }

  const envSelect = document.getElementById("f-env");
  data.envs.forEach(function (name, code) {
    const option = el("option", null, name || "(no id)");
    option.value = String(code);
    envSelect.append(option);
  });

  function passes(i) {
    if (state.env !== "" && envc[i] !== Number(state.env)) return false;
    if (!isNaN(state.min) && !(reward[i] >= state.min)) return false;
    if (!isNaN(state.max) && !(reward[i] <= state.max)) return false;
    if (state.errors === "yes" && !errors[i]) return false;
    if (state.errors === "no" && errors[i]) return false;
    if (state.end === "terminated" && !term[i]) return false;
    if (state.end === "truncated" && !trunc[i]) return false;
    if (state.end === "neither" && (term[i] || trunc[i])) return false;
    if (state.group && (group[i] !== state.group[0] || (state.group.length > 1 && gep[i] !== state.group[1]))) return false;
    if (state.matches && !state.matches[i]) return false;
    return true;
  }
  function refilter() {
    const out = new Int32Array(n);
    let m = 0;
    for (let k = 0; k < n; k++) if (passes(order[k])) out[m++] = order[k];
    view = out.subarray(0, m);
    countText();
    drawList(true);
  }
  function countText(extra) {
    const episodes = n === 1 ? " episode" : " episodes";
    document.getElementById("count").textContent =
      (view.length === n ? n.toLocaleString("en-US") + episodes : view.length.toLocaleString("en-US") + " of " + n.toLocaleString("en-US") + episodes) +
      (extra ? " · " + extra : "");
  }

  const list = document.getElementById("list");
  const spacer = document.getElementById("list-spacer");
  const pool = [];
  function makeRow() {
    const row = el("div", "row");
    row.setAttribute("role", "row");
    for (const col of COLS) row.append(el("span", "cell c-" + col.key));
    row.dataset.i = "-1";
    spacer.append(row);
    return row;
  }
  function fill(row, i) {
    const cells = row.children;
    for (let k = 0; k < COLS.length; k++) {
      const text = COLS[k].text(i);
      cells[k].textContent = text;
      cells[k].title = text;  // a cell cut short shows all of it on hover
    }
    row.dataset.i = String(i);
    row.classList.toggle("has-errors", errors[i] > 0);
    row.classList.toggle("good", reward[i] > 0);
  }
  let drawPending = false;
  let spacerHeight = "";
  function drawList(reset) {
    const height = view.length * ROW + "px";
    if (height !== spacerHeight) spacer.style.height = spacerHeight = height;
    const first = Math.max(0, Math.floor(list.scrollTop / ROW) - 8);
    const count = Math.ceil((list.clientHeight || 600) / ROW) + 16;
    while (pool.length < count) pool.push(makeRow());
    for (let k = 0; k < pool.length; k++) {
      const row = pool[k];
      const pos = first + k;
      if (pos >= view.length) {
        row.hidden = true;
        continue;
      }
      row.hidden = false;
      const i = view[pos];
      if (row._pos !== pos) {
        row.style.transform = "translateY(" + pos * ROW + "px)";
        row._pos = pos;
      }
      if (reset || row.dataset.i !== String(i)) fill(row, i);
      row.classList.toggle("selected", i === selected);
    }
  }
  list.addEventListener("scroll", function () {
    if (drawPending) return;
    drawPending = true;
    requestAnimationFrame(function () {
      drawPending = false;
      drawList(false);
    });
  }, { passive: true });
  window.addEventListener("resize", () => drawList(false));
  list.addEventListener("click", function (event) {
    const row = event.target.closest(".row");
    if (row && row.dataset.i !== "-1") select(Number(row.dataset.i));
  });
  list.addEventListener("keydown", function (event) {
    if (event.key !== "ArrowDown" && event.key !== "ArrowUp") return;
    event.preventDefault();
    const pos = view.indexOf(selected);
    const next = Math.min(view.length - 1, Math.max(0, pos + (event.key === "ArrowDown" ? 1 : -1)));
    if (view.length) {
      select(view[next]);
      const y = next * ROW;
      if (y < list.scrollTop) list.scrollTop = y;
      else if (y + ROW > list.scrollTop + list.clientHeight) list.scrollTop = y + ROW - list.clientHeight;
    }
  });

  // -- filters -------------------------------------------------------------------------------
  const form = document.getElementById("filters");
  form.addEventListener("submit", (event) => event.preventDefault());
  function readFilters() {
    state.env = envSelect.value;
    state.min = parseFloat(document.getElementById("f-min").value);
    state.max = parseFloat(document.getElementById("f-max").value);
    state.errors = document.getElementById("f-errors").value;
    state.end = document.getElementById("f-end").value;
    const g = document.getElementById("f-group").value.trim().split("/").filter((x) => x !== "").map(Number);
    state.group = g.length && g.every(Number.isFinite) ? g : null;
    refilter();
  }
  for (const id of ["f-env", "f-min", "f-max", "f-errors", "f-end", "f-group"]) {
    document.getElementById(id).addEventListener("input", readFilters);
  }
  let searchSeq = 0;
  let searchTimer = null;
  document.getElementById("f-text").addEventListener("input", function (event) {
    const q = event.target.value;
    clearTimeout(searchTimer);
    searchTimer = setTimeout(async function () {
      const seq = ++searchSeq;
      if (!normalize(q)) {
        state.matches = null;
        refilter();
        return;
      }
      countText("searching…");
      try {
        const found = await source.search(q);
        if (seq !== searchSeq) return;
        const mask = new Uint8Array(n);
        for (const i of found) mask[i] = 1;
        state.matches = mask;
        refilter();
      } catch (e) {
        countText("search failed: " + e.message);
      }
    }, 200);
  });

  // -- one episode, one group ----------------------------------------------------------------
  const detail = document.getElementById("detail");
  function facts(i, record, where) {
    const dl = el("dl", "facts");
    function add(k, v) {
      if (v === "" || v === null || v === undefined) return;
      dl.append(el("dt", null, k), el("dd", null, v));
    }
    add("env", data.envs[envc[i]] || "(no id)");
    add("task", C.task[i] + (C.task_id[i] && C.task_id[i] !== C.task[i] ? " (" + C.task_id[i] + ")" : ""));
    add("file", where);
    add("total reward", OG.num(reward[i]));
    add("turns", turns[i]);
    add("end", endText(i));
    if (!isNaN(group[i])) add("group", group[i] + "/" + gep[i] + (isNaN(adv[i]) ? "" : " · advantage " + OG.signed(adv[i])));
    if (C.seat && C.seat[i] !== null) add("seat", C.seat[i]);
    if (C.game && C.game[i] !== null) add("game", C.game[i]);
    if (record && record.seed !== null && record.seed !== undefined) add("seed", record.seed);
    return dl;
  }
  function errorList(record) {
    const box = el("div", "errors");
    box.append(el("strong", null, record.errors.length + (record.errors.length === 1 ? " error" : " errors") + " in this episode"));
    const ul = el("ul");
    for (const e of record.errors) ul.append(el("li", null, OG.errorText(e)));
    box.append(ul);
    return box;
  }
  function episodeBody(i, got, inGroup) {
    const box = el("div", "episode");
    const record = got.record;
    if (!inGroup) {
      const h = el("div", "episode-head");
      h.append(el("h2", null, "Episode " + count(i + 1)));
      if (!isNaN(group[i])) {
        const b = el("button", "group-button", "group " + group[i] + "/" + gep[i] + " side by side");
        b.type = "button";
        b.addEventListener("click", () => showGroup(i));
        h.append(b);
      }
      if (C.game && C.game[i] !== null) {
        const b = el("button", "game-button", "the game's seats side by side");
        b.type = "button";
        b.addEventListener("click", () => showGame(i));
        h.append(b);
      }
      box.append(h, facts(i, record, got.where));
    }
    if (got.error) {
      box.append(el("div", "errors", got.error));
      return box;
    }
    if (Array.isArray(record.errors) && record.errors.length) box.append(errorList(record));
    if (!inGroup && Array.isArray(record.tools) && record.tools.length) {
      const tools = el("details", "tools");
      tools.append(el("summary", null, record.tools.length + " tools offered: " +
        record.tools.map((t) => (t && t.function && t.function.name) || "?").join(", ")));
      tools.append(el("pre", "json", JSON.stringify(record.tools, null, 2)));
      box.append(tools);
    }
    box.append(OG.renderConversation(record));
    return box;
  }
  async function select(i) {
    selected = i;
    drawList(false);
    detail.replaceChildren(el("p", "muted", "loading episode " + (i + 1) + "…"));
    const got = await source.episode(i).catch((e) => ({ error: String(e.message || e) }));
    if (selected !== i) return;
    detail.replaceChildren(episodeBody(i, got, false));
    detail.scrollTop = 0;
    // The address names the episode (#episode-N): a link to it opens it (the query, a served
    // page's token, stays as it was).
    history.replaceState(null, "", location.pathname + location.search + "#episode-" + (i + 1));
  }
  const overlay = document.getElementById("group-view");
  // Episodes side by side in the overlay: a column each, headed by what tells them apart.
  function sideBySide(title, members, label) {
    const head = el("div", "overlay-head");
    const close = el("button", "close", "close");
    close.type = "button";
    close.addEventListener("click", hideGroup);
    head.append(el("h2", null, title), close);
    const cols = el("div", "group-columns");
    overlay.replaceChildren(head, cols);
    overlay.hidden = false;
    for (const k of members) {
      const col = el("div", "group-column");
      const top = el("div", "group-column-head");
      top.append(el("strong", null, label(k)), el("span", "badge" + (adv[k] > 0 ? " good" : adv[k] < 0 ? " bad" : ""), "advantage " + (OG.signed(adv[k]) || "–")),
        el("span", "badge", "reward " + OG.num(reward[k])), el("span", "muted small", turns[k] + " turns · " + endText(k)));
      col.append(top, el("p", "muted", "loading…"));
      cols.append(col);
      source.episode(k).catch((e) => ({ error: String(e.message || e) })).then(function (got) {
        col.replaceChildren(top, episodeBody(k, got, true));
      });
    }
    close.focus();
  }
  function showGroup(i) {
    const members = [];
    for (let k = 0; k < n; k++) if (filec[k] === filec[i] && group[k] === group[i] && gep[k] === gep[i]) members.push(k);
    sideBySide("Group " + group[i] + "/" + gep[i] + " · " + members.length + " episodes of task " + C.task[i], members,
      (k) => "episode " + (k + 1) + (C.seat && C.seat[k] !== null ? " · " + C.seat[k] : ""));
  }
  function showGame(i) {
    const members = [];
    for (let k = 0; k < n; k++) if (filec[k] === filec[i] && C.game[k] === C.game[i]) members.push(k);
    sideBySide("Game " + C.game[i] + " · " + members.length + " seats · task " + C.task[i], members, (k) => C.seat[k]);
  }
  function hideGroup() {
    overlay.hidden = true;
    overlay.replaceChildren();
  }
  document.addEventListener("keydown", function (event) {
    if (event.key === "Escape" && !overlay.hidden) hideGroup();
  });

  resort();
  const linked = /^#episode-(\d+)$/.exec(location.hash);
  if (linked && +linked[1] >= 1 && +linked[1] <= n) select(+linked[1] - 1);
  document.body.dataset.ready = "1";
  // For tests and the benchmark: what the list shows, and a synchronous redraw.
  OG.viewState = { shown: () => view.length, select: select, rows: n, draw: () => drawList(false) };
})();
