// Words for the page: error descriptions, times, people's and conversations'
// names, and the client-side ids (clientMessageId, upload keys).

import { state } from "./store.js";
import { el } from "./dom.js";

// The avatar colours a member may choose (updateProfile.avatarColor); a member
// who chose none gets one picked from its id, the same on every page.
export const AVATAR_COLORS = ["blue", "green", "orange", "purple", "red", "teal", "pink", "gray"];

export function avatarNode(memberId, name) {
  let color = state.people.get(memberId)?.avatarColor;
  if (!AVATAR_COLORS.includes(color)) {
    let hash = 0;
    for (const ch of String(memberId || "")) hash = (hash * 31 + ch.codePointAt(0)) >>> 0;
    color = AVATAR_COLORS[hash % AVATAR_COLORS.length];
  }
  const words = String(name || "?").trim().split(/\s+/).filter(Boolean);
  const initials = words.slice(0, 2).map((word) => Array.from(word)[0]).join("").toUpperCase() || "?";
  // Decoration: the name next to it is what assistive technology reads.
  return el("span", { class: `avatar avatar-${color}`, "aria-hidden": "true" }, initials);
}

export function randomId() {
  if (crypto.randomUUID && window.isSecureContext) return "web-" + crypto.randomUUID();
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return "web-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

const ERROR_WORDS = {
  forbidden: "You are not allowed to do that here.",
  not_found: "That no longer exists.",
  rate_limited: "Too many requests — slowing down.",
  unavailable: "The node is busy — trying again.",
  disconnected: "Not connected.",
  validation_failed: "That was not accepted.",
  invalid_target: "That conversation cannot be found.",
  conflict: "The message changed meanwhile — reload it and try again.",
  search_unavailable: "Search is not ready yet.",
  unsupported: "This node does not support that yet.",
};

export function moderationWords(err) {
  const matched = (err?.details?.matched || []).map((word) => `“${word}”`).join(", ");
  return (
    "Not sent: this workspace does not allow " +
    (matched ? `the words ${matched}` : "some of these words") +
    ". Your text is kept — change it and send again."
  );
}

export function describeError(err) {
  if (!err) return "unknown error";
  if (err.code) {
    const words = ERROR_WORDS[err.code];
    return words ? `${words}${err.message ? ` (${err.message})` : ""}` : `${err.code}: ${err.message || "request failed"}`;
  }
  return err.message || String(err);
}

export function formatTime(iso) {
  const at = new Date(iso);
  if (Number.isNaN(at.getTime())) return "";
  const sameDay = at.toDateString() === new Date().toDateString();
  return sameDay
    ? at.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" })
    : at.toLocaleString([], { dateStyle: "short", timeStyle: "short" });
}

export function personName(member) {
  if (!member) return "";
  return member.displayName || member.handle || member.id || member.memberId || "";
}

export function scopeLabel(scope) {
  if (!scope) return "";
  switch (scope.type) {
    case "channel":
      return "#" + (scope.slug || scope.name || scope.id);
    case "dm": {
      const peer = state.dmPeers.get(scope.id);
      if (peer) return peer.id === state.me?.id ? `${personName(peer)} (you)` : personName(peer);
      return scope.name || "Direct message";
    }
    case "thread":
      return state.threads[scope.id]?.label || scope.name || "Thread";
    case "task":
      return scope.name || "Task";
    case "service_account":
      return scope.name || scope.service?.handle || scope.id;
    default:
      return scope.name || scope.slug || scope.id;
  }
}
