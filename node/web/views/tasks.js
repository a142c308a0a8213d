// Tasks (docs/tasks.md): the sidebar's "Tasks" section (assigned to me, created by
// me, with status badges and unread), the task bar over an open task's
// discussion (status control, assignees with add and remove), "Create task" from
// the sidebar and from a message's actions, and the `taskUpdated` event.

import { state } from "../store.js";
import { $, el, show, setText, unreadBadge } from "../dom.js";
import { describeError, personName } from "../format.js";
import { request } from "../connection.js";
import { refreshScopesNow } from "./sidebar.js";
import { openScope } from "./conversation.js";

export const STATUSES = [
  ["open", "Open"],
  ["in_progress", "In progress"],
  ["blocked", "Blocked"],
  ["done", "Done"],
  ["cancelled", "Cancelled"],
];
const STATUS_LABEL = Object.fromEntries(STATUSES);
const tasks = new Map(); // taskId -> TaskEntry (from `tasks` and `taskUpdated`)
let linkedChannel = null; // the channel a task created from a message is linked to

export async function loadTasks() {
  try {
    const { tasks: list } = await request("tasks", { filter: "mine", limit: 200 });
    tasks.clear();
    for (const task of list) tasks.set(task.taskId, task);
  } catch {
    return; // a node without tasks: the section stays empty
  }
  renderTasks();
}

export function isTask(scopeId) {
  return state.scopes.get(scopeId)?.type === "task" || tasks.has(scopeId);
}

export function renderTasks() {
  const mine = state.me?.id;
  const items = [...tasks.values()]
    .filter((t) => state.scopes.has(t.taskId))
    .sort((a, b) => a.title.localeCompare(b.title))
    .map((task) => taskItem(task, mine));
  $("task-list").replaceChildren(...items);
  show($("tasks-title"), items.length > 0);
  renderTaskBar();
}

function taskItem(task, mine) {
  const scope = state.scopes.get(task.taskId);
  const open = task.taskId === state.current;
  const unread = open || scope?.notification === "mute" ? 0 : scope?.unread || 0;
  const role = task.assignees.includes(mine) ? "assigned to me" : task.creatorId === mine ? "created by me" : "";
  const link = el(
    "a",
    {
      href: "#c=" + encodeURIComponent(task.taskId),
      class: "scope" + (unread ? " has-unread" : ""),
      "aria-current": open ? "page" : null,
      title: role ? `${task.title} (${role})` : task.title,
      "data-scope": task.taskId,
      onclick: (event) => {
        event.preventDefault();
        openScope(task.taskId, { reveal: true });
      },
    },
    el("span", { class: "scope-name" }, task.title),
    el("span", { class: "tag status-" + task.status }, STATUS_LABEL[task.status] || task.status),
    unreadBadge(unread),
  );
  return el("li", {}, link);
}

function renderTaskBar() {
  const bar = $("task-bar");
  const task = tasks.get(state.current);
  show(bar, Boolean(task));
  if (!task) return;
  const select = $("task-status");
  select.value = task.status;
  setText($("task-status-now"), `Status: ${STATUS_LABEL[task.status] || task.status}`);
  const people = task.assignees.map((id) => {
    const person = state.people.get(id);
    const name = person ? personName(person) : id;
    return el(
      "li",
      {},
      el("span", {}, name),
      el(
        "button",
        { type: "button", class: "link", "aria-label": `Unassign ${name}`, onclick: () => reassign(task, task.assignees.filter((a) => a !== id)) },
        "Remove",
      ),
    );
  });
  $("task-assignees").replaceChildren(...people);
  const choices = [...state.people.values()].filter((p) => !task.assignees.includes(p.id));
  $("task-add-select").replaceChildren(
    el("option", { value: "" }, "Add assignee…"),
    ...choices.map((p) => el("option", { value: p.id }, personName(p))),
  );
}

async function update(task, fields) {
  setText($("task-error"), "");
  try {
    const { task: updated } = await request("updateTask", { taskId: task.taskId, ...fields });
    tasks.set(updated.taskId, updated);
    renderTasks();
  } catch (err) {
    setText($("task-error"), describeError(err));
    renderTaskBar();
  }
}

function reassign(task, assignees) {
  return update(task, { assignees });
}

export function onTaskUpdated(frame) {
  const known = tasks.get(frame.taskId);
  const entry = { ...(known || {}), ...frame };
  tasks.set(frame.taskId, entry);
  if (!known || !state.scopes.has(frame.taskId)) {
    // A new task (or one just assigned to me): its scope and unread come with `scopes`.
    refreshScopesNow().then(loadTasks);
    return;
  }
  renderTasks();
}

export function createTaskFrom(message) {
  // Title prefilled from the message, linked to its channel.
  const scope = state.scopes.get(message.scopeId);
  linkedChannel = scope?.type === "channel" ? scope.id : null;
  const excerpt = (message.content || "").replace(/\s+/g, " ").trim().slice(0, 120);
  $("task-title").value = excerpt;
  setText($("task-linked"), linkedChannel ? `Linked to #${scope.slug}` : "");
  const details = $("task-form").closest("details");
  details.open = true;
  $("task-title").focus();
}

async function createTask(event) {
  event.preventDefault();
  const title = $("task-title").value.trim();
  if (!title) return;
  const assignee = $("task-assignee").value;
  setText($("task-create-error"), "");
  const fields = { title, assignees: assignee ? [assignee] : [] };
  if (linkedChannel) fields.channelId = linkedChannel;
  try {
    const { taskId } = await request("createTask", fields);
    $("task-form").reset();
    linkedChannel = null;
    setText($("task-linked"), "");
    $("task-form").closest("details").open = false;
    await refreshScopesNow();
    await loadTasks();
    openScope(taskId, { reveal: true });
  } catch (err) {
    setText($("task-create-error"), describeError(err));
  }
}

function fillAssigneeChoices() {
  const people = [...state.people.values()].sort((a, b) => personName(a).localeCompare(personName(b)));
  $("task-assignee").replaceChildren(
    el("option", { value: "" }, "Nobody yet"),
    ...people.map((p) => el("option", { value: p.id }, personName(p))),
  );
}

export function wireTasks() {
  $("task-form").addEventListener("submit", createTask);
  $("task-form").closest("details").addEventListener("toggle", fillAssigneeChoices);
  $("task-status").replaceChildren(...STATUSES.map(([value, label]) => el("option", { value }, label)));
  $("task-status").addEventListener("change", (event) => {
    const task = tasks.get(state.current);
    if (task) update(task, { status: event.target.value });
  });
  $("task-add-select").addEventListener("change", (event) => {
    const task = tasks.get(state.current);
    const id = event.target.value;
    if (task && id) reassign(task, [...task.assignees, id]);
  });
}
