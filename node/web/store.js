// The client's state: one mutable object every module reads and patches, the
// localStorage keys it survives a reload with, and the few helpers that
// persist parts of it (outbox, thread labels) or record how far a scope was seen.

export const STORAGE_TOKEN = "scopenode.token";
export const STORAGE_WORKSPACE = "scopenode.workspace";
export const STORAGE_SCOPE = "scopenode.scope";
const STORAGE_THREADS = "scopenode.threads";
export const STORAGE_OUTBOX = "scopenode.outbox";
export const PAGE = 50;
// Reading back asks for more at a time: each page re-renders the whole log.
export const OLDER_PAGE = 100;

export const state = {
  token: "",
  workspace: "",
  ws: null,
  wantOnline: false,
  attempt: 0,
  reconnectTimer: null,
  reconnectAt: 0,
  countdownTimer: null,
  pingTimer: null,
  nextId: 1,
  pending: new Map(), // request id -> {resolve, reject, op}
  me: null,
  admin: false, // the welcome said so: the Admin button shows (the node checks every admin op)
  scopes: new Map(), // scopeId -> scope summary from `scopes`
  lastSeen: new Map(), // scopeId -> highest seq observed (for hello.resume)
  current: null, // scopeId open in the main view
  view: null, // {scopeId, messages: Map(seq -> message), hasMore, olderBefore, loading, unreadAfter}
  readSent: new Map(), // scopeId -> seq last sent with markRead
  panel: null, // {kind: "members"} | {kind: "thread", ...}
  pane: "list", // what a phone shows: "list" | "conversation" | "panel"
  scopesRefresh: null,
  threads: loadJson(STORAGE_THREADS, {}), // thread scopeId -> {label, rootId, parentId}
  replyCounts: new Map(), // root message id -> replies seen by this client
  dmPeers: new Map(), // dm scopeId -> member view of the other participant
  people: new Map(), // memberId -> member view (from `people`, else from rosters)
  outbox: loadJson(STORAGE_OUTBOX, []), // queued sends, resent with the same clientMessageId
  flushing: false,
  unsupported: new Set(), // ops this node answered as unknown
  owners: new Map(), // channel scopeId -> channelOwnerId (from `members`)
  pickerFor: null, // "<where>:<messageId>" whose emoji picker is open
  editing: null, // {key, messageId, draft, error, saving}
  sources: new Map(), // cited messageId -> {status: "loading" | "ok" | "gone", message}
  resolving: new Set(), // message ids whose pending sources are being read
  blobs: new Map(), // attachment id -> Promise of a blob: URL (fetched with the bearer token)
  blobUrls: new Map(), // attachment id -> blob: URL once fetched
  links: new Map(), // attachment id -> {url, at}: a signed download link and when it came
  composers: { main: { quote: null, uploads: [] }, thread: { quote: null, uploads: [] } },
};

function loadJson(key, fallback) {
  try {
    return JSON.parse(localStorage.getItem(key) || "null") ?? fallback;
  } catch {
    return fallback;
  }
}

export function saveOutbox() {
  localStorage.setItem(STORAGE_OUTBOX, JSON.stringify(state.outbox));
}

export function rememberThread(scopeId, root, parentId) {
  if (!scopeId || !root) return;
  const parent = state.scopes.get(parentId || root.scopeId);
  const excerpt = (root.content || "").replace(/\s+/g, " ").slice(0, 40);
  const where = parent?.slug ? `#${parent.slug}` : "thread";
  state.threads[scopeId] = { label: `${where}: ${excerpt}`, rootId: root.id, parentId: root.scopeId };
  localStorage.setItem(STORAGE_THREADS, JSON.stringify(state.threads));
}

export function observe(scopeId, seq) {
  if (typeof seq !== "number") return;
  if (seq > (state.lastSeen.get(scopeId) ?? -1)) state.lastSeen.set(scopeId, seq);
}
