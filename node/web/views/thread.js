// The side panel and the thread in it: root, replies and the thread composer.

import { state, rememberThread, observe } from "../store.js";
import { $, el, show, setText, redrawAfterPress } from "../dom.js";
import { describeError } from "../format.js";
import { request } from "../connection.js";
import { enqueue, sentCallbacks } from "../outbox.js";
import { scheduleMarkRead } from "../readstate.js";
import { refreshScopes, renderScopes } from "./sidebar.js";
import { openScope, keepEditorFocus } from "./conversation.js";
import { threadScopeOfRoot, startsGroup, messageNode } from "./message.js";
import { loadOwner } from "./edits.js";
import { takeComposer, clearComposer } from "./uploads.js";
import { showPane, focusComposer } from "./layout.js";
import { rove } from "./keyboard.js";
import { renderTyping } from "./presence.js";

// `reveal`: false when the open panel is only being brought up to date (a phone
// keeps showing whatever pane it shows).
export function openPanel(title, { reveal = true } = {}) {
  $("panel-title").textContent = title;
  show($("panel"), true);
  document.body.classList.add("with-panel");
  if (reveal) showPane("panel");
}

export function closePanel() {
  state.panel = null;
  clearComposer("thread");
  show($("panel"), false);
  show($("thread-composer"), false);
  document.body.classList.remove("with-panel");
  $("members-button").setAttribute("aria-expanded", "false");
  if (state.pane === "panel") showPane(state.current ? "conversation" : "list");
  renderScopes();
  renderTyping();
}

export async function openThreadScope(scopeId) {
  // From the sidebar: the thread's history carries its root.
  await openThread(null, scopeId);
}

export async function openThread(root, scopeId = null) {
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
      showPane("panel"); // the thread, not its channel, is what was asked for
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
  focusComposer("thread");
}

export const renderThread = redrawAfterPress(drawThread, (held, asked) => ({
  stick: Boolean(held.stick || asked.stick),
}));

function drawThread({ stick = false }) {
  const panel = state.panel;
  if (panel?.kind !== "thread") return;
  renderTyping();
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
  rove(body);
  restoreFocus();
}

export function sendThread(event) {
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
