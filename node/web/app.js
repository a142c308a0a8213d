// scopenode browser client: plain ES module, no dependencies, no build step.
// Speaks protocol version 1 over ws://<same host>/v1/ws. Message text is only
// ever put into the page through textContent / text nodes (see renderMarkdown).

const STORAGE_TOKEN = "scopenode.token";
const STORAGE_WORKSPACE = "scopenode.workspace";
const STORAGE_SCOPE = "scopenode.scope";
const STORAGE_THREADS = "scopenode.threads";
const STORAGE_OUTBOX = "scopenode.outbox";
const PAGE = 50;
const BACKOFF_BASE_MS = 1000;
// Short enough that a node restarted after a brief outage is found within seconds.
const BACKOFF_MAX_MS = 10000;
const GROUP_WINDOW_MS = 5 * 60 * 1000;
const SAFE_PROTOCOLS = new Set(["http:", "https:", "mailto:"]);
const BASE_TITLE = "scopenode";

const $ = (id) => document.getElementById(id);

const state = {
  token: "",
  workspace: "",
  ws: null,
  wantOnline: false,
  attempt: 0,
  reconnectTimer: null,
  reconnectAt: 0,
  countdownTimer: null,
  pingTimer: null,
  nextId: 1,
  pending: new Map(), // request id -> {resolve, reject, op}
  me: null,
  scopes: new Map(), // scopeId -> scope summary from `scopes`
  lastSeen: new Map(), // scopeId -> highest seq observed (for hello.resume)
  current: null, // scopeId open in the main view
  view: null, // {scopeId, messages: Map(seq -> message), hasMore, loading}
  readSent: new Map(), // scopeId -> seq last sent with markRead
  panel: null, // {kind: "members"} | {kind: "thread", ...}
  scopesRefresh: null,
  threads: loadJson(STORAGE_THREADS, {}), // thread scopeId -> {label, rootId, parentId}
  replyCounts: new Map(), // root message id -> replies seen by this client
  dmPeers: new Map(), // dm scopeId -> member view of the other participant
  people: new Map(), // memberId -> member view (from `people`, else from rosters)
  outbox: loadJson(STORAGE_OUTBOX, []), // queued sends, resent with the same clientMessageId
  flushing: false,
  unsupported: new Set(), // ops this node answered as unknown
  owners: new Map(), // channel scopeId -> channelOwnerId (from `members`)
  pickerFor: null, // "<where>:<messageId>" whose emoji picker is open
  editing: null, // {key, messageId, draft, error, saving}
  sources: new Map(), // cited messageId -> {status: "loading" | "ok" | "gone", message}
  resolving: new Set(), // message ids whose pending sources are being read
  blobs: new Map(), // attachment id -> Promise of a blob: URL (fetched with the bearer token)
  blobUrls: new Map(), // attachment id -> blob: URL once fetched
  composers: { main: { quote: null, uploads: [] }, thread: { quote: null, uploads: [] } },
};

const COMMON_EMOJI = ["👍", "❤️", "😂", "🎉", "🙏", "👀", "✅", "🚀"];
const PREVIEW_TYPES = /^image\/(png|jpeg|gif|webp|avif|bmp)$/i;

function loadJson(key, fallback) {
  try {
    return JSON.parse(localStorage.getItem(key) || "null") ?? fallback;
  } catch {
    return fallback;
  }
}

function saveOutbox() {
  localStorage.setItem(STORAGE_OUTBOX, JSON.stringify(state.outbox));
}

function rememberThread(scopeId, root, parentId) {
  if (!scopeId || !root) return;
  const parent = state.scopes.get(parentId || root.scopeId);
  const excerpt = (root.content || "").replace(/\s+/g, " ").slice(0, 40);
  const where = parent?.slug ? `#${parent.slug}` : "thread";
  state.threads[scopeId] = { label: `${where}: ${excerpt}`, rootId: root.id, parentId: root.scopeId };
  localStorage.setItem(STORAGE_THREADS, JSON.stringify(state.threads));
}

// ---------------------------------------------------------------- helpers

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function show(node, visible) {
  node.hidden = !visible;
}

function setText(node, text) {
  node.textContent = text || "";
  show(node, Boolean(text));
}

function randomId() {
  if (crypto.randomUUID && window.isSecureContext) return "web-" + crypto.randomUUID();
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return "web-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

const ERROR_WORDS = {
  forbidden: "You are not allowed to do that here.",
  not_found: "That no longer exists.",
  rate_limited: "Too many requests — slowing down.",
  unavailable: "The node is busy — trying again.",
  disconnected: "Not connected.",
  validation_failed: "That was not accepted.",
  invalid_target: "That conversation cannot be found.",
  conflict: "The message changed meanwhile — reload it and try again.",
  search_unavailable: "Search is not ready yet.",
  unsupported: "This node does not support that yet.",
};

function moderationWords(err) {
  const matched = (err?.details?.matched || []).map((word) => `“${word}”`).join(", ");
  return (
    "Not sent: this workspace does not allow " +
    (matched ? `the words ${matched}` : "some of these words") +
    ". Your text is kept — change it and send again."
  );
}

function describeError(err) {
  if (!err) return "unknown error";
  if (err.code) {
    const words = ERROR_WORDS[err.code];
    return words ? `${words}${err.message ? ` (${err.message})` : ""}` : `${err.code}: ${err.message || "request failed"}`;
  }
  return err.message || String(err);
}

function formatTime(iso) {
  const at = new Date(iso);
  if (Number.isNaN(at.getTime())) return "";
  const sameDay = at.toDateString() === new Date().toDateString();
  return sameDay
    ? at.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" })
    : at.toLocaleString([], { dateStyle: "short", timeStyle: "short" });
}

function personName(member) {
  if (!member) return "";
  return member.displayName || member.handle || member.id || member.memberId || "";
}

function scopeLabel(scope) {
  if (!scope) return "";
  switch (scope.type) {
    case "channel":
      return "#" + (scope.slug || scope.name || scope.id);
    case "dm": {
      const peer = state.dmPeers.get(scope.id);
      if (peer) return peer.id === state.me?.id ? `${personName(peer)} (you)` : personName(peer);
      return scope.name || "Direct message";
    }
    case "thread":
      return state.threads[scope.id]?.label || scope.name || "Thread";
    case "task":
      return "Task " + (scope.name || scope.id);
    default:
      return scope.name || scope.slug || scope.id;
  }
}

function observe(scopeId, seq) {
  if (typeof seq !== "number") return;
  if (seq > (state.lastSeen.get(scopeId) ?? -1)) state.lastSeen.set(scopeId, seq);
}

// ---------------------------------------------------------------- markdown

// A deliberately small Markdown subset: fenced code, quotes, paragraphs;
// inline code, **bold**, *italic*/_italic_, [links](url), bare URLs, @mentions.
// Every piece of message text becomes a text node: no HTML is ever parsed.

const NOT_BEFORE_MENTION = /[A-Za-z0-9_.+\-%/@]/;
const MAX_DEPTH = 4;

function renderMarkdown(content, message) {
  const frag = document.createDocumentFragment();
  const lines = String(content ?? "").split(/\r\n|\r|\n/);
  for (const block of blocks(lines, message, 0)) frag.append(block);
  return frag;
}

function blocks(lines, message, depth) {
  const out = [];
  let para = [];
  const flush = () => {
    if (para.length) out.push(el("p", {}, inline(para.join("\n"), message, 0)));
    para = [];
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = /^ {0,3}(`{3,}|~{3,})(.*)$/.exec(line);
    if (fence && !(fence[1][0] === "`" && fence[2].includes("`"))) {
      flush();
      const char = fence[1][0];
      const closing = new RegExp(`^ {0,3}\\${char}{${fence[1].length},}\\s*$`);
      const body = [];
      i++;
      while (i < lines.length && !closing.test(lines[i])) body.push(lines[i++]);
      const lang = fence[2].trim().split(/\s/)[0];
      out.push(
        el("pre", { "data-lang": lang || null }, el("code", {}, document.createTextNode(body.join("\n")))),
      );
      continue;
    }
    if (/^ {0,3}>/.test(line)) {
      flush();
      const quoted = [];
      while (i < lines.length && /^ {0,3}>/.test(lines[i])) {
        quoted.push(lines[i].replace(/^ {0,3}> ?/, ""));
        i++;
      }
      i--;
      // Quoted text is inert for routing; nested quotes render up to a small depth.
      const inner =
        depth < MAX_DEPTH
          ? blocks(quoted, null, depth + 1)
          : [el("p", {}, document.createTextNode(quoted.join("\n")))];
      out.push(el("blockquote", {}, inner));
      continue;
    }
    if (!line.trim()) {
      flush();
      continue;
    }
    para.push(line);
  }
  flush();
  return out;
}

function safeUrl(raw) {
  let url;
  try {
    url = new URL(raw);
  } catch {
    return null;
  }
  return SAFE_PROTOCOLS.has(url.protocol) ? url.href : null;
}

function linkNode(href, children) {
  return el("a", { href, target: "_blank", rel: "noopener noreferrer" }, children);
}

function mentionNode(handle, message) {
  const lower = handle.toLowerCase();
  const live = message && (message.mentions || []).map((h) => h.toLowerCase()).includes(lower);
  if (!live) return null;
  const mine = state.me && state.me.handle.toLowerCase() === lower;
  return el("span", { class: "mention" + (mine ? " me" : ""), "data-handle": lower }, "@" + handle);
}

function inline(text, message, depth) {
  const out = [];
  let buf = "";
  const flush = () => {
    if (buf) out.push(document.createTextNode(buf));
    buf = "";
  };
  let i = 0;
  while (i < text.length) {
    const ch = text[i];
    const prev = i > 0 ? text[i - 1] : "";
    const rest = text.slice(i);
    if (ch === "`") {
      const run = /^`+/.exec(rest)[0];
      const after = text.slice(i + run.length);
      const close = new RegExp(`(^|[^\`])${run}(?!\`)`).exec(after);
      if (close) {
        const end = close.index + close[1].length;
        flush();
        out.push(el("code", {}, document.createTextNode(after.slice(0, end))));
        i += run.length + end + run.length;
        continue;
      }
      buf += run;
      i += run.length;
      continue;
    }
    if ((ch === "_" && rest.startsWith("__")) || rest.startsWith("***")) {
      // Runs like `__init__` or `***` stay literal: only **bold**, *em* and _em_ are markup.
      const run = ch === "_" ? /^_+/.exec(rest)[0] : /^\*+/.exec(rest)[0];
      buf += run;
      i += run.length;
      continue;
    }
    if (depth < MAX_DEPTH && (ch === "*" || ch === "_")) {
      const strong = ch === "*" && rest.startsWith("**");
      const marker = strong ? "**" : ch;
      const wordy = ch === "_" && /[A-Za-z0-9]/.test(prev);
      const start = i + marker.length;
      const end = wordy ? -1 : text.indexOf(marker, start + 1);
      const inner = end > 0 ? text.slice(start, end) : "";
      const closesWordy = ch === "_" && /[A-Za-z0-9]/.test(text[end + 1] || "");
      const edgy = inner.startsWith(ch) || inner.endsWith(ch) || text[end + marker.length] === ch;
      if (inner && !edgy && !/^\s|\s$/.test(inner) && !inner.includes("\n\n") && !closesWordy) {
        flush();
        out.push(el(strong ? "strong" : "em", {}, inline(inner, message, depth + 1)));
        i = end + marker.length;
        continue;
      }
    }
    if (ch === "[") {
      const link = /^\[([^\]\n]{1,500})\]\(([^()\s]{1,2000})\)/.exec(rest);
      const href = link && safeUrl(link[2]);
      if (href) {
        flush();
        out.push(linkNode(href, inline(link[1], message, MAX_DEPTH)));
        i += link[0].length;
        continue;
      }
    }
    if ((ch === "h" || ch === "m") && !/[A-Za-z0-9]/.test(prev)) {
      const bare = /^(?:https?:\/\/|mailto:)[^\s<>"]+/.exec(rest);
      if (bare) {
        const raw = bare[0].replace(/[.,;:!?)'\]]+$/, "");
        const href = safeUrl(raw);
        if (href) {
          flush();
          out.push(linkNode(href, raw));
          i += raw.length;
          continue;
        }
      }
    }
    if (ch === "@" && !NOT_BEFORE_MENTION.test(prev)) {
      const token = /^@([A-Za-z0-9][A-Za-z0-9_.-]*)/.exec(rest);
      if (token) {
        const handle = token[1].replace(/[.-]+$/, "");
        const node = mentionNode(handle, message);
        if (node) {
          flush();
          out.push(node);
          i += 1 + handle.length;
          continue;
        }
      }
    }
    buf += ch;
    i += 1;
  }
  flush();
  return out;
}

function mentionsMe(message) {
  if (!state.me || !message) return false;
  const mine = state.me.handle.toLowerCase();
  return (message.mentions || []).some((h) => h.toLowerCase() === mine);
}

// ---------------------------------------------------------------- connection

function wsUrl() {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const query = state.workspace ? "?workspace=" + encodeURIComponent(state.workspace) : "";
  return `${scheme}//${location.host}/v1/ws${query}`;
}

function setStatus(text, kind) {
  const node = $("conn-status");
  if (node.textContent !== text) node.textContent = text;
  node.dataset.kind = kind;
  show($("retry-now"), kind === "down");
}

async function learnWorkspace() {
  // The token names its workspace; the node tells us which, so the
  // `?workspace=` routing parameter is right from the first connect.
  try {
    const response = await fetch("/v1/whoami", {
      headers: { Authorization: "Bearer " + state.token },
      cache: "no-store",
    });
    if (response.status === 401 || response.status === 403) return "rejected";
    if (!response.ok) return "unknown";
    const body = await response.json();
    if (body.workspaceId) state.workspace = body.workspaceId;
    return "ok";
  } catch {
    return "unknown"; // node unreachable: the socket's reconnect loop takes over
  }
}

function connect() {
  clearTimeout(state.reconnectTimer);
  clearInterval(state.countdownTimer);
  state.reconnectTimer = null;
  state.wantOnline = true;
  setStatus(state.attempt ? "Reconnecting…" : "Connecting…", "pending");
  let ws;
  try {
    ws = new WebSocket(wsUrl());
  } catch (err) {
    scheduleReconnect();
    return;
  }
  state.ws = ws;
  ws.addEventListener("open", () => {
    const hello = {
      type: "hello",
      token: state.token,
      client: { kind: "browser", name: "scopenode-web", version: "2" },
    };
    if (state.lastSeen.size) hello.resume = Object.fromEntries(state.lastSeen);
    ws.send(JSON.stringify(hello));
  });
  ws.addEventListener("message", (event) => {
    if (ws !== state.ws || typeof event.data !== "string") return;
    // A server frame may coalesce several JSON objects separated by "\n".
    for (const line of event.data.split("\n")) {
      if (!line.trim()) continue;
      let frame;
      try {
        frame = JSON.parse(line);
      } catch {
        console.warn("unparseable frame", line);
        continue;
      }
      try {
        dispatch(frame);
      } catch (err) {
        console.error("handling", frame, err);
      }
    }
  });
  ws.addEventListener("close", (event) => {
    if (ws !== state.ws) return;
    state.ws = null;
    state.connected = false;
    clearInterval(state.pingTimer);
    for (const [, waiter] of state.pending) {
      waiter.reject({ code: "disconnected", message: "connection lost", retryable: true });
    }
    state.pending.clear();
    onClosed(event.code, event.reason);
  });
}

function onClosed(code, reason) {
  state.connected = false;
  if (!state.wantOnline) return;
  if (code === 4401 || code === 4403) {
    const why =
      code === 4401
        ? "That token was not accepted. Check it and sign in again."
        : "That token belongs to another workspace.";
    logout(why + (reason ? ` (${reason})` : ""));
    return;
  }
  if (code === 4429 || code === 4503) {
    // Slow consumer or node draining: come back promptly and resume.
    state.attempt = Math.min(state.attempt, 1);
  }
  scheduleReconnect();
}

function scheduleReconnect() {
  if (!state.wantOnline) return;
  const delay = Math.min(BACKOFF_MAX_MS, BACKOFF_BASE_MS * 2 ** state.attempt);
  const jittered = Math.round(delay / 2 + Math.random() * (delay / 2));
  state.attempt += 1;
  state.reconnectAt = Date.now() + jittered;
  state.reconnectTimer = setTimeout(connect, jittered);
  const tick = () => {
    const left = Math.max(1, Math.ceil((state.reconnectAt - Date.now()) / 1000));
    setStatus(`Reconnecting in ${left} s…`, "down");
  };
  tick();
  clearInterval(state.countdownTimer);
  state.countdownTimer = setInterval(tick, 250);
  renderPending();
}

function retryNow() {
  if (!state.wantOnline || state.ws) return;
  connect();
}

function request(type, fields = {}) {
  return new Promise((resolve, reject) => {
    const ws = state.ws;
    if (!ws || ws.readyState !== WebSocket.OPEN || !state.connected) {
      reject({ code: "disconnected", message: "not connected", retryable: true });
      return;
    }
    const id = state.nextId++;
    state.pending.set(id, { resolve, reject, op: type });
    ws.send(JSON.stringify({ type, id, ...fields }));
  });
}

function supports(op) {
  return !state.unsupported.has(op);
}

function markUnsupported(op) {
  if (state.unsupported.has(op)) return;
  state.unsupported.add(op);
  for (const [id, waiter] of state.pending) {
    if (waiter.op !== op) continue;
    state.pending.delete(id);
    waiter.reject({ code: "unsupported", message: `${op} is not supported by this node`, retryable: false });
  }
  if (op === "search") show($("search-form"), false);
  show($("attach-button"), supports("attachments"));
  rerender();
}

function isUnknownOp(err) {
  return (
    err &&
    (err.code === "validation_failed" || err.code === "unknown_type" || err.code === "invalid_request" || err.code === "unsupported")
  );
}

function dispatch(frame) {
  switch (frame.type) {
    case "welcome":
      return onWelcome(frame);
    case "reply":
    case "error": {
      const waiter = frame.id === null || frame.id === undefined ? null : state.pending.get(frame.id);
      if (!waiter) {
        if (frame.type === "error") {
          // A node older than this client answers an op it does not know with an
          // id-less bad_frame naming the type: hide that control from now on.
          const unknown = /unknown frame type '([A-Za-z]+)'/.exec(frame.message || "");
          if (frame.code === "bad_frame" && unknown) markUnsupported(unknown[1]);
          else console.warn("server error", frame);
        }
        return;
      }
      state.pending.delete(frame.id);
      if (frame.type === "reply") waiter.resolve(frame.result || {});
      else waiter.reject(frame);
      return;
    }
    case "ping":
      state.ws?.send(JSON.stringify({ type: "pong", id: frame.id ?? null }));
      return;
    case "pong":
      return;
    case "message":
      return onMessage(frame.scopeId, frame.message);
    case "resumed":
      return onResumed(frame.scopes || {});
    case "readState":
      return onReadState(frame);
    case "membership":
      return onMembership(frame);
    case "invalidate":
      return onInvalidate(frame);
    case "threadUpdated":
      return onThreadUpdated(frame);
    case "reaction":
      return onReaction(frame);
    case "messageUpdated":
      return onMessageUpdated(frame);
    case "messageDeleted":
      return onMessageDeleted(frame);
    default:
      return; // additive protocol: ignore unknown event types
  }
}

function onWelcome(frame) {
  state.me = frame.member;
  state.connected = true;
  state.attempt = 0;
  clearInterval(state.countdownTimer);
  if (frame.workspaceId && !state.workspace) state.workspace = frame.workspaceId;
  localStorage.setItem(STORAGE_TOKEN, state.token);
  if (state.workspace) localStorage.setItem(STORAGE_WORKSPACE, state.workspace);
  setStatus("Connected", "up");
  $("me").textContent = `${personName(frame.member)} (@${frame.member.handle})`;
  clearInterval(state.pingTimer);
  const every = Math.max(5000, Math.floor((frame.heartbeatMs || 20000) / 2));
  let pingId = 0;
  state.pingTimer = setInterval(() => {
    if (state.ws?.readyState === WebSocket.OPEN) {
      state.ws.send(JSON.stringify({ type: "ping", id: "hb-" + ++pingId }));
    }
  }, every);
  setComposerEnabled(Boolean(state.current));
  if (!state.scopes.size) setText($("scope-empty"), "Loading conversations…");
  updateNotifyButton();
  refreshScopes(0).then(() => {
    if (!state.current) {
      const saved = localStorage.getItem(STORAGE_SCOPE);
      const first =
        (saved && state.scopes.has(saved) && saved) ||
        [...state.scopes.values()].find((s) => s.type === "channel" && s.slug === "general")?.id ||
        [...state.scopes.values()].find((s) => s.type === "channel")?.id;
      if (first) openScope(first);
      else renderTimeline({});
    } else if (!state.lastSeen.has(state.current)) openScope(state.current);
  });
  loadPeople();
  flushOutbox();
}

function onResumed(scopes) {
  for (const [scopeId, info] of Object.entries(scopes)) {
    if (info.hasMore) {
      // More than one resume page was missed: refetch instead of patching the gap.
      if (scopeId === state.current) openScope(scopeId);
      else state.lastSeen.delete(scopeId);
    }
  }
  refreshScopes();
}

// ---------------------------------------------------------------- scopes

function refreshScopes(delay = 50) {
  clearTimeout(state.scopesRefresh);
  return new Promise((resolve) => {
    state.scopesRefresh = setTimeout(async () => {
      try {
        await refreshScopesNow();
        if (state.current && state.scopes.has(state.current)) scheduleMarkRead();
      } catch (err) {
        if (err.code !== "disconnected") console.warn("scopes", describeError(err));
      }
      resolve();
    }, delay);
  });
}

async function refreshScopesNow() {
  const result = await request("scopes");
  state.scopes = new Map(result.scopes.map((s) => [s.id, s]));
  renderScopes();
  labelDms();
  labelThreads();
}

async function labelDms() {
  for (const scope of state.scopes.values()) {
    if (scope.type !== "dm" || state.dmPeers.has(scope.id)) continue;
    try {
      const { members } = await request("members", { scopeId: scope.id });
      const other = members.find((m) => m.id !== state.me?.id) || members[0];
      if (other) state.dmPeers.set(scope.id, other);
      for (const m of members) if (!state.people.has(m.id)) state.people.set(m.id, m);
    } catch {
      continue;
    }
  }
  renderScopes();
}

async function labelThreads() {
  for (const scope of state.scopes.values()) {
    if (scope.type !== "thread" || state.threads[scope.id]) continue;
    try {
      const page = await request("history", { target: "scope:" + scope.id, limit: 1 });
      if (page.root) {
        rememberThread(scope.id, page.root, page.root.scopeId);
        const seen = state.replyCounts.get(page.root.id) || 0;
        state.replyCounts.set(page.root.id, Math.max(seen, page.latestSeq || 0));
      }
    } catch {
      continue;
    }
  }
  renderScopes();
  if (state.view) renderTimeline({});
}

async function loadPeople() {
  if (state.unsupported.has("people")) return peopleFromRosters();
  try {
    const result = await request("people");
    const list = result.people || result.members || [];
    state.people = new Map(list.map((p) => [p.id, p]));
    if (state.view) renderTimeline({});
  } catch (err) {
    if (isUnknownOp(err)) {
      state.unsupported.add("people");
      await peopleFromRosters();
    }
  }
}

async function peopleFromRosters() {
  // Until the node lists people, everyone met in a joined channel is known.
  for (const scope of state.scopes.values()) {
    if (scope.type !== "channel") continue;
    try {
      const { members } = await request("members", { scopeId: scope.id });
      for (const m of members) state.people.set(m.id, m);
    } catch {
      continue;
    }
  }
}

function totalUnread() {
  let total = 0;
  for (const scope of state.scopes.values()) {
    if (scope.id === state.current || scope.notification === "mute") continue;
    if (state.panel?.kind === "thread" && state.panel.scopeId === scope.id) continue;
    total += scope.unread || 0;
  }
  return total;
}

function updateTitle() {
  const unread = totalUnread();
  const where = state.current ? scopeLabel(state.scopes.get(state.current)) : "";
  const base = where ? `${where} — ${BASE_TITLE}` : BASE_TITLE;
  document.title = unread ? `(${unread}) ${base}` : base;
  const icon = $("favicon");
  const dot = unread
    ? "%3Ccircle cx='25' cy='7' r='7' fill='%23e5484d'/%3E"
    : "";
  icon.href =
    "data:image/svg+xml,%3Csvg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 32 32'%3E" +
    "%3Crect width='32' height='32' rx='7' fill='%232456c7'/%3E" +
    "%3Cpath d='M9 11h14M9 16h10M9 21h7' stroke='white' stroke-width='3' stroke-linecap='round'/%3E" +
    dot +
    "%3C/svg%3E";
}

const TYPE_LIST = { channel: "channel-list", dm: "dm-list", thread: "thread-list", task: "channel-list" };

function renderScopes() {
  const lists = { "channel-list": [], "dm-list": [], "thread-list": [] };
  const scopes = [...state.scopes.values()].sort((a, b) => scopeLabel(a).localeCompare(scopeLabel(b)));
  for (const scope of scopes) {
    const open =
      scope.id === state.current || (state.panel?.kind === "thread" && state.panel.scopeId === scope.id);
    const unread = open || scope.notification === "mute" ? 0 : scope.unread || 0;
    const label = scopeLabel(scope);
    const link = el(
      "a",
      {
        href: "#c=" + encodeURIComponent(scope.id),
        class: "scope" + (unread ? " has-unread" : ""),
        "aria-current": open ? "page" : null,
        title: label,
        "data-scope": scope.id,
        onclick: (event) => {
          event.preventDefault();
          if (scope.type === "thread") openThreadScope(scope.id);
          else openScope(scope.id);
        },
      },
      el("span", { class: "scope-name" }, label),
      unread
        ? el(
            "span",
            { class: "badge" },
            el("span", { "aria-hidden": "true" }, unread > 99 ? "99+" : String(unread)),
            el("span", { class: "sr-only" }, ` ${unread} unread`),
          )
        : null,
      scope.notification === "mute" ? el("span", { class: "tag", title: "Muted" }, "muted") : null,
    );
    lists[TYPE_LIST[scope.type] || "channel-list"].push(el("li", {}, link));
  }
  for (const [id, items] of Object.entries(lists)) $(id).replaceChildren(...items);
  show($("threads-title"), lists["thread-list"].length > 0);
  setText($("scope-empty"), scopes.length ? "" : "No conversations yet — browse channels to join one.");
  const current = state.scopes.get(state.current);
  if (current) $("scope-title").textContent = scopeLabel(current);
  renderScopeTools();
  updateTitle();
}

function renderScopeTools() {
  const scope = state.scopes.get(state.current);
  const select = $("notify-select");
  show(select, Boolean(scope));
  show(document.querySelector("label[for=notify-select]"), Boolean(scope));
  if (scope) select.value = ["active", "quiet", "mute"].includes(scope.notification) ? scope.notification : "active";
  // DMs are fixed at creation: only channels and threads can be left.
  show($("leave-button"), Boolean(scope && scope.type === "channel"));
}

async function openScope(scopeId) {
  state.current = scopeId;
  localStorage.setItem(STORAGE_SCOPE, scopeId);
  state.view = { scopeId, messages: new Map(), hasMore: false, loading: true, error: "" };
  const scope = state.scopes.get(scopeId);
  $("scope-title").textContent = scope ? scopeLabel(scope) : "…";
  $("members-button").disabled = false;
  setComposerEnabled(true);
  setText($("composer-note"), "");
  if (state.panel?.kind === "members") openMembers();
  if (scope?.type === "channel") loadOwner(scopeId);
  renderScopes();
  renderTimeline({ stick: true });
  await loadHistory(scopeId, null);
}

async function loadHistory(scopeId, beforeSeq) {
  const view = state.view;
  if (!view || view.scopeId !== scopeId) return;
  view.loading = true;
  const fields = { target: "scope:" + scopeId, limit: PAGE };
  if (beforeSeq !== null) fields.beforeSeq = beforeSeq;
  try {
    const page = await request("history", fields);
    if (state.view !== view) return;
    for (const message of page.messages) view.messages.set(message.seq, message);
    view.hasMore = page.hasMore;
    if (beforeSeq === null) observe(scopeId, page.coversThroughSeq);
    view.error = "";
    view.loading = false;
    renderTimeline({ stick: beforeSeq === null, keepOffset: beforeSeq !== null });
    scheduleMarkRead();
  } catch (err) {
    if (state.view !== view) return;
    view.loading = false;
    view.error = err.code === "disconnected" ? "" : "Could not load history — " + describeError(err);
    renderTimeline({});
  }
}

// ---------------------------------------------------------------- timeline

function replyCount(message) {
  return Math.max(message.thread?.replyCount || 0, state.replyCounts.get(message.id) || 0);
}

function threadScopeOfRoot(rootId) {
  if (!rootId) return null;
  for (const [scopeId, info] of Object.entries(state.threads)) if (info.rootId === rootId) return scopeId;
  return null;
}

function participantNames(ids) {
  const names = ids.slice(0, 3).map((id) => (id === state.me?.id ? "you" : personName(state.people.get(id)) || "someone"));
  return names.join(", ") + (ids.length > 3 ? ` +${ids.length - 3}` : "");
}

function startsGroup(message, previous) {
  if (!previous) return true;
  if (previous.author?.memberId !== message.author?.memberId) return true;
  if (replyCount(previous) > 0) return true;
  const gap = new Date(message.createdAt) - new Date(previous.createdAt);
  return !(gap >= 0 && gap < GROUP_WINDOW_MS);
}

function messageNode(message, { inThread = false, grouped = false } = {}) {
  const author = message.author || {};
  const mine = state.me && author.memberId === state.me.id;
  const scope = state.scopes.get(message.scopeId);
  const live = !message.deleted && message.messageType !== "system";
  const canThread = !inThread && scope && scope.type === "channel" && live;
  const count = inThread ? 0 : replyCount(message);
  const threadScope = message.thread?.scopeId || threadScopeOfRoot(message.id);
  const threadUnread = threadScope ? state.scopes.get(threadScope)?.unread || 0 : 0;
  const authorName = personName({ displayName: author.displayName, handle: author.handle, id: author.memberId }) || "?";
  const headId = `h-${inThread ? "t" : "m"}-${message.id}`;
  const key = `${inThread ? "t" : "m"}:${message.id}`;
  const editing = state.editing?.key === key ? state.editing : null;
  const classes = ["msg"];
  if (mine) classes.push("mine");
  if (grouped) classes.push("grouped");
  if (message.deleted) classes.push("deleted");
  if (mentionsMe(message) && !mine && !message.deleted) classes.push("mentions-me");
  const actions = [];
  if (live && !editing) {
    if (canThread) {
      actions.push(el("button", { type: "button", class: "link", onclick: () => openThread(message) }, "Reply in thread"));
    }
    if (supports("react")) {
      actions.push(
        el(
          "button",
          {
            type: "button",
            class: "link",
            "aria-expanded": state.pickerFor === key ? "true" : "false",
            onclick: () => togglePicker(key),
          },
          "Add reaction",
        ),
      );
    }
    actions.push(el("button", { type: "button", class: "link", onclick: () => startQuote(message, inThread) }, "Quote"));
    actions.push(el("button", { type: "button", class: "link", onclick: () => openForward(message) }, "Forward"));
    if (mine && message.messageType === "text" && supports("edit")) {
      actions.push(el("button", { type: "button", class: "link", onclick: () => startEdit(key, message) }, "Edit"));
    }
    if ((mine || (state.me && channelOwnerOf(message.scopeId) === state.me.id)) && supports("delete")) {
      actions.push(el("button", { type: "button", class: "link", onclick: () => deleteMessage(message) }, "Delete"));
    }
  }
  let body;
  if (message.deleted) body = el("p", { class: "tombstone" }, "message deleted");
  else if (editing) body = editForm(editing, message);
  else {
    body = el("div", { class: "content" }, renderMarkdown(message.content ?? "", message));
    if (message.editedAt || message.revision) {
      // "(edited)" follows the text: inside its last paragraph when it ends with one.
      const mark = el("span", { class: "edited muted small", title: message.editedAt ? `edited ${message.editedAt}` : null }, "(edited)");
      const last = body.lastElementChild;
      (last?.tagName === "P" ? last : body).append(last?.tagName === "P" ? " " : "", mark);
    }
  }
  return el(
    "article",
    {
      class: classes.join(" "),
      "data-seq": message.seq,
      "data-id": message.id,
      "aria-labelledby": headId,
      id: inThread ? null : "m-" + message.id,
    },
    el(
      "div",
      { class: "msg-head" + (grouped ? " sr-only" : ""), id: headId },
      el("span", { class: "author" }, authorName),
      author.handle ? el("span", { class: "handle" }, "@" + author.handle) : null,
      author.type && author.type !== "human" ? el("span", { class: "tag" }, author.type) : null,
      el("time", { datetime: message.createdAt, title: message.createdAt }, formatTime(message.createdAt)),
    ),
    message.deleted ? null : sourcesNode(message),
    body,
    message.deleted ? null : attachmentsNode(message),
    message.deleted ? null : reactionsNode(message),
    live && state.pickerFor === key ? pickerNode(message) : null,
    count
      ? el(
          "button",
          {
            type: "button",
            class: "link replies" + (threadUnread ? " has-unread" : ""),
            onclick: () => openThread(message),
          },
          `${count} ${count === 1 ? "reply" : "replies"}`,
          threadUnread ? el("span", { class: "sr-only" }, `, ${threadUnread} unread`) : null,
          message.thread?.participants?.length
            ? el("span", { class: "muted small" }, " · " + participantNames(message.thread.participants))
            : null,
          message.thread?.lastReplyAt
            ? el("span", { class: "muted small" }, ` · last ${formatTime(message.thread.lastReplyAt)}`)
            : null,
        )
      : null,
    actions.length ? el("div", { class: "actions" }, actions) : null,
  );
}

// ---------------------------------------------------------------- reactions

function rerender() {
  if (state.view) renderTimeline({});
  if (state.panel?.kind === "thread") renderThread({});
}

function copiesOf(messageId) {
  // Every copy of a message the views hold (the timeline, the thread panel, its root).
  const out = [];
  if (state.view) for (const m of state.view.messages.values()) if (m.id === messageId) out.push(m);
  if (state.panel?.kind === "thread") {
    for (const m of state.panel.messages.values()) if (m.id === messageId) out.push(m);
    if (state.panel.root?.id === messageId) out.push(state.panel.root);
  }
  return out;
}

function applyReaction(message, memberId, emoji, op) {
  const list = (message.reactions ||= []);
  let entry = list.find((r) => r.emoji === emoji);
  if (op === "add") {
    if (!entry) {
      entry = { emoji, count: 0, memberIds: [] };
      list.push(entry);
    }
    entry.memberIds ||= [];
    if (entry.memberIds.includes(memberId)) return;
    entry.count += 1;
    if (entry.memberIds.length < 20 || memberId === state.me?.id) entry.memberIds.push(memberId);
    return;
  }
  if (!entry) return;
  const at = (entry.memberIds || []).indexOf(memberId);
  if (at >= 0) entry.memberIds.splice(at, 1);
  else if (entry.count <= (entry.memberIds || []).length) return; // not there: nothing to undo
  entry.count -= 1;
  if (entry.count <= 0) list.splice(list.indexOf(entry), 1);
}

function onReaction(frame) {
  for (const message of copiesOf(frame.messageId)) applyReaction(message, frame.memberId, frame.emoji, frame.op);
  rerender();
}

async function react(message, emoji, op = null) {
  const mine = (message.reactions || []).find((r) => r.emoji === emoji)?.memberIds?.includes(state.me?.id);
  const change = op || (mine ? "remove" : "add");
  state.pickerFor = null;
  try {
    const result = await request("react", { messageId: message.id, emoji, op: change });
    if (result.changed !== false) {
      for (const copy of copiesOf(message.id)) applyReaction(copy, state.me.id, emoji, change);
    }
  } catch (err) {
    if (err.code !== "unsupported") noteError(describeError(err));
  }
  rerender();
}

function togglePicker(key) {
  state.pickerFor = state.pickerFor === key ? null : key;
  rerender();
  if (state.pickerFor) document.querySelector(".picker button")?.focus();
}

function reactionsNode(message) {
  const list = (message.reactions || []).filter((r) => r.count > 0);
  if (!list.length) return null;
  return el(
    "div",
    { class: "reactions", role: "group", "aria-label": "Reactions" },
    list.map((r) => {
      const mine = (r.memberIds || []).includes(state.me?.id);
      const who = (r.memberIds || []).map((id) => (id === state.me?.id ? "you" : personName(state.people.get(id)) || "someone"));
      return el(
        "button",
        {
          type: "button",
          class: "reaction",
          "aria-pressed": mine ? "true" : "false",
          title: `${who.join(", ")}${r.count > who.length ? ` and ${r.count - who.length} more` : ""} reacted with ${r.emoji}`,
          disabled: !supports("react"),
          onclick: () => react(message, r.emoji),
        },
        `${r.emoji} ${r.count}`,
      );
    }),
  );
}

function pickerNode(message) {
  return el(
    "div",
    {
      class: "picker",
      role: "group",
      "aria-label": "Pick a reaction",
      onkeydown: (event) => {
        if (event.key === "Escape") {
          event.stopPropagation();
          state.pickerFor = null;
          rerender();
        }
      },
    },
    COMMON_EMOJI.map((emoji) =>
      el("button", { type: "button", "aria-label": `React with ${emoji}`, onclick: () => react(message, emoji, "add") }, emoji),
    ),
  );
}

function noteError(text) {
  setText($("composer-note"), text);
  $("composer-note").className = "note error";
}

// ---------------------------------------------------------------- edit and delete

function channelOwnerOf(scopeId) {
  const scope = state.scopes.get(scopeId);
  const parent =
    state.threads[scopeId]?.parentId ||
    (state.panel?.kind === "thread" && state.panel.scopeId === scopeId ? state.panel.root?.scopeId : null);
  if (scope?.type === "thread" || (!scope && parent)) return state.owners.get(parent) || null;
  return state.owners.get(scopeId) || null;
}

async function loadOwner(scopeId) {
  const scope = state.scopes.get(scopeId);
  if (!scopeId || state.owners.has(scopeId) || (scope && scope.type !== "channel")) return;
  state.owners.set(scopeId, null);
  try {
    const { members, channelOwnerId } = await request("members", { scopeId });
    state.owners.set(scopeId, channelOwnerId || null);
    for (const m of members || []) if (!state.people.has(m.id)) state.people.set(m.id, m);
    if (channelOwnerId === state.me?.id) rerender();
  } catch {
    state.owners.delete(scopeId);
  }
}

function startEdit(key, message) {
  state.pickerFor = null;
  state.editing = { key, messageId: message.id, draft: message.content || "", error: "", saving: false };
  rerender();
  focusEditor();
}

function focusEditor() {
  const box = document.querySelector(".edit-form textarea");
  if (!box) return;
  box.focus();
  box.setSelectionRange(box.value.length, box.value.length);
}

function cancelEdit() {
  state.editing = null;
  rerender();
}

function editForm(editing, message) {
  const id = "edit-" + editing.key.replace(/[^A-Za-z0-9_-]/g, "-");
  return el(
    "form",
    {
      class: "edit-form",
      onsubmit: (event) => {
        event.preventDefault();
        saveEdit(message);
      },
    },
    el("label", { for: id, class: "sr-only" }, "Edit message"),
    el(
      "textarea",
      {
        id,
        rows: 3,
        oninput: (event) => {
          editing.draft = event.target.value;
        },
        onkeydown: (event) => {
          if (event.key === "Escape") {
            event.stopPropagation();
            cancelEdit();
          } else if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
            event.preventDefault();
            saveEdit(message);
          }
        },
      },
      editing.draft,
    ),
    el(
      "div",
      { class: "edit-buttons" },
      el("button", { type: "submit", class: "primary", disabled: editing.saving }, "Save"),
      el("button", { type: "button", onclick: cancelEdit }, "Cancel"),
    ),
    editing.error ? el("p", { class: "error", role: "alert" }, editing.error) : null,
  );
}

async function saveEdit(message) {
  const editing = state.editing;
  if (!editing || editing.saving) return;
  const content = editing.draft;
  if (!content.trim()) {
    editing.error = "A message needs text — delete it instead.";
    rerender();
    focusEditor();
    return;
  }
  if (content === message.content) return cancelEdit();
  editing.saving = true;
  editing.error = "";
  rerender();
  try {
    const result = await request("edit", { messageId: message.id, content, revision: message.revision ?? 0 });
    for (const copy of copiesOf(message.id)) {
      copy.content = content;
      copy.revision = result.revision ?? (copy.revision || 0) + 1;
      copy.editedAt = result.editedAt || new Date().toISOString();
    }
    if (state.editing === editing) state.editing = null;
    rerender();
    return;
  } catch (err) {
    editing.saving = false;
    if (err.code === "moderation_blocked") editing.error = moderationWords(err).replace("Not sent", "Not saved");
    else editing.error = describeError(err);
  }
  rerender();
  if (state.editing === editing) focusEditor();
}

function onMessageUpdated(frame) {
  const fresh = frame.message;
  if (!fresh) return;
  for (const copy of copiesOf(fresh.id)) {
    if ((copy.revision || 0) > (fresh.revision || 0)) continue; // an older projection
    const pendingSources = (fresh.sources || []).some((src) => src.pending);
    Object.assign(copy, fresh, pendingSources ? { sources: copy.sources } : {});
  }
  rerender();
}

function tombstone(message) {
  Object.assign(message, { deleted: true, content: "", attachments: [], reactions: [], sources: [], mentions: [] });
}

function onMessageDeleted(frame) {
  for (const copy of copiesOf(frame.messageId)) tombstone(copy);
  if (state.editing?.messageId === frame.messageId) state.editing = null;
  state.sources.set(frame.messageId, { status: "gone" });
  rerender();
}

function confirmDialog(title, text, yes) {
  const dialog = $("confirm-dialog");
  $("confirm-title").textContent = title;
  $("confirm-text").textContent = text;
  $("confirm-yes").textContent = yes;
  return new Promise((resolve) => {
    const answer = (value) => {
      dialog.removeEventListener("close", onClose);
      for (const button of dialog.querySelectorAll("[data-answer]")) button.onclick = null;
      if (dialog.open) dialog.close();
      resolve(value);
    };
    const onClose = () => answer(false);
    dialog.addEventListener("close", onClose);
    for (const button of dialog.querySelectorAll("[data-answer]")) {
      button.onclick = () => answer(button.dataset.answer === "yes");
    }
    dialog.showModal();
    dialog.querySelector("[data-answer=no]").focus();
  });
}

async function deleteMessage(message) {
  const excerpt = (message.content || "").replace(/\s+/g, " ").slice(0, 120);
  const theirs = message.author?.memberId !== state.me?.id;
  const ok = await confirmDialog(
    "Delete this message?",
    `${theirs ? `It was written by ${message.author?.displayName || "someone else"}. ` : ""}Everyone will see “message deleted” instead of: ${excerpt}`,
    "Delete message",
  );
  if (!ok) return;
  try {
    await request("delete", { messageId: message.id });
    for (const copy of copiesOf(message.id)) tombstone(copy);
    rerender();
  } catch (err) {
    noteError(describeError(err));
  }
}

// ---------------------------------------------------------------- sources (quotes and forwards)

function sourceWord(kind) {
  return kind === "quote" ? "Quoted" : kind === "context" ? "Context" : "Forwarded";
}

function sourcesNode(message) {
  const list = message.sources || [];
  if (!list.length) return null;
  if (list.some((src) => src.pending)) resolvePending(message);
  return list.map((src) => sourceNode(src));
}

function sourceNode(src) {
  const word = sourceWord(src.kind);
  const placeholder = (text) => el("blockquote", { class: "source pending", "aria-label": `${word} message` }, text);
  if (src.unavailable) {
    return el(
      "blockquote",
      { class: "source unavailable", "aria-label": `${word} message` },
      `${word} message unavailable — you cannot read it`,
    );
  }
  if (src.pending || !src.messageId) return placeholder(src.kind === "quote" ? "quoted message" : `${word.toLowerCase()} message`);
  const known = state.sources.get(src.messageId);
  if (!known) loadSource(src);
  if (!known || known.status !== "ok") return placeholder(src.kind === "quote" ? "quoted message" : `${word.toLowerCase()} message`);
  const cited = known.message;
  const author = cited.author || {};
  const name = personName({ displayName: author.displayName, handle: author.handle, id: author.memberId }) || "?";
  const where = state.scopes.get(cited.scopeId) || (state.threads[cited.scopeId] ? { type: "thread", id: cited.scopeId } : null);
  return el(
    "blockquote",
    { class: "source", "aria-label": `${word} message from ${name}` },
    el(
      "div",
      { class: "source-head" },
      src.kind === "quote" ? null : el("span", {}, where ? `${word} from ${scopeLabel(where)}` : word),
      el("span", { class: "author" }, name),
      el("time", { datetime: cited.createdAt }, formatTime(cited.createdAt)),
      el("button", { type: "button", class: "link small", onclick: () => openAt(cited.scopeId, cited.seq, cited.id) }, "View"),
    ),
    cited.deleted
      ? el("p", { class: "tombstone" }, "message deleted")
      : el("div", { class: "content" }, renderMarkdown(cited.content || "", null)),
    cited.attachments?.length && !cited.deleted
      ? el("div", { class: "muted small" }, cited.attachments.map((a) => a.name).join(", "))
      : null,
  );
}

async function loadSource(src) {
  state.sources.set(src.messageId, { status: "loading" });
  try {
    const page = await request("history", { target: "scope:" + src.scopeId, beforeSeq: src.seq + 1, limit: 3 });
    const found = page.messages.find((m) => m.id === src.messageId);
    state.sources.set(src.messageId, found ? { status: "ok", message: found } : { status: "gone" });
  } catch (err) {
    if (err.code === "disconnected") state.sources.delete(src.messageId);
    else state.sources.set(src.messageId, { status: "gone" });
  }
  rerender();
}

async function resolvePending(message) {
  // Live events carry sources as pending: read the message itself to learn them.
  if (state.resolving.has(message.id)) return;
  state.resolving.add(message.id);
  let sources = null;
  try {
    const page = await request("history", { target: "scope:" + message.scopeId, beforeSeq: message.seq + 1, limit: 3 });
    const stored = page.messages.find((m) => m.id === message.id);
    if (stored && !(stored.sources || []).some((src) => src.pending)) sources = stored.sources || [];
  } catch (err) {
    if (err.code === "disconnected") {
      state.resolving.delete(message.id); // the next render after reconnecting tries again
      return;
    }
  }
  // Unresolvable: keep the words "quoted message" rather than retrying forever.
  const settled = sources || (message.sources || []).map((src) => ({ messageId: null, kind: src.kind }));
  for (const copy of copiesOf(message.id)) copy.sources = settled;
  rerender();
}

function startQuote(message, inThread) {
  const which = inThread && state.panel?.kind === "thread" ? "thread" : "main";
  state.composers[which].quote = message;
  renderExtras(which);
  $(which === "main" ? "composer-input" : "thread-input").focus();
}

function openForward(message) {
  const dialog = openDialog("forward-dialog");
  $("forward-comment").value = "";
  const author = message.author || {};
  $("forward-preview").replaceChildren(
    el(
      "blockquote",
      { class: "source" },
      el("div", { class: "source-head" }, el("span", { class: "author" }, author.displayName || author.handle || "?")),
      el("div", { class: "content" }, renderMarkdown(message.content || "", null)),
    ),
  );
  const scopes = [...state.scopes.values()]
    .filter((scope) => scope.type !== "thread" || state.threads[scope.id])
    .sort((a, b) => scopeLabel(a).localeCompare(scopeLabel(b)));
  const list = el("ul", { class: "browse-list" });
  for (const scope of scopes) {
    const label = scopeLabel(scope);
    list.append(
      el(
        "li",
        {},
        el("span", { class: "author" }, label),
        el(
          "button",
          {
            type: "button",
            "aria-label": `Forward to ${label}`,
            onclick: () => {
              const comment = $("forward-comment").value;
              enqueue("scope:" + scope.id, scope.id, comment, {
                forward: { mode: "single", sources: [{ messageId: message.id }] },
              });
              dialog.close();
              if (scope.type === "thread") openThreadScope(scope.id);
              else openScope(scope.id);
            },
          },
          "Forward",
        ),
      ),
    );
  }
  $("forward-body").replaceChildren(scopes.length ? list : el("p", { class: "muted" }, "No conversations."));
}

// ---------------------------------------------------------------- attachments

function formatSize(bytes) {
  if (typeof bytes !== "number") return "";
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KB`;
  return `${(bytes / 1024 / 1024).toFixed(1)} MB`;
}

function blobUrl(attachment) {
  // <img> and <a> cannot send the bearer token: fetch the bytes, hand out a blob: URL.
  if (!state.blobs.has(attachment.id)) {
    const url = attachment.url || `/v1/attachments/${encodeURIComponent(attachment.id)}`;
    const loading = fetch(url, { headers: { Authorization: "Bearer " + state.token }, cache: "no-store" })
      .then((response) => {
        if (!response.ok) throw new Error(response.status === 404 ? "the file is gone" : `download failed (${response.status})`);
        return response.blob();
      })
      .then((blob) => {
        const href = URL.createObjectURL(blob);
        state.blobUrls.set(attachment.id, href);
        return href;
      })
      .catch((err) => {
        state.blobs.delete(attachment.id);
        throw err;
      });
    state.blobs.set(attachment.id, loading);
  }
  return state.blobs.get(attachment.id);
}

async function downloadAttachment(attachment, event) {
  event.preventDefault();
  try {
    const href = await blobUrl(attachment);
    const link = el("a", { href, download: attachment.name || "file", hidden: true });
    document.body.append(link);
    link.click();
    link.remove();
  } catch (err) {
    noteError(`Could not download ${attachment.name}: ${err.message || err}`);
  }
}

function attachmentsNode(message) {
  const list = message.attachments || [];
  if (!list.length) return null;
  return el(
    "div",
    { class: "attachments", role: "group", "aria-label": "Attachments" },
    list.map((attachment) => {
      let preview = null;
      if (PREVIEW_TYPES.test(attachment.contentType || "")) {
        preview = el("img", { class: "preview", alt: attachment.name || "image", width: 288, height: 192 });
        const ready = state.blobUrls.get(attachment.id);
        if (ready) preview.src = ready;
        else {
          const img = preview;
          blobUrl(attachment).then(
            (href) => {
              img.src = href;
            },
            () => {
              img.alt = `${attachment.name} (preview unavailable)`;
            },
          );
        }
      }
      return el(
        "div",
        { class: "attachment" },
        preview,
        el(
          "span",
          { class: "file" },
          el(
            "a",
            { href: attachment.url || "#", onclick: (event) => downloadAttachment(attachment, event) },
            `Download ${attachment.name}`,
          ),
          el("span", { class: "muted small" }, formatSize(attachment.size)),
        ),
      );
    }),
  );
}

function uploadFiles(which, files) {
  const composer = state.composers[which];
  for (const file of files) {
    const upload = { key: randomId(), name: file.name || "file", size: file.size, progress: 0, attachmentId: null, error: "", xhr: null };
    composer.uploads.push(upload);
    const xhr = new XMLHttpRequest();
    upload.xhr = xhr;
    xhr.open("POST", "/v1/attachments?name=" + encodeURIComponent(upload.name));
    xhr.setRequestHeader("Authorization", "Bearer " + state.token);
    xhr.setRequestHeader("Content-Type", file.type || "application/octet-stream");
    xhr.upload.addEventListener("progress", (event) => {
      if (!event.lengthComputable) return;
      upload.progress = event.loaded / event.total;
      renderExtras(which);
    });
    xhr.addEventListener("load", () => {
      let body = {};
      try {
        body = JSON.parse(xhr.responseText || "{}");
      } catch {
        body = {};
      }
      if (xhr.status === 200 || xhr.status === 201) {
        upload.attachmentId = body.attachmentId;
        upload.progress = 1;
      } else if (xhr.status === 413) upload.error = "too large";
      else upload.error = body.message || `upload failed (${xhr.status})`;
      upload.xhr = null;
      renderExtras(which);
    });
    xhr.addEventListener("error", () => {
      upload.error = "upload failed";
      upload.xhr = null;
      renderExtras(which);
    });
    xhr.send(file);
  }
  renderExtras(which);
}

function removeUpload(which, upload) {
  upload.xhr?.abort();
  const composer = state.composers[which];
  composer.uploads = composer.uploads.filter((other) => other !== upload);
  renderExtras(which);
}

function renderExtras(which) {
  const composer = state.composers[which];
  const box = $(which === "main" ? "composer-extras" : "thread-extras");
  const chips = [];
  if (composer.quote) {
    const quoted = composer.quote;
    chips.push(
      el(
        "div",
        { class: "chip quote", role: "group", "aria-label": "Quoting" },
        el("span", { class: "excerpt" }, `Quoting ${quoted.author?.displayName || quoted.author?.handle || "?"}: ${(quoted.content || "").replace(/\s+/g, " ").slice(0, 80)}`),
        el(
          "button",
          {
            type: "button",
            class: "link",
            "aria-label": "Cancel quote",
            onclick: () => {
              composer.quote = null;
              renderExtras(which);
            },
          },
          "✕",
        ),
      ),
    );
  }
  for (const upload of composer.uploads) {
    const percent = Math.round(upload.progress * 100);
    chips.push(
      el(
        "div",
        { class: "chip upload" + (upload.error ? " failed" : "") },
        el("span", { class: "excerpt" }, upload.name),
        upload.error
          ? el("span", {}, upload.error)
          : upload.attachmentId
            ? el("span", { class: "muted small" }, `${formatSize(upload.size)} · ready`)
            : [
                el("progress", { max: 100, value: percent, "aria-label": `Uploading ${upload.name}` }),
                el("span", { class: "muted small" }, `${percent}%`),
              ],
        el(
          "button",
          { type: "button", class: "link", "aria-label": `Remove ${upload.name}`, onclick: () => removeUpload(which, upload) },
          "✕",
        ),
      ),
    );
  }
  box.replaceChildren(...chips);
  show(box, chips.length > 0);
}

function takeComposer(which) {
  // What a send carries besides its text; null while an upload is still running.
  const composer = state.composers[which];
  if (composer.uploads.some((u) => !u.attachmentId && !u.error)) return null;
  const extra = {};
  const ready = composer.uploads.filter((u) => u.attachmentId);
  if (ready.length) {
    extra.attachmentIds = ready.map((u) => u.attachmentId);
    extra.uploads = ready.map((u) => ({ name: u.name, size: u.size, attachmentId: u.attachmentId }));
  }
  if (composer.quote) extra.forward = { mode: "quote", sources: [{ messageId: composer.quote.id }] };
  return extra;
}

function clearComposer(which) {
  state.composers[which] = { quote: null, uploads: [] };
  renderExtras(which);
}

function wireDropZone(zone, which) {
  const hint = $("drop-hint");
  const hasFiles = (event) => [...(event.dataTransfer?.types || [])].includes("Files");
  zone.addEventListener("dragover", (event) => {
    if (!hasFiles(event) || (which === "main" && !state.current)) return;
    event.preventDefault();
    if (which === "main") show(hint, true);
  });
  zone.addEventListener("dragleave", (event) => {
    if (!zone.contains(event.relatedTarget)) show(hint, false);
  });
  zone.addEventListener("drop", (event) => {
    show(hint, false);
    if (!hasFiles(event)) return;
    event.preventDefault();
    event.stopPropagation();
    if (which === "main" && !state.current) return;
    uploadFiles(which, event.dataTransfer.files);
  });
}

// ---------------------------------------------------------------- search

function focusSearch(event) {
  const typing = event.target.closest?.("input, textarea, select, [contenteditable]");
  const ctrlK = (event.ctrlKey || event.metaKey) && event.key.toLowerCase() === "k";
  if (!ctrlK && !(event.key === "/" && !typing && !event.ctrlKey && !event.metaKey && !event.altKey)) return;
  if (!supports("search") || $("app-view").hidden) return;
  event.preventDefault();
  $("search-input").focus();
  $("search-input").select();
}

async function runSearch(query, more = false) {
  let panel = state.panel;
  if (!more || panel?.kind !== "search") {
    panel = { kind: "search", query, hits: [], nextCursor: null, hasMore: false, loading: true, error: "" };
    state.panel = panel;
    $("members-button").setAttribute("aria-expanded", "false");
    openPanel("Search");
    show($("thread-composer"), false);
  }
  panel.loading = true;
  renderSearch();
  try {
    const fields = { query, limit: 20 };
    if (more && panel.nextCursor) fields.cursor = panel.nextCursor;
    const result = await request("search", fields);
    if (state.panel !== panel) return;
    panel.hits.push(...(result.hits || []));
    panel.nextCursor = result.nextCursor || null;
    panel.hasMore = Boolean(result.hasMore && result.nextCursor);
    panel.error = "";
  } catch (err) {
    if (state.panel !== panel) return;
    panel.error =
      err.code === "search_unavailable"
        ? "Search is not ready yet — the node is still building its index. Try again in a little while."
        : describeError(err);
  }
  panel.loading = false;
  renderSearch();
}

function highlighted(content, ranges) {
  // Offsets count code points (as the node does); marks are elements, text stays text.
  const chars = Array.from(content || "");
  const spans = (ranges || [])
    .filter((r) => Array.isArray(r) && r[0] >= 0 && r[1] > r[0])
    .sort((a, b) => a[0] - b[0]);
  const from = Math.max(0, (spans[0]?.[0] ?? 0) - 60);
  const to = Math.min(chars.length, from + 280);
  const out = [];
  if (from > 0) out.push("…");
  let at = from;
  for (const [start, end] of spans) {
    const s = Math.max(start, at);
    const e = Math.min(end, to);
    if (e <= s) continue;
    if (s > at) out.push(chars.slice(at, s).join(""));
    out.push(el("mark", {}, chars.slice(s, e).join("")));
    at = e;
  }
  if (at < to) out.push(chars.slice(at, to).join(""));
  if (to < chars.length) out.push("…");
  return out;
}

function hitScopeLabel(scopeId) {
  const scope = state.scopes.get(scopeId);
  if (scope) return scopeLabel(scope);
  if (state.threads[scopeId]) return state.threads[scopeId].label;
  return "a conversation";
}

function renderSearch() {
  const panel = state.panel;
  if (panel?.kind !== "search") return;
  const list = el("ul", { class: "search-results", "aria-label": "Search results" });
  for (const hit of panel.hits) {
    const message = hit.message || {};
    const author = message.author || {};
    list.append(
      el(
        "li",
        {},
        el(
          "button",
          { type: "button", class: "hit", onclick: () => openAt(hit.scopeId, message.seq, message.id) },
          el(
            "span",
            { class: "hit-head" },
            el("span", { class: "where" }, hitScopeLabel(hit.scopeId)),
            el("span", { class: "author" }, author.displayName || author.handle || "?"),
            el("time", { datetime: message.createdAt }, formatTime(message.createdAt)),
          ),
          el("span", { class: "hit-text" }, highlighted(message.content, hit.highlights)),
        ),
      ),
    );
  }
  let status = null;
  if (panel.error) status = el("p", { class: "error", role: "alert" }, panel.error);
  else if (panel.loading) status = el("p", { class: "muted" }, "Searching…");
  else if (!panel.hits.length) status = el("p", { class: "muted", role: "status" }, `Nothing found for “${panel.query}”.`);
  else status = el("p", { class: "muted small", role: "status" }, `${panel.hits.length}${panel.hasMore ? "+" : ""} result${panel.hits.length === 1 ? "" : "s"} for “${panel.query}”`);
  $("panel-body").replaceChildren(
    ...[
      status,
      panel.hits.length ? list : null,
      panel.hasMore && !panel.loading
        ? el("button", { type: "button", class: "link more", onclick: () => runSearch(panel.query, true) }, "More results")
        : null,
    ].filter(Boolean),
  );
}

function flashMessage(selector) {
  const node = document.querySelector(selector);
  if (!node) return;
  node.scrollIntoView({ block: "center" });
  node.classList.add("flash");
}

async function openAt(scopeId, seq, messageId) {
  // Open a scope at one message: a page around its seq (older nodes: the page ending at it).
  let page;
  let around = true;
  try {
    page = await request("history", { target: "scope:" + scopeId, aroundSeq: seq, limit: PAGE });
    if (!page.messages.some((m) => m.seq === seq)) {
      // A node without aroundSeq ignores it (unknown fields are ignored) and answers the latest page.
      around = false;
      page = await request("history", { target: "scope:" + scopeId, beforeSeq: seq + 1, limit: PAGE });
    }
  } catch (err) {
    noteError("Could not open that message — " + describeError(err));
    return;
  }
  if (page.root) {
    // A thread: the panel shows it with its root.
    await openThread(null, scopeId);
    flashMessage(`#panel [data-id="${CSS.escape(messageId)}"]`);
    return;
  }
  state.current = scopeId;
  localStorage.setItem(STORAGE_SCOPE, scopeId);
  const latest = page.latestSeq ?? 0;
  const detached = (page.coversThroughSeq ?? latest) < latest;
  // Older messages remain when the page says where to continue backwards.
  const older = around ? page.continueBeforeSeq !== undefined : page.hasMore;
  state.view = { scopeId, messages: new Map(), hasMore: older, loading: false, error: "", detached };
  for (const message of page.messages) state.view.messages.set(message.seq, message);
  if (!detached) observe(scopeId, page.coversThroughSeq);
  const scope = state.scopes.get(scopeId);
  $("scope-title").textContent = scope ? scopeLabel(scope) : hitScopeLabel(scopeId);
  $("members-button").disabled = false;
  setComposerEnabled(true);
  setText($("composer-note"), "");
  loadOwner(scopeId);
  renderScopes();
  renderTimeline({});
  flashMessage(`#messages [data-id="${CSS.escape(messageId)}"]`);
  scheduleMarkRead();
}

function renderTimeline({ stick = false, keepOffset = false } = {}) {
  const box = $("timeline");
  const list = $("messages");
  const view = state.view;
  const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
  const fromBottom = box.scrollHeight - box.scrollTop;
  const restoreFocus = keepEditorFocus();
  list.replaceChildren();
  renderPending();
  show($("jump-latest"), Boolean(view?.detached));
  if (!view) {
    show($("load-older"), false);
    setText($("timeline-empty"), state.me ? "Pick a conversation on the left to start reading." : "");
    $("timeline-empty").classList.remove("error");
    return;
  }
  const messages = [...view.messages.values()].sort((a, b) => a.seq - b.seq);
  let previous = null;
  for (const message of messages) {
    list.append(messageNode(message, { grouped: !startsGroup(message, previous) }));
    previous = message;
  }
  show($("load-older"), view.hasMore && !view.loading);
  const empty = $("timeline-empty");
  if (view.error) setText(empty, view.error);
  else if (view.loading && !messages.length) setText(empty, "Loading…");
  else setText(empty, messages.length || pendingFor(view.scopeId).length ? "" : "No messages yet. Say hello.");
  empty.classList.toggle("error", Boolean(view.error));
  if (keepOffset) box.scrollTop = box.scrollHeight - fromBottom;
  else if ((stick || atBottom) && !view.detached) box.scrollTop = box.scrollHeight;
  restoreFocus();
}

function keepEditorFocus() {
  // Re-rendering replaces the nodes: an edit box being typed in keeps focus and caret.
  const active = document.activeElement;
  if (!active?.closest?.(".edit-form") || active.tagName !== "TEXTAREA") return () => {};
  const [start, end] = [active.selectionStart, active.selectionEnd];
  return () => {
    const box = document.querySelector(".edit-form textarea");
    if (!box || box === active) return;
    box.focus();
    box.setSelectionRange(start, end);
  };
}

function onMessage(scopeId, message) {
  if (!message) return;
  observe(scopeId, message.seq);
  const mine = state.me && message.author?.memberId === state.me.id;
  let shown = false;
  if (state.view && state.view.scopeId === scopeId && !state.view.detached) {
    state.view.messages.set(message.seq, message);
    renderTimeline({ stick: mine });
    shown = true;
  }
  const thread = state.panel?.kind === "thread" ? state.panel : null;
  if (thread && thread.scopeId === scopeId) {
    if (!thread.messages.has(message.seq)) thread.messages.set(message.seq, message);
    renderThread({ stick: true });
    shown = true;
  }
  const info = state.threads[scopeId];
  if (info && !onMessage.seen?.has(message.id)) {
    // Keep the root's "N replies" current even before the node's summary arrives.
    (onMessage.seen ??= new Set()).add(message.id);
    state.replyCounts.set(info.rootId, Math.max(state.replyCounts.get(info.rootId) || 0, message.seq));
    if (state.view?.scopeId === info.parentId) renderTimeline({});
  }
  if (!mine && mentionsMe(message)) notifyMention(scopeId, message, shown);
  const scope = state.scopes.get(scopeId);
  if (!scope) {
    refreshScopes(); // a new DM or thread we were just added to
    return;
  }
  scope.latestSeq = Math.max(scope.latestSeq || 0, message.seq);
  if (shown && document.visibilityState === "visible") scheduleMarkRead();
  else if (!mine && message.seq > (scope.lastReadSeq || 0)) scope.unread = (scope.unread || 0) + 1;
  renderScopes();
}

function onThreadUpdated(frame) {
  const thread = frame.thread || frame;
  const rootId = frame.rootMessageId || frame.messageId || thread.rootMessageId;
  if (!rootId) return;
  const parentId = frame.parentScopeId || frame.scopeId;
  if (thread.scopeId && !state.threads[thread.scopeId] && state.view) {
    const root = [...state.view.messages.values()].find((m) => m.id === rootId);
    if (root) rememberThread(thread.scopeId, root, root.scopeId);
  }
  if (state.view && state.view.scopeId === parentId) {
    for (const message of state.view.messages.values()) {
      if (message.id === rootId) message.thread = { ...(message.thread || {}), ...thread };
    }
    renderTimeline({});
  }
  const panel = state.panel?.kind === "thread" ? state.panel : null;
  if (panel?.root?.id === rootId) panel.root.thread = { ...(panel.root.thread || {}), ...thread };
  // A thread we were just admitted to (its root's author, a participant) shows up unread.
  if (thread.scopeId && !state.scopes.has(thread.scopeId)) refreshScopes();
}

// ---------------------------------------------------------------- notifications

function updateNotifyButton() {
  const supported = "Notification" in window;
  show($("notify-enable"), supported && Notification.permission === "default");
}

function notifyMention(scopeId, message, shown) {
  if (!("Notification" in window) || Notification.permission !== "granted") return;
  const scope = state.scopes.get(scopeId);
  if (scope && (scope.notification === "mute" || scope.notification === "quiet")) return;
  if (shown && document.visibilityState === "visible" && document.hasFocus()) return;
  const author = message.author?.displayName || message.author?.handle || "Someone";
  try {
    const note = new Notification(`${author} mentioned you${scope ? " in " + scopeLabel(scope) : ""}`, {
      body: (message.content || "").slice(0, 140),
      tag: message.id,
    });
    note.onclick = () => {
      window.focus();
      if (scope?.type === "thread") openThreadScope(scopeId);
      else openScope(scopeId);
    };
  } catch (err) {
    console.warn("notification", err);
  }
}

// ---------------------------------------------------------------- read state

let markReadTimer = null;

function scheduleMarkRead() {
  clearTimeout(markReadTimer);
  markReadTimer = setTimeout(flushMarkRead, 300);
}

function visibleScopes() {
  const out = [];
  if (state.view) {
    const seqs = [...state.view.messages.keys()];
    out.push([state.view.scopeId, Math.max(state.lastSeen.get(state.view.scopeId) ?? 0, ...seqs)]);
  }
  if (state.panel?.kind === "thread" && state.panel.scopeId) {
    const seqs = [...state.panel.messages.keys()];
    if (seqs.length) out.push([state.panel.scopeId, Math.max(...seqs)]);
  }
  return out;
}

async function flushMarkRead() {
  if (document.visibilityState !== "visible") return;
  for (const [scopeId, seq] of visibleScopes()) {
    if (!seq || seq <= (state.readSent.get(scopeId) ?? 0)) continue;
    const scope = state.scopes.get(scopeId);
    // Only scopes we are a member of (a thread is readable before we post in it).
    if (!scope || seq <= (scope.lastReadSeq ?? 0)) continue;
    state.readSent.set(scopeId, seq);
    try {
      const result = await request("markRead", { scopeId, seq });
      scope.lastReadSeq = result.lastReadSeq;
      scope.unread = 0;
      renderScopes();
      if (state.view) renderTimeline({});
    } catch (err) {
      if (err.code === "disconnected") state.readSent.delete(scopeId);
      else console.warn("markRead", describeError(err));
    }
  }
}

function onReadState(frame) {
  const scope = state.scopes.get(frame.scopeId);
  if (!scope) return;
  scope.lastReadSeq = Math.max(scope.lastReadSeq || 0, frame.lastReadSeq);
  refreshScopes(); // the node knows which unread messages remain
}

// ---------------------------------------------------------------- sending (offline queue)

function setComposerEnabled(enabled) {
  $("composer-input").disabled = !enabled;
  $("composer-send").disabled = !enabled;
  $("attach-button").disabled = !enabled;
}

function pendingFor(scopeId) {
  return state.outbox.filter((item) => item.scopeId === scopeId);
}

function renderPending() {
  const box = $("pending");
  const items = state.view ? pendingFor(state.view.scopeId) : [];
  box.replaceChildren(
    ...items.map((item) =>
      el(
        "div",
        { class: "msg pending" + (item.error ? " failed" : "") },
        el("div", { class: "content" }, document.createTextNode(item.content)),
        item.uploads?.length || item.forward
          ? el(
              "div",
              { class: "muted small" },
              [item.forward ? "with a quote" : "", item.uploads?.length ? item.uploads.map((u) => u.name).join(", ") : ""]
                .filter(Boolean)
                .join(" · "),
            )
          : null,
        el(
          "div",
          { class: "muted small" },
          item.error
            ? `Not sent — ${item.error} `
            : state.connected
              ? "Sending…"
              : "Waiting for the connection — will be sent when it is back.",
          item.error
            ? el("button", { type: "button", class: "link", onclick: () => discard(item) }, "Discard")
            : null,
        ),
      ),
    ),
  );
}

function discard(item) {
  state.outbox = state.outbox.filter((other) => other !== item);
  saveOutbox();
  renderPending();
}

function enqueue(target, scopeId, content, extra = {}) {
  const item = { clientMessageId: randomId(), target, scopeId, content, error: "", ...extra };
  state.outbox.push(item);
  saveOutbox();
  renderPending();
  flushOutbox();
  return item;
}

function describeHeld(result) {
  if (result.state === "held") return "newer messages arrived first; read them and send again";
  if (result.state === "partial_held") return "only part of it was posted";
  return `unexpected result ${result.state}`;
}

async function flushOutbox() {
  if (state.flushing || !state.connected) return;
  state.flushing = true;
  try {
    while (state.connected) {
      const item = state.outbox.find((i) => !i.error);
      if (!item) break;
      renderPending();
      let result;
      try {
        // The same clientMessageId on every attempt: a resend after a lost reply is `already_sent`.
        const fields = { target: item.target, content: item.content, clientMessageId: item.clientMessageId };
        if (item.attachmentIds?.length) fields.attachmentIds = item.attachmentIds;
        if (item.forward) fields.forward = item.forward;
        result = await request("send", fields);
      } catch (err) {
        if (err.code === "disconnected") break;
        if (err.code === "moderation_blocked") {
          // Nothing was stored: the text goes back to where it was typed, with the reason.
          state.outbox = state.outbox.filter((other) => other !== item);
          saveOutbox();
          restoreBlocked(item, err);
          continue;
        }
        if (err.retryable) {
          const wait = err.details?.retryAfterMs ?? 2000;
          setTimeout(flushOutbox, wait);
          break;
        }
        item.error = describeError(err);
        saveOutbox();
        continue;
      }
      if (result.state === "sent" || result.state === "already_sent") {
        state.outbox = state.outbox.filter((other) => other !== item);
        sentCallbacks.get(item.clientMessageId)?.(result);
        sentCallbacks.delete(item.clientMessageId);
      } else {
        item.error = describeHeld(result);
      }
      saveOutbox();
    }
  } finally {
    state.flushing = false;
    renderPending();
    const failed = state.outbox.find((i) => i.error);
    if (failed) {
      setText($("composer-note"), "Not sent — " + failed.error);
      $("composer-note").className = "note error";
    }
  }
}

const sentCallbacks = new Map(); // clientMessageId -> callback (not persisted)

function restoreBlocked(item, err) {
  const which = item.where === "thread" && state.panel?.kind === "thread" ? "thread" : "main";
  const input = $(which === "main" ? "composer-input" : "thread-input");
  const here = which === "thread" || item.scopeId === state.current;
  if (here && !input.value.trim()) {
    input.value = item.content;
    const composer = state.composers[which];
    if (!composer.uploads.length && item.uploads?.length) {
      composer.uploads = item.uploads.map((u) => ({ ...u, key: randomId(), progress: 1, error: "", xhr: null }));
    }
    if (!composer.quote && item.quote) composer.quote = item.quote;
    renderExtras(which);
  }
  const note = $(which === "main" ? "composer-note" : "thread-note");
  setText(note, moderationWords(err) + (here ? "" : ` (in ${item.target})`));
  note.className = "note error";
  note.setAttribute("role", "alert");
  input.focus();
}

function sendMain(event) {
  event.preventDefault();
  if (!state.current) return;
  const input = $("composer-input");
  const content = input.value;
  const extra = takeComposer("main");
  if (extra === null) {
    noteError("Wait for the uploads to finish, then send.");
    return;
  }
  if (!content.trim() && !extra.attachmentIds && !extra.forward) return;
  if (extra.forward) extra.quote = state.composers.main.quote;
  input.value = "";
  setText($("composer-note"), "");
  $("composer-note").setAttribute("role", "status");
  clearComposer("main");
  enqueue("scope:" + state.current, state.current, content, { ...extra, where: "main" });
  input.focus();
}

function enterToSend(form) {
  return (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      form.requestSubmit();
    }
  };
}

// ---------------------------------------------------------------- side panel

function openPanel(title) {
  $("panel-title").textContent = title;
  show($("panel"), true);
  document.body.classList.add("with-panel");
}

function closePanel() {
  state.panel = null;
  clearComposer("thread");
  show($("panel"), false);
  show($("thread-composer"), false);
  document.body.classList.remove("with-panel");
  $("members-button").setAttribute("aria-expanded", "false");
  renderScopes();
}

async function openMembers() {
  if (!state.current) return;
  const scopeId = state.current;
  const scope = state.scopes.get(scopeId);
  state.panel = { kind: "members", scopeId };
  openPanel("Members");
  show($("thread-composer"), false);
  $("members-button").setAttribute("aria-expanded", "true");
  const body = $("panel-body");
  body.replaceChildren(el("p", { class: "muted" }, "Loading…"));
  try {
    const { members, channelOwnerId } = await request("members", { scopeId });
    if (state.panel?.kind !== "members" || state.panel.scopeId !== scopeId) return;
    for (const m of members) if (!state.people.has(m.id)) state.people.set(m.id, m);
    const byId = new Map(members.map((m) => [m.id, m]));
    const list = el("ul", { class: "members" });
    const me = state.me?.id;
    // The node decides; the button is offered only where it would say yes:
    // the channel's owner removes others, an owner removes its private agent.
    const mayRemove = (member) =>
      me &&
      channelOwnerId &&
      member.id !== channelOwnerId &&
      ((me === channelOwnerId && member.id !== me) ||
        (member.visibility === "private" && member.ownerMemberId === me));
    for (const member of members) {
      let note = null;
      if (member.visibility === "private") {
        const owner = byId.get(member.ownerMemberId);
        const ownerName =
          member.ownerMemberId === me ? "you" : owner ? "@" + owner.handle : member.ownerMemberId || "unknown";
        note = el("span", { class: "tag private" }, `private (owner ${ownerName})`);
      }
      list.append(
        el(
          "li",
          {},
          el("span", { class: "author" }, personName(member)),
          " ",
          el("span", { class: "handle" }, "@" + member.handle),
          member.type && member.type !== "human" ? el("span", { class: "tag" }, member.type) : null,
          note,
          mayRemove(member)
            ? el(
                "button",
                { type: "button", class: "link", onclick: () => removeMember(scopeId, member) },
                "Remove",
              )
            : null,
        ),
      );
    }
    const parts = [el("p", { class: "muted small" }, `${members.length} member${members.length === 1 ? "" : "s"}`), list];
    if (scope?.type === "channel") parts.push(inviteForm(scopeId, byId));
    body.replaceChildren(...parts);
  } catch (err) {
    body.replaceChildren(el("p", { class: "error", role: "alert" }, describeError(err)));
  }
}

function inviteForm(scopeId, current) {
  const candidates = [...state.people.values()]
    .filter((p) => !current.has(p.id))
    .sort((a, b) => personName(a).localeCompare(personName(b)));
  const select = el(
    "select",
    { id: "invite-member" },
    candidates.map((p) => el("option", { value: p.id }, `${personName(p)} (@${p.handle})`)),
  );
  const error = el("p", { class: "error", role: "alert", hidden: true });
  const form = el(
    "form",
    {
      class: "invite",
      onsubmit: async (event) => {
        event.preventDefault();
        if (!select.value) return;
        try {
          await request("invite", { scopeId, memberId: select.value });
          openMembers();
        } catch (err) {
          setText(error, describeError(err));
        }
      },
    },
    el("label", { for: "invite-member" }, "Invite someone"),
    candidates.length ? select : el("p", { class: "muted small" }, "Everyone you know is already here."),
    candidates.length ? el("button", { type: "submit" }, "Invite") : null,
    error,
  );
  return form;
}

async function removeMember(scopeId, member) {
  if (!confirm(`Remove @${member.handle} from this channel?`)) return;
  try {
    await request("remove", { scopeId, memberId: member.id });
  } catch (err) {
    $("panel-body").prepend(el("p", { class: "error", role: "alert" }, describeError(err)));
    return;
  }
  if (state.panel?.kind === "members" && state.panel.scopeId === scopeId) openMembers();
}

function onMembership(frame) {
  if (state.me && frame.memberId === state.me.id) refreshScopes();
  if (state.panel?.kind === "members" && state.panel.scopeId === frame.scopeId) openMembers();
}

function onInvalidate(frame) {
  state.lastSeen.delete(frame.scopeId);
  if (state.current === frame.scopeId) openScope(frame.scopeId);
  if (state.panel?.kind === "thread" && state.panel.scopeId === frame.scopeId) {
    openThreadScope(frame.scopeId);
  }
  refreshScopes();
}

async function openThreadScope(scopeId) {
  // From the sidebar: the thread's history carries its root.
  await openThread(null, scopeId);
}

async function openThread(root, scopeId = null) {
  const parent = root ? state.scopes.get(root.scopeId) : null;
  const knownScope = scopeId || root?.thread?.scopeId || threadScopeOfRoot(root?.id);
  const target = knownScope ? "scope:" + knownScope : `#${parent?.slug}:${root.id}`;
  const panel = {
    kind: "thread",
    root,
    target,
    scopeId: knownScope || null,
    messages: new Map(),
    error: "",
    loading: true,
  };
  state.panel = panel;
  $("members-button").setAttribute("aria-expanded", "false");
  openPanel("Thread");
  show($("thread-composer"), true);
  setText($("thread-note"), "");
  renderThread({});
  renderScopes();
  try {
    const page = await request("history", { target, limit: 200 });
    if (state.panel !== panel) return;
    panel.scopeId = page.scopeId;
    if (page.root) panel.root = page.root;
    if (panel.root) {
      loadOwner(panel.root.scopeId);
      rememberThread(page.scopeId, panel.root, panel.root.scopeId);
      state.replyCounts.set(panel.root.id, Math.max(state.replyCounts.get(panel.root.id) || 0, page.latestSeq || 0));
    }
    for (const message of page.messages) panel.messages.set(message.seq, message);
    observe(page.scopeId, page.coversThroughSeq);
    if (panel.root && state.current !== panel.root.scopeId && state.scopes.has(panel.root.scopeId)) {
      openScope(panel.root.scopeId);
    }
  } catch (err) {
    if (state.panel !== panel) return;
    // No thread yet and none created by reading: the first reply creates it.
    if (err.code !== "not_found") panel.error = describeError(err);
  }
  panel.loading = false;
  renderThread({ stick: true });
  renderScopes();
  scheduleMarkRead();
  $("thread-input").focus();
}

function renderThread({ stick = false } = {}) {
  const panel = state.panel;
  if (panel?.kind !== "thread") return;
  const body = $("panel-body");
  const restoreFocus = keepEditorFocus();
  const replies = [...panel.messages.values()].sort((a, b) => a.seq - b.seq);
  const list = el("div", { class: "messages", "aria-label": "Thread replies", role: "log" });
  let previous = null;
  for (const message of replies) {
    list.append(messageNode(message, { inThread: true, grouped: !startsGroup(message, previous) }));
    previous = message;
  }
  let status = null;
  if (panel.error) status = el("p", { class: "error", role: "alert" }, panel.error);
  else if (panel.loading) status = el("p", { class: "muted" }, "Loading…");
  else if (!replies.length) status = el("p", { class: "muted" }, "No replies yet.");
  body.replaceChildren(
    ...[
      panel.root
        ? el("div", { class: "messages root", role: "group", "aria-label": "Thread root" }, messageNode(panel.root, { inThread: true }))
        : null,
      el("h3", { class: "replies-title" }, `${replies.length} ${replies.length === 1 ? "reply" : "replies"}`),
      list,
      status,
    ].filter(Boolean),
  );
  if (stick) body.scrollTop = body.scrollHeight;
  restoreFocus();
}

function sendThread(event) {
  event.preventDefault();
  const panel = state.panel;
  if (panel?.kind !== "thread") return;
  const input = $("thread-input");
  const content = input.value;
  const extra = takeComposer("thread");
  if (extra === null) {
    setText($("thread-note"), "Wait for the uploads to finish, then reply.");
    return;
  }
  if (!content.trim() && !extra.attachmentIds && !extra.forward) return;
  if (extra.forward) extra.quote = state.composers.thread.quote;
  input.value = "";
  setText($("thread-note"), "");
  clearComposer("thread");
  const target = panel.scopeId ? "scope:" + panel.scopeId : panel.target;
  const item = enqueue(target, panel.scopeId || "thread:" + panel.root?.id, content, { ...extra, where: "thread" });
  sentCallbacks.set(item.clientMessageId, (result) => {
    if (state.panel === panel && result.targetKey && !panel.scopeId) {
      panel.scopeId = result.targetKey;
      rememberThread(result.targetKey, panel.root, panel.root?.scopeId);
      panel.error = "";
      renderThread({ stick: true });
      refreshScopes();
    }
  });
  input.focus();
}

// ---------------------------------------------------------------- channels, DMs, leave

async function createChannel(event) {
  event.preventDefault();
  const slug = $("create-slug").value.trim();
  const name = $("create-name").value.trim() || slug;
  const visibility = $("create-visibility").value;
  setText($("create-error"), "");
  try {
    const { scopeId } = await request("createChannel", { slug, name, visibility });
    $("create-form").reset();
    $("create-form").closest("details").open = false;
    await refreshScopesNow();
    openScope(scopeId);
  } catch (err) {
    setText($("create-error"), describeError(err));
  }
}

function openDialog(id) {
  const dialog = $(id);
  if (!dialog.open) dialog.showModal();
  return dialog;
}

async function browseChannels() {
  openDialog("browse-dialog");
  const body = $("browse-body");
  body.replaceChildren(el("p", { class: "muted" }, "Loading…"));
  let channels;
  try {
    const result = await request("channels");
    channels = result.channels || [];
  } catch (err) {
    body.replaceChildren(
      el(
        "p",
        { class: "error", role: "alert" },
        isUnknownOp(err) ? "This node cannot list channels yet." : describeError(err),
      ),
    );
    return;
  }
  channels.sort((a, b) => (a.slug || "").localeCompare(b.slug || ""));
  const list = el("ul", { class: "browse-list" });
  for (const channel of channels) {
    const joined = channel.joined || state.scopes.has(channel.id);
    const count = channel.memberCount ?? channel.members ?? 0;
    list.append(
      el(
        "li",
        {},
        el(
          "div",
          { class: "browse-info" },
          el("span", { class: "author" }, "#" + channel.slug),
          channel.name && channel.name !== channel.slug ? el("span", { class: "muted" }, channel.name) : null,
          el("span", { class: "muted small" }, `${count} member${count === 1 ? "" : "s"}`),
          channel.description ? el("span", { class: "small" }, channel.description) : null,
        ),
        el(
          "button",
          {
            type: "button",
            class: joined ? "" : "primary",
            "aria-label": `${joined ? "Open" : "Join"} #${channel.slug}`,
            onclick: () => joinChannel(channel.id, joined),
          },
          joined ? "Open" : "Join",
        ),
      ),
    );
  }
  body.replaceChildren(channels.length ? list : el("p", { class: "muted" }, "No public channels yet."));
}

async function joinChannel(scopeId, joined) {
  try {
    if (!joined) await request("join", { scopeId });
    $("browse-dialog").close();
    await refreshScopesNow();
    openScope(scopeId);
  } catch (err) {
    $("browse-body").prepend(el("p", { class: "error", role: "alert" }, describeError(err)));
  }
}

async function newDirectMessage() {
  openDialog("dm-dialog");
  $("dm-filter").value = "";
  $("dm-body").replaceChildren(el("p", { class: "muted" }, "Loading…"));
  await loadPeople();
  renderPeople();
  $("dm-filter").focus();
}

function renderPeople() {
  const filter = $("dm-filter").value.trim().toLowerCase();
  const people = [...state.people.values()]
    .filter((p) => !filter || personName(p).toLowerCase().includes(filter) || p.handle.toLowerCase().includes(filter))
    .sort((a, b) => personName(a).localeCompare(personName(b)));
  const list = el("ul", { class: "browse-list" });
  for (const person of people) {
    const you = person.id === state.me?.id;
    list.append(
      el(
        "li",
        {},
        el(
          "button",
          { type: "button", class: "person", onclick: () => startDm(person) },
          el("span", { class: "author" }, personName(person) + (you ? " (you)" : "")),
          " ",
          el("span", { class: "handle" }, "@" + person.handle),
          person.type && person.type !== "human" ? el("span", { class: "tag" }, person.type) : null,
        ),
      ),
    );
  }
  $("dm-body").replaceChildren(people.length ? list : el("p", { class: "muted" }, "Nobody found."));
}

async function startDm(person) {
  try {
    // Reading a DM target opens (creates) the conversation.
    const page = await request("history", { target: "dm:" + person.id, limit: 1 });
    state.dmPeers.set(page.scopeId, person);
    $("dm-dialog").close();
    await refreshScopesNow();
    openScope(page.scopeId);
  } catch (err) {
    $("dm-body").prepend(el("p", { class: "error", role: "alert" }, describeError(err)));
  }
}

async function leaveCurrent() {
  const scope = state.scopes.get(state.current);
  if (!scope || !confirm(`Leave ${scopeLabel(scope)}?`)) return;
  try {
    await request("leave", { scopeId: scope.id });
  } catch (err) {
    setText($("composer-note"), describeError(err));
    $("composer-note").className = "note error";
    return;
  }
  state.current = null;
  state.view = null;
  localStorage.removeItem(STORAGE_SCOPE);
  closePanel();
  $("scope-title").textContent = "Select a conversation";
  $("members-button").disabled = true;
  setComposerEnabled(false);
  await refreshScopesNow();
  renderTimeline({});
}

async function setNotification() {
  const scope = state.scopes.get(state.current);
  if (!scope) return;
  const value = $("notify-select").value;
  try {
    await request("setNotification", { scopeId: scope.id, state: value });
    scope.notification = value;
    renderScopes();
  } catch (err) {
    setText($("composer-note"), describeError(err));
    $("composer-note").className = "note error";
    renderScopeTools();
  }
}

// ---------------------------------------------------------------- login

function showLogin(message) {
  show($("app-view"), false);
  show($("login-view"), true);
  $("login-token").value = state.token || "";
  setText($("login-error"), message || "");
  $("login-token").focus();
}

async function start(token, workspace) {
  state.token = token;
  state.workspace = workspace;
  state.attempt = 0;
  state.me = null;
  if (!state.workspace) {
    const known = await learnWorkspace();
    if (known === "rejected") {
      state.token = "";
      localStorage.removeItem(STORAGE_TOKEN);
      showLogin("That token was not accepted. Check it and sign in again.");
      return;
    }
  }
  show($("login-view"), false);
  show($("app-view"), true);
  connect();
}

function logout(message) {
  state.wantOnline = false;
  state.connected = false;
  clearTimeout(state.reconnectTimer);
  clearInterval(state.countdownTimer);
  clearInterval(state.pingTimer);
  const ws = state.ws;
  state.ws = null;
  if (ws) ws.close(1000, "sign out");
  localStorage.removeItem(STORAGE_TOKEN);
  localStorage.removeItem(STORAGE_WORKSPACE);
  localStorage.removeItem(STORAGE_OUTBOX);
  state.outbox = [];
  state.me = null;
  state.workspace = "";
  state.scopes = new Map();
  state.lastSeen = new Map();
  state.readSent = new Map();
  state.dmPeers = new Map();
  state.people = new Map();
  state.current = null;
  state.view = null;
  closePanel();
  renderScopes();
  renderTimeline({});
  $("scope-title").textContent = "Select a conversation";
  $("members-button").disabled = true;
  setComposerEnabled(false);
  state.token = "";
  showLogin(message);
}

function readFragment() {
  // The login link `#token=…` (a fragment never reaches a server log); removed from the URL at once.
  if (!location.hash.includes("token=")) return null;
  const params = new URLSearchParams(location.hash.slice(1));
  history.replaceState(null, "", location.pathname + location.search);
  const token = params.get("token");
  return token ? { token, workspace: params.get("workspace") || "" } : null;
}

function init() {
  $("login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const token = $("login-token").value.trim();
    if (!token) return;
    localStorage.removeItem(STORAGE_WORKSPACE);
    start(token, "");
  });
  $("logout").addEventListener("click", () => logout(""));
  $("retry-now").addEventListener("click", retryNow);
  $("composer").addEventListener("submit", sendMain);
  $("composer-input").addEventListener("keydown", enterToSend($("composer")));
  $("thread-composer").addEventListener("submit", sendThread);
  $("thread-input").addEventListener("keydown", enterToSend($("thread-composer")));
  $("load-older").addEventListener("click", () => {
    const view = state.view;
    if (!view || view.loading) return;
    const oldest = Math.min(...view.messages.keys());
    if (Number.isFinite(oldest)) loadHistory(view.scopeId, oldest);
  });
  $("members-button").addEventListener("click", () => {
    if (state.panel?.kind === "members") closePanel();
    else openMembers();
  });
  $("leave-button").addEventListener("click", leaveCurrent);
  $("notify-select").addEventListener("change", setNotification);
  $("browse-button").addEventListener("click", browseChannels);
  $("dm-button").addEventListener("click", newDirectMessage);
  $("dm-filter").addEventListener("input", renderPeople);
  for (const button of document.querySelectorAll("dialog [data-close]")) {
    button.addEventListener("click", () => button.closest("dialog").close());
  }
  $("notify-enable").addEventListener("click", async () => {
    await Notification.requestPermission();
    updateNotifyButton();
  });
  $("panel-close").addEventListener("click", closePanel);
  $("create-form").addEventListener("submit", createChannel);
  $("search-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const query = $("search-input").value.trim();
    if (query) runSearch(query);
  });
  $("search-input").addEventListener("keydown", (event) => {
    if (event.key === "Escape") {
      event.stopPropagation();
      $("search-input").blur();
    }
  });
  document.addEventListener("keydown", focusSearch);
  $("attach-button").addEventListener("click", () => $("attach-input").click());
  $("attach-input").addEventListener("change", (event) => {
    if (state.current) uploadFiles("main", event.target.files);
    event.target.value = "";
  });
  wireDropZone(document.querySelector("section.main"), "main");
  wireDropZone($("thread-composer"), "thread");
  $("jump-latest").addEventListener("click", () => state.current && openScope(state.current));
  document.addEventListener("click", (event) => {
    // A click outside an open emoji picker closes it.
    if (!state.pickerFor || event.target.closest?.(".picker, .actions")) return;
    state.pickerFor = null;
    rerender();
  });
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible") scheduleMarkRead();
  });
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && state.panel && !document.querySelector("dialog[open]")) closePanel();
  });
  window.addEventListener("online", retryNow);

  const fromFragment = readFragment();
  const token = fromFragment?.token || localStorage.getItem(STORAGE_TOKEN) || "";
  const workspace = fromFragment
    ? fromFragment.workspace
    : localStorage.getItem(STORAGE_WORKSPACE) || "";
  if (token) start(token, workspace);
  else showLogin("");
}

init();
