// The workspace admin page: members, invites and channels, each action one of
// the node's admin ops (docs/invites.md). The node checks every request; the
// Admin button only shows for a member whose welcome said it is an admin.

import { state } from "../store.js";
import { $, el, setText, show } from "../dom.js";
import { describeError, formatTime, personName } from "../format.js";
import { request } from "../connection.js";
import { refreshScopesNow } from "./sidebar.js";

const EXPIRIES = [
  ["1 hour", 3600],
  ["1 day", 86400],
  ["7 days", 7 * 86400],
  ["30 days", 30 * 86400],
];
const STATUS_WORDS = { usable: "usable", expired: "expired", used_up: "used up", revoked: "revoked" };

const page = { members: [], channels: [], invites: [] };

export function setAdmin(admin) {
  state.admin = admin;
  show($("admin-button"), admin);
  if (!admin) closeAdmin();
}

export function wireAdmin() {
  $("admin-button").addEventListener("click", () => ($("admin-view").hidden ? openAdmin() : closeAdmin()));
  $("admin-view").addEventListener("keydown", (event) => {
    if (event.key !== "Escape" || document.querySelector("dialog[open]")) return;
    event.preventDefault();
    closeAdmin();
  });
}

export function closeAdmin() {
  const view = $("admin-view");
  if (view.hidden) return;
  view.hidden = true;
  document.body.classList.remove("admin-open");
  $("admin-button").setAttribute("aria-expanded", "false");
  if (state.admin) $("admin-button").focus({ preventScroll: true });
}

async function openAdmin() {
  const view = $("admin-view");
  view.replaceChildren(...skeleton());
  view.hidden = false;
  document.body.classList.add("admin-open");
  $("admin-button").setAttribute("aria-expanded", "true");
  $("admin-title").focus({ preventScroll: true });
  await reload();
}

function skeleton() {
  return [
    el(
      "div",
      { class: "admin-head" },
      el("h2", { id: "admin-title", tabindex: "-1" }, "Workspace admin"),
      el("button", { type: "button", class: "link", onclick: closeAdmin }, "Close admin"),
    ),
    section("members", "Members", memberForm()),
    section("invites", "Invites", inviteForm()),
    section("channels", "Channels", channelForm()),
  ];
}

function section(key, title, form) {
  return el(
    "section",
    { class: "admin-section", "aria-labelledby": `admin-${key}-title` },
    el("h3", { id: `admin-${key}-title` }, title),
    el("p", { id: `admin-${key}-error`, class: "error", role: "alert", hidden: true }),
    el("ul", { id: `admin-${key}-list`, class: "admin-list", "aria-labelledby": `admin-${key}-title` }),
    form,
  );
}

async function reload() {
  try {
    const [members, invites, channels] = await Promise.all([
      request("adminMembers"),
      request("adminInvites"),
      request("adminChannels"),
    ]);
    page.members = members.members;
    page.invites = invites.invites;
    page.channels = channels.channels;
  } catch (err) {
    setText($("admin-members-error"), describeError(err));
    return;
  }
  renderMembers();
  renderInvites();
  renderChannels();
}

// One admin op from a button or form: its error shows in its section, and the
// page is read again after it, so every list shows what the node now holds.
async function act(key, op, fields) {
  setText($(`admin-${key}-error`), "");
  try {
    const result = await request(op, fields);
    await reload();
    return result;
  } catch (err) {
    setText($(`admin-${key}-error`), describeError(err));
    return null;
  }
}

function labelled(id, text, control) {
  return [el("label", { for: id }, text), control];
}

// ------------------------------------------------------------------ members

function memberForm() {
  const form = el(
    "form",
    { id: "admin-member-form", class: "admin-form", autocomplete: "off" },
    el("h4", {}, "Add a member"),
    labelled("admin-member-handle", "Handle", el("input", { id: "admin-member-handle", required: true, spellcheck: "false" })),
    labelled("admin-member-name", "Display name", el("input", { id: "admin-member-name" })),
    labelled(
      "admin-member-kind",
      "Kind",
      el(
        "select",
        { id: "admin-member-kind", onchange: () => show($("admin-owner-box"), $("admin-member-kind").value === "private") },
        el("option", { value: "human" }, "Human"),
        el("option", { value: "agent" }, "Agent"),
        el("option", { value: "private" }, "Private agent"),
      ),
    ),
    el("div", { id: "admin-owner-box", hidden: true }, labelled("admin-member-owner", "Owner", el("select", { id: "admin-member-owner" }))),
    el("button", { type: "submit" }, "Add member"),
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const kind = $("admin-member-kind").value;
    const fields = { handle: $("admin-member-handle").value.trim(), kind: kind === "human" ? "human" : "agent" };
    const name = $("admin-member-name").value.trim();
    if (name) fields.displayName = name;
    if (kind === "private") Object.assign(fields, { private: true, ownerMemberId: $("admin-member-owner").value });
    if (await act("members", "adminCreateMember", fields)) form.reset();
  });
  return form;
}

function renderMembers() {
  const owners = page.members.filter((m) => m.type === "human" && m.active);
  $("admin-member-owner").replaceChildren(...owners.map((m) => el("option", { value: m.id }, `@${m.handle}`)));
  $("admin-members-list").replaceChildren(...page.members.map(memberRow));
}

function memberRow(member) {
  const who = `@${member.handle}`;
  const facts = [member.private ? "private agent" : member.type];
  if (member.admin) facts.push("admin");
  if (!member.active) facts.push("deactivated");
  const me = member.id === state.me?.id;
  const buttons = [];
  if (member.type === "human" && !me && member.active) {
    const [words, admin] = member.admin ? ["Remove admin", false] : ["Make admin", true];
    buttons.push(button(`${words} ${who}`, words, () => act("members", "adminSetAdmin", { memberId: member.id, admin })));
  }
  if (member.active) {
    buttons.push(button(`Issue token for ${who}`, "Issue token", () => issueToken(member)));
    buttons.push(button(`Revoke tokens of ${who}`, "Revoke tokens", () => act("members", "adminRevokeTokens", { memberId: member.id })));
  }
  if (member.active && !me) {
    buttons.push(button(`Deactivate ${who}`, "Deactivate", () => act("members", "adminDeactivateMember", { memberId: member.id })));
  }
  return el(
    "li",
    { class: "admin-row" },
    el("span", { class: "admin-what" }, el("strong", {}, personName(member)), ` ${who}`, el("span", { class: "muted small" }, ` · ${facts.join(" · ")}`)),
    el("span", { class: "admin-actions" }, buttons),
  );
}

function button(label, text, onclick) {
  return el("button", { type: "button", class: "link", "aria-label": label, onclick }, text);
}

async function issueToken(member) {
  const result = await act("members", "adminIssueToken", { memberId: member.id });
  if (!result) return;
  // Shown once: the node keeps only its hash.
  const box = el("input", { id: "admin-token", readonly: true, value: result.token, spellcheck: "false" });
  $("admin-token-made")?.remove();
  $("admin-members-list").after(
    el(
      "p",
      { id: "admin-token-made", class: "admin-secret", role: "status" },
      ...labelled("admin-token", `New token for @${member.handle} (shown once)`, box),
    ),
  );
  box.select();
}

// ------------------------------------------------------------------ invites

function inviteForm() {
  const form = el(
    "form",
    { id: "admin-invite-form", class: "admin-form", autocomplete: "off" },
    el("h4", {}, "Create an invite link"),
    labelled(
      "admin-invite-expiry",
      "Expires in",
      el("select", { id: "admin-invite-expiry" }, EXPIRIES.map(([words, seconds]) => el("option", { value: String(seconds), selected: seconds === 7 * 86400 }, words))),
    ),
    labelled("admin-invite-uses", "Uses (empty: unlimited)", el("input", { id: "admin-invite-uses", type: "number", min: "1", inputmode: "numeric" })),
    el("fieldset", { id: "admin-invite-channels", class: "admin-channels" }, el("legend", {}, "Also join")),
    el("button", { type: "submit" }, "Create invite"),
    el("div", { id: "admin-invite-made", role: "status" }),
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    $("admin-invite-made").replaceChildren(); // one link at a time, never an older one
    const fields = { expiresInS: Number($("admin-invite-expiry").value) };
    const uses = $("admin-invite-uses").value.trim();
    if (uses) fields.maxUses = Number(uses);
    fields.join = [...form.querySelectorAll("input[name=join]:checked")].map((box) => box.value);
    const made = await act("invites", "adminCreateInvite", fields);
    if (!made) return;
    const link = el("input", { id: "admin-invite-link", readonly: true, value: made.inviteUrl, spellcheck: "false" });
    $("admin-invite-made").replaceChildren(
      ...labelled("admin-invite-link", "Invite link (shown once)", link),
      el("button", { type: "button", onclick: () => navigator.clipboard?.writeText(made.inviteUrl) }, "Copy link"),
    );
    link.select();
  });
  return form;
}

function renderInvites() {
  const boxes = page.channels
    .filter((c) => !c.default)
    .map((c) => el("label", { class: "check" }, el("input", { type: "checkbox", name: "join", value: c.slug }), ` #${c.slug}`));
  $("admin-invite-channels").replaceChildren(el("legend", {}, "Also join"), ...(boxes.length ? boxes : [el("span", { class: "muted small" }, "no other channels")]));
  $("admin-invites-list").replaceChildren(
    ...page.invites.map((invite) => {
      const uses = invite.maxUses ? `${invite.uses} of ${invite.maxUses} uses` : `${invite.uses} uses`;
      const facts = [STATUS_WORDS[invite.status] || invite.status, uses, `expires ${formatTime(invite.expiresAt)}`];
      if (invite.channels.length) facts.push(invite.channels.join(" "));
      const created = `created ${formatTime(invite.createdAt)}`;
      return el(
        "li",
        { class: "admin-row" },
        el("span", { class: "admin-what" }, `Invite ${created}`, el("span", { class: "muted small" }, ` · ${facts.join(" · ")}`)),
        invite.status === "usable"
          ? el("span", { class: "admin-actions" }, button(`Revoke invite ${created}`, "Revoke", () => act("invites", "adminRevokeInvite", { inviteId: invite.id })))
          : null,
      );
    }),
  );
}

// ------------------------------------------------------------------ channels

function channelForm() {
  const form = el(
    "form",
    { id: "admin-channel-form", class: "admin-form", autocomplete: "off" },
    el("h4", {}, "Create a channel"),
    labelled("admin-channel-slug", "Slug", el("input", { id: "admin-channel-slug", required: true, pattern: "[a-z0-9][a-z0-9_\\-]{0,79}", spellcheck: "false" })),
    labelled("admin-channel-name", "Name", el("input", { id: "admin-channel-name" })),
    labelled(
      "admin-channel-visibility",
      "Visibility",
      el("select", { id: "admin-channel-visibility" }, el("option", { value: "public" }, "public"), el("option", { value: "private" }, "private")),
    ),
    el("label", { class: "check" }, el("input", { id: "admin-channel-default", type: "checkbox" }), " Default: everyone who joins the workspace joins it"),
    el("button", { type: "submit" }, "Create channel"),
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const slug = $("admin-channel-slug").value.trim().replace(/^#/, "");
    const fields = {
      slug,
      name: $("admin-channel-name").value.trim() || slug,
      visibility: $("admin-channel-visibility").value,
      default: $("admin-channel-default").checked,
    };
    if (await act("channels", "adminCreateChannel", fields)) {
      form.reset();
      refreshScopesNow(); // the creator is its first member: the sidebar lists it
    }
  });
  return form;
}

function renderChannels() {
  $("admin-channels-list").replaceChildren(
    ...page.channels.map((c) => {
      const facts = [c.visibility, `${c.memberCount} members`];
      if (c.default) facts.push("default");
      return el("li", { class: "admin-row" }, el("span", { class: "admin-what" }, el("strong", {}, `#${c.slug}`), ` ${c.name}`, el("span", { class: "muted small" }, ` · ${facts.join(" · ")}`)));
    }),
  );
}
