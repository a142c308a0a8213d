// The conversation switcher (Ctrl+K or Cmd+K): a dialog whose textbox filters
// the conversations of the sidebar; Enter opens the first match, the arrow keys
// walk the list.

import { state } from "../store.js";
import { $, el } from "../dom.js";
import { scopeLabel } from "../format.js";
import { openScope } from "./conversation.js";
import { openThreadScope } from "./thread.js";
import { focusComposer } from "./layout.js";

function label(scope) {
  return scope.type === "thread" && state.threads[scope.id] ? state.threads[scope.id].label : scopeLabel(scope);
}

function matches() {
  const query = $("switch-filter").value.trim().toLowerCase().replace(/^#/, "");
  const ranked = [];
  for (const scope of state.scopes.values()) {
    const name = label(scope).toLowerCase();
    const bare = name.replace(/^#/, "");
    if (query && !name.includes(query)) continue;
    // Names that start with what was typed come first, then unread ones.
    const rank = (query && !bare.startsWith(query) ? 2 : 0) + (scope.unread ? 0 : 1);
    ranked.push({ scope, rank, name });
  }
  ranked.sort((a, b) => a.rank - b.rank || a.name.localeCompare(b.name));
  return ranked.map((entry) => entry.scope);
}

function go(scope) {
  $("switch-dialog").close();
  if (scope.type === "thread") openThreadScope(scope.id);
  else openScope(scope.id, { reveal: true });
}

function render() {
  const found = matches();
  const items = found.map((scope) => {
    const unread = scope.id === state.current ? 0 : scope.unread || 0;
    return el(
      "li",
      {},
      el(
        "button",
        { type: "button", class: "person", "data-scope": scope.id, onclick: () => go(scope) },
        el("span", { class: "author" }, label(scope)),
        unread ? el("span", { class: "muted small" }, ` ${unread} unread`) : null,
      ),
    );
  });
  $("switch-list").replaceChildren(...(items.length ? items : [el("li", { class: "muted" }, "No conversation matches.")]));
}

function walk(event) {
  const buttons = [...$("switch-list").querySelectorAll("button")];
  if (event.target === $("switch-filter")) {
    if (event.key === "Enter") {
      event.preventDefault();
      const first = matches()[0];
      if (first) go(first);
    } else if (event.key === "ArrowDown" && buttons.length) {
      event.preventDefault();
      buttons[0].focus();
    }
    return;
  }
  const at = buttons.indexOf(event.target);
  if (at < 0 || (event.key !== "ArrowDown" && event.key !== "ArrowUp")) return;
  event.preventDefault();
  const next = at + (event.key === "ArrowDown" ? 1 : -1);
  (next < 0 ? $("switch-filter") : buttons[Math.min(next, buttons.length - 1)]).focus();
}

export function openSwitcher() {
  const dialog = $("switch-dialog");
  if (dialog.open) return dialog.close();
  $("switch-filter").value = "";
  render();
  dialog.showModal();
  $("switch-filter").focus();
}

export function wireSwitcher() {
  $("switch-filter").addEventListener("input", render);
  $("switch-dialog").addEventListener("keydown", walk);
  $("switch-dialog").addEventListener("close", () => {
    // Closed without a choice: typing goes on where it was.
    if (document.activeElement === document.body) focusComposer();
  });
  document.addEventListener("keydown", (event) => {
    const key = event.key.toLowerCase();
    if (key !== "k" || !(event.ctrlKey || event.metaKey) || event.altKey || event.shiftKey) return;
    if ($("app-view").hidden) return;
    event.preventDefault();
    const other = document.querySelector("dialog[open]:not(#switch-dialog)");
    if (!other) openSwitcher();
  });
}
