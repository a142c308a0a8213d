// The sidebar: the conversation lists with unread badges, the page title and
// favicon dot, the people directory, and the open conversation's tools
// (notification level, leave, create channel).

import { STORAGE_SCOPE, state, rememberThread } from "../store.js";
import { $, el, show, setText, place, unreadBadge } from "../dom.js";
import { describeError, scopeLabel } from "../format.js";
import { request, isUnknownOp } from "../connection.js";
import { scheduleMarkRead } from "../readstate.js";
import { openScope, renderTimeline, setComposerEnabled } from "./conversation.js";
import { closePanel, openThreadScope } from "./thread.js";
import { confirmDialog } from "./dialogs.js";
import { showPane } from "./layout.js";
import { presenceDot, followPresence } from "./presence.js";
import { loadTasks, renderTasks } from "./tasks.js";

const BASE_TITLE = "scopenode";

export function refreshScopes(delay = 50) {
  clearTimeout(state.scopesRefresh);
  return new Promise((resolve) => {
    state.scopesRefresh = setTimeout(async () => {
      try {
        await refreshScopesNow();
        if (state.current && state.scopes.has(state.current)) scheduleMarkRead();
      } catch (err) {
        if (err.code !== "disconnected") console.warn("scopes", describeError(err));
      }
      resolve();
    }, delay);
  });
}

export async function refreshScopesNow() {
  const result = await request("scopes");
  state.scopes = new Map(result.scopes.map((s) => [s.id, s]));
  renderScopes();
  if (result.scopes.some((s) => s.type === "task")) loadTasks();
  labelDms();
  labelThreads();
}

async function labelDms() {
  for (const scope of state.scopes.values()) {
    if (scope.type !== "dm" || state.dmPeers.has(scope.id)) continue;
    try {
      const { members } = await request("members", { scopeId: scope.id });
      const other = members.find((m) => m.id !== state.me?.id) || members[0];
      if (other) state.dmPeers.set(scope.id, other);
      for (const m of members) if (!state.people.has(m.id)) state.people.set(m.id, m);
    } catch {
      continue;
    }
  }
  renderScopes();
  followPresence([...state.dmPeers.values()].map((peer) => peer.id));
}

async function labelThreads() {
  for (const scope of state.scopes.values()) {
    if (scope.type !== "thread" || state.threads[scope.id]) continue;
    try {
      const page = await request("history", { target: "scope:" + scope.id, limit: 1 });
      if (page.root) {
        rememberThread(scope.id, page.root, page.root.scopeId);
        const seen = state.replyCounts.get(page.root.id) || 0;
        state.replyCounts.set(page.root.id, Math.max(seen, page.latestSeq || 0));
      }
    } catch {
      continue;
    }
  }
  renderScopes();
  if (state.view) renderTimeline({});
}

// Dispatched on document when a load of the people list ends, loaded or not:
// the open DM dialog draws from it (app.js wires it), including one opened
// before the connection was up.
export const PEOPLE_LOADED = "scopenode:people";

export async function loadPeople() {
  try {
    if (state.unsupported.has("people")) await peopleFromRosters();
    else await peopleFromNode();
  } finally {
    document.dispatchEvent(new Event(PEOPLE_LOADED));
  }
}

async function peopleFromNode() {
  try {
    const result = await request("people");
    const list = result.people || result.members || [];
    state.people = new Map(list.map((p) => [p.id, p]));
    if (state.view) renderTimeline({});
  } catch (err) {
    if (isUnknownOp(err)) {
      state.unsupported.add("people");
      await peopleFromRosters();
    }
  }
}

async function peopleFromRosters() {
  // Until the node lists people, everyone met in a joined channel is known.
  for (const scope of state.scopes.values()) {
    if (scope.type !== "channel") continue;
    try {
      const { members } = await request("members", { scopeId: scope.id });
      for (const m of members) state.people.set(m.id, m);
    } catch {
      continue;
    }
  }
}

function totalUnread() {
  let total = 0;
  for (const scope of state.scopes.values()) {
    if (scope.id === state.current || scope.notification === "mute") continue;
    if (state.panel?.kind === "thread" && state.panel.scopeId === scope.id) continue;
    total += scope.unread || 0;
  }
  return total;
}

function updateTitle() {
  const unread = totalUnread();
  const where = state.current ? scopeLabel(state.scopes.get(state.current)) : "";
  const base = where ? `${where} — ${BASE_TITLE}` : BASE_TITLE;
  document.title = unread ? `(${unread}) ${base}` : base;
  const icon = $("favicon");
  const dot = unread
    ? "%3Ccircle cx='25' cy='7' r='7' fill='%23e5484d'/%3E"
    : "";
  icon.href =
    "data:image/svg+xml,%3Csvg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 32 32'%3E" +
    "%3Crect width='32' height='32' rx='7' fill='%232456c7'/%3E" +
    "%3Cpath d='M9 11h14M9 16h10M9 21h7' stroke='white' stroke-width='3' stroke-linecap='round'/%3E" +
    dot +
    "%3C/svg%3E";
}

const TYPE_LIST = {
  channel: "channel-list",
  dm: "dm-list",
  thread: "thread-list",
  task: "channel-list",
  service_account: "app-list",
};

// The items of the last drawing, by scope, with what each showed. The list is
// redrawn on every unread change anywhere: an item whose scope looks the same
// keeps its node, so a click in progress on it is not lost to the redraw.
let drawnItems = new Map();

export function renderScopes() {
  const lists = { "channel-list": [], "dm-list": [], "thread-list": [], "app-list": [] };
  const scopes = [...state.scopes.values()].sort((a, b) => scopeLabel(a).localeCompare(scopeLabel(b)));
  const items = new Map();
  for (const scope of scopes) {
    if (scope.type === "task") continue; // listed under Tasks (views/tasks.js)
    const open =
      scope.id === state.current || (state.panel?.kind === "thread" && state.panel.scopeId === scope.id);
    const unread = open || scope.notification === "mute" ? 0 : scope.unread || 0;
    const label = scopeLabel(scope);
    const peer = scope.type === "dm" ? state.dmPeers.get(scope.id) : null;
    const look = JSON.stringify([scope.type, label, unread, open, scope.notification, peer?.id ?? null]);
    let item = drawnItems.get(scope.id);
    if (item?.look !== look) item = { look, node: scopeItem(scope, label, unread, open, peer) };
    items.set(scope.id, item);
    lists[TYPE_LIST[scope.type] || "channel-list"].push(item.node);
  }
  drawnItems = items;
  for (const [id, nodes] of Object.entries(lists)) place($(id), nodes);
  show($("threads-title"), lists["thread-list"].length > 0);
  show($("apps-title"), lists["app-list"].length > 0);
  setText($("scope-empty"), scopes.length ? "" : "No conversations yet — browse channels to join one.");
  const current = state.scopes.get(state.current);
  if (current) $("scope-title").textContent = scopeLabel(current);
  renderScopeTools();
  renderTasks();
  updateTitle();
}

function scopeItem(scope, label, unread, open, peer) {
  const link = el(
    "a",
    {
      href: "#c=" + encodeURIComponent(scope.id),
      class: "scope" + (unread ? " has-unread" : ""),
      "aria-current": open ? "page" : null,
      title: label,
      "data-scope": scope.id,
      onclick: (event) => {
        event.preventDefault();
        if (scope.type === "thread") openThreadScope(scope.id);
        else openScope(scope.id, { reveal: true });
      },
    },
    el("span", { class: "scope-name" }, label),
    unreadBadge(unread),
    scope.notification === "mute" ? el("span", { class: "tag", title: "Muted" }, "muted") : null,
  );
  // Beside the link, not in it: the link keeps the conversation's name.
  return el("li", {}, link, peer ? presenceDot(peer) : null);
}

function renderScopeTools() {
  const scope = state.scopes.get(state.current);
  const select = $("notify-select");
  show(select, Boolean(scope));
  show(document.querySelector("label[for=notify-select]"), Boolean(scope));
  if (scope) select.value = ["active", "quiet", "mute"].includes(scope.notification) ? scope.notification : "active";
  // DMs are fixed at creation: only channels and threads can be left.
  show($("leave-button"), Boolean(scope && scope.type === "channel"));
}

export async function createChannel(event) {
  event.preventDefault();
  const slug = $("create-slug").value.trim();
  const name = $("create-name").value.trim() || slug;
  const visibility = $("create-visibility").value;
  setText($("create-error"), "");
  try {
    const { scopeId } = await request("createChannel", { slug, name, visibility });
    $("create-form").reset();
    $("create-form").closest("details").open = false;
    await refreshScopesNow();
    openScope(scopeId, { reveal: true });
  } catch (err) {
    setText($("create-error"), describeError(err));
  }
}

export async function leaveCurrent() {
  const scope = state.scopes.get(state.current);
  if (!scope) return;
  const label = scopeLabel(scope);
  const ok = await confirmDialog(
    `Leave ${label}?`,
    `New messages in ${label} stop reaching you. A public channel can be joined again from Browse channels; a private one needs an invitation.`,
    "Leave channel",
  );
  if (!ok || state.current !== scope.id) return;
  try {
    await request("leave", { scopeId: scope.id });
  } catch (err) {
    setText($("composer-note"), describeError(err));
    $("composer-note").className = "note error";
    return;
  }
  state.current = null;
  state.view = null;
  localStorage.removeItem(STORAGE_SCOPE);
  closePanel();
  showPane("list");
  $("scope-title").textContent = "Select a conversation";
  $("members-button").disabled = true;
  setComposerEnabled(false);
  await refreshScopesNow();
  renderTimeline({});
  (document.querySelector("nav .scope") || $("browse-button")).focus();
}

export async function setNotification() {
  const scope = state.scopes.get(state.current);
  if (!scope) return;
  const value = $("notify-select").value;
  try {
    await request("setNotification", { scopeId: scope.id, state: value });
    scope.notification = value;
    renderScopes();
  } catch (err) {
    setText($("composer-note"), describeError(err));
    $("composer-note").className = "note error";
    renderScopeTools();
  }
}
