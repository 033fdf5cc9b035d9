// shoal's dashboard: reads the live feed (GET /dashboard/events, SSE read through fetch so the API key
// travels in a header), draws the snapshot, and talks to the ordinary API for previews, placing,
// cancelling downloads and chat. No framework, no build step; every text from the cluster goes in as
// text, never as markup.
'use strict';

const KEY_ITEM = 'shoal-api-key';
let apiKey = sessionStorage.getItem(KEY_ITEM) || '';
let snapshot = null;
let keyWaiters = [];

// ---------- small helpers ----------
const $ = (sel) => document.querySelector(sel);
const SVG = 'http://www.w3.org/2000/svg';

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function svg(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function bytes(n) {
  if (n === null || n === undefined || !isFinite(n)) return '–';
  const units = ['B', 'kB', 'MB', 'GB', 'TB'];
  let i = 0;
  while (Math.abs(n) >= 1000 && i < units.length - 1) { n /= 1000; i++; }
  return (i === 0 ? n.toFixed(0) : n.toFixed(1)) + ' ' + units[i];
}
const rate = (n) => bytes(n) + '/s';
const pct = (x) => (x === null || x === undefined) ? '–' : (100 * x).toFixed(0) + '%';
function ms(us) {
  if (us === null || us === undefined) return '–';
  return us >= 1000 ? (us / 1000).toFixed(1) + ' ms' : us.toFixed(0) + ' µs';
}
function duration(s) {
  if (s === null || s === undefined || !isFinite(s)) return '–';
  if (s < 60) return s.toFixed(0) + ' s';
  if (s < 3600) return Math.floor(s / 60) + ' min ' + Math.round(s % 60) + ' s';
  return (s / 3600).toFixed(1) + ' h';
}
const short = (id) => (id || '').slice(-6);
function nodeName(id) {
  const n = snapshot && snapshot.nodes.find((n) => n.id === id);
  return n ? `${n.name} ·${short(id)}` : `·${short(id)}`;
}
function replace(target, ...children) { target.replaceChildren(...children.flat(Infinity)); }

// ---------- API key ----------
function headers(extra) {
  const h = Object.assign({}, extra || {});
  if (apiKey) h['Authorization'] = 'Bearer ' + apiKey;
  return h;
}

function askKey(message) {
  $('#key-dialog').hidden = false;
  $('#key-error').textContent = message || '';
  $('#key-input').focus();
  return new Promise((resolve) => keyWaiters.push(resolve));
}

$('#key-form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  apiKey = $('#key-input').value.trim();
  sessionStorage.setItem(KEY_ITEM, apiKey);
  $('#key-dialog').hidden = true;
  const waiters = keyWaiters;
  keyWaiters = [];
  waiters.forEach((w) => w());
});

async function api(method, path, body) {
  for (;;) {
    const init = { method, headers: headers(body ? { 'content-type': 'application/json' } : {}) };
    if (body) init.body = JSON.stringify(body);
    const r = await fetch(path, init);
    if (r.status === 401) { await askKey(apiKey ? 'That key was refused.' : ''); continue; }
    const text = await r.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch (_) { data = { error: { message: text } }; }
    if (!r.ok) {
      const msg = (data && data.error && (data.error.message || data.error)) || r.statusText;
      throw new Error(`${r.status}: ${msg}`);
    }
    return data;
  }
}

// Reads an SSE body as it arrives: calls onEvent({data, comment}) per event.
async function readSse(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += decoder.decode(value, { stream: true }).replace(/\r\n/g, '\n');
    let cut;
    while ((cut = buf.indexOf('\n\n')) >= 0) {
      const block = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      const data = [];
      const comments = [];
      for (const line of block.split('\n')) {
        if (line.startsWith('data:')) data.push(line.slice(5).replace(/^ /, ''));
        else if (line.startsWith(':')) comments.push(line.slice(1).replace(/^ /, ''));
      }
      onEvent({ data: data.length ? data.join('\n') : null, comments });
    }
  }
}

// ---------- live feed ----------
function setLive(on, text) {
  const l = $('#live');
  l.classList.toggle('off', !on);
  l.textContent = text || (on ? 'live' : 'disconnected');
}

async function follow() {
  for (;;) {
    try {
      const r = await fetch('/dashboard/events', { headers: headers() });
      if (r.status === 401) { setLive(false, 'key needed'); await askKey(apiKey ? 'That key was refused.' : ''); continue; }
      if (!r.ok) throw new Error(r.statusText);
      setLive(true);
      await readSse(r, (ev) => {
        if (ev.data === null) return;
        const s = JSON.parse(ev.data);
        if (s.error) { setLive(false, s.error); return; }
        snapshot = s;
        render();
      });
    } catch (e) {
      console.warn('feed:', e);
    }
    setLive(false);
    await new Promise((r) => setTimeout(r, 1000));
  }
}

// ---------- rendering ----------
function render() {
  const s = snapshot;
  $('#summary').textContent =
    `${s.nodes.length} node${s.nodes.length === 1 ? '' : 's'} · ${s.instances.length} instance${s.instances.length === 1 ? '' : 's'} · this node ${nodeName(s.node)}`;
  renderTopology(s);
  renderNodes(s);
  renderInstances(s);
  renderDownloads(s);
  renderModels(s);
}

function renderTopology(s) {
  const g = $('#topology');
  const W = 800, H = 240, cx = W / 2, cy = H / 2;
  const n = s.nodes.length;
  const r = n <= 1 ? 0 : Math.min(330, 220 + 20 * n);
  const pos = {};
  s.nodes.forEach((node, i) => {
    const a = -Math.PI / 2 + (2 * Math.PI * i) / Math.max(n, 1) + (n === 2 ? Math.PI / 2 : 0);
    pos[node.id] = [cx + r * Math.cos(a), cy + (r * 0.3) * Math.sin(a)];
  });
  const parts = [];
  for (const l of s.links) {
    const [a, b] = [pos[l.a], pos[l.b]];
    if (!a || !b) continue;
    const flow = (l.a_to_b_bytes_per_s || 0) + (l.b_to_a_bytes_per_s || 0);
    parts.push(svg('line', {
      class: 'link' + (flow > 0 ? ' busy' : ''), x1: a[0], y1: a[1], x2: b[0], y2: b[1],
      'data-a': l.a, 'data-b': l.b,
    }));
    const mx = (a[0] + b[0]) / 2, my = (a[1] + b[1]) / 2;
    const t = svg('text', { class: 'label link-label', x: mx, y: my - 18, 'data-a': l.a, 'data-b': l.b });
    t.append(svg('tspan', { x: mx, dy: 0 }, `${l.kind} · rtt ${ms(l.rtt_us)} · ${l.bandwidth_bps ? rate(l.bandwidth_bps) : 'bandwidth –'}`));
    t.append(svg('tspan', { x: mx, dy: 15 },
      `${short(l.a)}→${short(l.b)} ${rate(l.a_to_b_bytes_per_s)} · ${short(l.b)}→${short(l.a)} ${rate(l.b_to_a_bytes_per_s)}`));
    parts.push(t);
  }
  for (const node of s.nodes) {
    const [x, y] = pos[node.id];
    const grp = svg('g', { class: 'node' + (node.me ? ' me' : ''), 'data-node': node.id });
    const R = 42;
    grp.append(svg('circle', { cx: x, cy: y, r: R }));
    const used = node.memory ? (node.memory.used || 0) : 0;
    if (used > 0) {
      const c = 2 * Math.PI * (R + 4);
      grp.append(svg('circle', {
        class: 'mem', cx: x, cy: y, r: R + 4, 'stroke-dasharray': `${c * used} ${c}`,
        transform: `rotate(-90 ${x} ${y})`,
      }));
    }
    grp.append(svg('text', { x, y: y - 6 }, node.name || short(node.id)));
    grp.append(svg('text', { class: 'small', x, y: y + 9 }, '·' + short(node.id)));
    grp.append(svg('text', { class: 'small', x, y: y + 23 }, node.tok_s > 0 ? `${node.tok_s.toFixed(1)} tok/s` : `${node.cpu_cores} cores`));
    parts.push(grp);
  }
  replace(g, parts);
}

// Facts shown in their own lines; any other field a node publishes (CPU load, temperature, power, …)
// is listed as it comes.
const KNOWN = new Set(['id', 'name', 'api_url', 'memory', 'cpu_cores', 'accelerator', 'backend', 'started',
  'me', 'coordinator', 'running', 'queued', 'tok_s', 'gpus']);

// Each GPU a node found, by name and backend ("none" without one: it computes on its CPU).
function gpuList(gpus) {
  if (!gpus || gpus.length === 0) return 'none';
  return gpus.map((g) => {
    let text = `${g.name} · ${g.backend}`;
    if (g.memory_total) text += ` · ${(g.memory_total / 2 ** 30).toFixed(1)} GiB`;
    if (g.q4_k_bytes_per_s) text += ` · q4_k ${(g.q4_k_bytes_per_s / 1e9).toFixed(2)} GB/s`;
    return text;
  }).join('; ');
}

function factValue(k, v) {
  if (v === null || v === undefined) return '–';
  if (k === 'cpu_load' && typeof v === 'number') return pct(v);
  if (k.endsWith('_c') && typeof v === 'number') return v.toFixed(0) + ' °C';
  if (k.endsWith('_w') && typeof v === 'number') return v.toFixed(1) + ' W';
  if (typeof v === 'number') return Number.isInteger(v) ? String(v) : v.toFixed(2);
  if (typeof v === 'object') {
    return Object.entries(v).filter(([, x]) => x !== null && typeof x !== 'object')
      .map(([k, x]) => `${k} ${typeof x === 'number' && !Number.isInteger(x) ? x.toFixed(2) : x}`).join(', ') || '–';
  }
  return String(v);
}

function renderNodes(s) {
  const cards = s.nodes.map((n) => {
    const m = n.memory || {};
    const extra = Object.entries(n).filter(([k, v]) => !KNOWN.has(k) && v !== null && v !== undefined);
    return el('div', { class: 'card node-card', 'data-node': n.id },
      el('h3', {}, n.name || short(n.id), el('span', { class: 'muted' }, '·' + short(n.id)),
        n.me && el('span', { class: 'badge' }, 'this node'),
        n.coordinator && el('span', { class: 'badge' }, 'coordinator')),
      el('dl', {},
        el('dt', {}, 'cores'), el('dd', {}, `${n.cpu_cores} · ${n.accelerator || ''} ${n.backend || ''}`),
        el('dt', {}, 'gpu'), el('dd', { class: 'gpus' }, gpuList(n.gpus)),
        el('dt', {}, 'memory'), el('dd', {}, `${bytes(m.total - m.available)} of ${bytes(m.total)} used`,
          el('div', { class: 'bar' }, el('div', { style: `width:${Math.round(100 * (m.used || 0))}%` }))),
        el('dt', {}, 'pressure'), el('dd', {}, pct(m.pressure)),
        el('dt', {}, 'serving'), el('dd', { class: 'tok-s' }, `${(n.tok_s || 0).toFixed(1)} tok/s · ${n.running} running · ${n.queued} queued`),
        extra.map(([k, v]) => [el('dt', {}, k.replace(/_(c|w)$/, '').replace(/_/g, ' ')), el('dd', {}, factValue(k, v))]),
        el('dt', {}, 'api'), el('dd', {}, n.api_url || '–')));
  });
  replace($('#nodes'), cards);
}

/** " · gpu:0 ×k layers" when a stage's first layers run on a GPU of its node, else nothing. */
function gpuLabel(st) {
  return st.gpu ? ` · gpu:${st.gpu.index} ×${st.gpu.layers} layers` : '';
}

/** " · with B, C (tensor-parallel, weights 2:1:1)" when a group computes the stage, else nothing. */
function groupLabel(st) {
  if (!st.group) return '';
  return ` · with ${st.group.members.map(nodeName).join(', ')} (tensor-parallel, weights ${st.group.weights.join(':')})`;
}

function stageLabel(st) {
  if (st.state === 'downloading' && st.needed) return `downloading ${pct(st.done / st.needed)}`;
  if (st.state === 'failed') return 'failed';
  return st.state || 'waiting';
}

// The states each instance went through while this page watched, with when each began.
const instanceHistory = new Map();

function historyOf(i) {
  let h = instanceHistory.get(i.id);
  if (!h) { h = []; instanceHistory.set(i.id, h); }
  if (!h.length || h[h.length - 1].status !== i.status) h.push({ status: i.status, at: performance.now() });
  return h;
}

function historyText(h) {
  if (h.length < 2) return '';
  const took = (h[h.length - 1].at - h[0].at) / 1000;
  return `${h.map((x) => x.status).join(' → ')} (${took.toFixed(1)} s)`;
}

// Speculative decoding's acceptance since the instance started, when it drafted at all.
function speculationText(m) {
  if (!m.drafted_tokens) return '';
  const rate = 100 * (m.accepted_tokens || 0) / m.drafted_tokens;
  const perPass = m.spec_passes ? ((m.accepted_tokens || 0) + m.spec_passes) / m.spec_passes : 0;
  return ` · drafts ${rate.toFixed(0)}% accepted, ${perPass.toFixed(1)} tokens a pass`;
}

function renderInstances(s) {
  if (!s.instances.length) { replace($('#instances'), el('p', { class: 'muted' }, 'No instance.')); return; }
  replace($('#instances'), s.instances.map((i) => {
    const layers = i.stages.reduce((t, st) => t + (st.end - st.start), 0) || 1;
    const m = i.measured || {};
    const h = historyOf(i);
    return el('div', {
      class: 'instance', 'data-instance': i.id, 'data-model': i.model, 'data-status': i.status,
      'data-history': h.map((x) => x.status).join(' '),
    },
      el('div', {}, el('strong', {}, i.model), ' ', el('span', { class: 'badge ' + i.status }, i.status),
        ' ', el('span', { class: 'muted' }, i.id), ' ', el('span', { class: 'muted' }, historyText(h))),
      el('div', { class: 'stages' }, i.stages.map((st) => el('div', {
        class: 'stage ' + (st.state || ''), style: `flex:${st.end - st.start}`,
        title: st.error || '',
        'data-group': st.group ? st.group.members.join(' ') : '',
      }, `${nodeName(st.node)} · layers ${st.start}–${st.end - 1}${gpuLabel(st)}${groupLabel(st)} · ${stageLabel(st)}`))),
      el('div', { class: 'muted' },
        `predicted ${i.predicted_tok_s ? i.predicted_tok_s.toFixed(1) : '–'} tok/s · measured ` +
        `${m.decode_tok_s ? m.decode_tok_s.toFixed(1) : '–'} tok/s, TTFT ${m.ttft_ms ? m.ttft_ms.toFixed(0) + ' ms' : '–'} · ` +
        `${m.running || 0} running, ${m.finished || 0} served · ${layers} layers` + speculationText(m)));
  }));
}

function renderDownloads(s) {
  if (!s.downloads.length) { replace($('#downloads'), el('p', { class: 'muted' }, 'No download.')); return; }
  replace($('#downloads'), s.downloads.map((d) => {
    const frac = d.needed ? d.done / d.needed : 0;
    return el('div', { class: 'download', 'data-model': d.model, 'data-node': d.node },
      el('div', {}, el('strong', {}, d.model), ' on ', nodeName(d.node), ' ',
        el('span', { class: 'badge ' + d.state }, d.state),
        d.state === 'running' && el('button', {
          class: 'danger', style: 'float:right',
          onclick: (ev) => cancelDownload(ev.target, d),
        }, 'Cancel')),
      el('div', { class: 'bar' }, el('div', { style: `width:${(100 * frac).toFixed(1)}%` })),
      el('div', { class: 'muted' },
        `${bytes(d.done)} of ${bytes(d.needed)} (${pct(frac)}) · ${rate(d.bytes_per_s)} · ETA ${duration(d.eta_s)}`),
      d.error && el('div', { class: 'error' }, d.error));
  }));
}

async function cancelDownload(button, d) {
  button.disabled = true;
  try {
    await api('DELETE', `/downloads/${encodeURIComponent(d.model).replace(/%2F/g, '/')}?node=${encodeURIComponent(d.node)}`);
  } catch (e) {
    alert(`Cancelling failed: ${e.message}`);
    button.disabled = false;
  }
}

function fillSelect(select, ids) {
  const current = select.value;
  const have = [...select.options].map((o) => o.value);
  if (have.join('\n') === ids.join('\n')) return;
  replace(select, ids.map((id) => el('option', { value: id }, id)));
  if (ids.includes(current)) select.value = current;
}

function renderModels(s) {
  replace($('#models'), s.models.map((m) => el('span', { class: 'model', 'data-model': m.id },
    m.id, el('span', { class: 'badge ' + (m.online ? 'online' : 'offline') },
      m.online ? `on ${m.nodes.length} node${m.nodes.length === 1 ? '' : 's'}` : 'offline'),
    m.bytes ? el('span', { class: 'muted' }, bytes(m.bytes)) : null)));
  fillSelect($('#preview-model'), s.models.filter((m) => m.online).map((m) => m.id));
  const served = [...new Set(s.instances.filter((i) => i.status === 'ready').map((i) => i.model))];
  const chat = [...served, ...s.models.filter((m) => m.online && !served.includes(m.id)).map((m) => m.id)];
  fillSelect($('#chat-model'), chat);
}

// ---------- placement previews ----------
$('#preview-button').addEventListener('click', async () => {
  const model = $('#preview-model').value;
  if (!model) return;
  const out = $('#previews');
  replace(out, el('p', { class: 'muted' }, 'Planning…'));
  try {
    const data = await api('GET', `/instance/previews?model=${encodeURIComponent(model)}`);
    if (!data.previews.length) { replace(out, el('p', { class: 'muted' }, 'No placement fits.')); return; }
    replace(out, data.previews.map((p, k) => {
      const pr = p.prediction || {};
      return el('div', { class: 'preview', 'data-preview': k },
        el('div', {}, el('strong', {}, `#${k + 1}`), ' ',
          `${pr.decode_tok_s ? pr.decode_tok_s.toFixed(1) : '–'} tok/s one stream · ` +
          `${ms(p.predicted_token_latency_us)}/token · TTFT ${pr.ttft_us ? (pr.ttft_us / 1000).toFixed(0) + ' ms' : '–'}` +
          (pr.prompt_tokens ? ` for ${pr.prompt_tokens} tokens` : ''),
          el('button', { class: 'place', style: 'float:right', onclick: (ev) => place(ev.target, model, p) }, 'Place')),
        el('div', { class: 'stages' }, p.stages.map((st) => el('div', { class: 'stage', style: `flex:${st.end - st.start}` },
          `${nodeName(st.node)} · layers ${st.start}–${st.end - 1}${groupLabel(st)}`))),
        el('ul', { class: 'reasons' }, (p.nodes || []).map((n) => el('li', { class: n.used ? 'in' : 'out' },
          `${nodeName(n.node)}: ${n.reason}`))));
    }));
  } catch (e) {
    replace(out, el('p', { class: 'error' }, e.message));
  }
});

async function place(button, model, p) {
  button.disabled = true;
  button.textContent = 'Placing…';
  try {
    const grouped = p.stages.some((s) => s.group);
    // A group of every layer is asked for as one; a pipeline with a group in it is left to the planner
    // on the same nodes (a manual split names one node a stage).
    const body = !grouped ? { model, nodes: p.stages.map((s) => s.node), layers: p.stages.map((s) => s.end - s.start) }
      : p.stages.length === 1 ? { model, nodes: [p.stages[0].node, ...p.stages[0].group.members], tensor_parallel: true }
        : { model, nodes: p.stages.flatMap((s) => [s.node, ...(s.group ? s.group.members : [])]) };
    const rec = await api('POST', '/instance', body);
    button.textContent = `Placed ${rec.id}`;
  } catch (e) {
    button.textContent = 'Place';
    button.disabled = false;
    alert(`Placing failed: ${e.message}`);
  }
}

// ---------- chat ----------
let conversation = [];
let stopChat = null;

$('#chat-stop').addEventListener('click', () => { if (stopChat) stopChat.abort(); });

$('#chat-clear').addEventListener('click', () => { conversation = []; replace($('#chat-log')); $('#chat-stats').textContent = ''; });

$('#chat-input').addEventListener('keydown', (ev) => {
  if (ev.key === 'Enter' && !ev.shiftKey) { ev.preventDefault(); $('#chat-form').requestSubmit(); }
});

$('#chat-form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const text = $('#chat-input').value.trim();
  const model = $('#chat-model').value;
  if (!text || !model) return;
  $('#chat-input').value = '';
  $('#chat-send').disabled = true;
  const log = $('#chat-log');
  log.append(el('div', { class: 'msg user' }, text));
  const answer = el('div', { class: 'msg assistant' });
  log.append(answer);
  conversation.push({ role: 'user', content: text });
  stopChat = new AbortController();
  $('#chat-stop').hidden = false;
  try {
    const reply = await chat(model, answer, stopChat.signal);
    conversation.push({ role: 'assistant', content: reply });
  } catch (e) {
    if (e.name === 'AbortError') {
      // Stopped by the user: the server cancels the request when the connection closes.
      answer.append(el('span', { class: 'muted' }, ' (stopped)'));
      conversation.push({ role: 'assistant', content: answer.firstChild ? answer.firstChild.textContent : '' });
    } else {
      answer.classList.add('error');
      answer.textContent = e.message;
      conversation.pop();
    }
  } finally {
    stopChat = null;
    $('#chat-stop').hidden = true;
    $('#chat-send').disabled = false;
    $('#prefill').hidden = true;
  }
});

// Streams one answer into `answer`: a prefill bar with ETA while the prompt is processed (the server's
// `: prefill {"done":…,"total":…}` comments), then tokens per second while it decodes.
async function chat(model, answer, signal) {
  const started = performance.now();
  const body = {
    model, messages: conversation, stream: true,
    stream_options: { include_usage: true, include_progress: true },
  };
  let r;
  for (;;) {
    r = await fetch('/v1/chat/completions', {
      method: 'POST', headers: headers({ 'content-type': 'application/json' }), body: JSON.stringify(body), signal,
    });
    if (r.status !== 401) break;
    await askKey(apiKey ? 'That key was refused.' : '');
  }
  if (!r.ok) {
    let msg = r.statusText;
    try { msg = (await r.json()).error.message; } catch (_) { /* keep the status text */ }
    throw new Error(`${r.status}: ${msg}`);
  }
  const stats = $('#chat-stats');
  const bar = $('#prefill-bar'), barText = $('#prefill-text');
  let text = '', tokens = 0, firstAt = null, prefillStart = null, failure = null;
  stats.textContent = 'waiting for the first token…';
  await readSse(r, (ev) => {
    for (const c of ev.comments) {
      if (!c.startsWith('prefill ') || firstAt !== null) continue;
      const p = JSON.parse(c.slice(8));
      const now = performance.now();
      if (prefillStart === null) prefillStart = { t: now, done: p.done };
      $('#prefill').hidden = false;
      bar.max = p.total;
      bar.value = p.done;
      const speed = (p.done - prefillStart.done) / ((now - prefillStart.t) / 1000);
      const eta = speed > 0 ? (p.total - p.done) / speed : null;
      barText.textContent = `prompt ${p.done} / ${p.total} tokens` + (eta !== null ? ` · ETA ${duration(eta)}` : '');
    }
    if (ev.data === null || ev.data === '[DONE]') return;
    const chunk = JSON.parse(ev.data);
    if (chunk.error) { failure = chunk.error.message || 'the request failed'; return; }
    for (const ch of chunk.choices || []) {
      const piece = ch.delta && ch.delta.content;
      if (piece) {
        const now = performance.now();
        if (firstAt === null) { firstAt = now; $('#prefill').hidden = true; }
        tokens++;
        text += piece;
        answer.textContent = text;
        $('#chat-log').scrollTop = $('#chat-log').scrollHeight;
        const secs = (now - firstAt) / 1000;
        stats.textContent = `TTFT ${((firstAt - started) / 1000).toFixed(2)} s · ` +
          (secs > 0 ? `${((tokens - 1) / secs).toFixed(1)} tok/s` : 'decoding…');
      }
    }
    if (chunk.usage) {
      const u = chunk.usage;
      const secs = firstAt !== null ? (performance.now() - firstAt) / 1000 : 0;
      stats.textContent = `${u.prompt_tokens} prompt + ${u.completion_tokens} generated tokens · TTFT ` +
        `${firstAt !== null ? ((firstAt - started) / 1000).toFixed(2) + ' s' : '–'}` +
        (secs > 0 && u.completion_tokens > 1 ? ` · ${((u.completion_tokens - 1) / secs).toFixed(1)} tok/s` : '');
    }
  });
  if (failure) throw new Error(failure);
  return text;
}

follow();
