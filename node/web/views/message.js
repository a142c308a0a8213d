// One message as an article: header, sources, text, attachments, reactions,
// thread summary and actions; reactions and the emoji picker.

import { state } from "../store.js";
import { el } from "../dom.js";
import { avatarNode, describeError, formatTime, personName } from "../format.js";
import { renderMarkdown, mentionsMe } from "../markdown.js";
import { request, supports } from "../connection.js";
import { rerender, copiesOf, noteError, openScope } from "./conversation.js";
import { channelOwnerOf, startEdit, editForm, deleteMessage } from "./edits.js";
import { sourcesNode, startQuote, openForward } from "./sources.js";
import { attachmentsNode } from "./uploads.js";
import { openThread } from "./thread.js";
import { createTaskFrom, isTask } from "./tasks.js";
import { isNotice, rewindActions, rewindTag, rewoundBody } from "./rewind.js";
import { cardNode, isCard, shareMessage } from "./cards.js";

// Messages their author may edit: text, and a task's discussion.
const EDITABLE = new Set(["text", "task_discussion"]);

const GROUP_WINDOW_MS = 5 * 60 * 1000;

const COMMON_EMOJI = ["👍", "❤️", "😂", "🎉", "🙏", "👀", "✅", "🚀"];

function replyCount(message) {
  return Math.max(message.thread?.replyCount || 0, state.replyCounts.get(message.id) || 0);
}

export function threadScopeOfRoot(rootId) {
  if (!rootId) return null;
  for (const [scopeId, info] of Object.entries(state.threads)) if (info.rootId === rootId) return scopeId;
  return null;
}

function participantNames(ids) {
  const names = ids.slice(0, 3).map((id) => (id === state.me?.id ? "you" : personName(state.people.get(id)) || "someone"));
  return names.join(", ") + (ids.length > 3 ? ` +${ids.length - 3}` : "");
}

export function startsGroup(message, previous) {
  if (!previous) return true;
  if (previous.author?.memberId !== message.author?.memberId) return true;
  if (replyCount(previous) > 0) return true;
  const gap = new Date(message.createdAt) - new Date(previous.createdAt);
  return !(gap >= 0 && gap < GROUP_WINDOW_MS);
}

export function messageNode(message, { inThread = false, grouped = false } = {}) {
  const author = message.author || {};
  const mine = state.me && author.memberId === state.me.id;
  const scope = state.scopes.get(message.scopeId);
  const live = !message.deleted && message.messageType !== "system" && !isNotice(message);
  const canThread = !inThread && scope && scope.type === "channel" && live;
  const count = inThread ? 0 : replyCount(message);
  const threadScope = message.thread?.scopeId || threadScopeOfRoot(message.id);
  const threadUnread = threadScope ? state.scopes.get(threadScope)?.unread || 0 : 0;
  const authorName = personName({ displayName: author.displayName, handle: author.handle, id: author.memberId }) || "?";
  const headId = `h-${inThread ? "t" : "m"}-${message.id}`;
  const key = `${inThread ? "t" : "m"}:${message.id}`;
  const editing = state.editing?.key === key ? state.editing : null;
  const classes = ["msg"];
  if (mine) classes.push("mine");
  if (grouped) classes.push("grouped");
  if (message.deleted) classes.push("deleted");
  if (message.rewound) classes.push("rewound");
  if (isNotice(message)) classes.push("notice");
  if (mentionsMe(message) && !mine && !message.deleted) classes.push("mentions-me");
  const actions = [];
  if (live && !editing) {
    if (canThread) {
      actions.push(el("button", { type: "button", class: "link", onclick: () => openThread(message) }, "Reply in thread"));
    }
    if (supports("react")) {
      actions.push(
        el(
          "button",
          {
            type: "button",
            class: "link",
            "aria-expanded": state.pickerFor === key ? "true" : "false",
            onclick: () => togglePicker(key),
          },
          "Add reaction",
        ),
      );
    }
    actions.push(el("button", { type: "button", class: "link", onclick: () => startQuote(message, inThread) }, "Quote"));
    actions.push(el("button", { type: "button", class: "link", onclick: () => openForward(message) }, "Forward"));
    if (supports("shareMessage") && !isCard(message)) {
      actions.push(el("button", { type: "button", class: "link", onclick: () => shareMessage(message) }, "Share"));
    }
    const cardOf = message.messageType === "task_card" ? message.metadata?.taskId : null;
    if (cardOf && isTask(cardOf)) {
      actions.push(el("button", { type: "button", class: "link", onclick: () => openScope(cardOf, { reveal: true }) }, "Open task"));
    }
    if (!inThread && supports("createTask")) {
      actions.push(el("button", { type: "button", class: "link", onclick: () => createTaskFrom(message) }, "Create task"));
    }
    // One row of a long send cannot take the whole text back: no Edit on those.
    if (mine && EDITABLE.has(message.messageType) && !message.chunkRows && supports("edit")) {
      actions.push(el("button", { type: "button", class: "link", onclick: () => startEdit(key, message) }, "Edit"));
    }
    if ((mine || (state.me && channelOwnerOf(message.scopeId) === state.me.id)) && supports("delete")) {
      actions.push(el("button", { type: "button", class: "link", onclick: () => deleteMessage(message) }, "Delete"));
    }
    actions.push(...rewindActions(message));
  }
  let body;
  if (message.deleted) body = el("p", { class: "tombstone" }, "message deleted");
  else if (editing) body = editForm(editing, message);
  else if (isCard(message)) body = rewoundBody(message, cardNode(message));
  else {
    body = el("div", { class: "content", dir: "auto" }, renderMarkdown(message.content ?? "", message));
    if (message.editedAt || message.revision) {
      // "(edited)" follows the text: inside its last paragraph when it ends with one.
      const mark = el("span", { class: "edited muted small", title: message.editedAt ? `edited ${message.editedAt}` : null }, "(edited)");
      const last = body.lastElementChild;
      (last?.tagName === "P" ? last : body).append(last?.tagName === "P" ? " " : "", mark);
    }
    body = rewoundBody(message, body);
  }
  return el(
    "article",
    {
      class: classes.join(" "),
      "data-seq": message.seq,
      "data-id": message.id,
      "aria-labelledby": headId,
      id: inThread ? null : "m-" + message.id,
    },
    el(
      "div",
      { class: "msg-head" + (grouped ? " sr-only" : ""), id: headId },
      avatarNode(author.memberId, authorName),
      el("span", { class: "author" }, authorName),
      author.handle ? el("span", { class: "handle" }, "@" + author.handle) : null,
      author.type === "service"
        ? el("span", { class: "tag app", title: "A service account (an app) posted this" }, "APP")
        : author.type && author.type !== "human"
          ? el("span", { class: "tag" }, author.type)
          : null,
      el("time", { datetime: message.createdAt, title: message.createdAt }, formatTime(message.createdAt)),
      rewindTag(message),
    ),
    message.deleted ? null : sourcesNode(message),
    body,
    message.deleted ? null : attachmentsNode(message),
    message.deleted ? null : reactionsNode(message),
    live && state.pickerFor === key ? pickerNode(message) : null,
    count
      ? el(
          "button",
          {
            type: "button",
            class: "link replies" + (threadUnread ? " has-unread" : ""),
            onclick: () => openThread(message),
          },
          `${count} ${count === 1 ? "reply" : "replies"}`,
          threadUnread ? el("span", { class: "sr-only" }, `, ${threadUnread} unread`) : null,
          message.thread?.participants?.length
            ? el("span", { class: "muted small" }, " · " + participantNames(message.thread.participants))
            : null,
          message.thread?.lastReplyAt
            ? el("span", { class: "muted small" }, ` · last ${formatTime(message.thread.lastReplyAt)}`)
            : null,
        )
      : null,
    actions.length ? el("div", { class: "actions" }, actions) : null,
  );
}

function applyReaction(message, memberId, emoji, op) {
  const list = (message.reactions ||= []);
  let entry = list.find((r) => r.emoji === emoji);
  if (op === "add") {
    if (!entry) {
      entry = { emoji, count: 0, memberIds: [] };
      list.push(entry);
    }
    entry.memberIds ||= [];
    if (entry.memberIds.includes(memberId)) return;
    entry.count += 1;
    if (entry.memberIds.length < 20 || memberId === state.me?.id) entry.memberIds.push(memberId);
    return;
  }
  if (!entry) return;
  const at = (entry.memberIds || []).indexOf(memberId);
  if (at >= 0) entry.memberIds.splice(at, 1);
  else if (entry.count <= (entry.memberIds || []).length) return; // not there: nothing to undo
  entry.count -= 1;
  if (entry.count <= 0) list.splice(list.indexOf(entry), 1);
}

export function onReaction(frame) {
  for (const message of copiesOf(frame.messageId)) applyReaction(message, frame.memberId, frame.emoji, frame.op);
  rerender();
}

async function react(message, emoji, op = null) {
  const mine = (message.reactions || []).find((r) => r.emoji === emoji)?.memberIds?.includes(state.me?.id);
  const change = op || (mine ? "remove" : "add");
  state.pickerFor = null;
  try {
    const result = await request("react", { messageId: message.id, emoji, op: change });
    if (result.changed !== false) {
      for (const copy of copiesOf(message.id)) applyReaction(copy, state.me.id, emoji, change);
    }
  } catch (err) {
    if (err.code !== "unsupported") noteError(describeError(err));
  }
  rerender();
}

function togglePicker(key) {
  state.pickerFor = state.pickerFor === key ? null : key;
  rerender();
  if (state.pickerFor) document.querySelector(".picker button")?.focus();
}

function reactionsNode(message) {
  const list = (message.reactions || []).filter((r) => r.count > 0);
  if (!list.length) return null;
  return el(
    "div",
    { class: "reactions", role: "group", "aria-label": "Reactions" },
    list.map((r) => {
      const mine = (r.memberIds || []).includes(state.me?.id);
      const who = (r.memberIds || []).map((id) => (id === state.me?.id ? "you" : personName(state.people.get(id)) || "someone"));
      return el(
        "button",
        {
          type: "button",
          class: "reaction",
          "aria-pressed": mine ? "true" : "false",
          title: `${who.join(", ")}${r.count > who.length ? ` and ${r.count - who.length} more` : ""} reacted with ${r.emoji}`,
          disabled: !supports("react"),
          onclick: () => react(message, r.emoji),
        },
        `${r.emoji} ${r.count}`,
      );
    }),
  );
}

function pickerNode(message) {
  return el(
    "div",
    {
      class: "picker",
      role: "group",
      "aria-label": "Pick a reaction",
      onkeydown: (event) => {
        if (event.key === "Escape") {
          event.stopPropagation();
          state.pickerFor = null;
          rerender();
        }
      },
    },
    COMMON_EMOJI.map((emoji) =>
      el("button", { type: "button", "aria-label": `React with ${emoji}`, onclick: () => react(message, emoji, "add") }, emoji),
    ),
  );
}
