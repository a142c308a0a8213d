// The safe Markdown renderer: message text in, a DocumentFragment of elements
// and text nodes out. No HTML is ever parsed; only http(s) and mailto links.

import { state } from "./store.js";
import { el } from "./dom.js";

const SAFE_PROTOCOLS = new Set(["http:", "https:", "mailto:"]);

// A deliberately small Markdown subset: fenced code, quotes, paragraphs;
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
  const flush = () => {
    if (para.length) out.push(el("p", {}, inline(para.join("\n"), message, 0)));
    para = [];
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = /^ {0,3}(`{3,}|~{3,})(.*)$/.exec(line);
    if (fence && !(fence[1][0] === "`" && fence[2].includes("`"))) {
      flush();
      const char = fence[1][0];
      const closing = new RegExp(`^ {0,3}\\${char}{${fence[1].length},}\\s*$`);
      const body = [];
      i++;
      while (i < lines.length && !closing.test(lines[i])) body.push(lines[i++]);
      const lang = fence[2].trim().split(/\s/)[0];
      out.push(
        el("pre", { "data-lang": lang || null }, el("code", {}, document.createTextNode(body.join("\n")))),
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
    if (!line.trim()) {
      flush();
      continue;
    }
    para.push(line);
  }
  flush();
  return out;
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
      const close = new RegExp(`(^|[^\`])${run}(?!\`)`).exec(after);
      if (close) {
        const end = close.index + close[1].length;
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

export function mentionsMe(message) {
  if (!state.me || !message) return false;
  const mine = state.me.handle.toLowerCase();
  return (message.mentions || []).some((h) => h.toLowerCase() === mine);
}
