// Signing in and out: the token from the login form, the login link's fragment
// or localStorage; the workspace it belongs to; clearing everything on logout.

import { STORAGE_TOKEN, STORAGE_WORKSPACE, STORAGE_OUTBOX, STORAGE_SCOPE, state } from "./store.js";
import { $, show, setText } from "./dom.js";
import { connect } from "./connection.js";
import { renderScopes } from "./views/sidebar.js";
import { renderTimeline, setComposerEnabled } from "./views/conversation.js";
import { closePanel } from "./views/thread.js";
import { readInvite, openInvite } from "./invite.js";
import { setAdmin } from "./views/admin.js";

// While the invite page is up, nothing else may take the screen: the page's
// start-up would otherwise show the sign-in form, or sign in with a token
// this browser kept from before.
let inviting = false;

async function learnWorkspace() {
  // The token names its workspace; the node tells us which, so the
  // `?workspace=` routing parameter is right from the first connect.
  try {
    const response = await fetch("/v1/whoami", {
      headers: { Authorization: "Bearer " + state.token },
      cache: "no-store",
    });
    if (response.status === 401 || response.status === 403) return "rejected";
    if (!response.ok) return "unknown";
    const body = await response.json();
    if (body.workspaceId) state.workspace = body.workspaceId;
    return "ok";
  } catch {
    return "unknown"; // node unreachable: the socket's reconnect loop takes over
  }
}

export function showLogin(message) {
  if (inviting) return;
  show($("app-view"), false);
  show($("login-view"), true);
  $("login-token").value = state.token || "";
  setText($("login-error"), message || "");
  $("login-token").focus();
}

export async function start(token, workspace) {
  if (inviting) return;
  state.token = token;
  state.workspace = workspace;
  state.attempt = 0;
  state.me = null;
  if (!state.workspace) {
    const known = await learnWorkspace();
    if (known === "rejected") {
      state.token = "";
      localStorage.removeItem(STORAGE_TOKEN);
      showLogin("That token was not accepted. Check it and sign in again.");
      return;
    }
  }
  show($("login-view"), false);
  show($("app-view"), true);
  connect();
}

export function logout(message) {
  state.wantOnline = false;
  state.connected = false;
  clearTimeout(state.reconnectTimer);
  clearInterval(state.countdownTimer);
  clearInterval(state.pingTimer);
  const ws = state.ws;
  state.ws = null;
  if (ws) ws.close(1000, "sign out");
  localStorage.removeItem(STORAGE_TOKEN);
  localStorage.removeItem(STORAGE_WORKSPACE);
  localStorage.removeItem(STORAGE_OUTBOX);
  state.outbox = [];
  state.me = null;
  setAdmin(false);
  state.workspace = "";
  state.scopes = new Map();
  state.lastSeen = new Map();
  state.readSent = new Map();
  state.dmPeers = new Map();
  state.people = new Map();
  state.current = null;
  state.view = null;
  closePanel();
  renderScopes();
  renderTimeline({});
  $("scope-title").textContent = "Select a conversation";
  $("members-button").disabled = true;
  setComposerEnabled(false);
  state.token = "";
  showLogin(message);
}

function joinedWith(token, workspace) {
  inviting = false;
  // A new member in this browser: nothing of whoever used it before (a queued
  // send, the conversation left open) may carry over to it.
  localStorage.removeItem(STORAGE_OUTBOX);
  localStorage.removeItem(STORAGE_SCOPE);
  state.outbox = [];
  state.current = null;
  localStorage.setItem(STORAGE_TOKEN, token);
  localStorage.setItem(STORAGE_WORKSPACE, workspace || "");
  start(token, workspace || "");
}

export function readFragment() {
  // An invite link `#invite=…` opens the invite page instead (invite.js).
  const invite = readInvite();
  if (invite !== null) {
    inviting = true;
    openInvite(invite, {
      signIn: joinedWith,
      onCancel: () => {
        inviting = false;
        showLogin("");
      },
    });
    return null;
  }
  // The login link `#token=…` (a fragment never reaches a server log); removed from the URL at once.
  if (!location.hash.includes("token=")) return null;
  const params = new URLSearchParams(location.hash.slice(1));
  history.replaceState(null, "", location.pathname + location.search);
  const token = params.get("token");
  return token ? { token, workspace: params.get("workspace") || "" } : null;
}
