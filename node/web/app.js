// scopenode browser client: plain ES module, no dependencies, no build step.
// Speaks protocol version 1 (see PROTOCOL.md) over ws://<same host>/v1/ws.

const STORAGE_TOKEN = "scopenode.token";
const STORAGE_WORKSPACE = "scopenode.workspace";
const STORAGE_SCOPE = "scopenode.scope";
const STORAGE_THREADS = "scopenode.threads";
const PAGE = 50;
const BACKOFF_BASE_MS = 500;
const BACKOFF_MAX_MS = 30000;
const REACTIONS = ["👍", "🎉", "👀"];

const $ = (id) => document.getElementById(id);

const state = {
  token: "",
  workspace: "",
  ws: null,
  wantOnline: false,
  attempt: 0,
  reconnectTimer: null,
  pingTimer: null,
  nextId: 1,
  pending: new Map(), // request id -> {resolve, reject, op}
  me: null,
  scopes: new Map(), // scopeId -> scope summary from `scopes`
  lastSeen: new Map(), // scopeId -> highest seq observed (for hello.resume)
  current: null, // scopeId open in the main view
  view: null, // {scopeId, messages: Map(seq -> message), hasMore, loading}
  reactions: new Map(), // messageId -> Map(emoji -> Set(memberId))
  readSent: new Map(), // scopeId -> seq last sent with markRead
  panel: null, // {kind: "members"} | {kind: "thread", ...}
  scopesRefresh: null,
  threadLabels: loadThreadLabels(), // thread scopeId -> "#slug: root excerpt"
};

function loadThreadLabels() {
  try {
    return JSON.parse(localStorage.getItem(STORAGE_THREADS) || "{}") || {};
  } catch {
    return {};
  }
}

function rememberThread(scopeId, parentSlug, root) {
  const excerpt = (root.content || "").replace(/\s+/g, " ").slice(0, 40);
  state.threadLabels[scopeId] = `#${parentSlug}: ${excerpt}`;
  localStorage.setItem(STORAGE_THREADS, JSON.stringify(state.threadLabels));
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

function describeError(err) {
  if (!err) return "unknown error";
  if (err.code) return `${err.code}: ${err.message || "request failed"}`;
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

function scopeLabel(scope) {
  if (!scope) return "";
  switch (scope.type) {
    case "channel":
      return "#" + (scope.slug || scope.name || scope.id);
    case "dm":
      return "DM " + (scope.name || scope.id);
    case "thread":
      return "↳ " + (state.threadLabels[scope.id] || scope.name || "thread …" + scope.id.slice(-6));
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

// ---------------------------------------------------------------- connection

function wsUrl() {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const query = state.workspace ? "?workspace=" + encodeURIComponent(state.workspace) : "";
  return `${scheme}//${location.host}/v1/ws${query}`;
}

function setStatus(text, kind) {
  const node = $("conn-status");
  node.textContent = text;
  node.dataset.kind = kind;
}

function connect() {
  clearTimeout(state.reconnectTimer);
  state.reconnectTimer = null;
  state.wantOnline = true;
  setStatus(state.attempt ? "Reconnecting…" : "Connecting…", "pending");
  let ws;
  try {
    ws = new WebSocket(wsUrl());
  } catch (err) {
    scheduleReconnect(describeError(err));
    return;
  }
  state.ws = ws;
  ws.addEventListener("open", () => {
    const hello = {
      type: "hello",
      token: state.token,
      client: { kind: "browser", name: "scopenode-web", version: "1" },
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
    clearInterval(state.pingTimer);
    for (const [, waiter] of state.pending) {
      waiter.reject({ code: "disconnected", message: "connection lost", retryable: true });
    }
    state.pending.clear();
    onClosed(event.code, event.reason);
  });
}

function onClosed(code, reason) {
  if (!state.wantOnline) return;
  if (code === 4401 || code === 4403) {
    const why =
      code === 4401
        ? "The token was rejected (4401). Check it and sign in again."
        : "The token is not valid for this workspace (4403).";
    logout(why + (reason ? ` (${reason})` : ""));
    return;
  }
  if (code === 4429 || code === 4503) {
    // Slow consumer / node draining: reconnect promptly and resume.
    state.attempt = Math.min(state.attempt, 1);
  }
  scheduleReconnect(`closed ${code}${reason ? ": " + reason : ""}`);
}

function scheduleReconnect(why) {
  if (!state.wantOnline) return;
  const delay = Math.min(BACKOFF_MAX_MS, BACKOFF_BASE_MS * 2 ** state.attempt);
  const jittered = Math.round(delay / 2 + Math.random() * (delay / 2));
  state.attempt += 1;
  setStatus(`Disconnected (${why}) — retrying in ${Math.ceil(jittered / 1000)} s`, "down");
  state.reconnectTimer = setTimeout(connect, jittered);
}

function request(type, fields = {}) {
  return new Promise((resolve, reject) => {
    const ws = state.ws;
    if (!ws || ws.readyState !== WebSocket.OPEN || !state.me) {
      reject({ code: "disconnected", message: "not connected", retryable: true });
      return;
    }
    const id = state.nextId++;
    state.pending.set(id, { resolve, reject, op: type });
    ws.send(JSON.stringify({ type, id, ...fields }));
  });
}

function dispatch(frame) {
  switch (frame.type) {
    case "welcome":
      return onWelcome(frame);
    case "reply":
    case "error": {
      const waiter = frame.id === null || frame.id === undefined ? null : state.pending.get(frame.id);
      if (!waiter) {
        if (frame.type === "error") console.warn("server error", frame);
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
    case "reaction":
      return onReaction(frame);
    case "readState":
      return onReadState(frame);
    case "membership":
      return onMembership(frame);
    case "invalidate":
      return onInvalidate(frame);
    default:
      return; // additive protocol: ignore unknown event types
  }
}

function onWelcome(frame) {
  state.me = frame.member;
  state.attempt = 0;
  if (frame.workspaceId && !state.workspace) {
    state.workspace = frame.workspaceId; // sticky routing for reconnects
  }
  localStorage.setItem(STORAGE_TOKEN, state.token);
  if (state.workspace) localStorage.setItem(STORAGE_WORKSPACE, state.workspace);
  setStatus("Connected", "up");
  $("me").textContent = `${frame.member.displayName || frame.member.handle} (@${frame.member.handle})`;
  clearInterval(state.pingTimer);
  const every = Math.max(5000, Math.floor((frame.heartbeatMs || 20000) / 2));
  let pingId = 0;
  state.pingTimer = setInterval(() => {
    if (state.ws?.readyState === WebSocket.OPEN) {
      state.ws.send(JSON.stringify({ type: "ping", id: "hb-" + ++pingId }));
    }
  }, every);
  setComposerEnabled(Boolean(state.current));
  if (!state.scopes.size) setText($("scope-empty"), "Loading scopes…");
  refreshScopes(0);
  if (state.current && !state.lastSeen.has(state.current)) openScope(state.current);
  else if (!state.current) renderTimeline({});
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
  state.scopesRefresh = setTimeout(async () => {
    try {
      const result = await request("scopes");
      state.scopes = new Map(result.scopes.map((s) => [s.id, s]));
      if (state.current && state.scopes.has(state.current)) {
        // The open scope is being read: its unread count is ours to clear.
        scheduleMarkRead();
      }
      renderScopes();
      if (!state.current) openDefaultScope();
    } catch (err) {
      if (err.code !== "disconnected") console.warn("scopes", err);
    }
  }, delay);
}

function openDefaultScope() {
  const remembered = localStorage.getItem(STORAGE_SCOPE);
  const channels = [...state.scopes.values()].filter((s) => s.type === "channel");
  const pick =
    state.scopes.get(remembered) ||
    channels.find((s) => s.slug === "general") ||
    channels[0] ||
    [...state.scopes.values()][0];
  if (pick) openScope(pick.id);
}

const TYPE_ORDER = { channel: 0, dm: 1, thread: 2, task: 3 };

function renderScopes() {
  const list = $("scope-list");
  list.replaceChildren();
  const scopes = [...state.scopes.values()].sort(
    (a, b) =>
      (TYPE_ORDER[a.type] ?? 9) - (TYPE_ORDER[b.type] ?? 9) ||
      scopeLabel(a).localeCompare(scopeLabel(b)),
  );
  for (const scope of scopes) {
    const unread = scope.id === state.current ? 0 : scope.unread || 0;
    const button = el(
      "button",
      {
        type: "button",
        class: "scope" + (unread ? " has-unread" : ""),
        "aria-current": scope.id === state.current ? "page" : null,
        title: scope.id,
        onclick: () => openScope(scope.id),
      },
      el("span", { class: "scope-name" }, scopeLabel(scope)),
      unread
        ? el("span", { class: "badge", "aria-label": `${unread} unread` }, unread > 99 ? "99+" : unread)
        : null,
    );
    list.append(el("li", {}, button));
  }
  setText($("scope-empty"), scopes.length ? "" : "No scopes yet — create a channel or join one.");
  const current = state.scopes.get(state.current);
  if (current) $("scope-title").textContent = scopeLabel(current);
}

async function openScope(scopeId) {
  state.current = scopeId;
  localStorage.setItem(STORAGE_SCOPE, scopeId);
  state.view = { scopeId, messages: new Map(), hasMore: false, loading: true, error: "" };
  const scope = state.scopes.get(scopeId);
  $("scope-title").textContent = scope ? scopeLabel(scope) : scopeId;
  $("members-button").disabled = false;
  setComposerEnabled(true);
  setText($("composer-note"), "");
  if (state.panel?.kind === "members") openMembers();
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
    if (beforeSeq === null) {
      observe(scopeId, page.coversThroughSeq);
    }
    view.error = "";
    view.loading = false;
    renderTimeline({ stick: beforeSeq === null, keepOffset: beforeSeq !== null });
    scheduleMarkRead();
  } catch (err) {
    if (state.view !== view) return;
    view.loading = false;
    view.error = "Could not load history — " + describeError(err);
    renderTimeline({});
  }
}

// ---------------------------------------------------------------- timeline

function messageNode(message, { inThread = false } = {}) {
  const author = message.author || {};
  const mine = state.me && author.memberId === state.me.id;
  const scope = state.scopes.get(message.scopeId);
  const canThread =
    !inThread && scope && scope.type === "channel" && scope.slug && message.messageType !== "system";
  const reactions = state.reactions.get(message.id);
  const chips = [];
  if (reactions) {
    for (const [emoji, who] of reactions) {
      if (!who.size) continue;
      const pressed = state.me && who.has(state.me.id);
      chips.push(
        el(
          "button",
          {
            type: "button",
            class: "chip",
            "aria-pressed": pressed ? "true" : "false",
            "aria-label": `${emoji} ${who.size}`,
            onclick: () => react(message, emoji, pressed ? "remove" : "add"),
          },
          `${emoji} ${who.size}`,
        ),
      );
    }
  }
  const actions = el(
    "div",
    { class: "actions" },
    REACTIONS.map((emoji) =>
      el(
        "button",
        {
          type: "button",
          class: "icon",
          title: `React ${emoji}`,
          "aria-label": `React ${emoji}`,
          onclick: () => react(message, emoji, "add"),
        },
        emoji,
      ),
    ),
    canThread
      ? el(
          "button",
          { type: "button", class: "link", onclick: () => openThread(message) },
          "Reply in thread",
        )
      : null,
  );
  return el(
    "li",
    { class: "msg" + (mine ? " mine" : ""), "data-seq": message.seq, id: inThread ? null : "m-" + message.id },
    el(
      "div",
      { class: "msg-head" },
      el("span", { class: "author" }, author.displayName || author.handle || author.memberId || "?"),
      author.handle ? el("span", { class: "handle" }, "@" + author.handle) : null,
      author.type && author.type !== "human" ? el("span", { class: "tag" }, author.type) : null,
      el("time", { datetime: message.createdAt, title: message.createdAt }, formatTime(message.createdAt)),
    ),
    el("div", { class: "content" }, message.content ?? ""),
    message.attachments?.length
      ? el("div", { class: "muted small" }, `${message.attachments.length} attachment(s)`)
      : null,
    chips.length ? el("div", { class: "chips" }, chips) : null,
    actions,
  );
}

function renderTimeline({ stick = false, keepOffset = false } = {}) {
  const box = $("timeline");
  const list = $("messages");
  const view = state.view;
  const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
  const fromBottom = box.scrollHeight - box.scrollTop;
  list.replaceChildren();
  if (!view) {
    show($("load-older"), false);
    setText($("timeline-empty"), state.me ? "Pick a scope on the left to start reading." : "");
    $("timeline-empty").classList.remove("error");
    return;
  }
  const messages = [...view.messages.values()].sort((a, b) => a.seq - b.seq);
  for (const message of messages) list.append(messageNode(message));
  show($("load-older"), view.hasMore && !view.loading);
  const empty = $("timeline-empty");
  if (view.error) setText(empty, view.error);
  else if (view.loading && !messages.length) setText(empty, "Loading…");
  else setText(empty, messages.length ? "" : "No messages yet. Say hello.");
  empty.classList.toggle("error", Boolean(view.error));
  if (keepOffset) box.scrollTop = box.scrollHeight - fromBottom;
  else if (stick || atBottom) box.scrollTop = box.scrollHeight;
}

function onMessage(scopeId, message) {
  if (!message) return;
  observe(scopeId, message.seq);
  const mine = state.me && message.author?.memberId === state.me.id;
  let shown = false;
  if (state.view && state.view.scopeId === scopeId) {
    state.view.messages.set(message.seq, message);
    renderTimeline({ stick: mine });
    shown = true;
  }
  const thread = state.panel?.kind === "thread" ? state.panel : null;
  if (thread && thread.scopeId === scopeId) {
    thread.messages.set(message.seq, message);
    renderThread({ stick: true });
    shown = true;
  }
  const scope = state.scopes.get(scopeId);
  if (!scope) {
    refreshScopes(); // a new DM or thread we were just added to
    return;
  }
  scope.latestSeq = Math.max(scope.latestSeq || 0, message.seq);
  if (shown) scheduleMarkRead();
  else if (!mine) scope.unread = (scope.unread || 0) + 1;
  renderScopes();
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
      if (scope) {
        scope.lastReadSeq = result.lastReadSeq;
        scope.unread = 0;
        renderScopes();
      }
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
  refreshScopes(); // the server knows which unread messages remain
}

// ---------------------------------------------------------------- sending

function setComposerEnabled(enabled) {
  $("composer-input").disabled = !enabled;
  $("composer-send").disabled = !enabled;
}

function describeSendResult(result) {
  switch (result.state) {
    case "sent":
    case "already_sent":
      return "";
    case "held":
      return (
        `Held: newer messages arrived (latest seq ${result.latestSeq}). ` +
        "Your message was not posted — read them and send again."
      );
    case "partial_held":
      return (
        `Partly held: ${result.accepted?.length ?? 0} part(s) posted, the rest held ` +
        `because newer messages arrived (latest seq ${result.latestSeq}).`
      );
    default:
      return `Unexpected result: ${result.state}`;
  }
}

async function sendFrom(input, note, target, onSent) {
  const content = input.value;
  if (!content.trim()) return;
  input.disabled = true;
  setText(note, "Sending…");
  note.className = "note";
  try {
    const result = await request("send", { target, content, clientMessageId: randomId() });
    const message = describeSendResult(result);
    if (result.state === "sent" || result.state === "already_sent") {
      input.value = "";
      observe(result.targetKey, result.acceptedSeq);
    }
    setText(note, message);
    if (message) note.className = "note warn";
    onSent?.(result);
  } catch (err) {
    setText(note, "Not sent — " + describeError(err));
    note.className = "note error";
  } finally {
    input.disabled = false;
    input.focus();
  }
}

function sendMain(event) {
  event.preventDefault();
  if (!state.current) return;
  sendFrom($("composer-input"), $("composer-note"), "scope:" + state.current);
}

function enterToSend(form) {
  return (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      form.requestSubmit();
    }
  };
}

// ---------------------------------------------------------------- reactions

async function react(message, emoji, op) {
  try {
    await request("react", { messageId: message.id, emoji, op });
  } catch (err) {
    setText($("composer-note"), "Reaction failed — " + describeError(err));
    $("composer-note").className = "note error";
  }
}

function onReaction(frame) {
  let byEmoji = state.reactions.get(frame.messageId);
  if (!byEmoji) state.reactions.set(frame.messageId, (byEmoji = new Map()));
  let who = byEmoji.get(frame.emoji);
  if (!who) byEmoji.set(frame.emoji, (who = new Set()));
  if (frame.op === "remove") who.delete(frame.memberId);
  else who.add(frame.memberId);
  if (state.view?.scopeId === frame.scopeId) renderTimeline({});
  if (state.panel?.kind === "thread") renderThread({});
}

// ---------------------------------------------------------------- side panel

function openPanel(title) {
  $("panel-title").textContent = title;
  show($("panel"), true);
  document.body.classList.add("with-panel");
}

function closePanel() {
  state.panel = null;
  show($("panel"), false);
  show($("thread-composer"), false);
  document.body.classList.remove("with-panel");
  $("members-button").setAttribute("aria-expanded", "false");
}

async function openMembers() {
  if (!state.current) return;
  const scopeId = state.current;
  state.panel = { kind: "members", scopeId };
  openPanel("Members");
  show($("thread-composer"), false);
  $("members-button").setAttribute("aria-expanded", "true");
  const body = $("panel-body");
  body.replaceChildren(el("p", { class: "muted" }, "Loading…"));
  try {
    const { members, channelOwnerId } = await request("members", { scopeId });
    if (state.panel?.kind !== "members" || state.panel.scopeId !== scopeId) return;
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
          state.me && member.ownerMemberId === state.me.id
            ? "you"
            : owner
              ? "@" + owner.handle
              : member.ownerMemberId || "unknown";
        note = el("span", { class: "tag private" }, `private (owner ${ownerName})`);
      }
      list.append(
        el(
          "li",
          {},
          el("span", { class: "author" }, member.displayName || member.handle),
          " ",
          el("span", { class: "handle" }, "@" + member.handle),
          member.type && member.type !== "human" ? el("span", { class: "tag" }, member.type) : null,
          note,
          mayRemove(member)
            ? el(
                "button",
                {
                  class: "link",
                  title: "Remove from this channel",
                  onclick: () => removeMember(scopeId, member),
                },
                "Remove",
              )
            : null,
        ),
      );
    }
    body.replaceChildren(
      el("p", { class: "muted small" }, `${members.length} member(s) · scope id `, el("code", {}, scopeId)),
      list,
    );
  } catch (err) {
    body.replaceChildren(el("p", { class: "error", role: "alert" }, describeError(err)));
  }
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
    openThread(state.panel.root);
  }
  refreshScopes();
}

async function openThread(root) {
  const parent = state.scopes.get(root.scopeId);
  const target = `#${parent?.slug}:${root.id}`;
  const panel = { kind: "thread", root, target, parentSlug: parent?.slug, scopeId: null, messages: new Map(), error: "", loading: true };
  state.panel = panel;
  $("members-button").setAttribute("aria-expanded", "false");
  openPanel("Thread");
  show($("thread-composer"), true);
  setText($("thread-note"), "");
  renderThread({});
  try {
    const page = await request("history", { target, limit: 200 });
    if (state.panel !== panel) return;
    panel.scopeId = page.scopeId;
    rememberThread(page.scopeId, parent?.slug, root);
    renderScopes();
    for (const message of page.messages) panel.messages.set(message.seq, message);
    observe(page.scopeId, page.coversThroughSeq);
  } catch (err) {
    if (state.panel !== panel) return;
    // e.g. invalid_target while reply threads are not enabled on this node
    panel.error = describeError(err);
  }
  panel.loading = false;
  renderThread({ stick: true });
  scheduleMarkRead();
  $("thread-input").focus();
}

function renderThread({ stick = false } = {}) {
  const panel = state.panel;
  if (panel?.kind !== "thread") return;
  const body = $("panel-body");
  const replies = [...panel.messages.values()].sort((a, b) => a.seq - b.seq);
  const list = el("ol", { class: "messages", "aria-label": "Thread replies", role: "log" });
  for (const message of replies) list.append(messageNode(message, { inThread: true }));
  let status = null;
  if (panel.error) status = el("p", { class: "error", role: "alert" }, panel.error);
  else if (panel.loading) status = el("p", { class: "muted" }, "Loading…");
  else if (!replies.length) status = el("p", { class: "muted" }, "No replies yet.");
  body.replaceChildren(
    ...[
      el("ol", { class: "messages root", "aria-label": "Thread root" }, messageNode(panel.root, { inThread: true })),
      el("h3", { class: "replies-title" }, `${replies.length} repl${replies.length === 1 ? "y" : "ies"}`),
      list,
      status,
    ].filter(Boolean),
  );
  if (stick) body.scrollTop = body.scrollHeight;
}

function sendThread(event) {
  event.preventDefault();
  const panel = state.panel;
  if (panel?.kind !== "thread") return;
  const target = panel.scopeId ? "scope:" + panel.scopeId : panel.target;
  sendFrom($("thread-input"), $("thread-note"), target, (result) => {
    if (state.panel === panel && result.targetKey && !panel.scopeId) {
      panel.scopeId = result.targetKey;
      rememberThread(result.targetKey, panel.parentSlug, panel.root);
      panel.error = "";
      renderThread({ stick: true });
      refreshScopes();
    }
  });
}

// ---------------------------------------------------------------- channels

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

async function joinScope(event) {
  event.preventDefault();
  const scopeId = $("join-id").value.trim();
  setText($("join-error"), "");
  try {
    await request("join", { scopeId });
    $("join-form").reset();
    $("join-form").closest("details").open = false;
    await refreshScopesNow();
    openScope(scopeId);
  } catch (err) {
    setText($("join-error"), describeError(err));
  }
}

async function refreshScopesNow() {
  const result = await request("scopes");
  state.scopes = new Map(result.scopes.map((s) => [s.id, s]));
  renderScopes();
}

// ---------------------------------------------------------------- login

function showLogin(message) {
  show($("app-view"), false);
  show($("login-view"), true);
  $("login-token").value = state.token || "";
  $("login-workspace").value = state.workspace || "";
  setText($("login-error"), message || "");
  $("login-token").focus();
}

function start(token, workspace) {
  state.token = token;
  state.workspace = workspace;
  state.attempt = 0;
  state.me = null;
  show($("login-view"), false);
  show($("app-view"), true);
  connect();
}

function logout(message) {
  state.wantOnline = false;
  clearTimeout(state.reconnectTimer);
  clearInterval(state.pingTimer);
  const ws = state.ws;
  state.ws = null;
  if (ws) ws.close(1000, "sign out");
  localStorage.removeItem(STORAGE_TOKEN);
  state.me = null;
  state.scopes = new Map();
  state.lastSeen = new Map();
  state.readSent = new Map();
  state.reactions = new Map();
  state.current = null;
  state.view = null;
  closePanel();
  renderScopes();
  renderTimeline({});
  $("scope-title").textContent = "Select a scope";
  $("members-button").disabled = true;
  setComposerEnabled(false);
  if (!message) state.token = "";
  showLogin(message);
}

function readFragment() {
  // #token=…&workspace=… (handy for scripted and headless use); removed from the URL at once.
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
    start(token, $("login-workspace").value.trim());
  });
  $("logout").addEventListener("click", () => logout(""));
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
  $("panel-close").addEventListener("click", closePanel);
  $("create-form").addEventListener("submit", createChannel);
  $("join-form").addEventListener("submit", joinScope);
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible") scheduleMarkRead();
  });
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && state.panel) closePanel();
  });

  const fromFragment = readFragment();
  const token = fromFragment?.token || localStorage.getItem(STORAGE_TOKEN) || "";
  const workspace = fromFragment
    ? fromFragment.workspace
    : localStorage.getItem(STORAGE_WORKSPACE) || "";
  if (fromFragment && fromFragment.workspace === "") localStorage.removeItem(STORAGE_WORKSPACE);
  if (token) start(token, workspace);
  else {
    state.workspace = workspace;
    showLogin("");
  }
}

init();
