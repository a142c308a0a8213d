// Which pane a phone shows (the conversation list, a conversation, or the side
// panel) and the Back buttons between them, the top bar's overflow menu, where
// focus goes when a conversation opens, and what Escape closes. Above 640 px
// every pane is on screen at once, so the pane changes nothing there.

import { state } from "../store.js";
import { $ } from "../dom.js";
import { closePanel } from "./thread.js";

// A touch screen's keyboard would cover the conversation it was asked to show.
const TOUCH = window.matchMedia("(hover: none) and (pointer: coarse)");
const PHONE = window.matchMedia("(max-width: 640px)");

export function showPane(pane) {
  state.pane = pane;
  document.body.dataset.pane = pane;
}

export function focusComposer(which = "main") {
  if (TOUCH.matches || document.querySelector("dialog[open]") || $("app-view").hidden) return;
  const box = $(which === "main" ? "composer-input" : "thread-input");
  if (!box.disabled && box.offsetParent !== null) box.focus({ preventScroll: true });
}

function backToList() {
  showPane("list");
  const link = document.querySelector('nav .scope[aria-current="page"]') || $("browse-button");
  link.focus({ preventScroll: true });
}

function setMenu(open) {
  document.querySelector(".topbar").classList.toggle("menu-open", open);
  $("menu-button").setAttribute("aria-expanded", String(open));
}

function menuOpen() {
  return $("menu-button").getAttribute("aria-expanded") === "true";
}

function onEscape(event) {
  if (event.key !== "Escape" || event.defaultPrevented) return;
  if (document.querySelector("dialog[open]")) return; // the dialog closes itself
  if (menuOpen()) {
    setMenu(false);
    $("menu-button").focus();
    return;
  }
  const inSearch = event.target === $("search-input");
  if (!state.panel && !inSearch) return;
  // Focus inside the panel would be left on nothing once it closes.
  const stranded = inSearch || $("panel").contains(document.activeElement) || document.activeElement === document.body;
  if (state.panel) closePanel();
  if (stranded) {
    if (inSearch) $("search-input").blur();
    focusComposer();
  }
}

function fitPlaceholder() {
  // The desktop hint (Enter, Shift+Enter) would wrap over three lines of a phone's composer.
  const box = $("composer-input");
  box.dataset.hint ??= box.placeholder;
  box.placeholder = PHONE.matches ? "Write a message…" : box.dataset.hint;
}

export function wireLayout() {
  showPane(state.pane);
  fitPlaceholder();
  PHONE.addEventListener("change", fitPlaceholder);
  $("back-to-list").addEventListener("click", backToList);
  $("panel-back").addEventListener("click", () => {
    closePanel();
    focusComposer();
  });
  $("menu-button").addEventListener("click", () => setMenu(!menuOpen()));
  $("top-menu").addEventListener("click", (event) => {
    if (event.target.closest("button")) setMenu(false);
  });
  document.addEventListener("click", (event) => {
    if (menuOpen() && !event.target.closest?.("#top-menu, #menu-button")) setMenu(false);
  });
  document.addEventListener("keydown", onEscape);
}
