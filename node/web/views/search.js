// Search: the "/" shortcut, the results panel with highlights, and
// opening a conversation at a hit.

import { STORAGE_SCOPE, PAGE, state, observe } from "../store.js";
import { $, el, show, setText } from "../dom.js";
import { describeError, formatTime, scopeLabel } from "../format.js";
import { request, supports } from "../connection.js";
import { scheduleMarkRead } from "../readstate.js";
import { renderScopes } from "./sidebar.js";
import { noteError, renderTimeline, setComposerEnabled } from "./conversation.js";
import { loadOwner } from "./edits.js";
import { openPanel, openThread } from "./thread.js";
import { showPane, focusComposer } from "./layout.js";

export function focusSearch(event) {
  const typing = event.target.closest?.("input, textarea, select, [contenteditable]");
  if (event.key !== "/" || typing || event.ctrlKey || event.metaKey || event.altKey) return;
  if (!supports("search") || $("app-view").hidden || document.querySelector("dialog[open]")) return;
  event.preventDefault();
  $("search-input").focus();
  $("search-input").select();
}

export async function runSearch(query, more = false) {
  let panel = state.panel;
  if (!more || panel?.kind !== "search") {
    panel = { kind: "search", query, hits: [], nextCursor: null, hasMore: false, loading: true, error: "", searched: null };
    state.panel = panel;
    $("members-button").setAttribute("aria-expanded", "false");
    openPanel("Search");
    show($("thread-composer"), false);
  }
  panel.loading = true;
  renderSearch();
  try {
    const fields = { query, limit: 20 };
    if (more && panel.nextCursor) fields.cursor = panel.nextCursor;
    const result = await request("search", fields);
    if (state.panel !== panel) return;
    panel.hits.push(...(result.hits || []));
    panel.nextCursor = result.nextCursor || null;
    panel.hasMore = Boolean(result.hasMore && result.nextCursor);
    panel.searched = result.searched || null;
    panel.error = "";
  } catch (err) {
    if (state.panel !== panel) return;
    panel.error =
      err.code === "search_unavailable"
        ? "Search is not ready yet — the node is still building its index. Try again in a little while."
        : describeError(err);
  }
  panel.loading = false;
  renderSearch();
}

function highlighted(content, ranges) {
  // Offsets count code points (as the node does); marks are elements, text stays text.
  const chars = Array.from(content || "");
  const spans = (ranges || [])
    .filter((r) => Array.isArray(r) && r[0] >= 0 && r[1] > r[0])
    .sort((a, b) => a[0] - b[0]);
  const from = Math.max(0, (spans[0]?.[0] ?? 0) - 60);
  const to = Math.min(chars.length, from + 280);
  const out = [];
  if (from > 0) out.push("…");
  let at = from;
  for (const [start, end] of spans) {
    const s = Math.max(start, at);
    const e = Math.min(end, to);
    if (e <= s) continue;
    if (s > at) out.push(chars.slice(at, s).join(""));
    out.push(el("mark", {}, chars.slice(s, e).join("")));
    at = e;
  }
  if (at < to) out.push(chars.slice(at, to).join(""));
  if (to < chars.length) out.push("…");
  return out;
}

function hitScopeLabel(scopeId) {
  const scope = state.scopes.get(scopeId);
  if (scope) return scopeLabel(scope);
  if (state.threads[scopeId]) return state.threads[scopeId].label;
  return "a conversation";
}

const OPERATORS = "Narrow with from:@name, in:#channel or in:@name (your direct messages), before:, after: or on:YYYY-MM-DD (UTC).";

// What the node understood the query as (its "searched" answer), in words:
// an empty page then says what was looked for, filters included.
export function describeSearched(searched, query) {
  if (!searched) return `“${query}”`;
  const parts = [];
  const words = [...(searched.terms || []).map((t) => `“${t}”`), ...(searched.excluded || []).map((t) => `without “${t}”`)];
  parts.push(words.length ? words.join(" ") : "messages");
  if (searched.from?.length) parts.push("from " + searched.from.join(" or "));
  if (searched.in?.length) parts.push("in " + searched.in.join(" or "));
  if (searched.since) parts.push("on or after " + searched.since);
  if (searched.until) parts.push("before " + searched.until);
  return parts.join(" ");
}

function renderSearch() {
  const panel = state.panel;
  if (panel?.kind !== "search") return;
  const list = el("ul", { class: "search-results", "aria-label": "Search results" });
  for (const hit of panel.hits) {
    const message = hit.message || {};
    const author = message.author || {};
    list.append(
      el(
        "li",
        {},
        el(
          "button",
          { type: "button", class: "hit", onclick: () => openAt(hit.scopeId, message.seq, message.id) },
          el(
            "span",
            { class: "hit-head" },
            el("span", { class: "where" }, hitScopeLabel(hit.scopeId)),
            el("span", { class: "author" }, author.displayName || author.handle || "?"),
            el("time", { datetime: message.createdAt }, formatTime(message.createdAt)),
          ),
          el("span", { class: "hit-text" }, highlighted(message.content, hit.highlights)),
        ),
      ),
    );
  }
  let status = null;
  if (panel.error) status = el("p", { class: "error", role: "alert" }, panel.error);
  else if (panel.loading) status = el("p", { class: "muted" }, "Searching…");
  else if (!panel.hits.length) status = el("p", { class: "muted", role: "status" }, `Nothing found: searched ${describeSearched(panel.searched, panel.query)}.`);
  else status = el("p", { class: "muted small", role: "status" }, `${panel.hits.length}${panel.hasMore ? "+" : ""} result${panel.hits.length === 1 ? "" : "s"} for ${describeSearched(panel.searched, panel.query)}`);
  const hint = !panel.loading && !panel.hits.length ? el("p", { class: "muted small" }, OPERATORS) : null;
  $("panel-body").replaceChildren(
    ...[
      status,
      hint,
      panel.hits.length ? list : null,
      panel.hasMore && !panel.loading
        ? el("button", { type: "button", class: "link more", onclick: () => runSearch(panel.query, true) }, "More results")
        : null,
    ].filter(Boolean),
  );
}

function flashMessage(selector) {
  const node = document.querySelector(selector);
  if (!node) return;
  node.scrollIntoView({ block: "center" });
  node.classList.add("flash");
}

export async function openAt(scopeId, seq, messageId) {
  // Open a scope at one message: a page around its seq (older nodes: the page ending at it).
  let page;
  let around = true;
  try {
    page = await request("history", { target: "scope:" + scopeId, aroundSeq: seq, limit: PAGE });
    if (!page.messages.some((m) => m.seq === seq)) {
      // A node without aroundSeq ignores it (unknown fields are ignored) and answers the latest page.
      around = false;
      page = await request("history", { target: "scope:" + scopeId, beforeSeq: seq + 1, limit: PAGE });
    }
  } catch (err) {
    noteError("Could not open that message — " + describeError(err));
    return;
  }
  if (page.root) {
    // A thread: the panel shows it with its root.
    await openThread(null, scopeId);
    flashMessage(`#panel [data-id="${CSS.escape(messageId)}"]`);
    return;
  }
  state.current = scopeId;
  localStorage.setItem(STORAGE_SCOPE, scopeId);
  const latest = page.latestSeq ?? 0;
  const detached = (page.coversThroughSeq ?? latest) < latest;
  // Older messages remain when the page says where to continue backwards.
  const older = around ? page.continueBeforeSeq !== undefined : page.hasMore;
  state.view = { scopeId, messages: new Map(), hasMore: older, loading: false, error: "", detached };
  for (const message of page.messages) state.view.messages.set(message.seq, message);
  if (!detached) observe(scopeId, page.coversThroughSeq);
  const scope = state.scopes.get(scopeId);
  $("scope-title").textContent = scope ? scopeLabel(scope) : hitScopeLabel(scopeId);
  $("members-button").disabled = false;
  setComposerEnabled(true);
  setText($("composer-note"), "");
  loadOwner(scopeId);
  renderScopes();
  renderTimeline({});
  showPane("conversation");
  focusComposer();
  flashMessage(`#messages [data-id="${CSS.escape(messageId)}"]`);
  scheduleMarkRead();
}
