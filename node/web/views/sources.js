// Quotes and forwards: the cited messages shown above a message (read on
// demand), quoting into a composer, and the forward dialog.

import { state } from "../store.js";
import { $, el } from "../dom.js";
import { formatTime, personName, scopeLabel } from "../format.js";
import { renderMarkdown } from "../markdown.js";
import { request } from "../connection.js";
import { enqueue } from "../outbox.js";
import { openScope, rerender, copiesOf } from "./conversation.js";
import { renderExtras } from "./uploads.js";
import { openAt } from "./search.js";
import { openThreadScope } from "./thread.js";
import { openDialog } from "./dialogs.js";
import { runNote } from "./schedules.js";

function sourceWord(kind) {
  return kind === "quote" ? "Quoted" : kind === "context" ? "Context" : "Forwarded";
}

export function sourcesNode(message) {
  const list = message.sources || [];
  if (!list.length) return null;
  if (list.some((src) => src.pending)) resolvePending(message);
  return list.map((src) => sourceNode(src));
}

function sourceNode(src) {
  if (src.kind === "schedule_run") return runNote(src);
  const word = sourceWord(src.kind);
  const placeholder = (text) => el("blockquote", { class: "source pending", "aria-label": `${word} message` }, text);
  if (src.unavailable) {
    return el(
      "blockquote",
      { class: "source unavailable", "aria-label": `${word} message` },
      `${word} message unavailable — you cannot read it`,
    );
  }
  if (src.pending || !src.messageId) return placeholder(src.kind === "quote" ? "quoted message" : `${word.toLowerCase()} message`);
  const known = state.sources.get(src.messageId);
  if (!known) loadSource(src);
  if (!known || known.status !== "ok") return placeholder(src.kind === "quote" ? "quoted message" : `${word.toLowerCase()} message`);
  const cited = known.message;
  const author = cited.author || {};
  const name = personName({ displayName: author.displayName, handle: author.handle, id: author.memberId }) || "?";
  const where = state.scopes.get(cited.scopeId) || (state.threads[cited.scopeId] ? { type: "thread", id: cited.scopeId } : null);
  return el(
    "blockquote",
    { class: "source", "aria-label": `${word} message from ${name}` },
    el(
      "div",
      { class: "source-head" },
      src.kind === "quote" ? null : el("span", {}, where ? `${word} from ${scopeLabel(where)}` : word),
      el("span", { class: "author" }, name),
      el("time", { datetime: cited.createdAt }, formatTime(cited.createdAt)),
      el("button", { type: "button", class: "link small", onclick: () => openAt(cited.scopeId, cited.seq, cited.id) }, "View"),
    ),
    cited.deleted
      ? el("p", { class: "tombstone" }, "message deleted")
      : el("div", { class: "content", dir: "auto" }, renderMarkdown(cited.content || "", null)),
    cited.attachments?.length && !cited.deleted
      ? el("div", { class: "muted small" }, cited.attachments.map((a) => a.name).join(", "))
      : null,
  );
}

async function loadSource(src) {
  state.sources.set(src.messageId, { status: "loading" });
  try {
    const page = await request("history", { target: "scope:" + src.scopeId, beforeSeq: src.seq + 1, limit: 3 });
    const found = page.messages.find((m) => m.id === src.messageId);
    state.sources.set(src.messageId, found ? { status: "ok", message: found } : { status: "gone" });
  } catch (err) {
    if (err.code === "disconnected") state.sources.delete(src.messageId);
    else state.sources.set(src.messageId, { status: "gone" });
  }
  rerender();
}

async function resolvePending(message) {
  // Live events carry sources as pending: read the message itself to learn them.
  if (state.resolving.has(message.id)) return;
  state.resolving.add(message.id);
  let sources = null;
  try {
    const page = await request("history", { target: "scope:" + message.scopeId, beforeSeq: message.seq + 1, limit: 3 });
    const stored = page.messages.find((m) => m.id === message.id);
    if (stored && !(stored.sources || []).some((src) => src.pending)) sources = stored.sources || [];
  } catch (err) {
    if (err.code === "disconnected") {
      state.resolving.delete(message.id); // the next render after reconnecting tries again
      return;
    }
  }
  // Unresolvable: keep the words "quoted message" rather than retrying forever.
  const settled = sources || (message.sources || []).map((src) => ({ messageId: null, kind: src.kind }));
  for (const copy of copiesOf(message.id)) copy.sources = settled;
  rerender();
}

export function startQuote(message, inThread) {
  const which = inThread && state.panel?.kind === "thread" ? "thread" : "main";
  state.composers[which].quote = message;
  renderExtras(which);
  $(which === "main" ? "composer-input" : "thread-input").focus();
}

export function openForward(message) {
  const dialog = openDialog("forward-dialog");
  $("forward-comment").value = "";
  const author = message.author || {};
  $("forward-preview").replaceChildren(
    el(
      "blockquote",
      { class: "source" },
      el("div", { class: "source-head" }, el("span", { class: "author" }, author.displayName || author.handle || "?")),
      el("div", { class: "content", dir: "auto" }, renderMarkdown(message.content || "", null)),
    ),
  );
  const scopes = [...state.scopes.values()]
    .filter((scope) => scope.type !== "thread" || state.threads[scope.id])
    .sort((a, b) => scopeLabel(a).localeCompare(scopeLabel(b)));
  const list = el("ul", { class: "browse-list" });
  for (const scope of scopes) {
    const label = scopeLabel(scope);
    list.append(
      el(
        "li",
        {},
        el("span", { class: "author" }, label),
        el(
          "button",
          {
            type: "button",
            "aria-label": `Forward to ${label}`,
            onclick: () => {
              const comment = $("forward-comment").value;
              enqueue("scope:" + scope.id, scope.id, comment, {
                forward: { mode: "single", sources: [{ messageId: message.id }] },
              });
              dialog.close();
              if (scope.type === "thread") openThreadScope(scope.id);
              else openScope(scope.id);
            },
          },
          "Forward",
        ),
      ),
    );
  }
  $("forward-body").replaceChildren(scopes.length ? list : el("p", { class: "muted" }, "No conversations."));
}
