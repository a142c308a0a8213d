// Read state: marks what is on screen as read (debounced markRead), and follows
// read positions moved by the member's other sessions.

import { state } from "./store.js";
import { describeError } from "./format.js";
import { request } from "./connection.js";
import { refreshScopes, renderScopes } from "./views/sidebar.js";
import { renderTimeline } from "./views/conversation.js";

let markReadTimer = null;

export function scheduleMarkRead() {
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

export function onReadState(frame) {
  const scope = state.scopes.get(frame.scopeId);
  if (!scope) return;
  scope.lastReadSeq = Math.max(scope.lastReadSeq || 0, frame.lastReadSeq);
  refreshScopes(); // the node knows which unread messages remain
}
