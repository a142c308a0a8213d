// What each server frame does: routes frames to the views that own them, and
// handles the session-wide ones (welcome, resumed, invalidate).

import { STORAGE_TOKEN, STORAGE_WORKSPACE, STORAGE_SCOPE, state } from "./store.js";
import { $, setText } from "./dom.js";
import { personName } from "./format.js";
import { setStatus, markUnsupported } from "./connection.js";
import { flushOutbox } from "./outbox.js";
import { onReadState } from "./readstate.js";
import { updateNotifyButton } from "./notifications.js";
import { refreshScopes, loadPeople } from "./views/sidebar.js";
import {
  openScope,
  renderTimeline,
  onMessage,
  onThreadUpdated,
  setComposerEnabled,
} from "./views/conversation.js";
import { onReaction } from "./views/message.js";
import { setAdmin } from "./views/admin.js";
import { onMessageUpdated, onMessageDeleted } from "./views/edits.js";
import { openThreadScope } from "./views/thread.js";
import { onMembership } from "./views/members.js";
import { onTyping, clearTyping, onPresence, loadPresence } from "./views/presence.js";
import { onMemberUpdated } from "./views/profile.js";
import { onTaskUpdated } from "./views/tasks.js";
import { isWorkflowScope, onWorkflowMessage, onWorkflowUpdated } from "./views/workflows.js";

export function dispatch(frame) {
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
      // A plan's transcript is no conversation: only its plan view shows it.
      if (isWorkflowScope(frame.scopeId)) return onWorkflowMessage(frame);
      clearTyping(frame.scopeId, frame.message?.author?.memberId);
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
    case "typing":
      return onTyping(frame);
    case "presence":
      return onPresence(frame);
    case "memberUpdated":
      return onMemberUpdated(frame);
    case "taskUpdated":
      return onTaskUpdated(frame);
    case "workflowUpdated":
      return onWorkflowUpdated(frame);
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
  setAdmin(Boolean(frame.admin));
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
      const typing = document.activeElement?.matches?.("input, textarea, select");
      if (first) openScope(first, { focus: !typing });
      else renderTimeline({});
    } else if (!state.lastSeen.has(state.current)) openScope(state.current);
  });
  loadPeople();
  loadPresence();
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

function onInvalidate(frame) {
  state.lastSeen.delete(frame.scopeId);
  if (state.current === frame.scopeId) openScope(frame.scopeId);
  if (state.panel?.kind === "thread" && state.panel.scopeId === frame.scopeId) {
    openThreadScope(frame.scopeId);
  }
  refreshScopes();
}
