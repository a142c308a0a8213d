// The offline send queue: items persisted in localStorage, resent in order with
// the same clientMessageId, shown under the timeline until the node stores them.

import { state, saveOutbox } from "./store.js";
import { $, el, setText } from "./dom.js";
import { randomId, moderationWords, describeError } from "./format.js";
import { request } from "./connection.js";
import { renderExtras } from "./views/uploads.js";
import { showHints } from "./views/hints.js";

export function pendingFor(scopeId) {
  return state.outbox.filter((item) => item.scopeId === scopeId);
}

export function renderPending() {
  const box = $("pending");
  const items = state.view ? pendingFor(state.view.scopeId) : [];
  box.replaceChildren(
    ...items.map((item) =>
      el(
        "div",
        { class: "msg pending" + (item.error ? " failed" : "") },
        el("div", { class: "content", dir: "auto" }, document.createTextNode(item.content)),
        item.uploads?.length || item.forward
          ? el(
              "div",
              { class: "muted small" },
              [item.forward ? "with a quote" : "", item.uploads?.length ? item.uploads.map((u) => u.name).join(", ") : ""]
                .filter(Boolean)
                .join(" · "),
            )
          : null,
        el(
          "div",
          { class: "muted small" },
          item.error
            ? `Not sent — ${item.error} `
            : state.connected
              ? "Sending…"
              : "Waiting for the connection — will be sent when it is back.",
          item.error
            ? el("button", { type: "button", class: "link", onclick: () => discard(item) }, "Discard")
            : null,
        ),
      ),
    ),
  );
}

function discard(item) {
  state.outbox = state.outbox.filter((other) => other !== item);
  saveOutbox();
  renderPending();
}

export function enqueue(target, scopeId, content, extra = {}) {
  const item = { clientMessageId: randomId(), target, scopeId, content, error: "", ...extra };
  state.outbox.push(item);
  saveOutbox();
  renderPending();
  flushOutbox();
  return item;
}

function describeHeld(result) {
  if (result.state === "held") return "newer messages arrived first; read them and send again";
  if (result.state === "partial_held") return "only part of it was posted";
  return `unexpected result ${result.state}`;
}

export async function flushOutbox() {
  if (state.flushing || !state.connected) return;
  state.flushing = true;
  try {
    while (state.connected) {
      const item = state.outbox.find((i) => !i.error);
      if (!item) break;
      renderPending();
      let result;
      try {
        // The same clientMessageId on every attempt: a resend after a lost reply is `already_sent`.
        const fields = { target: item.target, content: item.content, clientMessageId: item.clientMessageId };
        if (item.attachmentIds?.length) fields.attachmentIds = item.attachmentIds;
        if (item.forward) fields.forward = item.forward;
        result = await request("send", fields);
      } catch (err) {
        if (err.code === "disconnected") break;
        if (err.code === "moderation_blocked") {
          // Nothing was stored: the text goes back to where it was typed, with the reason.
          state.outbox = state.outbox.filter((other) => other !== item);
          saveOutbox();
          restoreBlocked(item, err);
          continue;
        }
        if (err.retryable) {
          const wait = err.details?.retryAfterMs ?? 2000;
          setTimeout(flushOutbox, wait);
          break;
        }
        item.error = describeError(err);
        saveOutbox();
        continue;
      }
      if (result.state === "sent" || result.state === "already_sent") {
        state.outbox = state.outbox.filter((other) => other !== item);
        sentCallbacks.get(item.clientMessageId)?.(result);
        sentCallbacks.delete(item.clientMessageId);
        if (result.hints) showHints(item, result.hints);
      } else {
        item.error = describeHeld(result);
      }
      saveOutbox();
    }
  } finally {
    state.flushing = false;
    renderPending();
    const failed = state.outbox.find((i) => i.error);
    if (failed) {
      setText($("composer-note"), "Not sent — " + failed.error);
      $("composer-note").className = "note error";
    }
  }
}

export const sentCallbacks = new Map(); // clientMessageId -> callback (not persisted)

function restoreBlocked(item, err) {
  const which = item.where === "thread" && state.panel?.kind === "thread" ? "thread" : "main";
  const input = $(which === "main" ? "composer-input" : "thread-input");
  const here = which === "thread" || item.scopeId === state.current;
  if (here && !input.value.trim()) {
    input.value = item.content;
    const composer = state.composers[which];
    if (!composer.uploads.length && item.uploads?.length) {
      composer.uploads = item.uploads.map((u) => ({ ...u, key: randomId(), progress: 1, error: "", xhr: null }));
    }
    if (!composer.quote && item.quote) composer.quote = item.quote;
    renderExtras(which);
  }
  const note = $(which === "main" ? "composer-note" : "thread-note");
  setText(note, moderationWords(err) + (here ? "" : ` (in ${item.target})`));
  note.className = "note error";
  note.setAttribute("role", "alert");
  input.focus();
}
