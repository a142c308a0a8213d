// Workflows (docs/workflows.md): the "Workflows" page (the plans I created or
// that were shared with me), a plan's view (its transcript with the agent's
// replies and the final reply marked, the draft at its current revision, the
// request composer, sharing and archiving for the creator), and the
// `workflowUpdated` event.
// A plan's transcript is read only with `workflowTranscript`: its scope is in
// no conversation list.

import { state } from "../store.js";
import { $, el, show, setText } from "../dom.js";
import { describeError, personName, randomId } from "../format.js";
import { request } from "../connection.js";

const plans = new Map(); // planId -> WorkflowPlanEntry
const planOfScope = new Map(); // the plan's scope id -> planId
let current = null; // the planId shown

export function isWorkflowScope(scopeId) {
  return planOfScope.has(scopeId);
}

async function loadPlans() {
  try {
    const { plans: list } = await request("workflowPlans");
    plans.clear();
    for (const plan of list) {
      plans.set(plan.planId, plan);
      planOfScope.set(plan.scopeId, plan.planId);
    }
  } catch (err) {
    setText($("wf-create-error"), describeError(err));
    return;
  }
  renderPlans();
}

function renderPlans() {
  const items = [...plans.values()].map((plan) =>
    el(
      "li",
      {},
      el(
        "button",
        {
          type: "button",
          class: "link",
          "aria-current": plan.planId === current ? "true" : null,
          onclick: () => showPlan(plan.planId),
        },
        plan.title,
      ),
      el("span", { class: "muted small" }, ` · revision ${plan.revision}`),
    ),
  );
  $("wf-list").replaceChildren(...items);
  show($("wf-empty"), items.length === 0);
}

function nameOf(author) {
  const person = state.people.get(author.memberId);
  return person ? personName(person) : author.displayName || author.handle;
}

function entry(message) {
  const source = message.metadata?.source || {};
  const final = message.messageType === "workflow_reply" && source.final;
  const kind = message.messageType === "workflow_request" ? "request" : final ? "final" : "reply";
  return el(
    "li",
    { class: "wf-entry wf-" + kind },
    el("span", { class: "wf-author" }, nameOf(message.author)),
    final ? el("strong", { class: "tag" }, "Final reply") : null,
    el("p", { class: "wf-content" }, message.content),
  );
}

async function showPlan(planId) {
  current = planId;
  const plan = plans.get(planId);
  if (!plan) return;
  show($("wf-plan"), true);
  setText($("wf-plan-title"), plan.title);
  const archived = plan.status === "archived" ? " · archived" : "";
  setText($("wf-revision"), `Draft revision ${plan.revision}${archived}`);
  $("wf-request-form").querySelector("button").disabled = Boolean(archived);
  $("wf-draft").textContent = plan.draft || "No draft yet.";
  renderShare(plan);
  renderPlans();
  try {
    const page = await request("workflowTranscript", { planId, limit: 200 });
    if (current === planId) $("wf-transcript").replaceChildren(...page.messages.map(entry));
  } catch (err) {
    setText($("wf-request-error"), describeError(err));
  }
}

function renderShare(plan) {
  const mine = plan.creatorId === state.me?.id;
  show($("wf-share-form"), mine);
  if (!mine) return;
  $("wf-archive").textContent = plan.status === "archived" ? "Restore plan" : "Archive plan";
  const humans = [...state.people.values()].filter(
    (p) => p.type === "human" && p.id !== plan.creatorId && !plan.sharedWith.includes(p.id),
  );
  $("wf-share").replaceChildren(...humans.map((p) => el("option", { value: p.id }, personName(p))));
}

async function refresh() {
  await loadPlans();
  if (current) await showPlan(current);
}

export function onWorkflowUpdated(frame) {
  planOfScope.set(frame.scopeId, frame.planId);
  if ($("workflows-dialog").open) refresh();
}

export function onWorkflowMessage(frame) {
  if ($("workflows-dialog").open && plans.get(current)?.scopeId === frame.scopeId) showPlan(current);
}

async function createPlan(event) {
  event.preventDefault();
  const title = $("wf-title").value.trim();
  const agentId = $("wf-agent").value;
  if (!title || !agentId) return;
  setText($("wf-create-error"), "");
  try {
    const { planId } = await request("createWorkflowPlan", { title, agentId });
    $("wf-create-form").reset();
    $("wf-new").open = false;
    await loadPlans();
    await showPlan(planId);
  } catch (err) {
    setText($("wf-create-error"), describeError(err));
  }
}

async function sendRequest(event) {
  event.preventDefault();
  const content = $("wf-request").value.trim();
  if (!content || !current) return;
  setText($("wf-request-error"), "");
  try {
    await request("workflowRequest", { planId: current, content, clientMessageId: randomId() });
    $("wf-request").value = "";
    await showPlan(current);
  } catch (err) {
    setText($("wf-request-error"), describeError(err));
  }
}

async function share(event) {
  event.preventDefault();
  const memberId = $("wf-share").value;
  if (!memberId || !current) return;
  try {
    await request("shareWorkflowPlan", { planId: current, memberId });
    await refresh();
  } catch (err) {
    setText($("wf-request-error"), describeError(err));
  }
}

async function toggleArchive() {
  const plan = plans.get(current);
  if (!plan) return;
  const status = plan.status === "archived" ? "draft" : "archived";
  try {
    await request("updateWorkflowPlan", { planId: plan.planId, status });
    await refresh();
  } catch (err) {
    setText($("wf-request-error"), describeError(err));
  }
}

function fillAgents() {
  const agents = [...state.people.values()].filter((p) => p.type === "agent");
  $("wf-agent").replaceChildren(...agents.map((p) => el("option", { value: p.id }, personName(p))));
}

function openPage() {
  fillAgents();
  $("workflows-dialog").showModal();
  refresh();
}

export function wireWorkflows() {
  $("workflows-button").addEventListener("click", openPage);
  $("wf-create-form").addEventListener("submit", createPlan);
  $("wf-new").addEventListener("toggle", fillAgents);
  $("wf-request-form").addEventListener("submit", sendRequest);
  $("wf-share-form").addEventListener("submit", share);
  $("wf-archive").addEventListener("click", toggleArchive);
}
