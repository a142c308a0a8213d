// Rewind (docs/rewind.md): "Mark rewind point" and "Rewind to here" on a
// message, the greyed, collapsed range a rewind set aside, and its notice.
// After a rewind every reader gets `invalidate` and reads the conversation
// again (events.js), so nothing here patches the log by hand.

import { state } from "../store.js";
import { el } from "../dom.js";
import { describeError } from "../format.js";
import { request, supports } from "../connection.js";
import { rerender, noteError } from "./conversation.js";
import { channelOwnerOf } from "./edits.js";
import { confirmDialog } from "./dialogs.js";

export const REWIND_NOTICE = "rewind_notice";
const REWINDABLE = new Set(["channel", "dm", "thread"]);
const marked = new Set(); // message ids this session marked as rewind points

function scopeTypeOf(message) {
  const scope = state.scopes.get(message.scopeId);
  if (scope) return scope.type;
  return state.threads[message.scopeId] ? "thread" : null;
}

// Mirrors the server's rule (actors/rewind.py); the server decides.
function mayRewind(message) {
  const type = scopeTypeOf(message);
  if (!state.me || state.me.type !== "human") return false;
  if (type === "dm") return true;
  return channelOwnerOf(message.scopeId) === state.me.id;
}

async function markPoint(message) {
  const { recoveryPointId } = await request("markRecoveryPoint", { messageId: message.id });
  marked.add(message.id);
  return recoveryPointId;
}

async function onMark(message) {
  try {
    await markPoint(message);
    rerender();
  } catch (err) {
    noteError(describeError(err));
  }
}

async function onRewind(message) {
  const ok = await confirmDialog(
    "Rewind this conversation to here?",
    "Everything after this message is set aside for everyone: it stays readable, greyed, and nothing still waiting to be delivered or to wake an agent is sent.",
    "Rewind",
  );
  if (!ok) return;
  try {
    const recoveryPointId = await markPoint(message);
    await request("rewind", { scopeId: message.scopeId, recoveryPointId });
  } catch (err) {
    noteError(describeError(err));
  }
}

// The buttons a message offers: any reader marks, the conversation's owner rewinds.
export function rewindActions(message) {
  if (message.rewound || !REWINDABLE.has(scopeTypeOf(message)) || !supports("rewind")) return [];
  const out = [];
  if (!marked.has(message.id)) {
    out.push(el("button", { type: "button", class: "link", onclick: () => onMark(message) }, "Mark rewind point"));
  }
  if (mayRewind(message)) {
    out.push(el("button", { type: "button", class: "link", onclick: () => onRewind(message) }, "Rewind to here"));
  }
  return out;
}

export function isNotice(message) {
  return message.messageType === REWIND_NOTICE;
}

// A point this session marked shows a tag; a set-aside message is collapsed.
export function rewindTag(message) {
  if (message.rewound) return el("span", { class: "tag rewound-tag" }, "rewound");
  if (marked.has(message.id)) return el("span", { class: "tag" }, "rewind point");
  return null;
}

// The ones the reader opened stay open when the timeline is drawn again
// (a new message, an invalidate).
const opened = new Set();

export function rewoundBody(message, body) {
  if (!message.rewound) return body;
  const toggled = (event) => {
    if (event.target.open) opened.add(message.id);
    else opened.delete(message.id);
  };
  return el(
    "details",
    { class: "rewound-body", open: opened.has(message.id), ontoggle: toggled },
    el("summary", {}, "Rewound message"),
    body,
  );
}
