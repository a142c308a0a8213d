// Cards (docs/cards.md): a shared channel or message, shown only as far as
// the node lets this reader see it, and a service's interactive card.

import { state } from "../store.js";
import { $, el, show } from "../dom.js";
import { describeError, formatTime, scopeLabel } from "../format.js";
import { renderMarkdown } from "../markdown.js";
import { request, supports } from "../connection.js";
import { copiesOf, noteError, openScope, rerender } from "./conversation.js";
import { openDialog } from "./dialogs.js";
import { refreshScopesNow } from "./sidebar.js";
import { openAt } from "./search.js";

const SHARE = "channel_share_card";
const APP = "app_interactive_card";
const resolving = new Set(); // share card messages whose card is being read
const acting = new Set(); // app card messages with an action in flight
const expiring = new Map(); // app card message id -> timer redrawing it when it expires

export function isCard(message) {
  return Boolean(message.card) && (message.messageType === SHARE || message.messageType === APP);
}

export function cardNode(message) {
  return message.messageType === APP ? appCard(message) : shareCard(message);
}

// An older projection must not undo a newer card (card revisions only grow).
export function staleCard(copy, fresh) {
  return (copy.card?.revision || 0) > (fresh.card?.revision || 0);
}

function group(label, classes, ...children) {
  return el("section", { class: "msg-card " + classes, role: "group", "aria-label": label }, ...children);
}

function shareCard(message) {
  const card = message.card;
  const what = card.kind === "message" ? "message" : "channel";
  if (card.revoked) {
    return group(`Shared ${what}, no longer available`, "card-share card-revoked", el("p", { class: "muted" }, `Shared ${what} — no longer available`));
  }
  if (card.pending) {
    resolve(message);
    return group(`Shared ${what}`, "card-share card-pending", el("p", { class: "muted" }, `Shared ${what}…`));
  }
  if (!card.source) {
    const text = what === "message" ? "A message you cannot see" : "A channel you cannot see";
    return group(text, "card-share card-unavailable", el("p", { class: "muted" }, text));
  }
  return what === "message" ? sharedMessage(card.source) : sharedChannel(card.source);
}

function sharedChannel(source) {
  const count = `${source.memberCount} ${source.memberCount === 1 ? "member" : "members"}`;
  const open = source.joined || state.scopes.has(source.scopeId);
  // A private channel is shown only to its members, who open it; a public one
  // can be joined from the card.
  const button = open
    ? el("button", { type: "button", onclick: () => openScope(source.scopeId, { reveal: true }) }, "Open")
    : source.visibility === "public"
      ? el("button", { type: "button", class: "primary", onclick: () => join(source.scopeId) }, "Join")
      : null;
  return group(
    `Shared channel #${source.slug}`,
    "card-share card-channel",
    el("h4", {}, `#${source.slug}`, " ", el("span", { class: "muted" }, source.name)),
    source.description ? el("p", { dir: "auto" }, source.description) : null,
    el("p", { class: "muted small" }, `${count} · ${source.visibility}`),
    button,
  );
}

function sharedMessage(source) {
  const author = source.author || {};
  const name = author.displayName || author.handle || "?";
  return group(
    `Shared message from ${name}`,
    "card-share card-message",
    el("div", { class: "source-head" }, el("span", { class: "author" }, name), el("time", { datetime: source.createdAt }, formatTime(source.createdAt))),
    source.deleted
      ? el("p", { class: "tombstone" }, "message deleted")
      : el("div", { class: "content", dir: "auto" }, renderMarkdown(source.content || "", null)),
    el("button", { type: "button", class: "link small", onclick: () => openAt(source.scopeId, source.seq, source.messageId) }, "View"),
  );
}

async function join(scopeId) {
  try {
    await request("join", { scopeId });
    await refreshScopesNow();
    openScope(scopeId, { reveal: true });
  } catch (err) {
    noteError(describeError(err));
  }
}

async function resolve(message) {
  // Live events carry a share card unresolved: history says what this reader may see.
  if (resolving.has(message.id)) return;
  resolving.add(message.id);
  try {
    const page = await request("history", { target: "scope:" + message.scopeId, beforeSeq: message.seq + 1, limit: 1 });
    const stored = page.messages.find((m) => m.id === message.id);
    const card = stored?.card || { ...message.card, pending: false };
    for (const copy of copiesOf(message.id)) if (copy.card?.pending) copy.card = card;
  } catch (err) {
    if (err.code !== "disconnected") for (const copy of copiesOf(message.id)) copy.card = { ...copy.card, pending: false };
  } finally {
    resolving.delete(message.id);
  }
  rerender();
}

function expired(card) {
  return card.state === "expired" || (card.expiresAt && Date.now() >= Date.parse(card.expiresAt));
}

// A card on screen turns "expired" at its time, not at the next redraw.
function redrawAtExpiry(message) {
  const left = message.card.expiresAt ? Date.parse(message.card.expiresAt) - Date.now() : NaN;
  if (!(left > 0) || expiring.has(message.id) || left > 2 ** 31 - 1) return;
  expiring.set(
    message.id,
    setTimeout(() => {
      expiring.delete(message.id);
      rerender();
    }, left + 50),
  );
}

function appCard(message) {
  const card = message.card;
  const over = expired(card);
  if (!over) redrawAtExpiry(message);
  const busy = acting.has(message.id);
  const buttons = (card.actions || []).map((action) =>
    el(
      "button",
      {
        type: "button",
        class: action.style === "danger" ? "danger" : action.style === "primary" ? "primary" : "",
        disabled: over || busy,
        onclick: () => act(message, action.id, ""),
      },
      action.label,
    ),
  );
  return group(
    message.content || card.title,
    "card-app" + (over ? " card-expired" : ""),
    el("h4", { dir: "auto" }, card.title),
    card.text ? el("div", { class: "content", dir: "auto" }, renderMarkdown(card.text, null)) : null,
    card.fields?.length
      ? el("dl", { class: "card-fields" }, ...card.fields.flatMap((f) => [el("dt", {}, f.label), el("dd", { dir: "auto" }, f.value)]))
      : null,
    buttons.length ? el("div", { class: "card-actions" }, ...buttons) : null,
    card.select ? selectNode(message, card.select, over || busy) : null,
    over ? el("p", { class: "muted small" }, "expired") : null,
    busy ? el("p", { class: "muted small", role: "status" }, "Sending…") : null,
  );
}

function selectNode(message, select, disabled) {
  const id = `card-${message.id}-${select.id}`;
  const choice = el(
    "select",
    { id, disabled },
    select.options.map((option) => el("option", { value: option.value }, option.label)),
  );
  return el(
    "div",
    { class: "card-actions" },
    el("label", { for: id }, select.label),
    choice,
    el("button", { type: "button", disabled, onclick: () => act(message, select.id, choice.value) }, "Submit"),
  );
}

async function act(message, actionId, value) {
  if (acting.has(message.id)) return;
  acting.add(message.id);
  rerender();
  try {
    const result = await request("cardAction", { messageId: message.id, actionId, value, revision: message.card.revision });
    for (const copy of copiesOf(message.id)) {
      if ((copy.card?.revision || 0) < result.revision) copy.card = { ...copy.card, revision: result.revision };
    }
  } catch (err) {
    if (err.code === "conflict" && err.details?.expired) noteError("This card has expired.");
    else if (err.code === "conflict") noteError("Someone else acted on this card first.");
    else noteError(describeError(err));
  } finally {
    acting.delete(message.id);
    rerender();
  }
}

// ---------------------------------------------------------------- sharing

export function shareButtonFor(scope) {
  show($("share-channel-button"), scope?.type === "channel" && supports("shareChannel"));
}

export function wireCards() {
  $("share-channel-button").addEventListener("click", () => {
    const scope = state.scopes.get(state.current);
    if (scope) openShare("shareChannel", { channelId: scope.id }, `Share ${scopeLabel(scope)}`);
  });
}

export function shareMessage(message) {
  openShare("shareMessage", { messageId: message.id }, "Share message");
}

function openShare(op, fields, title) {
  openDialog("share-dialog");
  $("share-title").textContent = title;
  const scopes = [...state.scopes.values()]
    .filter((scope) => scope.type !== "thread" && scope.type !== "service_account")
    .sort((a, b) => scopeLabel(a).localeCompare(scopeLabel(b)));
  const list = el("ul", { class: "browse-list" });
  for (const scope of scopes) {
    const label = scopeLabel(scope);
    const onclick = async () => {
      try {
        await request(op, { ...fields, target: "scope:" + scope.id });
        $("share-dialog").close();
        openScope(scope.id, { reveal: true });
      } catch (err) {
        $("share-body").prepend(el("p", { class: "error", role: "alert" }, describeError(err)));
      }
    };
    list.append(el("li", {}, el("span", { class: "author" }, label), el("button", { type: "button", "aria-label": `Share to ${label}`, onclick }, "Share")));
  }
  $("share-body").replaceChildren(scopes.length ? list : el("p", { class: "muted" }, "No conversations."));
}
