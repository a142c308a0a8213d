// The members panel: roster, private agents' owners, invite and remove.

import { state } from "../store.js";
import { $, el, show, setText } from "../dom.js";
import { avatarNode, describeError, personName, scopeLabel } from "../format.js";
import { request } from "../connection.js";
import { refreshScopes } from "./sidebar.js";
import { openPanel } from "./thread.js";
import { confirmDialog } from "./dialogs.js";
import { presenceDot, followPresence } from "./presence.js";

// `refresh`: the open panel follows a change (another conversation, a roster
// event) without taking a phone's screen from what it shows.
export async function openMembers({ refresh = false } = {}) {
  if (!state.current) return;
  const scopeId = state.current;
  const scope = state.scopes.get(scopeId);
  state.panel = { kind: "members", scopeId };
  openPanel("Members", { reveal: !refresh });
  show($("thread-composer"), false);
  $("members-button").setAttribute("aria-expanded", "true");
  const body = $("panel-body");
  body.replaceChildren(el("p", { class: "muted" }, "Loading…"));
  try {
    const { members, channelOwnerId } = await request("members", { scopeId });
    if (state.panel?.kind !== "members" || state.panel.scopeId !== scopeId) return;
    for (const m of members) if (!state.people.has(m.id)) state.people.set(m.id, m);
    followPresence(members.map((m) => m.id));
    const byId = new Map(members.map((m) => [m.id, m]));
    const list = el("ul", { class: "members" });
    const me = state.me?.id;
    // The node decides; the button is offered only where it would say yes:
    // the channel's owner removes others, an owner removes its private agent.
    const mayRemove = (member) =>
      me &&
      channelOwnerId &&
      member.id !== channelOwnerId &&
      ((me === channelOwnerId && member.id !== me) ||
        (member.visibility === "private" && member.ownerMemberId === me));
    for (const member of members) {
      let note = null;
      if (member.visibility === "private") {
        const owner = byId.get(member.ownerMemberId);
        const ownerName =
          member.ownerMemberId === me ? "you" : owner ? "@" + owner.handle : member.ownerMemberId || "unknown";
        note = el("span", { class: "tag private" }, `private (owner ${ownerName})`);
      }
      list.append(
        el(
          "li",
          {},
          presenceDot(member),
          avatarNode(member.id, personName(member)),
          el("span", { class: "author" }, personName(member)),
          " ",
          el("span", { class: "handle" }, "@" + member.handle),
          member.type && member.type !== "human" ? el("span", { class: "tag" }, member.type) : null,
          note,
          mayRemove(member)
            ? el(
                "button",
                { type: "button", class: "link", onclick: () => removeMember(scopeId, member) },
                "Remove",
              )
            : null,
        ),
      );
    }
    const parts = [el("p", { class: "muted small" }, `${members.length} member${members.length === 1 ? "" : "s"}`), list];
    if (scope?.type === "channel") parts.push(inviteForm(scopeId, byId));
    body.replaceChildren(...parts);
  } catch (err) {
    body.replaceChildren(el("p", { class: "error", role: "alert" }, describeError(err)));
  }
}

function inviteForm(scopeId, current) {
  const candidates = [...state.people.values()]
    .filter((p) => !current.has(p.id))
    .sort((a, b) => personName(a).localeCompare(personName(b)));
  const select = el(
    "select",
    { id: "invite-member" },
    candidates.map((p) => el("option", { value: p.id }, `${personName(p)} (@${p.handle})`)),
  );
  const error = el("p", { class: "error", role: "alert", hidden: true });
  const form = el(
    "form",
    {
      class: "invite",
      onsubmit: async (event) => {
        event.preventDefault();
        if (!select.value) return;
        try {
          await request("invite", { scopeId, memberId: select.value });
          openMembers({ refresh: true });
        } catch (err) {
          setText(error, describeError(err));
        }
      },
    },
    el("label", { for: "invite-member" }, "Invite someone"),
    candidates.length ? select : el("p", { class: "muted small" }, "Everyone you know is already here."),
    candidates.length ? el("button", { type: "submit" }, "Invite") : null,
    error,
  );
  return form;
}

async function removeMember(scopeId, member) {
  const where = scopeLabel(state.scopes.get(scopeId)) || "this channel";
  const ok = await confirmDialog(
    `Remove @${member.handle} from ${where}?`,
    `${personName(member)} will no longer see new messages in ${where}. They can be invited again.`,
    "Remove member",
  );
  if (!ok) return;
  try {
    await request("remove", { scopeId, memberId: member.id });
  } catch (err) {
    $("panel-body").prepend(el("p", { class: "error", role: "alert" }, describeError(err)));
    return;
  }
  if (state.panel?.kind === "members" && state.panel.scopeId === scopeId) openMembers({ refresh: true });
}

export function onMembership(frame) {
  if (state.me && frame.memberId === state.me.id) refreshScopes();
  if (state.panel?.kind === "members" && state.panel.scopeId === frame.scopeId) openMembers({ refresh: true });
}
