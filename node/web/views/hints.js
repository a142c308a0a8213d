// Send hints under the composer: the message was stored, but someone it
// mentions will not read it. In a channel the sender may invite them there
// (the node decides; a refusal is shown in the note).

import { state } from "../store.js";
import { $, el, setText } from "../dom.js";
import { describeError, scopeLabel } from "../format.js";
import { request } from "../connection.js";

export function showHints(item, hints) {
  const missing = (hints || []).filter((h) => h.kind === "not_in_scope");
  // The note belongs to the open conversation; a hint about another one would mislead.
  if (!missing.length || item.where === "thread" || item.scopeId !== state.current) return;
  const note = $("composer-note");
  const scope = state.scopes.get(item.scopeId);
  const where = scope?.type === "channel" ? scopeLabel(scope) : "this conversation";
  note.className = "note hint";
  note.replaceChildren(
    ...missing.map((hint) =>
      el(
        "span",
        { class: "hint", "data-member-id": hint.memberId },
        `@${hint.handle} is not in ${where} — `,
        scope?.type === "channel"
          ? el(
              "button",
              { type: "button", class: "link", onclick: () => invite(item.scopeId, hint, where) },
              "Invite?",
            )
          : "they will not see it.",
        " ",
      ),
    ),
  );
  note.hidden = false;
}

async function invite(scopeId, hint, where) {
  const note = $("composer-note");
  // Only an owner is hinted its private agent, which joins a channel privately.
  const own = state.people.get(hint.memberId)?.ownerMemberId === state.me?.id;
  try {
    await request("invite", { scopeId, memberId: hint.memberId, ...(own ? { visibility: "private" } : {}) });
    if (state.current !== scopeId) return;
    note.className = "note";
    setText(note, `Invited @${hint.handle} to ${where}. Mention them again to ask.`);
  } catch (err) {
    note.className = "note error";
    setText(note, describeError(err));
  }
}
