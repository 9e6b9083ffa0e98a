// raftmq console: draws the cluster from the console's JSON API (console.rs beside this file).
//
// Broker groups and the election timeline arrive as server-sent events (api/events), one per
// poll of the cluster by the server (every 250 ms). Topics and consumer groups are fetched every
// second, one round at a time; the lag history behind each group's chart lives here, in memory.
// Rows are updated in place, never rebuilt, so a button under the pointer stays where it is.
'use strict';

const REFRESH_MS = 1000; // topics and consumer groups
const LISTS_EVERY = 5; // rounds between reloads of the topic and group lists
const LAG_WINDOW_MS = 5 * 60 * 1000; // the lag chart's width
const QUIET_MS = 3000; // no snapshot for this long: say so

const $ = (selector) => document.querySelector(selector);

const ui = {
  connected: false,
  lastEventAt: 0,
  clusterError: null,
  actions: false,
  topics: null, // api/topics' list (null until it loads)
  topicsError: null,
  groups: null,
  groupsError: null,
  topicStatus: new Map(), // topic -> {value, at, rates: Map("broker/queue" -> msgs/s), error}
  groupStatus: new Map(), // group -> {value, error}
  lagHistory: new Map(), // group -> [[ms, lag], ...]
  topicOpen: null, // the topic whose queues are shown
  groupOpen: null,
};

// ---- helpers

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'class') e.className = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  e.append(...children.filter((c) => c !== null && c !== undefined));
  return e;
}

function headRow(columns) {
  return el('tr', {}, ...columns.map((c) => (c.startsWith('#')
    ? el('th', { class: 'num' }, c.slice(1)) : el('th', {}, c))));
}

// Makes `parent`'s children one per item, in order, reusing the child of the same key:
// `make()` builds a new one, `update(child, item)` refreshes it.
function syncKeyed(parent, items, keyOf, make, update) {
  const old = new Map([...parent.children].map((c) => [c.dataset.key, c]));
  items.forEach((item, i) => {
    const key = String(keyOf(item));
    let child = old.get(key);
    old.delete(key);
    if (!child) {
      child = make();
      child.dataset.key = key;
    }
    if (parent.children[i] !== child) parent.insertBefore(child, parent.children[i] || null);
    update(child, item);
  });
  for (const c of old.values()) c.remove();
}

const row = () => el('tr');

// Sets a table row's cells: a Node is kept as it is, a number is formatted, null is a dash.
// A cell is right-aligned when its column's header has class `num`.
function setCells(tr, values) {
  const head = tr.closest('table').tHead.rows[0];
  while (tr.cells.length > values.length) tr.deleteCell(-1);
  values.forEach((v, i) => {
    const td = tr.cells[i] || tr.insertCell();
    td.classList.toggle('num', head.cells[i]?.classList.contains('num') ?? false);
    if (v instanceof Node) {
      if (td.childNodes.length !== 1 || td.firstChild !== v) td.replaceChildren(v);
      return;
    }
    let text = typeof v === 'number' ? num(v) : String(v);
    if (v === null || v === undefined) text = '–';
    if (td.textContent !== text) td.textContent = text;
  });
}

function num(n) {
  return n.toLocaleString('en-US', { maximumFractionDigits: Number.isInteger(n) ? 0 : 1 });
}

function bytes(n) {
  if (n === null || n === undefined) return null;
  const units = ['B', 'kB', 'MB', 'GB', 'TB'];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i += 1; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

function clock(ms) {
  const d = new Date(ms);
  const p = (n, w = 2) => String(n).padStart(w, '0');
  const hms = `${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
  return `${hms}.${p(d.getMilliseconds(), 3)}`;
}

function ago(ms) {
  if (!ms) return null;
  const s = Math.max(0, (Date.now() - ms) / 1000);
  if (s < 90) return `${s.toFixed(0)} s ago`;
  if (s < 5400) return `${(s / 60).toFixed(0)} min ago`;
  return `${(s / 3600).toFixed(1)} h ago`;
}

function seconds(ms) {
  return ms === null || ms === undefined ? null : `${(ms / 1000).toFixed(1)} s`;
}

// GET (or `init`) `url` as JSON; throws the server's `{"error"}` text on a failure status.
async function getJSON(url, init) {
  const r = await fetch(url, init);
  let body = null;
  try { body = await r.json(); } catch { /* not JSON: the status tells */ }
  if (!r.ok) throw new Error(body?.error ?? `${url}: HTTP ${r.status}`);
  return body;
}

function showError(selector, lines) {
  const p = $(selector);
  const text = lines.filter(Boolean).join('\n');
  p.hidden = !text;
  p.textContent = text;
}

// ---- broker groups and the timeline (server-sent events)

function connect() {
  const source = new EventSource('api/events');
  source.onopen = () => { ui.connected = true; showFreshness(); };
  source.onerror = () => { ui.connected = false; showFreshness(); };
  source.onmessage = (e) => renderCluster(JSON.parse(e.data));
}

function showFreshness() {
  const quiet = Date.now() - ui.lastEventAt;
  let [text, cls] = ['live', 'on'];
  if (!ui.connected) [text, cls] = ['reconnecting…', 'off'];
  else if (quiet > QUIET_MS) [text, cls] = [`no update for ${Math.round(quiet / 1000)} s`, 'warn'];
  else if (ui.clusterError) [text, cls] = ['cluster unreachable', 'warn'];
  const badge = $('#live');
  badge.textContent = text;
  badge.className = `badge ${cls}`;
}

function renderCluster(snap) {
  ui.lastEventAt = Date.now();
  ui.connected = true;
  ui.clusterError = snap.error;
  ui.actions = snap.actions;
  const read = snap.updated_ms ? ` · read ${clock(snap.updated_ms)}` : '';
  $('#meta').textContent = `nameserver ${snap.nameservers.join(', ')} · `
    + `${snap.actions ? 'actions allowed' : 'read-only'}${read}`;
  const brokers = (snap.status?.clusters ?? [])
    .flatMap((c) => c.brokers.map((b) => ({ ...b, cluster: c.name })));
  showError('#cluster-error', [snap.error,
    snap.status && !brokers.length ? 'The nameservers know no broker group.' : null]);
  const rates = new Map(snap.rates.map((r) => [`${r.broker}/${r.node_id}`, r]));
  syncKeyed($('#brokers'), brokers, (b) => `${b.cluster}/${b.name}`, makeBroker,
    (card, b) => updateBroker(card, b, rates));
  renderTimeline(snap.timeline);
  showFreshness();
}

const NODE_COLUMNS = ['node', 'address', 'role', '#term', '#last log', '#commit', '#applied',
  '#lag', 'ready', '#produce/s', '#pull/s'];

function makeBroker() {
  const columns = ui.actions ? [...NODE_COLUMNS, 'action'] : NODE_COLUMNS;
  return el('article', { class: 'broker' },
    el('h3'),
    el('p', { class: 'note', hidden: '' }),
    el('div', { class: 'scroll' },
      el('table', {}, el('thead', {}, headRow(columns)), el('tbody'))));
}

// The node answering as leader, the one of the highest term if several do (the server's
// timeline uses the same rule; the status' leader_id may be the nameservers' stale record).
function leaderOf(b) {
  return b.nodes.filter((n) => n.role === 'leader')
    .reduce((best, n) => (best && best.term >= n.term ? best : n), null);
}

function updateBroker(card, b, rates) {
  const leader = leaderOf(b);
  card.dataset.broker = b.name;
  card.classList.toggle('leaderless', !leader);
  const led = leader ? `leader node ${leader.node_id}` : 'no leader';
  card.querySelector('h3').replaceChildren(b.name,
    el('span', { class: 'hint' }, ` ${b.cluster} · ${led} · term ${b.term}`));
  syncKeyed(card.querySelector('tbody'), b.nodes, (n) => n.node_id, row,
    (tr, n) => updateNode(tr, n, b, leader, rates.get(`${b.name}/${n.node_id}`), card));
}

function updateNode(tr, n, b, leader, rate, card) {
  const leads = leader?.node_id === n.node_id;
  tr.className = leads ? 'leader' : n.role === 'down' ? 'down' : '';
  tr.dataset.node = n.node_id;
  tr.dataset.role = n.role;
  let role = leads ? '★ leader' : n.role === 'leader' ? 'leader (old term)' : n.role;
  if (n.repairing_to !== undefined) role += ` (repairing to ${num(n.repairing_to)})`;
  if (n.catching_up) role += ` (catching up ${num(n.catching_up.progress_pct)} %)`;
  const ready = n.ready === null ? null : n.ready ? 'yes' : 'no';
  const cells = [String(n.node_id), n.address, role, n.term, n.last_log_index, n.committed,
    n.applied, n.lag, ready, rate?.produce_msgs_per_sec, rate?.pull_msgs_per_sec];
  if (ui.actions) {
    tr.transfer ??= el('button', { type: 'button', class: 'transfer',
      onclick: () => transfer(b.name, n.node_id, card) }, 'make leader');
    tr.transfer.hidden = leads || n.role === 'down' || n.role === 'learner';
    cells.push(tr.transfer);
  }
  setCells(tr, cells);
}

async function transfer(broker, to, card) {
  if (!window.confirm(`Hand the leadership of ${broker} to node ${to}?`)) return;
  const note = card.querySelector('.note');
  note.hidden = false;
  note.className = 'note';
  note.textContent = `handing ${broker} to node ${to}…`;
  try {
    await getJSON('api/leader/transfer', {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ broker, to }),
    });
    note.textContent = `node ${to} leads ${broker}`;
  } catch (e) {
    note.className = 'note error';
    note.textContent = `transfer failed: ${e.message}`;
  }
}

function leaderChange(e) {
  const node = (id) => (id === null ? 'none' : `node ${id}`);
  if (e.kind === 'lost') return `${node(e.old_leader)} → none`;
  const through = e.gap_ms > 0 && e.old_leader !== null ? ' → none' : '';
  return `${node(e.old_leader)}${through} → ${node(e.new_leader)}`;
}

function renderTimeline(events) {
  $('#timeline-empty').hidden = events.length > 0;
  syncKeyed($('#timeline tbody'), events, (e) => `${e.time_ms}/${e.broker}/${e.kind}`, row,
    (tr, e) => {
      tr.className = e.kind;
      Object.assign(tr.dataset, {
        kind: e.kind, broker: e.broker, old: e.old_leader ?? 'none', new: e.new_leader ?? 'none',
        gap: e.gap_ms ?? '',
      });
      const what = e.kind === 'lost' ? 'leader lost' : 'elected';
      setCells(tr, [clock(e.time_ms), e.broker, `${leaderChange(e)} (${what})`, e.term,
        e.gap_ms === null ? null : `${num(e.gap_ms)} ms`]);
    });
}

// ---- topics and consumer groups (polled)

let round = 0;

async function refresh() {
  try {
    if (round % LISTS_EVERY === 0 || !ui.topics || !ui.groups) {
      await Promise.all([loadTopics(), loadGroups()]);
    }
    const names = (list) => [...new Set((list ?? []).map((x) => x.name))];
    await Promise.all([...names(ui.topics).map(loadTopic), ...names(ui.groups).map(loadGroup)]);
  } finally {
    round += 1;
    renderTopics();
    renderGroups();
    setTimeout(refresh, REFRESH_MS);
  }
}

async function loadTopics() {
  try {
    ui.topics = (await getJSON('api/topics')).topics;
    ui.topicsError = null;
    $('#topic-names').replaceChildren(...ui.topics.map((t) => el('option', { value: t.name })));
  } catch (e) {
    ui.topicsError = `cannot list the topics: ${e.message}`;
  }
}

async function loadGroups() {
  try {
    ui.groups = (await getJSON('api/groups')).groups;
    ui.groupsError = null;
  } catch (e) {
    ui.groupsError = `cannot list the consumer groups: ${e.message}`;
  }
}

const maxOffsets = (value) => new Map(value.brokers.flatMap((b) =>
  b.queues.map((q) => [`${b.name}/${q.queue}`, q.max_offset])));

async function loadTopic(name) {
  const prev = ui.topicStatus.get(name);
  const at = Date.now();
  try {
    const value = await getJSON(`api/topic?name=${encodeURIComponent(name)}`);
    // Messages in per second and queue: how far its max offset moved since the last status.
    const rates = new Map();
    if (prev?.value) {
      const before = maxOffsets(prev.value);
      const dt = (at - prev.at) / 1000;
      for (const [k, max] of maxOffsets(value)) {
        if (before.has(k) && dt > 0) rates.set(k, Math.max(0, max - before.get(k)) / dt);
      }
    }
    ui.topicStatus.set(name, { value, at, rates, error: null });
  } catch (e) {
    ui.topicStatus.set(name, { ...prev, error: `topic ${name}: ${e.message}` });
  }
}

async function loadGroup(name) {
  try {
    const value = await getJSON(`api/group?name=${encodeURIComponent(name)}`);
    ui.groupStatus.set(name, { value, error: null });
    const now = Date.now();
    const history = (ui.lagHistory.get(name) ?? []).filter(([t]) => now - t <= LAG_WINDOW_MS);
    history.push([now, value.lag]);
    ui.lagHistory.set(name, history);
  } catch (e) {
    const prev = ui.groupStatus.get(name);
    ui.groupStatus.set(name, { ...prev, error: `group ${name}: ${e.message}` });
  }
}

// A button showing `name` that opens (or closes) its detail below the table.
function opener(name, toggle) {
  return el('button', { type: 'button', class: 'link', onclick: () => toggle(name) }, name);
}

function renderTopics() {
  const topics = ui.topics ?? [];
  showError('#topics-error', [ui.topicsError,
    ...topics.map((t) => ui.topicStatus.get(t.name)?.error)]);
  syncKeyed($('#topics tbody'), topics, (t) => t.name, row, (tr, t) => {
    const s = ui.topicStatus.get(t.name);
    const v = s?.value;
    tr.dataset.topic = t.name;
    tr.classList.toggle('open', ui.topicOpen === t.name);
    tr.nameButton ??= opener(t.name, (name) => {
      ui.topicOpen = ui.topicOpen === name ? null : name;
      renderTopics();
    });
    const rate = s?.rates?.size ? [...s.rates.values()].reduce((a, b) => a + b, 0) : null;
    const stored = (v?.brokers ?? []).flatMap((b) => b.queues.map((q) => q.last_store_ms ?? 0));
    const hosts = t.brokers.map((b) => `${b.name} (${b.queues})`).join(', ');
    setCells(tr, [tr.nameButton, t.type, hosts, v?.messages, bytes(v?.bytes), rate,
      ago(Math.max(0, ...stored))]);
  });
  renderTopicDetail();
}

// The detail panel under a table, built once: a title and a table.
function panel(selector, columns) {
  const p = $(selector);
  if (!p.firstChild) {
    const table = el('table', {}, el('thead', {}, headRow(columns)), el('tbody'));
    p.append(el('h3'), el('div', { class: 'scroll' }, table));
  }
  return { p, title: p.querySelector('h3'), body: p.querySelector('tbody') };
}

function renderTopicDetail() {
  const { p, title, body } = panel('#topic-detail', ['broker group', 'leader', '#queue',
    '#min offset', '#max offset', '#messages', '#bytes', '#in/s', 'last stored']);
  const s = ui.topicStatus.get(ui.topicOpen);
  p.hidden = !ui.topicOpen;
  if (!ui.topicOpen) return;
  title.textContent = `Topic ${ui.topicOpen}: queues`;
  const queues = (s?.value?.brokers ?? []).flatMap((b) => b.queues.map((q) => ({ b, q })));
  syncKeyed(body, queues, ({ b, q }) => `${b.name}/${q.queue}`, row, (tr, { b, q }) => {
    setCells(tr, [b.name, b.leader_id === null ? 'none' : `node ${b.leader_id}`, q.queue,
      q.min_offset, q.max_offset, q.messages, bytes(q.bytes),
      s.rates.get(`${b.name}/${q.queue}`) ?? null, ago(q.last_store_ms)]);
  });
}

const SVG = 'http://www.w3.org/2000/svg';

// Total lag over the last LAG_WINDOW_MS as a line, scaled to its highest point.
function lagChart(points) {
  const [w, h] = [160, 32];
  const svg = document.createElementNS(SVG, 'svg');
  svg.setAttribute('class', 'spark');
  svg.setAttribute('viewBox', `0 0 ${w} ${h}`);
  svg.setAttribute('overflow', 'visible');
  const now = Date.now();
  const top = Math.max(1, ...points.map(([, lag]) => lag));
  const xy = points.map(([t, lag]) =>
    [w * (1 - (now - t) / LAG_WINDOW_MS), h - 3 - ((h - 6) * lag) / top]);
  const shape = (tag, attrs) => {
    const e = document.createElementNS(SVG, tag);
    Object.entries(attrs).forEach(([k, v]) => e.setAttribute(k, v));
    return e;
  };
  const title = shape('title', {});
  title.textContent = `highest lag in the last 5 min: ${num(top)}`;
  const line = xy.map(([x, y]) => `${x.toFixed(1)},${y.toFixed(1)}`).join(' ');
  svg.append(title, shape('line', { x1: 0, y1: h - 1.5, x2: w, y2: h - 1.5 }),
    shape('polyline', { points: line }));
  // The newest point, so the chart shows something from its first sample on.
  const [x, y] = xy[xy.length - 1] ?? [];
  if (x !== undefined) svg.append(shape('circle', { cx: x.toFixed(1), cy: y.toFixed(1), r: 2.5 }));
  return svg;
}

function renderGroups() {
  const groups = ui.groups ?? [];
  showError('#groups-error', [ui.groupsError,
    ...[...new Set(groups.map((g) => g.name))].map((n) => ui.groupStatus.get(n)?.error)]);
  const key = (g) => `${g.name}/${g.brokers.join(',')}`;
  syncKeyed($('#groups tbody'), groups, key, row, (tr, g) => {
    const v = ui.groupStatus.get(g.name)?.value;
    tr.dataset.group = g.name;
    tr.classList.toggle('open', ui.groupOpen === g.name);
    tr.nameButton ??= opener(g.name, (name) => {
      ui.groupOpen = ui.groupOpen === name ? null : name;
      renderGroups();
    });
    setCells(tr, [tr.nameButton, g.brokers.join(', '), v?.members?.length, v?.lag,
      lagChart(ui.lagHistory.get(g.name) ?? [])]);
  });
  renderGroupDetail();
}

function renderGroupDetail() {
  const { p, title, body } = panel('#group-detail', ['broker group', 'topic', '#queue',
    '#committed', '#max offset', '#lag', '#lag age', 'member', 'last commit', '#in flight',
    '#retrying', '#ready']);
  const v = ui.groupStatus.get(ui.groupOpen)?.value;
  p.hidden = !ui.groupOpen;
  if (!ui.groupOpen) return;
  const members = v?.members?.length ? `members ${v.members.join(', ')}` : 'no member';
  title.textContent = `Group ${ui.groupOpen}: queues (${members})`;
  const queues = (v?.brokers ?? []).flatMap((b) => b.queues.map((q) => ({ b, q })));
  syncKeyed(body, queues, ({ b, q }) => `${b.name}/${q.topic}/${q.queue}`, row, (tr, { b, q }) => {
    setCells(tr, [b.name, q.topic, q.queue, q.committed_offset, q.max_offset, q.lag,
      seconds(q.lag_ms), q.member, ago(q.last_commit_ms), q.inflight, q.retrying, q.ready]);
  });
}

// ---- message lookup

function messageCard(m) {
  const fields = [['broker group', m.broker], ['queue', m.queue], ['offset', m.offset],
    ['message id', m.msg_id], ['key', m.key], ['tag', m.tag],
    ['stored', m.store_ms ? new Date(m.store_ms).toISOString() : null],
    ...Object.entries(m.properties ?? {}).map(([k, v]) => [`property ${k}`, v])];
  const text = m.body !== undefined;
  return el('article', { class: 'msg' },
    el('dl', {}, ...fields.filter(([, v]) => v !== null && v !== undefined && v !== '')
      .flatMap(([k, v]) => [el('dt', {}, k), el('dd', {}, String(v))])),
    el('h4', {}, text ? 'body' : 'body (base64: not UTF-8)'),
    el('pre', { class: text ? 'body' : 'body base64' }, text ? m.body : m.body_base64 ?? ''));
}

async function lookup(ev) {
  ev.preventDefault();
  const topic = $('#lookup-topic').value.trim();
  const by = $('#lookup-by').value;
  const value = $('#lookup-value').value.trim();
  const out = $('#lookup-result');
  out.replaceChildren(el('p', { class: 'hint' }, 'looking…'));
  try {
    const q = `topic=${encodeURIComponent(topic)}&${by}=${encodeURIComponent(value)}`;
    const { messages } = await getJSON(`api/msg?${q}`);
    out.replaceChildren(...(messages.length ? messages.map(messageCard)
      : [el('p', { class: 'hint' }, `No message of topic ${topic} has ${by} ${value}.`)]));
  } catch (e) {
    out.replaceChildren(el('p', { class: 'error' }, `lookup failed: ${e.message}`));
  }
}

$('#lookup').addEventListener('submit', lookup);
connect();
refresh();
setInterval(showFreshness, 1000);
