// The invite page: `/#invite=<code>` lets a person pick a handle and join the
// workspace in one step. It builds its own view (the sign-in form stays hidden
// while it is up), asks the node what the invite is for, redeems it and hands
// the session token it gets to the caller, which signs in with it.

import { el, show, setText } from "./dom.js";

const REASONS = {
  expired: "This invite link has expired.",
  used_up: "This invite link has already been used as often as it allows.",
  revoked: "This invite link was withdrawn.",
};

export function readInvite() {
  // Like the login link's token, the code leaves the address bar at once.
  if (!location.hash.startsWith("#invite=")) return null;
  const code = new URLSearchParams(location.hash.slice(1)).get("invite");
  history.replaceState(null, "", location.pathname + location.search);
  return code || "";
}

async function post(path, body) {
  try {
    const response = await fetch(path, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
      cache: "no-store",
    });
    let answer = {};
    try {
      answer = await response.json();
    } catch {
      // not JSON: only the status says what happened
    }
    return { status: response.status, body: answer };
  } catch {
    return { status: 0, body: {} };
  }
}

function problem(answer) {
  if (answer.status === 0) return "The server cannot be reached. Check your connection and try again.";
  if (answer.status === 404) return "This invite link is not valid. Ask for a new one.";
  if (answer.status === 410) {
    return (REASONS[answer.body.details?.reason] || "This invite link can no longer be used.") +
      " Ask for a new one.";
  }
  if (answer.status === 429) {
    const seconds = Math.ceil((answer.body.details?.retryAfterMs || 1000) / 1000);
    return `Too many attempts from here. Try again in ${seconds} s.`;
  }
  return answer.body.message || "Something went wrong. Try again.";
}

function page(...children) {
  const card = el("div", { class: "card" }, ...children);
  const view = el("main", { id: "invite-view", class: "login", "aria-labelledby": "invite-title" }, card);
  document.getElementById("invite-view")?.remove();
  document.body.prepend(view);
  return view;
}

function unusable(message, onCancel) {
  page(
    el("h1", { id: "invite-title" }, "This invite cannot be used"),
    el("p", { class: "error", role: "alert" }, message),
    el("button", { type: "button", onclick: () => close(onCancel) }, "Go to sign in"),
  );
}

function close(then) {
  document.getElementById("invite-view")?.remove();
  then();
}

// `signIn(token, workspace)` takes over once the invite is redeemed;
// `onCancel()` shows the ordinary sign-in form.
export async function openInvite(code, { signIn, onCancel }) {
  for (const id of ["login-view", "app-view"]) {
    const node = document.getElementById(id);
    if (node) show(node, false);
  }
  page(el("h1", { id: "invite-title" }, "Opening your invite…"));
  const found = code
    ? await post("/v1/invites/lookup", { code })
    : { status: 404, body: {} };
  if (found.status !== 200) return unusable(problem(found), onCancel);

  const error = el("p", { class: "error", role: "alert", hidden: true });
  const handle = el("input", {
    id: "invite-handle",
    required: true,
    maxlength: "64",
    spellcheck: "false",
    autocomplete: "username",
    autocapitalize: "none",
  });
  const displayName = el("input", { id: "invite-name", maxlength: "256", autocomplete: "name" });
  const join = el("button", { type: "submit", class: "primary" }, "Join");
  const form = el(
    "form",
    { autocomplete: "off" },
    el("h1", { id: "invite-title" }, `Join ${found.body.workspaceName}`),
    el("p", { class: "muted" }, "Pick the handle people will mention you by, and the name they will see."),
    el("label", { for: "invite-handle" }, "Handle"),
    handle,
    el("p", { class: "muted small" }, "Lower-case letters, digits, “.”, “_” and “-”."),
    el("label", { for: "invite-name" }, "Display name"),
    displayName,
    join,
    error,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    setText(error, "");
    join.disabled = true;
    const answer = await post("/v1/invites/redeem", {
      code,
      handle: handle.value.trim().toLowerCase(),
      displayName: displayName.value.trim() || null,
    });
    join.disabled = false;
    if (answer.status === 200) {
      close(() => signIn(answer.body.token, answer.body.workspace));
      return;
    }
    if (answer.status === 404 || answer.status === 410) return unusable(problem(answer), onCancel);
    const path = answer.body.details?.path;
    if (answer.status === 409 && path === "$.handle") {
      setText(error, `The handle “${handle.value.trim().toLowerCase()}” is taken. Pick another.`);
      handle.focus();
      return;
    }
    setText(error, problem(answer));
    if (path === "$.displayName") displayName.focus();
    else if (path === "$.handle") handle.focus();
  });
  const view = page(form);
  view.querySelector("#invite-handle").focus();
}
