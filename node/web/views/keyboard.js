// The keyboard model of a message list: the whole list is one Tab stop (one
// article holds tabindex 0, the newest until another is visited), Up/Down/Home/End
// move between articles, and a message's own controls join the Tab order only
// while focus is inside that message, so Tab passes a long conversation in one
// step. Also: focus surviving a re-render, and Up in an empty composer editing
// your last message.

import { state } from "../store.js";
import { supports } from "../connection.js";
import { startEdit } from "./edits.js";

const CONTROLS = "a[href], button, input, select, textarea, summary, [tabindex]:not(article)";
const visited = new Map(); // list container id -> data-id of the article holding its Tab stop

export function rove(container) {
  const articles = [...container.querySelectorAll("article")];
  if (!articles.length) return;
  const wanted = visited.get(container.id);
  const stop = articles.find((a) => a.dataset.id === wanted) || articles[articles.length - 1];
  const active = document.activeElement;
  const inside = container.contains(active) ? active.closest("article") : null;
  for (const article of articles) {
    article.tabIndex = article === stop ? 0 : -1;
    for (const control of article.querySelectorAll(CONTROLS)) {
      if (article === inside) control.removeAttribute("tabindex");
      else control.tabIndex = -1;
    }
  }
}

export function keepMessageFocus(active) {
  // Re-rendering replaces every article: focus goes back to the same message
  // (and the same control in it), without scrolling.
  const article = active?.closest?.("article[data-id]");
  if (!article) return () => {};
  const container = article.closest("#messages, #panel-body");
  if (!container) return () => {};
  const index = active === article ? -1 : [...article.querySelectorAll(CONTROLS)].indexOf(active);
  const id = article.dataset.id;
  return () => {
    if (document.activeElement && document.activeElement !== document.body) return; // moved on meanwhile
    const fresh = [...container.querySelectorAll("article")].find((a) => a.dataset.id === id);
    if (!fresh) return;
    const target = index < 0 ? fresh : fresh.querySelectorAll(CONTROLS)[index] || fresh;
    target.focus({ preventScroll: true });
  };
}

function step(container, event) {
  const article = event.target;
  if (article.tagName !== "ARTICLE" || !container.contains(article)) return;
  const articles = [...container.querySelectorAll("article")];
  const at = articles.indexOf(article);
  const next = {
    ArrowUp: at - 1,
    ArrowDown: at + 1,
    Home: 0,
    End: articles.length - 1,
  }[event.key];
  if (next === undefined || event.altKey || event.ctrlKey || event.metaKey) return;
  event.preventDefault();
  articles[Math.max(0, Math.min(articles.length - 1, next))].focus();
}

export function wireList(container) {
  container.addEventListener("focusin", (event) => {
    const article = event.target.closest?.("article");
    if (!article?.dataset.id) return;
    visited.set(container.id, article.dataset.id);
    rove(container);
  });
  container.addEventListener("focusout", (event) => {
    // Leaving a message takes its controls out of the Tab order again.
    const from = event.target.closest?.("article");
    if (from && !from.contains(event.relatedTarget)) setTimeout(() => rove(container));
  });
  container.addEventListener("keydown", (event) => step(container, event));
}

export function editLastOwn(which) {
  return (event) => {
    if (event.key !== "ArrowUp" || event.shiftKey || event.altKey || event.ctrlKey || event.metaKey) return;
    if (event.isComposing || event.target.value !== "" || !supports("edit")) return;
    const source = which === "main" ? state.view?.messages : state.panel?.kind === "thread" ? state.panel.messages : null;
    let last = null;
    for (const message of source?.values() || []) {
      const mine = state.me && message.author?.memberId === state.me.id;
      if (mine && message.messageType === "text" && !message.deleted && (!last || message.seq > last.seq)) last = message;
    }
    if (!last) return;
    event.preventDefault();
    startEdit(`${which === "main" ? "m" : "t"}:${last.id}`, last);
  };
}
