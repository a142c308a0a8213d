// Desktop notifications for mentions, and the button that asks for permission.

import { state } from "./store.js";
import { $, show } from "./dom.js";
import { scopeLabel } from "./format.js";
import { openScope } from "./views/conversation.js";
import { openThreadScope } from "./views/thread.js";

export function updateNotifyButton() {
  const supported = "Notification" in window;
  show($("notify-enable"), supported && Notification.permission === "default");
}

export function notifyMention(scopeId, message, shown) {
  if (!("Notification" in window) || Notification.permission !== "granted") return;
  const scope = state.scopes.get(scopeId);
  if (scope && (scope.notification === "mute" || scope.notification === "quiet")) return;
  if (shown && document.visibilityState === "visible" && document.hasFocus()) return;
  const author = message.author?.displayName || message.author?.handle || "Someone";
  try {
    const note = new Notification(`${author} mentioned you${scope ? " in " + scopeLabel(scope) : ""}`, {
      body: (message.content || "").slice(0, 140),
      tag: message.id,
    });
    note.onclick = () => {
      window.focus();
      if (scope?.type === "thread") openThreadScope(scopeId);
      else openScope(scopeId);
    };
  } catch (err) {
    console.warn("notification", err);
  }
}
