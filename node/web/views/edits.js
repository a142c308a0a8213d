// Editing and deleting messages: the inline edit form, tombstones, live
// updates and deletions, and who may delete (the channel owner).

import { staleCard } from "./cards.js";
import { state } from "../store.js";
import { el } from "../dom.js";
import { moderationWords, describeError } from "../format.js";
import { request } from "../connection.js";
import { rerender, copiesOf, noteError } from "./conversation.js";
import { confirmDialog } from "./dialogs.js";
import { focusComposer } from "./layout.js";

export function channelOwnerOf(scopeId) {
  const scope = state.scopes.get(scopeId);
  const parent =
    state.threads[scopeId]?.parentId ||
    (state.panel?.kind === "thread" && state.panel.scopeId === scopeId ? state.panel.root?.scopeId : null);
  if (scope?.type === "thread" || (!scope && parent)) return state.owners.get(parent) || null;
  return state.owners.get(scopeId) || null;
}

export async function loadOwner(scopeId) {
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

export function startEdit(key, message) {
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

function endEdit() {
  // Typing goes on in the composer the edit was started from (Up there, or Edit).
  const key = state.editing?.key || "";
  const typing = Boolean(document.activeElement?.closest?.(".edit-form"));
  state.editing = null;
  rerender();
  if (typing) focusComposer(key.startsWith("t:") ? "thread" : "main");
}

export function editForm(editing, message) {
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
            endEdit();
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
      el("button", { type: "button", onclick: endEdit }, "Cancel"),
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
  if (content === message.content) return endEdit();
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
    if (state.editing === editing) endEdit();
    else rerender();
    return;
  } catch (err) {
    editing.saving = false;
    if (err.code === "moderation_blocked") editing.error = moderationWords(err).replace("Not sent", "Not saved");
    else editing.error = describeError(err);
  }
  rerender();
  if (state.editing === editing) focusEditor();
}

export function onMessageUpdated(frame) {
  const fresh = frame.message;
  if (!fresh) return;
  for (const copy of copiesOf(fresh.id)) {
    if ((copy.revision || 0) > (fresh.revision || 0) || staleCard(copy, fresh)) continue; // an older projection
    const pendingSources = (fresh.sources || []).some((src) => src.pending);
    Object.assign(copy, fresh, pendingSources ? { sources: copy.sources } : {});
  }
  rerender();
}

function tombstone(message) {
  Object.assign(message, { deleted: true, content: "", attachments: [], reactions: [], sources: [], mentions: [] });
}

export function onMessageDeleted(frame) {
  for (const copy of copiesOf(frame.messageId)) tombstone(copy);
  if (state.editing?.messageId === frame.messageId) state.editing = null;
  state.sources.set(frame.messageId, { status: "gone" });
  rerender();
}

export async function deleteMessage(message) {
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
