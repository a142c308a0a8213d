// The safe Markdown renderer: message text in, a DocumentFragment of elements
// and text nodes out. No HTML is ever parsed; only http(s) and mailto links.

import { state } from "./store.js";
import { el } from "./dom.js";

const SAFE_PROTOCOLS = new Set(["http:", "https:", "mailto:"]);

// A deliberately small Markdown subset: fenced code, quotes, lists (one level
// nested), # headings (as styled text), paragraphs;
// inline code, **bold**, *italic*/_italic_, [links](url), bare URLs, @mentions.
// Every piece of message text becomes a text node: no HTML is ever parsed.

const NOT_BEFORE_MENTION = /[A-Za-z0-9_.+\-%/@]/;
const MAX_DEPTH = 4;

export function renderMarkdown(content, message) {
  const frag = document.createDocumentFragment();
  const lines = String(content ?? "").split(/\r\n|\r|\n/);
  for (const block of blocks(lines, message, 0)) frag.append(block);
  return frag;
}

function blocks(lines, message, depth) {
  const out = [];
  let para = [];
  let reach = null; // fenceReach(lines), computed when a fence first needs it
  const flush = () => {
    if (para.length) out.push(el("p", {}, inline(para.join("\n"), message, 0)));
    para = [];
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = openingFence(lines, i, () => (reach ??= fenceReach(lines)));
    if (fence) {
      if (fence.before) para.push(fence.before);
      flush();
      const body = fence.first === null ? [] : [fence.first];
      i++;
      while (i < lines.length && !fence.closing.test(lines[i])) body.push(lines[i++]);
      out.push(
        el("pre", { "data-lang": fence.lang || null }, el("code", {}, document.createTextNode(body.join("\n")))),
      );
      continue;
    }
    if (/^ {0,3}>/.test(line)) {
      flush();
      const quoted = [];
      while (i < lines.length && /^ {0,3}>/.test(lines[i])) {
        quoted.push(lines[i].replace(/^ {0,3}> ?/, ""));
        i++;
      }
      i--;
      // Quoted text is inert for routing; nested quotes render up to a small depth.
      const inner =
        depth < MAX_DEPTH
          ? blocks(quoted, null, depth + 1)
          : [el("p", {}, document.createTextNode(quoted.join("\n")))];
      out.push(el("blockquote", {}, inner));
      continue;
    }
    const heading = headingOf(line);
    if (heading) {
      flush();
      // Styled text, not h1–h3: a message must not add to the page's outline.
      out.push(el("p", { class: `md-heading md-h${heading.level}` }, el("strong", {}, inline(heading.text, message, 0))));
      continue;
    }
    const item = listItem(line);
    if (item && item.indent < 4 && (!para.length || item.ordered === null || item.start === 1)) {
      flush();
      i = list(lines, i, message, out);
      continue;
    }
    if (!line.trim()) {
      flush();
      continue;
    }
    para.push(line);
  }
  flush();
  return out;
}

// Every pattern here is linear in the line's length: a message is rendered on
// every reader's page, so none may backtrack over a long run of one character.
const HEADING = /^ {0,3}(#{1,3})[ \t]+(.*)$/s;

function headingOf(line) {
  const match = HEADING.exec(line);
  if (!match) return null;
  let text = match[2].trimEnd();
  let end = text.length;
  while (end > 0 && text[end - 1] === "#") end--;
  // A closing run of #s (after a space) is not part of the heading.
  if (end < text.length && (end === 0 || text[end - 1] === " " || text[end - 1] === "\t")) {
    text = text.slice(0, end).trimEnd();
  }
  return text.trim() ? { level: match[1].length, text } : null;
}
const LIST_ITEM = /^( *)(?:([-*+])|(\d{1,9})[.)])[ \t]+(.*)$/s;

function listItem(line) {
  const match = LIST_ITEM.exec(line);
  if (!match || !match[4].trim()) return null;
  return {
    indent: match[1].length,
    ordered: match[2] ? null : "ol",
    start: match[3] ? Number(match[3]) : null,
    text: match[4],
  };
}

// A list from lines[i] on, one level of nesting (deeper items join the nested
// list); returns the index of its last line.
function list(lines, i, message, out) {
  const first = listItem(lines[i]);
  const top = listNode(first);
  let current = null;
  let nested = null;
  for (; i < lines.length; i++) {
    const item = listItem(lines[i]);
    if (!item) {
      const line = lines[i];
      // A lazy continuation line belongs to the item above it.
      if (line.trim() && current && /^\s/.test(line) && !headingOf(line)) {
        (nested?.lastChild || current).append("\n", ...inline(line.trim(), message, 0));
        continue;
      }
      break;
    }
    if (item.indent >= first.indent + 2 && current) {
      if (!nested) {
        nested = listNode(item);
        current.append(nested);
      }
      nested.append(el("li", {}, inline(item.text, message, 0)));
      continue;
    }
    if ((item.ordered === null) !== (first.ordered === null)) break;
    nested = null;
    current = el("li", {}, inline(item.text, message, 0));
    top.append(current);
  }
  out.push(top);
  return i - 1;
}

function listNode(item) {
  if (item.ordered === null) return el("ul", {});
  return el("ol", { start: item.start !== 1 ? String(item.start) : null });
}

// A fence opening at lines[i]: at the line's start (CommonMark's), or after
// text on the same line when a closing fence follows ("look: ```js").
// An opening with nothing after it at all is text, never an empty block.
// `reach()`: fenceReach of the lines, to tell whether a closing fence follows.
function openingFence(lines, i, reach) {
  const line = lines[i];
  const start = /^ {0,3}(`{3,}|~{3,})(.*)$/s.exec(line);
  let before = "";
  let run;
  let rest;
  if (start && !(start[1][0] === "`" && start[2].includes("`"))) {
    [, run, rest] = start;
  } else {
    const mid = midFence(line);
    if (!mid) return null;
    ({ before, run, rest } = mid);
  }
  const closing = new RegExp(`^ {0,3}\\${run[0]}{${run.length},}\\s*$`);
  const closed = reach()[run[0]][i + 1] >= run.length;
  if (!closed && (before || (i + 1 >= lines.length && !rest.trim()))) return null;
  const info = rest.trim();
  const word = /^[\w+#.-]*$/.test(info);
  // After text, what follows the fence is a language only when it is one word.
  const lang = word ? info : before ? "" : info.split(/\s/)[0];
  const first = word || !before ? null : rest;
  return { before, lang, first, closing };
}

// The last run of three or more backticks (or tildes) on a line after some
// text, when nothing after it is a backtick or tilde.
function midFence(line) {
  for (const char of ["`", "~"]) {
    const at = line.lastIndexOf(char.repeat(3));
    if (at < 0) continue;
    let from = at;
    while (from > 0 && line[from - 1] === char) from--;
    const to = at + 3;
    const rest = line.slice(to);
    if (rest.includes("`") || rest.includes("~")) continue;
    const before = line.slice(0, from).trimEnd();
    if (before.trim()) return { before, run: line.slice(from, to), rest };
  }
  return null;
}

// For each fence character, the longest bare fence line at or after each
// index: one pass, so a message of many fences costs no more than its length.
function fenceReach(lines) {
  const reach = { "`": new Array(lines.length + 1).fill(0), "~": new Array(lines.length + 1).fill(0) };
  for (let k = lines.length - 1; k >= 0; k--) {
    reach["`"][k] = reach["`"][k + 1];
    reach["~"][k] = reach["~"][k + 1];
    const bare = /^ {0,3}(`{3,}|~{3,})\s*$/.exec(lines[k]);
    if (bare) reach[bare[1][0]][k] = Math.max(reach[bare[1][0]][k], bare[1].length);
  }
  return reach;
}

function safeUrl(raw) {
  let url;
  try {
    url = new URL(raw);
  } catch {
    return null;
  }
  return SAFE_PROTOCOLS.has(url.protocol) ? url.href : null;
}

function linkNode(href, children) {
  return el("a", { href, target: "_blank", rel: "noopener noreferrer" }, children);
}

function mentionNode(handle, message) {
  const lower = handle.toLowerCase();
  const live = message && (message.mentions || []).map((h) => h.toLowerCase()).includes(lower);
  if (!live) return null;
  const mine = state.me && state.me.handle.toLowerCase() === lower;
  return el("span", { class: "mention" + (mine ? " me" : ""), "data-handle": lower }, "@" + handle);
}

function inline(text, message, depth) {
  const out = [];
  let buf = "";
  const flush = () => {
    if (buf) out.push(document.createTextNode(buf));
    buf = "";
  };
  let i = 0;
  while (i < text.length) {
    const ch = text[i];
    const prev = i > 0 ? text[i - 1] : "";
    const rest = text.slice(i);
    if (ch === "`") {
      const run = /^`+/.exec(rest)[0];
      const after = text.slice(i + run.length);
      const end = closingRun(after, run.length);
      if (end >= 0) {
        flush();
        out.push(el("code", {}, document.createTextNode(after.slice(0, end))));
        i += run.length + end + run.length;
        continue;
      }
      buf += run;
      i += run.length;
      continue;
    }
    if ((ch === "_" && rest.startsWith("__")) || rest.startsWith("***")) {
      // Runs like `__init__` or `***` stay literal: only **bold**, *em* and _em_ are markup.
      const run = ch === "_" ? /^_+/.exec(rest)[0] : /^\*+/.exec(rest)[0];
      buf += run;
      i += run.length;
      continue;
    }
    if (depth < MAX_DEPTH && (ch === "*" || ch === "_")) {
      const strong = ch === "*" && rest.startsWith("**");
      const marker = strong ? "**" : ch;
      const wordy = ch === "_" && /[A-Za-z0-9]/.test(prev);
      const start = i + marker.length;
      const end = wordy ? -1 : text.indexOf(marker, start + 1);
      const inner = end > 0 ? text.slice(start, end) : "";
      const closesWordy = ch === "_" && /[A-Za-z0-9]/.test(text[end + 1] || "");
      const edgy = inner.startsWith(ch) || inner.endsWith(ch) || text[end + marker.length] === ch;
      if (inner && !edgy && !/^\s|\s$/.test(inner) && !inner.includes("\n\n") && !closesWordy) {
        flush();
        out.push(el(strong ? "strong" : "em", {}, inline(inner, message, depth + 1)));
        i = end + marker.length;
        continue;
      }
    }
    if (ch === "[") {
      const link = /^\[([^\]\n]{1,500})\]\(([^()\s]{1,2000})\)/.exec(rest);
      const href = link && safeUrl(link[2]);
      if (href) {
        flush();
        out.push(linkNode(href, inline(link[1], message, MAX_DEPTH)));
        i += link[0].length;
        continue;
      }
    }
    if ((ch === "h" || ch === "m") && !/[A-Za-z0-9]/.test(prev)) {
      const bare = /^(?:https?:\/\/|mailto:)[^\s<>"]+/.exec(rest);
      if (bare) {
        const raw = bare[0].replace(/[.,;:!?)'\]]+$/, "");
        const href = safeUrl(raw);
        if (href) {
          flush();
          out.push(linkNode(href, raw));
          i += raw.length;
          continue;
        }
      }
    }
    if (ch === "@" && !NOT_BEFORE_MENTION.test(prev)) {
      const token = /^@([A-Za-z0-9][A-Za-z0-9_.-]*)/.exec(rest);
      if (token) {
        const handle = token[1].replace(/[.-]+$/, "");
        const node = mentionNode(handle, message);
        if (node) {
          flush();
          out.push(node);
          i += 1 + handle.length;
          continue;
        }
      }
    }
    buf += ch;
    i += 1;
  }
  flush();
  return out;
}

// Where the next run of exactly `length` backticks starts in `text`, or -1.
// Scanned, not a RegExp: a run of thousands of backticks makes a pattern too
// large to compile.
function closingRun(text, length) {
  let at = text.indexOf("`");
  while (at >= 0) {
    let end = at;
    while (end < text.length && text[end] === "`") end++;
    if (end - at === length) return at;
    at = text.indexOf("`", end);
  }
  return -1;
}

export function mentionsMe(message) {
  if (!state.me || !message) return false;
  const mine = state.me.handle.toLowerCase();
  return (message.mentions || []).some((h) => h.toLowerCase() === mine);
}
