// The WebSocket: connect with hello (and resume from the last seqs seen),
// reconnect with jittered backoff, heartbeats, request/reply by id, and which
// ops this node does not support. Incoming frames go to events.js.

import { state } from "./store.js";
import { $, show } from "./dom.js";
import { dispatch } from "./events.js";
import { renderPending } from "./outbox.js";
import { logout } from "./session.js";
import { rerender } from "./views/conversation.js";

const BACKOFF_BASE_MS = 1000;
// Short enough that a node restarted after a brief outage is found within seconds.
const BACKOFF_MAX_MS = 10000;

function wsUrl() {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const query = state.workspace ? "?workspace=" + encodeURIComponent(state.workspace) : "";
  return `${scheme}//${location.host}/v1/ws${query}`;
}

export function setStatus(text, kind) {
  const node = $("conn-status");
  if (node.textContent !== text) node.textContent = text;
  node.dataset.kind = kind;
  show($("retry-now"), kind === "down");
}

export function connect() {
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

export function retryNow() {
  if (!state.wantOnline || state.ws) return;
  connect();
}

// A read or any other request the node refused with rate_limited is asked
// again when the node says its turn comes (details.retryAfterMs), a few times
// at most; sends have their own retry in outbox.js.
const RATE_LIMITED_RETRIES = 5;

export async function request(type, fields = {}) {
  for (let attempt = 0; ; attempt++) {
    try {
      return await requestOnce(type, fields);
    } catch (err) {
      if (type === "send" || err?.code !== "rate_limited" || attempt >= RATE_LIMITED_RETRIES) throw err;
      await new Promise((wake) => setTimeout(wake, err.details?.retryAfterMs ?? 1000));
    }
  }
}

function requestOnce(type, fields) {
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

export function supports(op) {
  return !state.unsupported.has(op);
}

export function markUnsupported(op) {
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

export function isUnknownOp(err) {
  return (
    err &&
    (err.code === "validation_failed" || err.code === "unknown_type" || err.code === "invalid_request" || err.code === "unsupported")
  );
}
