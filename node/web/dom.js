// Building the page: the element factory and the show/hide helpers. Text goes in
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
