// Building the page: the element factory, the show/hide helpers, place()
// for redrawing a list while keeping its unchanged nodes, and
// redrawAfterPress() for redraws that must not land between a press and its
// release. Text goes in
// only as text nodes (children are appended, never parsed as HTML).

export const $ = (id) => document.getElementById(id);

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

export function show(node, visible) {
  node.hidden = !visible;
}

export function setText(node, text) {
  node.textContent = text || "";
  show(node, Boolean(text));
}

// Puts ``wanted`` in ``list`` in order, leaving in place the nodes already there
// (those not wanted go): a redraw costs the nodes that changed, not the whole
// list's, and a node kept is still the one a click in progress landed on.
export function place(list, wanted) {
  const keep = new Set(wanted);
  let cursor = list.firstChild;
  const drop = () => {
    const next = cursor.nextSibling;
    cursor.remove();
    cursor = next;
  };
  for (const node of wanted) {
    while (cursor && !keep.has(cursor)) drop();
    if (node === cursor) cursor = cursor.nextSibling;
    else list.insertBefore(node, cursor);
  }
  while (cursor) drop();
}

// A list item's unread count: the number shown, the words read out.
export function unreadBadge(unread) {
  if (!unread) return null;
  return el(
    "span",
    { class: "badge" },
    el("span", { "aria-hidden": "true" }, unread > 99 ? "99+" : String(unread)),
    el("span", { class: "sr-only" }, ` ${unread} unread`),
  );
}

// A redraw between a pointer's press and its release replaces the node the
// press landed on, and the browser then gives the click to no one: a button on
// a message lost its click whenever a frame for the conversation arrived in
// between. Whole-view redraws asked for during a press wait for its release
// (and for the click that follows it, which is dispatched in the same task),
// or for PRESS_WAIT_MS when the press is held longer (a selection, a drag).
const PRESS_WAIT_MS = 1000;
const held = new Map();
let pressing = false;
let pressTimer = 0;

function release() {
  pressing = false;
  clearTimeout(pressTimer);
  setTimeout(() => {
    const due = [...held.values()];
    held.clear();
    for (const redraw of due) redraw();
  });
}

document.addEventListener(
  "pointerdown",
  () => {
    pressing = true;
    clearTimeout(pressTimer);
    pressTimer = setTimeout(release, PRESS_WAIT_MS);
  },
  true,
);
document.addEventListener("pointerup", release, true);
document.addEventListener("pointercancel", release, true);

// True when ``redraw`` was put off until the press ends (the last one asked
// for under ``key`` runs then); false when the caller may draw now, which also
// drops a redraw still held under ``key``.
function heldForPress(key, redraw) {
  if (!pressing) {
    held.delete(key);
    return false;
  }
  held.set(key, redraw);
  return true;
}

// ``draw(options)`` made to wait out a press: called during one, it runs on
// the release, once, with the options of every call held combined by
// ``merge(held, asked)``.
export function redrawAfterPress(draw, merge) {
  let waiting = null;
  const redraw = (options = {}) => {
    const wanted = waiting ? merge(waiting, options) : options;
    waiting = null;
    if (heldForPress(redraw, replay)) waiting = wanted;
    else draw(wanted);
  };
  const replay = () => {
    const options = waiting;
    waiting = null;
    if (options) redraw(options);
  };
  return redraw;
}
