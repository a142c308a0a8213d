// The main conversation: opening a scope, paging its history, rendering the
// timeline, live messages and thread summaries, and the main composer. What
// reading back needs (paging on scroll, the unread line, long sends) is in
// history.js.

import { STORAGE_SCOPE, PAGE, OLDER_PAGE, state, rememberThread, observe } from "../store.js";
import { $, show, setText, place, redrawAfterPress } from "../dom.js";
import { describeError, scopeLabel } from "../format.js";
import { mentionsMe } from "../markdown.js";
import { request } from "../connection.js";
import { pendingFor, renderPending, enqueue } from "../outbox.js";
import { scheduleMarkRead } from "../readstate.js";
import { notifyMention } from "../notifications.js";
import { refreshScopes, renderScopes } from "./sidebar.js";
import { startsGroup, messageNode } from "./message.js";
import { loadOwner } from "./edits.js";
import { takeComposer, clearComposer } from "./uploads.js";
import { renderThread } from "./thread.js";
import { openMembers } from "./members.js";
import { showPane, focusComposer } from "./layout.js";
import { rove, keepMessageFocus } from "./keyboard.js";
import * as history from "./history.js";
import { renderTyping } from "./presence.js";
import { serviceComposer, postAsService } from "./services.js";
import { shareButtonFor } from "./cards.js";

// `reveal`: a switch the reader asked for (or the first one) brings the
// conversation on screen and focus to its composer; a refetch of the open one
// (after a reconnect) leaves both where they are. `focus`: the composer takes
// focus (the first open after sign-in leaves it in a field the reader is
// already typing in, e.g. the search box).
export async function openScope(scopeId, { reveal = scopeId !== state.current, focus = reveal } = {}) {
  const pane = state.pane;
  state.current = scopeId;
  localStorage.setItem(STORAGE_SCOPE, scopeId);
  const scope = state.scopes.get(scopeId);
  const unreadAfter = history.unreadMarkAtOpen(scope);
  state.view = { scopeId, messages: new Map(), hasMore: false, loading: true, error: "", unreadAfter };
  history.wireHistory(loadOlder);
  $("scope-title").textContent = scope ? scopeLabel(scope) : "…";
  $("members-button").disabled = false;
  setComposerEnabled(true);
  serviceComposer(scope);
  shareButtonFor(scope);
  setText($("composer-note"), "");
  if (state.panel?.kind === "members") openMembers({ refresh: true });
  if (scope?.type === "channel") loadOwner(scopeId);
  renderScopes();
  renderTimeline({ stick: true });
  renderTyping();
  showPane(reveal ? "conversation" : pane);
  if (focus) focusComposer();
  await loadHistory(scopeId, null);
}

export async function loadHistory(scopeId, beforeSeq) {
  const view = state.view;
  if (!view || view.scopeId !== scopeId) return;
  view.loading = true;
  const fields = { target: "scope:" + scopeId, limit: beforeSeq === null ? PAGE : OLDER_PAGE };
  if (beforeSeq !== null) fields.beforeSeq = beforeSeq;
  try {
    const page = await request("history", fields);
    if (state.view !== view) return;
    for (const message of page.messages) view.messages.set(message.seq, message);
    // A page may skip rows the reader cannot see, even all of them: the node
    // says where to go on. One that does not move on ends the paging rather
    // than asking the same question forever. Seqs start at 1.
    const lowest = page.messages.length ? page.messages[0].seq : Infinity;
    const next = page.continueBeforeSeq ?? Math.min(lowest, view.olderBefore ?? Infinity);
    const moved = beforeSeq === null || next < beforeSeq;
    if (Number.isFinite(next)) view.olderBefore = Math.min(next, view.olderBefore ?? Infinity);
    view.hasMore = page.hasMore && moved && !view.messages.has(1);
    if (beforeSeq === null) observe(scopeId, page.coversThroughSeq);
    view.error = "";
    view.loading = false;
    renderTimeline({ stick: beforeSeq === null, keepOffset: beforeSeq !== null });
    // The first unread may be pages back: fetch until its line can be shown
    // (within reason), then bring it on screen once.
    if (view.unreadAfter !== null && !view.unreadShown) {
      if (history.revealNewMessagesLine()) view.unreadShown = true;
      else if (view.hasMore && view.messages.size < UNREAD_REACH) {
        loadOlder();
        return;
      }
    }
    history.updateJump();
    scheduleMarkRead();
    // A page that does not fill the screen leaves the top in reach: keep going.
    history.maybeLoadOlder();
  } catch (err) {
    if (state.view !== view) return;
    view.loading = false;
    view.error = err.code === "disconnected" ? "" : "Could not load history — " + describeError(err);
    renderTimeline({});
  }
}

const UNREAD_REACH = 500;

export function loadOlder() {
  const view = state.view;
  if (!view || view.loading) return;
  const oldest = view.olderBefore ?? Math.min(...view.messages.keys());
  if (Number.isFinite(oldest)) loadHistory(view.scopeId, oldest);
}

export function rerender() {
  if (state.view) renderTimeline({});
  if (state.panel?.kind === "thread") renderThread({});
}

export function copiesOf(messageId) {
  // Every copy of a message the views hold (the timeline, the thread panel, its root).
  const out = [];
  if (state.view) for (const m of state.view.messages.values()) if (m.id === messageId) out.push(m);
  if (state.panel?.kind === "thread") {
    for (const m of state.panel.messages.values()) if (m.id === messageId) out.push(m);
    if (state.panel.root?.id === messageId) out.push(state.panel.root);
  }
  return out;
}

export function noteError(text) {
  setText($("composer-note"), text);
  $("composer-note").className = "note error";
}

// The message nodes of the last drawing, by message.
let drawn = { scopeId: null, nodes: new Map() };

// Redraws held during a press, together: stuck to the bottom if any asked
// for it, nodes reused only if every one was an older page.
export const renderTimeline = redrawAfterPress(drawTimeline, (held, asked) => ({
  stick: Boolean(held.stick || asked.stick),
  keepOffset: Boolean(held.keepOffset && asked.keepOffset),
}));

function drawTimeline({ stick = false, keepOffset = false }) {
  const box = $("timeline");
  const list = $("messages");
  const view = state.view;
  const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
  const fromBottom = box.scrollHeight - box.scrollTop;
  const restoreFocus = keepEditorFocus();
  renderPending();
  if (!view) {
    list.replaceChildren();
    show($("load-older"), false);
    show($("jump-latest"), false);
    setText($("timeline-empty"), state.me ? "Pick a conversation on the left to start reading." : "");
    $("timeline-empty").classList.remove("error");
    return;
  }
  const messages = history.wholeSends([...view.messages.values()].sort((a, b) => a.seq - b.seq));
  const firstUnread = history.firstUnreadSeq(view, messages);
  // An older page only adds messages above: the ones on screen keep their
  // nodes (drawing a thousand again for each page froze the reader for a
  // second). Any other drawing builds every node anew.
  const reuse = keepOffset && drawn.scopeId === view.scopeId;
  const kept = reuse ? drawn : { nodes: new Map(), line: null };
  drawn = { scopeId: view.scopeId, nodes: new Map(), line: null };
  const wanted = [];
  let previous = null;
  for (const message of messages) {
    const unread = message.seq === firstUnread;
    if (unread) wanted.push((drawn.line = kept.line || history.newMessagesLine()));
    const grouped = !unread && !startsGroup(message, previous);
    let shown = kept.nodes.get(message);
    if (shown?.grouped !== grouped) shown = { grouped, node: messageNode(message, { grouped }) };
    drawn.nodes.set(message, shown);
    wanted.push(shown.node);
    previous = message;
  }
  if (reuse) place(list, wanted);
  else list.replaceChildren(...wanted);
  show($("load-older"), view.hasMore && !view.loading);
  const empty = $("timeline-empty");
  if (view.error) setText(empty, view.error);
  else if (view.loading && !messages.length) setText(empty, "Loading…");
  else setText(empty, messages.length || pendingFor(view.scopeId).length ? "" : "No messages yet. Say hello.");
  empty.classList.toggle("error", Boolean(view.error));
  if (keepOffset) box.scrollTop = box.scrollHeight - fromBottom;
  else if ((stick || atBottom) && !view.detached) box.scrollTop = box.scrollHeight;
  rove(list);
  restoreFocus();
  history.updateJump();
}

export function keepEditorFocus() {
  // Re-rendering replaces the nodes: an edit box being typed in keeps focus and
  // caret, a message or one of its buttons keeps focus.
  const active = document.activeElement;
  if (!active?.closest?.(".edit-form") || active.tagName !== "TEXTAREA") return keepMessageFocus(active);
  const [start, end] = [active.selectionStart, active.selectionEnd];
  return () => {
    const box = document.querySelector(".edit-form textarea");
    if (!box || box === active) return;
    box.focus();
    box.setSelectionRange(start, end);
  };
}

export function onMessage(scopeId, message) {
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
  // A rewind's notice raises no unread (docs/rewind.md).
  else if (!mine && message.messageType !== "rewind_notice" && message.seq > (scope.lastReadSeq || 0)) {
    scope.unread = (scope.unread || 0) + 1;
  }
  renderScopes();
}

export function onThreadUpdated(frame) {
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

export function setComposerEnabled(enabled) {
  $("composer-input").disabled = !enabled;
  $("composer-send").disabled = !enabled;
  $("attach-button").disabled = !enabled;
}

export function sendMain(event) {
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
  const scope = state.scopes.get(state.current);
  if (scope?.service) {
    postAsService(scope, content);
    return;
  }
  if (extra.forward) extra.quote = state.composers.main.quote;
  input.value = "";
  setText($("composer-note"), "");
  $("composer-note").setAttribute("role", "status");
  clearComposer("main");
  enqueue("scope:" + state.current, state.current, content, { ...extra, where: "main" });
  input.focus();
}

export function enterToSend(form) {
  return (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      form.requestSubmit();
    }
  };
}
