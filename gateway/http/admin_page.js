"use strict";
// One static page, no build step and nothing fetched but the gateway's own JSON API: it
// must work on a host without internet access. Rates and charts come from the counters
// of successive polls of /admin/api/state, after what the gateway itself sampled before
// the page opened (/admin/api/history), so the charts are full from the first paint.
const REFRESH_MS = 1000;
const HISTORY_S = 1800;       // the charts' window: the last half hour at most,
const MIN_SPAN_S = 60;        // and at least one (it grows as the page polls)
const COLS = 13;              // columns of a queue table
const SVG = "http://www.w3.org/2000/svg";
let current = null;           // the last state polled
let counted = null;           // {time, counters} of that poll, for the next rates
let firstPoll = null;         // the time of the page's first poll
const history = new Map();    // chart key -> [{t, in, acked}] per poll, oldest first
const peeks = new Map();      // "topic\u0000group\u0000state" -> messages shown under the row

// -- small DOM helpers -------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("data-") || k.startsWith("aria-") || k === "role") node.setAttribute(k, v);
    else if (k === "onclick") node.addEventListener("click", v);
    else node[k] = v;
  }
  for (const child of children) node.append(child instanceof Node ? child : String(child));
  return node;
}

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const child of children) node.append(child instanceof Node ? child : String(child));
  return node;
}

function fmt(r) {
  if (r === 0) return "0";
  return r >= 10 ? Math.round(r).toString() : r.toFixed(1);
}

function topicHref(name) {
  return "#topic=" + encodeURIComponent(name);
}

function viewedTopic() {
  const m = /^#topic=(.*)$/.exec(location.hash);
  return m === null ? null : decodeURIComponent(m[1]);
}

// -- rates and their history -------------------------------------------------------------

function topicKey(topic) { return JSON.stringify(["topic", topic]); }
function groupKey(topic, group) { return JSON.stringify(["group", topic, group]); }

function counters(state) {
  const out = new Map();
  for (const t of state.topics) {
    let acked = 0;
    for (const g of t.groups) {
      out.set(groupKey(t.name, g.name), {in: g.message_count, acked: g.finish_count});
      acked += g.finish_count;
    }
    // a topic's acked/s is its groups' together (each group acknowledges its own copy)
    out.set(topicKey(t.name), {in: t.message_count, acked});
  }
  return out;
}

function record(state) {
  const now = counters(state);
  if (firstPoll === null) firstPoll = state.time;
  if (counted !== null) {
    const seconds = state.time - counted.time;
    if (seconds > 0) {
      for (const [key, c] of now) {
        const before = counted.counters.get(key);
        if (before === undefined) continue;
        if (!history.has(key)) history.set(key, []);
        // a counter that went down (a topic deleted and made again) counts as 0, not negative
        history.get(key).push({t: state.time,
                               in: Math.max(0, (c.in - before.in) / seconds),
                               acked: Math.max(0, (c.acked - before.acked) / seconds)});
      }
    }
  }
  for (const [key, samples] of history) {
    if (!now.has(key)) { history.delete(key); continue; }
    while (samples.length && samples[0].t < state.time - HISTORY_S) samples.shift();
  }
  counted = {time: state.time, counters: now};
}

function latest(key) {
  const samples = history.get(key);
  const last = samples && samples[samples.length - 1];
  return last && current && last.t === current.time ? last : null;
}

function niceCeil(v) {
  if (!(v > 0)) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

// Seconds the charts span: every chart the same, so that they line up on a page.
function span() {
  if (current === null || firstPoll === null) return MIN_SPAN_S;
  return Math.min(HISTORY_S, Math.max(MIN_SPAN_S, Math.ceil((current.time - firstPoll) / 60) * 60));
}

function ago(seconds) {
  return seconds >= 60 ? `−${+(seconds / 60).toFixed(1)} min` : `−${Math.round(seconds)} s`;
}

// A chart of in/s and acked/s over the last span() seconds, newest at the right.
function chart(key, width, height, axes) {
  const seconds = span();
  const now = current === null ? 0 : current.time;
  const samples = (history.get(key) || []).filter(s => s.t >= now - seconds);
  const peak = samples.reduce((m, s) => Math.max(m, s.in, s.acked), 0);
  const top = niceCeil(peak);
  const [left, right, up, down] = axes ? [34, 6, 8, 16] : [1, 3, 3, 2];
  const w = width - left - right;
  const h = height - up - down;
  const x = t => (left + w * (1 - (now - t) / seconds)).toFixed(1);
  const y = v => (up + h * (1 - v / top)).toFixed(1);
  const node = svg("svg", {class: "chart", width, height, viewBox: `0 0 ${width} ${height}`,
                           "data-key": key, "data-points": samples.length, "data-peak": peak,
                           role: "img",
                           "data-span": seconds,
                           "aria-label": `in/s and acked/s over the last ${ago(seconds).slice(1)}`});
  node.append(svg("title", {}, `in/s (blue) and acked/s (green), last ${ago(seconds).slice(1)}; ` +
                               `peak ${fmt(peak)}/s`));
  if (axes) {
    node.append(svg("line", {class: "grid", x1: left, x2: left + w, y1: y(top / 2), y2: y(top / 2)}));
    node.append(svg("line", {class: "grid", x1: left, x2: left + w, y1: y(top), y2: y(top)}));
    const tick = v => String(Number(v.toPrecision(3)));
    node.append(svg("text", {x: left - 4, y: Number(y(top)) + 4, "text-anchor": "end"}, tick(top)));
    node.append(svg("text", {x: left - 4, y: Number(y(top / 2)) + 4, "text-anchor": "end"}, tick(top / 2)));
    node.append(svg("text", {x: left - 4, y: Number(y(0)) + 4, "text-anchor": "end"}, "0"));
    for (const [back, anchor] of [[seconds, "start"], [seconds / 2, "middle"], [0, "end"]]) {
      node.append(svg("text", {x: x(now - back), y: height - 3, "text-anchor": anchor},
                      back === 0 ? "now" : ago(back)));
    }
  }
  node.append(svg("line", {class: "axis", x1: left, x2: left + w, y1: y(0), y2: y(0)}));
  for (const series of ["acked", "in"]) {
    if (samples.length === 0) continue;
    node.append(svg("polyline", {class: series, "data-series": series,
      points: samples.map(s => `${x(s.t)},${y(s[series])}`).join(" ")}));
    const last = samples[samples.length - 1];
    node.append(svg("circle", {class: series, cx: x(last.t), cy: y(last[series]), r: axes ? 2.5 : 1.5}));
  }
  return node;
}

// -- the access token ----------------------------------------------------------------------
// A gateway with [http] auth_token answers 401 to its admin actions (and, with
// protect_reads, to its data): the page then asks for the token once, keeps it for the
// tab's life (sessionStorage) and sends it as a bearer token.

const TOKEN_KEY = "gateway-http-token";
let asking = null;  // the pending prompt, shared by every request that met a 401

function askToken(again) {
  if (asking === null) {
    asking = new Promise(resolve => {
      const dialog = document.getElementById("login");
      const input = document.getElementById("login-token");
      document.getElementById("login-error").textContent = again ? "That token was refused." : "";
      input.value = "";
      dialog.addEventListener("close", () => {
        asking = null;
        if (input.value) sessionStorage.setItem(TOKEN_KEY, input.value);
        resolve(Boolean(input.value));
      }, {once: true});
      dialog.showModal();
    });
  }
  return asking;
}

async function api(url, options) {
  for (let attempt = 0; ; attempt++) {
    const token = sessionStorage.getItem(TOKEN_KEY);
    const headers = token ? {authorization: `Bearer ${token}`} : {};
    const reply = await fetch(url, {...(options || {}), headers});
    if (reply.status !== 401 || attempt >= 3) return reply;
    if (!await askToken(token !== null)) return reply;
  }
}

// -- actions and peeks -------------------------------------------------------------------

const n0 = n => Number(n).toLocaleString("en-US");

// What an empty or a delete drops, from the last poll: the question names it.
function loss(action, topic, group) {
  const t = current.topics.find(x => x.name === topic);
  if (t === undefined) return null;
  const g = group === null ? null : t.groups.find(x => x.name === group);
  const c = g ? {ready: g.depth, in_flight: g.in_flight, deferred: g.deferred, buried: g.buried}
              : {ready: t.backlog, in_flight: 0, deferred: 0, buried: 0};
  if (group === null && action === "delete") {
    c.ready += t.groups_total.depth; c.in_flight = t.groups_total.in_flight;
    c.deferred = t.groups_total.deferred; c.buried = t.groups_total.buried;
  }
  const total = c.ready + c.in_flight + c.deferred + c.buried;
  const what = group === null ? `topic ${topic}` : `group ${group} of topic ${topic}`;
  const scope = group !== null ? "" : action === "delete"
    ? ` It has ${t.groups.length} group${t.groups.length === 1 ? "" : "s"}: all go with it.`
    : " Only the topic's backlog (messages no group has taken yet): its groups keep theirs.";
  return {title: `${action} ${what}?`, total,
    text: `${n0(total)} message${total === 1 ? "" : "s"} will be lost: ${n0(c.ready)} ready, ` +
          `${n0(c.in_flight)} in flight, ${n0(c.deferred)} deferred, ${n0(c.buried)} buried.` +
          `${scope} This cannot be undone.`};
}

function ask(question, verb) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-title").textContent = question.title;
  document.getElementById("confirm-text").textContent = question.text;
  document.getElementById("confirm-ok").textContent = verb;
  dialog.returnValue = "";
  return new Promise(resolve => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), {once: true});
    dialog.showModal();
  });
}

async function act(action, topic, group, extra) {
  if (action === "empty" || action === "delete") {
    const question = loss(action, topic, group);
    if (question === null || !await ask(question, action)) return;
  }
  const params = new URLSearchParams({topic});
  if (group !== null) params.set("group", group);
  for (const [k, v] of Object.entries(extra || {})) params.set(k, v);
  const reply = await api(`/admin/api/${action}?${params}`, {method: "POST"});
  if (!reply.ok) {
    document.getElementById("error").textContent = `${action} failed: ${reply.status}`;
  }
  await refresh();
}

async function togglePeek(topic, group, state) {
  const key = [topic, group, state].join("\u0000");
  if (peeks.has(key)) {
    peeks.delete(key);
  } else {
    const params = new URLSearchParams({topic, group, state, limit: "10"});
    const reply = await api(`/admin/api/peek?${params}`);
    peeks.set(key, reply.ok ? (await reply.json()).messages : []);
  }
  render();
}

function actions(topic, group, paused, buried) {
  const g = group === null ? null : group.name;
  const data = {"data-topic": topic, "data-group": g === null ? "" : g};
  const cell = el("td", {class: "name actions"});
  cell.append(el("button", {...data, "data-action": paused ? "unpause" : "pause",
                            onclick: () => act(paused ? "unpause" : "pause", topic, g)},
                 paused ? "unpause" : "pause"));
  cell.append(el("button", {...data, "data-action": "empty", onclick: () => act("empty", topic, g)},
                 "empty"));
  cell.append(el("button", {...data, "data-action": "delete", onclick: () => act("delete", topic, g)},
                 "delete"));
  if (g === null) {
    cell.append(el("button", {...data, "data-action": "publish", onclick: () => publish(topic)},
                   "publish"));
  } else {
    if (buried > 0 || group.deferred > 0) {
      cell.append(el("button", {...data, "data-action": "kick", onclick: () => act("kick", topic, g)},
                     "kick"));
    }
    cell.append(el("button", {...data, "data-action": "peek-ready",
                              onclick: () => togglePeek(topic, g, "ready")}, "peek ready"));
    if (buried > 0) {
      cell.append(el("button", {...data, "data-action": "peek-buried",
                                onclick: () => togglePeek(topic, g, "buried")}, "peek buried"));
    }
  }
  return cell;
}

function peekRows(topic, group) {
  const rows = [];
  for (const state of ["ready", "buried"]) {
    const messages = peeks.get([topic, group, state].join("\u0000"));
    if (messages === undefined) continue;
    const cell = el("td", {colSpan: COLS});
    cell.append(el("b", {}, `${state} in ${topic} / ${group}: ${messages.length} shown`),
                el("span", {class: "muted"}, " (click a message to open it)"));
    for (const m of messages) {
      const headers = m.headers.length ? `  ${m.headers.length} headers` : "";
      cell.append(el("pre", {"data-message": String(m.id), tabIndex: 0, role: "button",
                             title: "open this message",
                             onclick: () => openMessage(topic, group, m.id),
                             onkeydown: e => { if (e.key === "Enter") openMessage(topic, group, m.id); }},
        `#${m.id} pri ${m.priority} attempts ${m.attempts} ${m.size} B${headers}  ` +
        JSON.stringify(m.body) + (m.truncated ? " …" : "")));
    }
    rows.push(el("tr", {class: "peek"}, cell));
  }
  return rows;
}

async function publish(topic) {
  const dialog = document.getElementById("publish");
  document.getElementById("publish-title").textContent = `publish a message to ${topic}`;
  document.getElementById("publish-status").textContent = "";
  dialog.returnValue = "";
  dialog.showModal();
  await new Promise(resolve => dialog.addEventListener("close", resolve, {once: true}));
  const body = document.getElementById("publish-body").value;
  if (dialog.returnValue !== "ok" || body === "") return;
  const reply = await api(`/admin/api/publish?${new URLSearchParams({topic})}`,
                          {method: "POST", body});
  document.getElementById("error").textContent = reply.ok ? "" : `publish failed: ${reply.status}`;
  if (reply.ok) document.getElementById("publish-body").value = "";
  await refresh();
}

// -- the queue tables --------------------------------------------------------------------

function headRow() {
  const th = (label, cls, title) => el("th", {class: cls || "", title: title || ""}, label);
  return el("tr", {},
    th("topic / group", "name"), th("depth"), th("in flight"), th("deferred"), th("buried"),
    th("in /s"), th("acked /s"),
    th("recent /s", "name", `in/s (blue) and acked/s (green) over the last minutes ` +
                            `(up to ${HISTORY_S / 60}), from this page's polls`),
    th("messages", "opt"), th("requeued", "opt"), th("timed out", "opt"),
    th("consumers", "name"), th("actions", "name"));
}

function rateCell(key, series) {
  const r = latest(key);
  return el("td", {"data-field": series === "in" ? "in_rate" : "acked_rate"},
            r === null ? "–" : fmt(r[series]));
}

function chartCell(key) {
  return el("td", {class: "name chart-cell"}, chart(key, 120, 24, false));
}

function topicRow(t, linked) {
  const published = Object.entries(t.published).map(([p, n]) => `${p} ${n}`).join(", ");
  const name = linked
    ? el("a", {href: topicHref(t.name), "data-topic-link": t.name, title: "topic detail"}, t.name)
    : t.name;
  return el("tr", {class: "topic", "data-topic": t.name},
    el("td", {class: "name"}, name, t.paused ? el("span", {class: "paused"}, " paused") : ""),
    el("td", {"data-topic-field": "depth", title: "the topic's backlog (nsqd's topic depth) · its groups' ready together"},
       t.backlog, el("span", {class: "muted"}, ` · ${n0(t.groups_total.depth)}`)),
    ...["in_flight", "deferred", "buried"].map(k =>
      el("td", {class: "muted", "data-topic-field": k, title: "its groups together"}, n0(t.groups_total[k]))),
    rateCell(topicKey(t.name), "in"), rateCell(topicKey(t.name), "acked"),
    chartCell(topicKey(t.name)),
    el("td", {class: "opt"}, t.message_count), el("td", {class: "opt"}, ""),
    el("td", {class: "opt"}, ""),
    el("td", {class: "name who"}, published ? `published by ${published}` : ""),
    actions(t.name, null, t.paused, 0));
}

function groupRows(t, g) {
  const key = groupKey(t.name, g.name);
  const consumers = el("td", {class: "name who", "data-field": "consumers"});
  for (const [p, n] of Object.entries(g.consumers)) {
    consumers.append(el("span", {class: "proto"}, `${p} ${n}`));
  }
  return [el("tr", {class: "group", "data-topic": t.name, "data-group": g.name},
    el("td", {class: "name"}, g.name, g.paused ? el("span", {class: "paused"}, " paused") : ""),
    el("td", {"data-field": "depth"}, g.depth),
    el("td", {"data-field": "in_flight"}, g.in_flight),
    el("td", {"data-field": "deferred"}, g.deferred),
    el("td", {"data-field": "buried"}, g.buried),
    rateCell(key, "in"), rateCell(key, "acked"), chartCell(key),
    el("td", {class: "opt", "data-field": "message_count"}, g.message_count),
    el("td", {class: "opt"}, g.requeue_count), el("td", {class: "opt"}, g.timeout_count),
    consumers, actions(t.name, g, g.paused, g.buried)),
    ...peekRows(t.name, g.name)];
}

function queueTable(id, rows) {
  return el("table", {id}, el("thead", {}, headRow()), el("tbody", {}, ...rows));
}

// -- the views ---------------------------------------------------------------------------

function renderHeader(state) {
  document.getElementById("state").textContent = state.state;
  document.getElementById("listeners").textContent = Object.entries(state.addresses)
    .map(([k, v]) => `${k} ${v}`).join(" · ");
  document.getElementById("connections").textContent = "connections: " +
    (Object.entries(state.connections).map(([k, v]) => `${k} ${v}`).join(", ") || "none");
  document.getElementById("updated").textContent =
    "updated " + new Date(state.time * 1000).toLocaleTimeString();
}

function renderOverview(state) {
  const head = document.getElementById("queues-head");
  if (head.childElementCount === 0) head.append(headRow());
  const rows = [];
  const filter = document.getElementById("filter").value.trim().toLowerCase();
  const sort = document.getElementById("sort").value;
  const held = t => t.backlog + Object.values(t.groups_total).reduce((a, b) => a + b, 0);
  const rate = t => { const r = latest(topicKey(t.name)); return r === null ? 0 : r.in; };
  const shownTopics = state.topics
    .filter(t => !filter || t.name.toLowerCase().includes(filter) ||
                 t.groups.some(g => g.name.toLowerCase().includes(filter)))
    .sort((a, b) => sort === "held" ? held(b) - held(a) : sort === "in" ? rate(b) - rate(a)
                                     : a.name < b.name ? -1 : 1);
  for (const t of shownTopics) {
    rows.push(topicRow(t, true));
    for (const g of t.groups) rows.push(...groupRows(t, g));
  }
  if (rows.length === 0) {
    const none = state.topics.length ? `no topic or group matches “${filter}”` : "no topics yet";
    rows.push(el("tr", {}, el("td", {class: "empty name", colSpan: COLS}, none)));
  }
  renderNode(state);
  renderClients(state.clients);
  document.getElementById("rows").replaceChildren(...rows);

  renderLinks(state.links);
  const routes = document.getElementById("routes");
  if (state.routes.length === 0) {
    routes.className = "empty";
    routes.textContent = "none";
  } else {
    routes.className = "";
    routes.replaceChildren(el("table", {},
      el("tr", {}, el("th", {class: "name"}, "server"), el("th", {class: "name"}, "peer"),
         el("th", {class: "name"}, "direction"), el("th", {}, "subjects it wants")),
      ...state.routes.map(r => el("tr", {"data-route": r.server_id},
        el("td", {class: "name"}, r.server_name || r.server_id),
        el("td", {class: "name"}, r.peer),
        el("td", {class: "name"}, r.dialed ? "dialed" : "accepted"),
        el("td", {}, r.interest)))));
  }
}

// One line per link to a live server (an import or export): what it moved, what it has
// in flight, what waits at its source, and its last error.
function renderLinks(links) {
  const box = document.getElementById("links");
  box.className = links.length ? "" : "empty";
  if (!links.length) { box.textContent = "none"; return; }
  const cols = [["kind", "kind"], ["name", "link"], ["upstream", "server"], ["state", "state"],
                ["moved", "moved"], ["in_flight", "in flight"], ["lag", "waiting there"],
                ["errors", "errors"], ["last_error", "last error"]];
  const text = (l, k) => (l[k] === null || l[k] === "") ? "–"
                       : typeof l[k] === "number" ? n0(l[k]) : String(l[k]);
  box.replaceChildren(el("table", {},
    el("tr", {}, ...cols.map(([, title]) => el("th", {class: "name"}, title))),
    ...links.map(l => el("tr", {"data-link": l.name},
      ...cols.map(([k]) => el("td", {class: "name", "data-field": k}, text(l, k)))))));
}

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${i === 0 ? n : n.toFixed(1)} ${units[i]}`;
}

function duration(s) {
  const d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60);
  return d ? `${d} d ${h} h` : h ? `${h} h ${m} min` : m ? `${m} min` : `${Math.floor(s)} s`;
}

// Every client of every protocol, with what nsqadmin shows of a client where known.
function renderClients(clients) {
  const box = document.getElementById("clients");
  box.className = clients.length ? "" : "empty";
  if (!clients.length) { box.textContent = "none"; return; }
  const cols = [["protocol", "protocol"], ["address", "address"], ["client_id", "client id"],
    ["hostname", "hostname"], ["user_agent", "user agent / name"], ["connected", "connected"],
    ["message_count", "messages"], ["finish_count", "finished"], ["requeue_count", "requeued"],
    ["subscriptions", "subs"], ["features", "TLS, compression"]];
  const text = (c, k) => {
    if (k === "connected") return c.connected_since ? new Date(c.connected_since * 1000).toLocaleTimeString() : "–";
    if (k === "features") return [c.tls, c.snappy ? "snappy" : "", c.deflate ? "deflate" : ""].filter(Boolean).join(" ") || "–";
    return c[k] === undefined || c[k] === "" ? "–" : String(c[k]);
  };
  box.replaceChildren(el("table", {id: "client-table"},
    el("tr", {}, ...cols.map(([, label]) => el("th", {class: "name"}, label))),
    ...clients.map(c => el("tr", {class: "client", "data-protocol": c.protocol},
      ...cols.map(([k]) => el("td", {class: k === "user_agent" ? "name ua" : "name", "data-field": k}, text(c, k)))))));
}

function renderNode(state) {
  const n = state.node, s = n.store;
  const fact = (field, label, value, cls) => el("span", {"data-node": field},
    el("span", {class: "muted"}, `${label} `), el("b", {class: cls || ""}, value));
  const conns = Object.entries(state.connections).map(([k, v]) => `${k} ${v}`).join(", ");
  document.getElementById("node").replaceChildren(
    fact("version", "version", n.version), fact("uptime", "up", duration(n.uptime)),
    fact("rss", "RSS", bytes(n.rss)), fact("store", "store", `${s.kind} ${s.where}`),
    fact("size", "size", bytes(s.size)), fact("health", "health", s.health, s.health === "ok" ? "" : "bad"),
    fact("fsync", "fsync", s.fsync), fact("connections", "connections", conns || "none"),
    fact("config", "config", n.config_file || "none"));
}

function chartCard(title, key, attrs) {
  const r = latest(key);
  const now = r === null ? "–" : null;
  return el("div", {class: "card", ...attrs},
    el("h3", {}, el("span", {}, title),
       el("span", {class: "muted"},
          el("span", {class: "key-in"}, "in "), now || fmt(r.in), "/s  ",
          el("span", {class: "key-acked"}, "acked "), now || fmt(r.acked), "/s")),
    chart(key, 420, 120, true));
}

function renderDetail(state, name) {
  const detail = document.getElementById("detail");
  const back = el("a", {href: "#", "data-back": ""}, "← all topics");
  const t = state.topics.find(x => x.name === name);
  detail.dataset.topic = name;
  if (t === undefined) {
    detail.replaceChildren(el("div", {class: "detail-head"}, back),
      el("p", {class: "empty"}, `topic ${name} does not exist (any more)`));
    return;
  }
  const published = Object.entries(t.published).map(([p, n]) => `${p} ${n}`).join(", ");
  const cards = [chartCard(`topic ${t.name}`, topicKey(t.name), {"data-chart": "topic"})];
  for (const g of t.groups) {
    cards.push(chartCard(`group ${g.name}`, groupKey(t.name, g.name), {"data-chart": g.name}));
  }
  const groupTableRows = [topicRow(t, false)];
  for (const g of t.groups) groupTableRows.push(...groupRows(t, g));
  const consumerRows = [];
  for (const g of t.groups) {
    for (const c of g.clients) {
      const since = c.connected_since ? new Date(c.connected_since * 1000).toLocaleTimeString() : "–";
      const features = [c.tls, c.snappy ? "snappy" : "", c.deflate ? "deflate" : "",
                        c.authed ? "authed" : ""].filter(Boolean).join(" ") || "–";
      consumerRows.push(el("tr", {class: "consumer", "data-group": g.name, "data-protocol": c.protocol},
        el("td", {class: "name", "data-field": "group"}, g.name),
        el("td", {class: "name", "data-field": "protocol"}, el("span", {class: "proto"}, c.protocol)),
        el("td", {class: "name", "data-field": "client_id"}, c.client_id || "–"),
        el("td", {class: "name", "data-field": "address"}, c.address || "–"),
        el("td", {class: "name", "data-field": "hostname"}, c.hostname || "–"),
        el("td", {class: "name ua", "data-field": "user_agent", title: c.user_agent || ""}, c.user_agent || "–"),
        el("td", {class: "name", "data-field": "connected"}, since),
        el("td", {"data-field": "in_flight"}, c.in_flight),
        el("td", {"data-field": "ready"}, c.ready),
        el("td", {"data-field": "finished"}, c.finish_count ?? "–"),
        el("td", {"data-field": "requeued"}, c.requeue_count ?? "–"),
        el("td", {class: "name", "data-field": "features"}, features)));
    }
  }
  if (consumerRows.length === 0) {
    consumerRows.push(el("tr", {}, el("td", {class: "empty name", colSpan: 12}, "no consumers")));
  }
  detail.replaceChildren(
    el("div", {class: "detail-head"}, back,
       el("h2", {}, `topic ${t.name}`, t.paused ? el("span", {class: "paused"}, " paused") : ""),
       el("span", {class: "muted"}, `${t.groups.length} group${t.groups.length === 1 ? "" : "s"} · ${t.message_count} messages · ` +
                                    `backlog ${t.backlog}` + (published ? ` · published by ${published}` : ""))),
    el("div", {class: "cards"}, ...cards),
    el("h2", {}, "groups"),
    queueTable("groups", groupTableRows),
    el("h2", {}, "consumers"),
    el("table", {id: "consumers"},
      el("thead", {}, el("tr", {},
        el("th", {class: "name"}, "group"), el("th", {class: "name"}, "protocol"),
        el("th", {class: "name"}, "client id"), el("th", {class: "name"}, "address"),
        el("th", {class: "name"}, "hostname"), el("th", {class: "name"}, "user agent"),
        el("th", {class: "name"}, "connected"), el("th", {}, "in flight"),
        el("th", {title: "deliveries the consumer will take at once (NSQ's RDY)"}, "ready window"),
        el("th", {}, "finished"), el("th", {}, "requeued"), el("th", {class: "name"}, "TLS, compression"))),
      el("tbody", {}, ...consumerRows)));
}

function render() {
  if (current === null) return;
  renderHeader(current);
  const name = viewedTopic();
  document.getElementById("overview").hidden = name !== null;
  document.getElementById("detail").hidden = name === null;
  if (name === null) renderOverview(current);
  else renderDetail(current, name);
}

// -- the message view --------------------------------------------------------------------

let shown = null;             // {bytes, mode} of the message in the dialog

function hexdump(bytes) {
  const lines = [];
  for (let at = 0; at < bytes.length; at += 16) {
    const row = bytes.subarray(at, at + 16);
    const hex = Array.from(row, b => b.toString(16).padStart(2, "0")).join(" ");
    const text = Array.from(row, b => (b >= 0x20 && b < 0x7f ? String.fromCharCode(b) : ".")).join("");
    lines.push(`${at.toString(16).padStart(8, "0")}  ${hex.padEnd(47)}  ${text}`);
  }
  return lines.join("\n");
}

function showBody(mode) {
  const body = document.getElementById("message-body");
  body.dataset.mode = mode;
  for (const b of document.querySelectorAll("button[data-body-mode]")) {
    b.setAttribute("aria-pressed", String(b.dataset.bodyMode === mode));
  }
  if (shown === null) { body.textContent = ""; return; }
  shown.mode = mode;
  body.textContent = mode === "hex" ? hexdump(shown.bytes)
                                    : new TextDecoder("utf-8").decode(shown.bytes);
}

async function openMessage(topic, group, id) {
  const dialog = document.getElementById("message");
  const mode = shown === null ? "text" : shown.mode;
  shown = null;
  document.getElementById("message-title").textContent = `message ${id}`;
  document.getElementById("message-status").textContent = "loading…";
  document.getElementById("message-facts").replaceChildren();
  document.getElementById("message-headers").replaceChildren();
  document.getElementById("message-size").textContent = "";
  dialog.dataset.id = String(id);
  showBody(mode);
  if (!dialog.open) dialog.showModal();
  const params = new URLSearchParams({topic, group, id: String(id)});
  const reply = await api(`/admin/api/message?${params}`, {cache: "no-store"});
  if (!reply.ok) {
    document.getElementById("message-status").textContent = reply.status === 404
      ? `message ${id} is no longer in ${topic} / ${group} (acknowledged or emptied)`
      : `could not load message ${id}: ${reply.status}`;
    return;
  }
  const m = await reply.json();
  document.getElementById("message-status").textContent = "";
  document.getElementById("message-title").textContent = `message ${m.id}`;
  const facts = [
    ["id", `${m.id} (NSQ ${m.id_hex})`], ["state", m.state], ["attempts", m.attempts],
    ["priority", m.priority], ["topic / group", `${topic} / ${group}`], ["age", `${fmt(m.age)} s`],
    ["origin", m.origin || "–"], ["time left", m.time_left > 0 ? `${fmt(m.time_left)} s` : "–"],
  ];
  if (m.reply_to) facts.push(["reply to", m.reply_to]);
  document.getElementById("message-facts").replaceChildren(...facts.flatMap(([k, v]) =>
    [el("dt", {}, k), el("dd", {"data-field": k.replace(/ \/ | /g, "_")}, v)]));
  document.getElementById("message-headers").replaceChildren(m.headers.length === 0
    ? el("span", {class: "muted"}, "none")
    : el("table", {}, el("tbody", {}, ...m.headers.map(([k, v]) =>
        el("tr", {"data-header": k}, el("td", {}, k), el("td", {}, v))))));
  document.getElementById("message-size").textContent =
    `${m.size} B` + (m.truncated ? ` (the first ${atob(m.body_base64).length} B shown)` : "");
  shown = {bytes: Uint8Array.from(atob(m.body_base64), c => c.charCodeAt(0)), mode};
  showBody(mode);
}

for (const b of document.querySelectorAll("button[data-body-mode]")) {
  b.addEventListener("click", () => showBody(b.dataset.bodyMode));
}
document.getElementById("message-close").addEventListener("click",
  () => document.getElementById("message").close());

// -- polling -----------------------------------------------------------------------------

// A poll rebuilds the tables. Rebuilt between a button's press and its release, the
// press lands on the old row and the release on the new one, and the browser sends the
// click to neither: the click is lost. So while a pointer is down the poll only records,
// and the page is drawn on the release, after the click has run.
let pressed = false;
let heldRender = false;
document.addEventListener("pointerdown", () => { pressed = true; }, true);
for (const [target, type] of [[document, "pointerup"], [document, "pointercancel"],
                              [window, "blur"]]) {
  target.addEventListener(type, () => {
    pressed = false;
    if (heldRender) { heldRender = false; setTimeout(render, 0); }
  }, true);
}

async function refresh() {
  try {
    const reply = await api("/admin/api/state", {cache: "no-store"});
    if (!reply.ok) throw new Error(`state: HTTP ${reply.status}`);
    const state = await reply.json();
    document.getElementById("error").textContent = "";
    record(state);
    current = state;
    document.body.dataset.polls = String(Number(document.body.dataset.polls || 0) + 1);
    if (pressed) heldRender = true;
    else render();
  } catch (exc) {
    document.getElementById("error").textContent = `refresh failed: ${exc}`;
  }
}

// What the gateway sampled before the page opened: the charts start full.
async function loadHistory() {
  try {
    const reply = await api("/admin/api/history", {cache: "no-store"});
    if (!reply.ok) return;
    const data = await reply.json();
    const add = (key, time, p) => {
      if (!history.has(key)) history.set(key, []);
      history.get(key).push({t: time, in: p.in, acked: p.acked});
    };
    for (const s of data.samples) {
      for (const [name, p] of Object.entries(s.topics)) add(topicKey(name), s.time, p);
      for (const [topic, groups] of Object.entries(s.groups)) {
        for (const [name, p] of Object.entries(groups)) add(groupKey(topic, name), s.time, p);
      }
    }
    if (data.samples.length) firstPoll = data.samples[0].time;
  } catch (exc) {
    document.getElementById("error").textContent = `history: ${exc}`;
  }
}

async function poll() {
  await refresh();
  setTimeout(poll, REFRESH_MS);  // after the reply, so slow replies never pile up
}

window.addEventListener("hashchange", render);
document.getElementById("filter").addEventListener("input", render);
document.getElementById("sort").addEventListener("change", render);
loadHistory().then(poll);
