// Service accounts (apps): their conversation is written by the service alone.
// A manager of the service gets a composer that posts as it ("Posting as
// deploys", servicePost); everyone else reads, with no composer at all.

import { $, show, setText } from "../dom.js";
import { describeError, randomId } from "../format.js";
import { request } from "../connection.js";

const PLACEHOLDER = "Write a message… (Enter to send, Shift+Enter for a new line)";

export function serviceComposer(scope) {
  const composer = $("composer");
  const service = scope?.service;
  show(composer, !service || service.manager);
  $("composer-input").placeholder = service ? `Posting as ${service.handle}` : PLACEHOLDER;
  $("composer-input").setAttribute("aria-label", service ? `Posting as ${service.handle}` : "Message");
  // A service's post carries text only: no uploads.
  $("attach-button").hidden = Boolean(service);
}

export async function postAsService(scope, content) {
  const input = $("composer-input");
  input.value = "";
  setText($("composer-note"), "");
  try {
    await request("servicePost", {
      service: scope.service.handle,
      content,
      clientMessageId: randomId(),
    });
  } catch (err) {
    // The text is kept: put it back for another try.
    if (!input.value) input.value = content;
    setText($("composer-note"), describeError(err));
    $("composer-note").className = "note error";
  }
  input.focus();
}
