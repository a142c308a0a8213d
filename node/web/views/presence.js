// Typing and presence (docs/presence.md): "ann is typing…" under the open
// conversation, and a presence dot for people in the members panel and the
// DM list. Nothing here is stored: a reconnect asks the node again.

import { state } from "../store.js";
import { $, el, setText } from "../dom.js";
import { personName } from "../format.js";
import { request, supports } from "../connection.js";

// The node forwards one `typing` per 2 s. A reader drops one 4.5 s after it
// came: a refresh may be a little late, and a typist who stopped right after
// one is cleared within 5 s of the last keystroke.
const TYPING_EVERY_MS = 2500;
const TYPING_SHOWN_MS = 4500;
// No key, pointer or focus for this long: this session is idle (the node's own
// timer, for a session that sends nothing, is the same 5 minutes).
const IDLE_AFTER_MS = 5 * 60 * 1000;
// While someone is at the keyboard, the node hears so at least this often.
const ACTIVE_EVERY_MS = 60 * 1000;

const typing = new Map(); // scopeId -> Map(memberId -> expiry timer)
const presence = new Map(); // memberId -> "online" | "away"; absent: offline
// The members whose dots are on screen: the node tells this session of them only.
const followed = new Set();
const FOLLOW_MAX = 500;
let followTimer = null;
const lastTyped = new Map(); // scopeId -> when this client last sent `typing`
let idle = false;
let lastInput = Date.now();
let lastReported = 0;

// ------------------------------------------------------------ typing

// `scopeOf()`: the scope the composer writes to now (none: nothing to say).
export function wireTyping(input, scopeOf) {
  input.addEventListener("input", () => {
    const scopeId = scopeOf();
    if (!scopeId || !input.value.trim() || !supports("typing")) return;
    const now = Date.now();
    if (now - (lastTyped.get(scopeId) || 0) < TYPING_EVERY_MS) return;
    lastTyped.set(scopeId, now);
    request("typing", { scopeId }).catch(() => {});
  });
}

export function onTyping(frame) {
  if (!frame.scopeId || !frame.memberId || frame.memberId === state.me?.id) return;
  let who = typing.get(frame.scopeId);
  if (!who) typing.set(frame.scopeId, (who = new Map()));
  clearTimeout(who.get(frame.memberId));
  who.set(
    frame.memberId,
    setTimeout(() => clearTyping(frame.scopeId, frame.memberId), TYPING_SHOWN_MS),
  );
  renderTyping();
}

// A message from someone ends their typing at once.
export function clearTyping(scopeId, memberId) {
  const who = typing.get(scopeId);
  if (!who || !who.has(memberId)) return;
  clearTimeout(who.get(memberId));
  who.delete(memberId);
  if (!who.size) typing.delete(scopeId);
  renderTyping();
}

// Under the open conversation, and under the open thread's replies.
export function renderTyping() {
  setText($("typing"), typingText(state.current));
  const thread = state.panel?.kind === "thread" ? state.panel.scopeId : null;
  setText($("thread-typing"), typingText(thread));
}

function typingText(scopeId) {
  const names = [...((scopeId && typing.get(scopeId)?.keys()) || [])].map(
    (id) => personName(state.people.get(id)) || "Someone",
  );
  if (names.length === 1) return `${names[0]} is typing…`;
  if (names.length === 2) return `${names[0]} and ${names[1]} are typing…`;
  return names.length ? "Several people are typing…" : "";
}

// ------------------------------------------------------------ presence

export function presenceOf(memberId) {
  // This session is the member's own proof of life; the node does not tell it.
  if (memberId === state.me?.id) return !state.connected ? "offline" : idle ? "away" : "online";
  return presence.get(memberId) || "offline";
}

// A dot with its words for assistive technology: "ann, online".
export function presenceDot(member) {
  if (!member?.id) return null;
  const dot = el("span", { "data-presence": member.id, role: "img" });
  paint(dot, member);
  return dot;
}

function paint(dot, member) {
  const now = presenceOf(member.id);
  dot.className = "presence " + now;
  dot.setAttribute("aria-label", `${personName(member)}, ${now}`);
  dot.title = now;
}

export function onPresence(frame) {
  if (!frame.memberId) return;
  if (frame.state === "online" || frame.state === "away") presence.set(frame.memberId, frame.state);
  else presence.delete(frame.memberId);
  repaint(frame.memberId);
}

function repaint(memberId) {
  const member = state.people.get(memberId) || { id: memberId };
  for (const dot of document.querySelectorAll(`[data-presence="${CSS.escape(memberId)}"]`)) {
    paint(dot, member);
  }
}

// A new session: it follows the same people, and the node's view replaces
// whatever this client held.
export function loadPresence() {
  idle = false;
  lastReported = Date.now();
  askSoon();
}

// Show these members' presence from now on (DM peers, an open members panel).
export function followPresence(ids) {
  const before = followed.size;
  for (const id of ids) {
    if (!id || id === state.me?.id || followed.has(id)) continue;
    followed.add(id);
    if (followed.size > FOLLOW_MAX) followed.delete(followed.values().next().value);
  }
  if (followed.size !== before) askSoon();
}

function askSoon() {
  clearTimeout(followTimer);
  followTimer = setTimeout(ask, 50);
}

async function ask() {
  if (!followed.size || !supports("presence")) return;
  try {
    const { members } = await request("presence", { memberIds: [...followed] });
    for (const entry of members || []) onPresence(entry);
  } catch {
    // Not connected, or an older node: the dots say offline until the next welcome.
  }
}

function report(nowIdle) {
  idle = nowIdle;
  lastReported = Date.now();
  if (state.me) repaint(state.me.id);
  if (state.connected && supports("setPresence")) {
    request("setPresence", { state: nowIdle ? "idle" : "active" }).catch(() => {});
  }
}

export function wireIdle() {
  const active = () => {
    lastInput = Date.now();
    if (idle || lastInput - lastReported > ACTIVE_EVERY_MS) report(false);
  };
  for (const type of ["keydown", "pointerdown", "focus"]) window.addEventListener(type, active, true);
  setInterval(() => {
    if (!idle && Date.now() - lastInput >= IDLE_AFTER_MS) report(true);
  }, 30 * 1000);
}
