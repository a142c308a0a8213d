// Modal dialogs: confirm, browse and join channels, start a direct message.

import { state } from "../store.js";
import { $, el } from "../dom.js";
import { describeError, personName } from "../format.js";
import { request, isUnknownOp } from "../connection.js";
import { refreshScopesNow, loadPeople } from "./sidebar.js";
import { openScope } from "./conversation.js";

export function confirmDialog(title, text, yes) {
  const dialog = $("confirm-dialog");
  $("confirm-title").textContent = title;
  $("confirm-text").textContent = text;
  $("confirm-yes").textContent = yes;
  return new Promise((resolve) => {
    const answer = (value) => {
      dialog.removeEventListener("close", onClose);
      for (const button of dialog.querySelectorAll("[data-answer]")) button.onclick = null;
      if (dialog.open) dialog.close();
      resolve(value);
    };
    const onClose = () => answer(false);
    dialog.addEventListener("close", onClose);
    for (const button of dialog.querySelectorAll("[data-answer]")) {
      button.onclick = () => answer(button.dataset.answer === "yes");
    }
    dialog.showModal();
    dialog.querySelector("[data-answer=no]").focus();
  });
}

export function openDialog(id) {
  const dialog = $(id);
  if (!dialog.open) dialog.showModal();
  return dialog;
}

export async function browseChannels() {
  openDialog("browse-dialog");
  const body = $("browse-body");
  body.replaceChildren(el("p", { class: "muted" }, "Loading…"));
  let channels;
  try {
    const result = await request("channels");
    channels = result.channels || [];
  } catch (err) {
    body.replaceChildren(
      el(
        "p",
        { class: "error", role: "alert" },
        isUnknownOp(err) ? "This node cannot list channels yet." : describeError(err),
      ),
    );
    return;
  }
  channels.sort((a, b) => (a.slug || "").localeCompare(b.slug || ""));
  const list = el("ul", { class: "browse-list" });
  for (const channel of channels) {
    const joined = channel.joined || state.scopes.has(channel.id);
    const count = channel.memberCount ?? channel.members ?? 0;
    list.append(
      el(
        "li",
        {},
        el(
          "div",
          { class: "browse-info" },
          el("span", { class: "author" }, "#" + channel.slug),
          channel.name && channel.name !== channel.slug ? el("span", { class: "muted" }, channel.name) : null,
          el("span", { class: "muted small" }, `${count} member${count === 1 ? "" : "s"}`),
          channel.description ? el("span", { class: "small" }, channel.description) : null,
        ),
        el(
          "button",
          {
            type: "button",
            class: joined ? "" : "primary",
            "aria-label": `${joined ? "Open" : "Join"} #${channel.slug}`,
            onclick: () => joinChannel(channel.id, joined),
          },
          joined ? "Open" : "Join",
        ),
      ),
    );
  }
  body.replaceChildren(channels.length ? list : el("p", { class: "muted" }, "No public channels yet."));
}

async function joinChannel(scopeId, joined) {
  try {
    if (!joined) await request("join", { scopeId });
    $("browse-dialog").close();
    await refreshScopesNow();
    openScope(scopeId, { reveal: true });
  } catch (err) {
    $("browse-body").prepend(el("p", { class: "error", role: "alert" }, describeError(err)));
  }
}

export async function newDirectMessage() {
  openDialog("dm-dialog");
  $("dm-filter").value = "";
  $("dm-body").replaceChildren(el("p", { class: "muted" }, "Loading…"));
  await loadPeople(); // its end draws the open dialog (PEOPLE_LOADED, app.js)
  $("dm-filter").focus();
}

export function renderPeople() {
  const filter = $("dm-filter").value.trim().toLowerCase();
  const people = [...state.people.values()]
    .filter((p) => !filter || personName(p).toLowerCase().includes(filter) || p.handle.toLowerCase().includes(filter))
    .sort((a, b) => personName(a).localeCompare(personName(b)));
  const list = el("ul", { class: "browse-list" });
  for (const person of people) {
    const you = person.id === state.me?.id;
    list.append(
      el(
        "li",
        {},
        el(
          "button",
          { type: "button", class: "person", onclick: () => startDm(person) },
          el("span", { class: "author" }, personName(person) + (you ? " (you)" : "")),
          " ",
          el("span", { class: "handle" }, "@" + person.handle),
          person.type && person.type !== "human" ? el("span", { class: "tag" }, person.type) : null,
        ),
      ),
    );
  }
  // Before the first welcome nobody is known yet: the list comes with the connection.
  const none = state.connected ? "Nobody found." : "Connecting…";
  $("dm-body").replaceChildren(people.length ? list : el("p", { class: "muted" }, none));
}

async function startDm(person) {
  try {
    // Reading a DM target opens (creates) the conversation.
    const page = await request("history", { target: "dm:" + person.id, limit: 1 });
    state.dmPeers.set(page.scopeId, person);
    $("dm-dialog").close();
    await refreshScopesNow();
    openScope(page.scopeId, { reveal: true });
  } catch (err) {
    $("dm-body").prepend(el("p", { class: "error", role: "alert" }, describeError(err)));
  }
}
