// Attachments: previews and downloads (fetched with the bearer token as blob:
// URLs), uploads with progress, and each composer's quote and upload chips.

import { state } from "../store.js";
import { $, el, show } from "../dom.js";
import { randomId } from "../format.js";
import { noteError } from "./conversation.js";

const PREVIEW_TYPES = /^image\/(png|jpeg|gif|webp|avif|bmp)$/i;

function formatSize(bytes) {
  if (typeof bytes !== "number") return "";
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KB`;
  return `${(bytes / 1024 / 1024).toFixed(1)} MB`;
}

function blobUrl(attachment) {
  // <img> and <a> cannot send the bearer token: fetch the bytes, hand out a blob: URL.
  if (!state.blobs.has(attachment.id)) {
    const url = attachment.url || `/v1/attachments/${encodeURIComponent(attachment.id)}`;
    const loading = fetch(url, { headers: { Authorization: "Bearer " + state.token }, cache: "no-store" })
      .then((response) => {
        if (!response.ok) throw new Error(response.status === 404 ? "the file is gone" : `download failed (${response.status})`);
        return response.blob();
      })
      .then((blob) => {
        const href = URL.createObjectURL(blob);
        state.blobUrls.set(attachment.id, href);
        return href;
      })
      .catch((err) => {
        state.blobs.delete(attachment.id);
        throw err;
      });
    state.blobs.set(attachment.id, loading);
  }
  return state.blobs.get(attachment.id);
}

async function downloadAttachment(attachment, event) {
  event.preventDefault();
  try {
    const href = await blobUrl(attachment);
    const link = el("a", { href, download: attachment.name || "file", hidden: true });
    document.body.append(link);
    link.click();
    link.remove();
  } catch (err) {
    noteError(`Could not download ${attachment.name}: ${err.message || err}`);
  }
}

// A new tab cannot send the bearer token: it opens a signed link the node
// issues for a minute (POST …/link). The link is fetched ahead when the pointer
// or focus reaches it, so the browser's own "Open link in new tab" works too.
const LINK_FRESH_MS = 40_000;

async function signedLink(attachment) {
  const known = state.links.get(attachment.id);
  if (known && Date.now() - known.at < LINK_FRESH_MS) return known.url;
  const base = attachment.url || `/v1/attachments/${encodeURIComponent(attachment.id)}`;
  const response = await fetch(base + "/link", {
    method: "POST",
    headers: { Authorization: "Bearer " + state.token },
    cache: "no-store",
  });
  if (!response.ok) throw new Error(response.status === 404 ? "the file is gone" : `no link (${response.status})`);
  const { url } = await response.json();
  state.links.set(attachment.id, { url, at: Date.now() });
  return url;
}

function openLink(attachment) {
  const link = el("a", { href: attachment.url || "#", target: "_blank", rel: "noopener noreferrer" }, `Open ${attachment.name}`);
  const refresh = () =>
    signedLink(attachment).then(
      (url) => link.setAttribute("href", url),
      () => {},
    );
  link.addEventListener("pointerenter", refresh);
  link.addEventListener("focus", refresh);
  link.addEventListener("click", async (event) => {
    event.preventDefault();
    // Opened at once, while the click still counts as the user's: a tab opened
    // after the fetch could be taken for a popup.
    const tab = window.open("about:blank", "_blank");
    if (tab) tab.opener = null;
    try {
      const url = await signedLink(attachment);
      if (tab) tab.location.replace(url);
      else window.open(url, "_blank", "noopener");
    } catch (err) {
      tab?.close();
      noteError(`Could not open ${attachment.name}: ${err.message || err}`);
    }
  });
  return link;
}

export function attachmentsNode(message) {
  const list = message.attachments || [];
  if (!list.length) return null;
  return el(
    "div",
    { class: "attachments", role: "group", "aria-label": "Attachments" },
    list.map((attachment) => {
      let preview = null;
      if (PREVIEW_TYPES.test(attachment.contentType || "")) {
        preview = el("img", { class: "preview", alt: attachment.name || "image", width: 288, height: 192 });
        const ready = state.blobUrls.get(attachment.id);
        if (ready) preview.src = ready;
        else {
          const img = preview;
          blobUrl(attachment).then(
            (href) => {
              img.src = href;
            },
            () => {
              img.alt = `${attachment.name} (preview unavailable)`;
            },
          );
        }
      }
      return el(
        "div",
        { class: "attachment" },
        preview,
        el(
          "span",
          { class: "file" },
          el(
            "a",
            { href: attachment.url || "#", onclick: (event) => downloadAttachment(attachment, event) },
            `Download ${attachment.name}`,
          ),
          " ",
          openLink(attachment),
          el("span", { class: "muted small" }, formatSize(attachment.size)),
        ),
      );
    }),
  );
}

export function uploadFiles(which, files) {
  const composer = state.composers[which];
  for (const file of files) {
    const upload = { key: randomId(), name: file.name || "file", size: file.size, progress: 0, attachmentId: null, error: "", xhr: null };
    composer.uploads.push(upload);
    const xhr = new XMLHttpRequest();
    upload.xhr = xhr;
    xhr.open("POST", "/v1/attachments?name=" + encodeURIComponent(upload.name));
    xhr.setRequestHeader("Authorization", "Bearer " + state.token);
    xhr.setRequestHeader("Content-Type", file.type || "application/octet-stream");
    xhr.upload.addEventListener("progress", (event) => {
      if (!event.lengthComputable) return;
      upload.progress = event.loaded / event.total;
      renderExtras(which);
    });
    xhr.addEventListener("load", () => {
      let body = {};
      try {
        body = JSON.parse(xhr.responseText || "{}");
      } catch {
        body = {};
      }
      if (xhr.status === 200 || xhr.status === 201) {
        upload.attachmentId = body.attachmentId;
        upload.progress = 1;
      } else if (xhr.status === 413) upload.error = "too large";
      else upload.error = body.message || `upload failed (${xhr.status})`;
      upload.xhr = null;
      renderExtras(which);
    });
    xhr.addEventListener("error", () => {
      upload.error = "upload failed";
      upload.xhr = null;
      renderExtras(which);
    });
    xhr.send(file);
  }
  renderExtras(which);
}

function removeUpload(which, upload) {
  upload.xhr?.abort();
  const composer = state.composers[which];
  composer.uploads = composer.uploads.filter((other) => other !== upload);
  renderExtras(which);
}

export function renderExtras(which) {
  const composer = state.composers[which];
  const box = $(which === "main" ? "composer-extras" : "thread-extras");
  const chips = [];
  if (composer.quote) {
    const quoted = composer.quote;
    chips.push(
      el(
        "div",
        { class: "chip quote", role: "group", "aria-label": "Quoting" },
        el("span", { class: "excerpt" }, `Quoting ${quoted.author?.displayName || quoted.author?.handle || "?"}: ${(quoted.content || "").replace(/\s+/g, " ").slice(0, 80)}`),
        el(
          "button",
          {
            type: "button",
            class: "link",
            "aria-label": "Cancel quote",
            onclick: () => {
              composer.quote = null;
              renderExtras(which);
            },
          },
          "✕",
        ),
      ),
    );
  }
  for (const upload of composer.uploads) {
    const percent = Math.round(upload.progress * 100);
    chips.push(
      el(
        "div",
        { class: "chip upload" + (upload.error ? " failed" : "") },
        el("span", { class: "excerpt" }, upload.name),
        upload.error
          ? el("span", {}, upload.error)
          : upload.attachmentId
            ? el("span", { class: "muted small" }, `${formatSize(upload.size)} · ready`)
            : [
                el("progress", { max: 100, value: percent, "aria-label": `Uploading ${upload.name}` }),
                el("span", { class: "muted small" }, `${percent}%`),
              ],
        el(
          "button",
          { type: "button", class: "link", "aria-label": `Remove ${upload.name}`, onclick: () => removeUpload(which, upload) },
          "✕",
        ),
      ),
    );
  }
  box.replaceChildren(...chips);
  show(box, chips.length > 0);
}

export function takeComposer(which) {
  // What a send carries besides its text; null while an upload is still running.
  const composer = state.composers[which];
  if (composer.uploads.some((u) => !u.attachmentId && !u.error)) return null;
  const extra = {};
  const ready = composer.uploads.filter((u) => u.attachmentId);
  if (ready.length) {
    extra.attachmentIds = ready.map((u) => u.attachmentId);
    extra.uploads = ready.map((u) => ({ name: u.name, size: u.size, attachmentId: u.attachmentId }));
  }
  if (composer.quote) extra.forward = { mode: "quote", sources: [{ messageId: composer.quote.id }] };
  return extra;
}

export function clearComposer(which) {
  state.composers[which] = { quote: null, uploads: [] };
  renderExtras(which);
}

export function wireDropZone(zone, which) {
  const hint = $("drop-hint");
  const hasFiles = (event) => [...(event.dataTransfer?.types || [])].includes("Files");
  zone.addEventListener("dragover", (event) => {
    if (!hasFiles(event) || (which === "main" && !state.current)) return;
    event.preventDefault();
    if (which === "main") show(hint, true);
  });
  zone.addEventListener("dragleave", (event) => {
    if (!zone.contains(event.relatedTarget)) show(hint, false);
  });
  zone.addEventListener("drop", (event) => {
    show(hint, false);
    if (!hasFiles(event)) return;
    event.preventDefault();
    event.stopPropagation();
    if (which === "main" && !state.current) return;
    uploadFiles(which, event.dataTransfer.files);
  });
}
