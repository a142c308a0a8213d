// Building the page: the element factory, the show/hide helpers, and place()
// for redrawing a list while keeping its unchanged nodes. Text goes in only as
// text nodes (children are appended, never parsed as HTML).

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
