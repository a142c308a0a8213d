// Schedules (docs/schedules.md): "Schedule message" next to Send (a time with
// presets, once or repeating), the sidebar's "Scheduled" list to edit, pause
// or delete my schedules, `/remind me …` in the composer, and the note a
// scheduled message shows about who scheduled it.

import { state } from "../store.js";
import { $, el, show, setText } from "../dom.js";
import { describeError, formatTime, personName, scopeLabel } from "../format.js";
import { request } from "../connection.js";

const UNITS = { second: 1, minute: 60, hour: 3600, day: 86400 };
const REPEATS = [
  ["", "Once"],
  ["day", "Every day"],
  ["weekday", "Every weekday"],
  ["week", "Every week"],
];
const WEEKDAYS = ["sunday", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday"];
const zone = () => Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC";
const pad = (n) => String(n).padStart(2, "0");

// `/remind me in 5 seconds to stretch`, `/remind me tomorrow at 9:00 to call
// Bob`, `/remind me at 17:30 to leave`: the time, and what to be reminded of
// (the words after "to"). Null when the text is not a reminder this knows.
export function parseReminder(text, now = new Date()) {
  const found = /^\/remind\s+me\s+(.+?)\s+to\s+(\S[\s\S]*)$/i.exec(text.trim());
  if (!found) return null;
  const [, when, what] = found;
  const inN = /^in\s+(\d{1,6})\s+(second|minute|hour|day)s?$/i.exec(when);
  if (inN) return { at: new Date(now.getTime() + Number(inN[1]) * UNITS[inN[2].toLowerCase()] * 1000), content: what };
  const clock = /^(tomorrow\s+)?at\s+([01]?\d|2[0-3])[:.]([0-5]\d)$/i.exec(when);
  if (!clock) return null;
  const at = new Date(now);
  at.setHours(Number(clock[2]), Number(clock[3]), 0, 0);
  if (clock[1] || at <= now) at.setDate(at.getDate() + 1);
  return { at, content: what };
}

function localInput(at) {
  return `${at.getFullYear()}-${pad(at.getMonth() + 1)}-${pad(at.getDate())}T${pad(at.getHours())}:${pad(at.getMinutes())}:${pad(at.getSeconds())}`;
}

function nextAt(hour, weekday = null) {
  const at = new Date();
  at.setHours(hour, 0, 0, 0);
  do at.setDate(at.getDate() + 1);
  while (weekday !== null && at.getDay() !== weekday);
  return at;
}

function note(text, error = false) {
  setText($("composer-note"), text);
  $("composer-note").className = error ? "note error" : "note";
}

// "/remind me …": handled here before the composer sends anything.
async function remind(event) {
  const input = $("composer-input");
  if (event.target !== $("composer") || !/^\/remind\b/i.test(input.value.trim())) return;
  event.preventDefault();
  event.stopImmediatePropagation();
  const reminder = parseReminder(input.value);
  if (!reminder) {
    note("Try /remind me in 10 minutes to stretch, or /remind me tomorrow at 9:00 to call Bob.", true);
    return;
  }
  try {
    await request("createSchedule", {
      target: "me",
      content: reminder.content,
      at: reminder.at.toISOString(),
      timeZone: zone(),
    });
    input.value = "";
    show($("schedule-button"), false);
    note(`Reminder set for ${formatTime(reminder.at.toISOString())}. It will arrive in your messages from Schedule.`);
    loadScheduled();
  } catch (err) {
    note(describeError(err), true);
  }
}

function dialog() {
  const at = el("input", { id: "schedule-at", type: "datetime-local", step: "1", required: true });
  const repeat = el("select", { id: "schedule-repeat" }, REPEATS.map(([value, label]) => el("option", { value }, label)));
  const preset = (label, when) =>
    el("button", { type: "button", onclick: () => (at.value = localInput(when())) }, label);
  const error = el("p", { id: "schedule-error", class: "error", role: "alert", hidden: true });
  const form = el(
    "form",
    { method: "dialog", onsubmit: schedule },
    el("label", { for: "schedule-at" }, "Send at"),
    at,
    el("div", { class: "presets" }, preset("Tomorrow 9:00", () => nextAt(9)), preset("Next Monday 9:00", () => nextAt(9, 1))),
    el("label", { for: "schedule-repeat" }, "Repeat"),
    repeat,
    error,
    el(
      "div",
      { class: "dialog-actions" },
      el("button", { type: "button", onclick: () => $("schedule-dialog").close() }, "Cancel"),
      el("button", { type: "submit", class: "primary" }, "Schedule"),
    ),
  );
  return el(
    "dialog",
    { id: "schedule-dialog", "aria-labelledby": "schedule-title" },
    el("div", { class: "dialog-head" }, el("h2", { id: "schedule-title" }, "Schedule message")),
    form,
  );
}

function openScheduler() {
  if (!state.current) return;
  if (!$("composer-input").value.trim()) {
    note("Write the message first, then schedule it.", true);
    return;
  }
  $("schedule-at").value = localInput(new Date(Date.now() + 3600_000));
  setText($("schedule-error"), "");
  $("schedule-dialog").showModal();
}

async function schedule(event) {
  event.preventDefault();
  const at = new Date($("schedule-at").value);
  if (Number.isNaN(at.getTime())) return;
  const every = $("schedule-repeat").value;
  const time = `${pad(at.getHours())}:${pad(at.getMinutes())}`;
  const timing = every
    ? { rule: { every, time, ...(every === "week" ? { weekday: WEEKDAYS[at.getDay()] } : {}) } }
    : { at: at.toISOString() };
  const scope = state.scopes.get(state.current);
  const target = scope?.type === "channel" ? "scope:" + state.current : null;
  if (!target) {
    setText($("schedule-error"), "Messages can be scheduled in channels; use /remind me for yourself.");
    return;
  }
  try {
    const content = $("composer-input").value;
    const made = await request("createSchedule", { target, content, timeZone: zone(), ...timing });
    $("schedule-dialog").close();
    $("composer-input").value = "";
    show($("schedule-button"), false);
    note(`Scheduled for ${formatTime(made.nextAt)}.`);
    loadScheduled();
  } catch (err) {
    setText($("schedule-error"), describeError(err));
  }
}

async function loadScheduled() {
  let list;
  try {
    ({ schedules: list } = await request("schedules"));
  } catch {
    return; // a node without schedules: the list stays empty
  }
  const items = list.map(scheduledItem);
  $("scheduled-list").replaceChildren(...items);
  show($("scheduled-empty"), items.length === 0);
}

function when(entry) {
  if (entry.paused) return "paused";
  if (entry.nextAt) return (entry.rule ? `${entry.rule.every}, next ` : "") + formatTime(entry.nextAt);
  return entry.lastRun?.outcome === "skipped" ? "skipped" : "sent";
}

function scheduledItem(entry) {
  const act = (fields, op = "pauseSchedule") => async () => {
    try {
      await request(op, { scheduleId: entry.scheduleId, ...fields });
    } catch (err) {
      setText($("scheduled-error"), describeError(err));
    }
    loadScheduled();
  };
  const text = el("span", { class: "scheduled-text" }, entry.content);
  const edit = () => {
    const box = el("input", { value: entry.content, "aria-label": "Edit scheduled message" });
    const save = el("button", { type: "button", onclick: () => act({ content: box.value }, "updateSchedule")() }, "Save");
    text.replaceChildren(box, save);
    box.focus();
  };
  return el(
    "li",
    { class: "scheduled" },
    text,
    el("span", { class: "muted small" }, ` in ${scopeLabel(state.scopes.get(entry.targetScopeId)) || "a conversation"} (${when(entry)}) `),
    entry.nextAt
      ? el("button", { type: "button", class: "link small", onclick: act({ paused: !entry.paused }) }, entry.paused ? "Resume" : "Pause")
      : null,
    el("button", { type: "button", class: "link small", onclick: edit }, "Edit"),
    el("button", { type: "button", class: "link small", onclick: act({}, "deleteSchedule") }, "Delete"),
  );
}

// Above a scheduled message: who scheduled it, and how late it came.
export function runNote(src) {
  const owner = personName(state.people.get(src.ownerMemberId)) || "someone";
  const late = src.delaySeconds ? ` · ${src.delaySeconds} s late` : "";
  return el("p", { class: "muted small source-run" }, `Scheduled by ${owner}${late}`);
}

export function wireSchedules() {
  document.body.append(dialog());
  // Shown once there is something to schedule: an empty composer keeps its
  // tab stops (Tab from it reaches the conversation list in three presses).
  const button = el(
    "button",
    { id: "schedule-button", type: "button", class: "icon-button", "aria-label": "Schedule message", hidden: true, onclick: openScheduler },
    "Schedule",
  );
  $("composer-send").before(button);
  const input = $("composer-input");
  const offer = () => show(button, Boolean(input.value.trim()) && !input.value.trim().startsWith("/"));
  input.addEventListener("input", offer);
  $("composer").addEventListener("submit", () => queueMicrotask(offer));
  const list = el(
    "details",
    { class: "side-form", ontoggle: (event) => event.target.open && loadScheduled() },
    el("summary", {}, "Scheduled"),
    el("ul", { id: "scheduled-list", class: "scheduled-list", "aria-label": "Scheduled messages" }),
    el("p", { id: "scheduled-empty", class: "muted small", hidden: true }, "Nothing scheduled."),
    el("p", { id: "scheduled-error", class: "error", role: "alert", hidden: true }),
  );
  $("task-form").closest("details").before(list);
  // Capture: a reminder is taken before the composer's own submit handler sends it.
  document.addEventListener("submit", remind, true);
}
