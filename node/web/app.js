// scopenode browser client: plain ES modules, no dependencies, no build step.
// Speaks protocol version 1 over ws://<same host>/v1/ws (connection.js). Message
// text is only ever put into the page through textContent / text nodes (see
// markdown.js). This module is the composition root: it wires the page's
// controls to the views and starts the session.

import { STORAGE_TOKEN, STORAGE_WORKSPACE, state } from "./store.js";
import { $ } from "./dom.js";
import { retryNow } from "./connection.js";
import { scheduleMarkRead } from "./readstate.js";
import { updateNotifyButton } from "./notifications.js";
import { showLogin, start, logout, readFragment } from "./session.js";
import { createChannel, leaveCurrent, setNotification, PEOPLE_LOADED } from "./views/sidebar.js";
import { openScope, loadHistory, rerender, sendMain, enterToSend } from "./views/conversation.js";
import { uploadFiles, wireDropZone } from "./views/uploads.js";
import { focusSearch, runSearch } from "./views/search.js";
import { closePanel, sendThread } from "./views/thread.js";
import { openMembers } from "./views/members.js";
import { browseChannels, newDirectMessage, renderPeople } from "./views/dialogs.js";
import { wireLayout } from "./views/layout.js";
import { wireList, editLastOwn } from "./views/keyboard.js";
import { wireSwitcher } from "./views/switcher.js";
import { wireAdmin } from "./views/admin.js";
import { wireTyping, wireIdle } from "./views/presence.js";
import { wireProfile } from "./views/profile.js";
import { wireTasks } from "./views/tasks.js";
import { wireWorkflows } from "./views/workflows.js";
import { wireSchedules } from "./views/schedules.js";
import { wireCards } from "./views/cards.js";

function init() {
  $("login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const token = $("login-token").value.trim();
    if (!token) return;
    localStorage.removeItem(STORAGE_WORKSPACE);
    start(token, "");
  });
  $("logout").addEventListener("click", () => logout(""));
  $("retry-now").addEventListener("click", retryNow);
  $("composer").addEventListener("submit", sendMain);
  $("composer-input").addEventListener("keydown", enterToSend($("composer")));
  $("composer-input").addEventListener("keydown", editLastOwn("main"));
  $("thread-composer").addEventListener("submit", sendThread);
  $("thread-input").addEventListener("keydown", enterToSend($("thread-composer")));
  $("thread-input").addEventListener("keydown", editLastOwn("thread"));
  wireList($("messages"));
  wireList($("panel-body"));
  wireLayout();
  wireSwitcher();
  wireAdmin();
  wireTyping($("composer-input"), () => state.current);
  wireTyping($("thread-input"), () => (state.panel?.kind === "thread" ? state.panel.scopeId : null));
  wireIdle();
  wireProfile();
  wireTasks();
  wireWorkflows();
  wireSchedules();
  wireCards();
  $("load-older").addEventListener("click", () => {
    const view = state.view;
    if (!view || view.loading) return;
    const oldest = Math.min(...view.messages.keys());
    if (Number.isFinite(oldest)) loadHistory(view.scopeId, oldest);
  });
  $("members-button").addEventListener("click", () => {
    if (state.panel?.kind === "members") closePanel();
    else openMembers();
  });
  $("leave-button").addEventListener("click", leaveCurrent);
  $("notify-select").addEventListener("change", setNotification);
  $("browse-button").addEventListener("click", browseChannels);
  $("dm-button").addEventListener("click", newDirectMessage);
  $("dm-filter").addEventListener("input", renderPeople);
  document.addEventListener(PEOPLE_LOADED, () => {
    if ($("dm-dialog").open) renderPeople();
  });
  for (const button of document.querySelectorAll("dialog [data-close]")) {
    button.addEventListener("click", () => button.closest("dialog").close());
  }
  $("notify-enable").addEventListener("click", async () => {
    await Notification.requestPermission();
    updateNotifyButton();
  });
  $("panel-close").addEventListener("click", closePanel);
  $("create-form").addEventListener("submit", createChannel);
  $("search-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const query = $("search-input").value.trim();
    if (query) runSearch(query);
  });
  document.addEventListener("keydown", focusSearch);
  $("attach-button").addEventListener("click", () => $("attach-input").click());
  $("attach-input").addEventListener("change", (event) => {
    if (state.current) uploadFiles("main", event.target.files);
    event.target.value = "";
  });
  wireDropZone(document.querySelector("section.main"), "main");
  wireDropZone($("thread-composer"), "thread");
  $("jump-latest").addEventListener("click", () => state.current && openScope(state.current));
  document.addEventListener("click", (event) => {
    // A click outside an open emoji picker closes it.
    if (!state.pickerFor || event.target.closest?.(".picker, .actions")) return;
    state.pickerFor = null;
    rerender();
  });
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible") scheduleMarkRead();
  });
  window.addEventListener("online", retryNow);

  const fromFragment = readFragment();
  const token = fromFragment?.token || localStorage.getItem(STORAGE_TOKEN) || "";
  const workspace = fromFragment
    ? fromFragment.workspace
    : localStorage.getItem(STORAGE_WORKSPACE) || "";
  if (token) start(token, workspace);
  else showLogin("");
}

init();
