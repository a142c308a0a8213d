// The member's profile: a dialog to change one's display name and avatar colour, and the
// `memberUpdated` event, which renames a member everywhere this page shows it
// (message headers, the members panel, the DM list, the people directory).

import { state } from "../store.js";
import { $, setText } from "../dom.js";
import { describeError, personName } from "../format.js";
import { request } from "../connection.js";
import { openDialog } from "./dialogs.js";
import { rerender } from "./conversation.js";
import { renderScopes } from "./sidebar.js";
import { openMembers } from "./members.js";

export function wireProfile() {
  $("profile-button").addEventListener("click", () => {
    $("profile-name").value = state.me?.displayName || "";
    $("profile-color").value = state.people.get(state.me?.id)?.avatarColor || "";
    setText($("profile-error"), "");
    openDialog("profile-dialog");
    $("profile-name").select();
  });
  $("profile-form").addEventListener("submit", saveProfile);
}

async function saveProfile(event) {
  event.preventDefault();
  const displayName = $("profile-name").value.trim();
  if (!displayName) {
    setText($("profile-error"), "A display name cannot be empty.");
    return;
  }
  const fields = { displayName };
  if ($("profile-color").value) fields.avatarColor = $("profile-color").value;
  try {
    const result = await request("updateProfile", fields);
    renamed({ ...state.me, displayName: result.displayName, avatarColor: result.avatarColor });
    $("profile-dialog").close();
  } catch (err) {
    setText($("profile-error"), describeError(err));
    $("profile-name").focus();
  }
}

export function onMemberUpdated(frame) {
  if (frame.member?.id) renamed(frame.member);
}

function renamed(member) {
  const { id, displayName, avatarColor } = member;
  if (state.me?.id === id) {
    state.me = { ...state.me, displayName };
    showMe();
  }
  const known = state.people.get(id);
  state.people.set(id, known ? { ...known, displayName, avatarColor } : member);
  for (const [scopeId, peer] of state.dmPeers) {
    if (peer.id === id) state.dmPeers.set(scopeId, { ...peer, displayName });
  }
  for (const message of heldMessages()) {
    if (message.author?.memberId === id) message.author = { ...message.author, displayName };
  }
  rerender();
  renderScopes();
  if (state.panel?.kind === "members") openMembers({ refresh: true });
}

export function showMe() {
  if (state.me) $("me").textContent = `${personName(state.me)} (@${state.me.handle})`;
}

function* heldMessages() {
  if (state.view) yield* state.view.messages.values();
  if (state.panel?.kind === "thread") {
    yield* state.panel.messages.values();
    if (state.panel.root) yield state.panel.root;
  }
}
