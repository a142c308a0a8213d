// Reading back through a conversation: the previous page loads when the reader
// nears the top, the "New messages" line sits before the first unread message,
// "Jump to latest" shows while the reader is away from the bottom, and the rows
// the node stored for one long send are folded back into one message.

import { state } from "../store.js";
import { $, el, show } from "../dom.js";

// Starting the next page a little before the very top keeps a steady scroll
// from stalling against the edge while the page is fetched.
const NEAR_TOP_PX = 400;
// A few lines of slack: a new message arriving while the reader is at the
// bottom must not make the button flash.
const AWAY_FROM_BOTTOM_PX = 160;

let loadOlder = () => {};

export function wireHistory(onNearTop) {
  loadOlder = onNearTop;
  if (wireHistory.done) return;
  wireHistory.done = true;
  $("timeline").addEventListener("scroll", afterScroll, { passive: true });
}

function afterScroll() {
  updateJump();
  maybeLoadOlder();
}

export function maybeLoadOlder() {
  const view = state.view;
  const box = $("timeline");
  if (!view || view.loading || view.error || !view.hasMore || !view.messages.size) return;
  if (box.scrollTop < NEAR_TOP_PX) loadOlder();
}

export function updateJump() {
  const box = $("timeline");
  const away = box.scrollHeight - box.scrollTop - box.clientHeight > AWAY_FROM_BOTTOM_PX;
  show($("jump-latest"), Boolean(state.view && (state.view.detached || away)));
}

// The reader's read mark when the conversation was opened: the line stays where
// it was even after the messages below it are marked read.
export function unreadMarkAtOpen(scope) {
  return scope && (scope.unread || 0) > 0 ? scope.lastReadSeq || 0 : null;
}

export function firstUnreadSeq(view, shown) {
  if (view.unreadAfter === null || view.unreadAfter === undefined) return null;
  // Until the read mark itself is loaded, the oldest message shown is not
  // known to be the first unread one.
  if (view.hasMore && !(shown[0]?.seq <= view.unreadAfter)) return null;
  const first = shown.find((m) => m.seq > view.unreadAfter && m.author?.memberId !== state.me?.id);
  return first ? first.seq : null;
}

export function newMessagesLine() {
  return el(
    "div",
    { class: "new-line", role: "separator", "aria-label": "New messages" },
    el("span", { "aria-hidden": "true" }, "New messages"),
  );
}

export function revealNewMessagesLine() {
  const line = $("messages").querySelector(".new-line");
  if (!line) return false;
  line.scrollIntoView({ block: "start" });
  return true;
}

// The node stores a send longer than its row limit as several rows, each with
// metadata.chunk = {index, count, clientMessageId}; joined in index order they
// give back the text that was sent. Other sends may land between them, so rows
// are matched by author and clientMessageId, not by being neighbours. The
// folded message takes the first row's identity (reactions, threads, quotes
// act on it) and the place of the earliest row shown.
export function wholeSends(sorted) {
  const groups = new Map();
  const out = [];
  for (const message of sorted) {
    const chunk = message.metadata?.chunk;
    if (!chunk || typeof chunk.clientMessageId !== "string" || !(chunk.count > 1)) {
      out.push(message);
      continue;
    }
    const key = `${message.author?.memberId}\n${chunk.clientMessageId}`;
    let group = groups.get(key);
    if (!group) {
      group = { rows: [] };
      groups.set(key, group);
      out.push(group);
    }
    group.rows.push(message);
  }
  return out.map((item) => (item.rows ? fold(item.rows) : item));
}

function fold(rows) {
  const seq = rows[0].seq;
  rows.sort((a, b) => a.metadata.chunk.index - b.metadata.chunk.index);
  const first = rows[0];
  if (rows.length === 1) return first;
  const content = rows.map((row) => (row.deleted ? "" : row.content ?? "")).join("");
  return { ...first, seq, content, chunkRows: rows };
}
