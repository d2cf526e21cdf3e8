// Turnpike's web console: one module, no dependencies, no build step. Everything it shows comes
// from the API under /v1 on this origin; rows are read from the record by cursor, the
// WebSocket only says when to read (and carries advisory streamed text).
//
// Safety: text from the API is only ever put into the page with textContent, never as HTML.

const $ = (id) => document.getElementById(id);
const TOKEN_KEY = "turnpike.token";
const MAX_ATTACHMENT = 8 * 1024 * 1024;
const ATTACHABLE = ["image/png", "image/jpeg", "image/gif", "image/webp", "application/pdf", "text/plain"];
const REFERENCE = /conv:(?:fi|at|gi):conv_[0-9A-HJKMNP-TV-Z]{26}\/turn_[0-9]+\/[A-Za-z0-9._~%\/-]+[A-Za-z0-9_~%-]/g;
// Rows kept out of sight: bookkeeping, not conversation (still in the page, in order).
const BOOKKEEPING = new Set(["turn_dispatched", "usage", "recall", "ingress_directive", "conversation_opened"]);

const state = {
  token: null,
  me: null,
  apps: [],
  listBefore: null,
  conv: null, // the open conversation's view
  gen: 0, // bumps when another conversation opens: stale work stops
};

// ---------- the API ----------

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

async function api(method, path, body, extra = {}) {
  const headers = { Authorization: `Bearer ${state.token}` };
  let payload;
  if (body instanceof FormData) {
    payload = body;
  } else if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    payload = JSON.stringify(body);
  }
  if (extra.idempotent) headers["Idempotency-Key"] = crypto.randomUUID();
  let response;
  try {
    response = await fetch(path, { method, headers, body: payload });
  } catch (e) {
    throw new ApiError(0, "offline", "The server cannot be reached.");
  }
  if (response.status === 401 && path !== "/v1/me") {
    signOut("Your session ended: sign in again.");
    throw new ApiError(401, "unauthorized", "Sign in again.");
  }
  const text = await response.text();
  let json = null;
  try {
    json = text ? JSON.parse(text) : null;
  } catch (e) {
    json = null;
  }
  if (!response.ok) {
    const message = (json && json.message) || text || `HTTP ${response.status}`;
    throw new ApiError(response.status, (json && json.code) || "error", message);
  }
  return json;
}

const conversationPath = (id, rest = "") => `/v1/conversations/${encodeURIComponent(id)}${rest}`;

// ---------- small DOM helpers ----------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(node.dataset, v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c);
  return node;
}

function show(id, on = true) {
  $(id).hidden = !on;
}

function say(id, text) {
  $(id).textContent = text || "";
}

function when(ms) {
  if (!ms) return "";
  return new Date(ms).toLocaleString();
}

function bytes(n) {
  if (n >= 1024 * 1024) return `${(n / 1024 / 1024).toFixed(1)} MiB`;
  if (n >= 1024) return `${(n / 1024).toFixed(1)} KiB`;
  return `${n} B`;
}

/// Text with the file references in it turned into download links.
function linked(text) {
  const span = el("span", { class: "text" });
  let last = 0;
  for (const m of String(text).matchAll(REFERENCE)) {
    span.append(text.slice(last, m.index));
    span.append(fileLink(m[0]));
    last = m.index + m[0].length;
  }
  span.append(String(text).slice(last));
  return span;
}

function fileLink(reference, label) {
  const last = reference.split("/").pop();
  let name = last;
  try {
    name = decodeURIComponent(last);
  } catch (e) {
    // Not valid percent-encoding: show it as it is.
  }
  return el("a", {
    href: "#",
    class: "file-link",
    dataset: { reference },
    text: label || name,
    onclick: (e) => {
      e.preventDefault();
      download(reference);
    },
  });
}

/// Downloads a file through a short-lived signed link (no token in the URL).
async function download(reference) {
  try {
    const link = await api("POST", "/v1/files/links", { reference, ttl_seconds: 120 });
    const a = el("a", { href: link.url, download: "" });
    document.body.append(a);
    a.click();
    a.remove();
  } catch (e) {
    flash(e.message);
  }
}

function flash(message) {
  const target = state.conv ? "send-error" : "signin-error";
  say(target, message);
}

// ---------- signing in ----------

async function signIn(token) {
  state.token = token;
  try {
    state.me = await api("GET", "/v1/me");
  } catch (e) {
    state.token = null;
    throw e;
  }
  sessionStorage.setItem(TOKEN_KEY, token);
  say("whoami", `${state.me.identity} · ${state.me.tenant}${state.me.admin ? " · admin" : ""}`);
  show("whoami");
  show("signout");
  show("signin", false);
  show("app");
  const apps = await api("GET", "/v1/apps");
  state.apps = apps.apps;
  fillApps();
  await loadConversations(true);
  route();
}

/// Leaves the open conversation: its stream, retries and pending reads stop, its rows go.
function leaveConversation() {
  closeStream();
  state.gen += 1;
  state.conv = null;
  chat.id = null;
  chat.rows = new Map();
  $("transcript").replaceChildren();
  markCurrent();
}

function signOut(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  leaveConversation();
  state.token = null;
  state.me = null;
  show("app", false);
  show("whoami", false);
  show("signout", false);
  show("signin");
  say("signin-error", message || "");
  $("token").focus();
}

$("signin-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  say("signin-error", "");
  try {
    await signIn($("token").value.trim());
    $("token").value = "";
  } catch (err) {
    say("signin-error", err.status === 401 ? "That token is not valid." : err.message);
  }
});
$("signout").addEventListener("click", () => signOut());

// ---------- the conversation list ----------

async function loadConversations(fresh) {
  if (fresh) {
    state.listBefore = null;
    $("conversations").replaceChildren();
  }
  const query = new URLSearchParams({ limit: "20" });
  if (state.listBefore) query.set("before", state.listBefore);
  const page = await api("GET", `/v1/conversations?${query}`);
  for (const c of page.conversations) $("conversations").append(conversationItem(c));
  state.listBefore = page.next_before || null;
  show("more-conversations", !!page.next_before);
  markCurrent();
}

function conversationItem(c) {
  return el(
    "li",
    { dataset: { id: c.id } },
    el(
      "a",
      { href: `#/c/${c.id}` },
      el("span", { class: "pill", dataset: { status: c.status }, text: c.status.replace("_", " ") }),
      " ",
      el("strong", { text: `${c.app} · ${c.agent}` }),
      c.started_by ? el("span", { class: "session", text: ` session (${c.started_by.kind})` }) : "",
      el("span", { class: "meta", text: `last active ${when(c.active_ms)}` }),
    ),
  );
}

function markCurrent() {
  for (const a of $("conversations").querySelectorAll("a")) {
    const current = state.conv && a.closest("li").dataset.id === state.conv.id;
    if (current) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
}

function refreshListItem(view) {
  const li = $("conversations").querySelector(`li[data-id="${view.id}"]`);
  if (li) li.replaceWith(conversationItem(view));
  else $("conversations").prepend(conversationItem(view));
  markCurrent();
}

$("more-conversations").addEventListener("click", () => loadConversations(false).catch((e) => flash(e.message)));

// ---------- new chat ----------

function fillApps() {
  const apps = $("new-app");
  apps.replaceChildren(...state.apps.map((a) => el("option", { value: a.id, text: a.id })));
  $("search-app").replaceChildren(
    el("option", { value: "", text: "any" }),
    ...state.apps.map((a) => el("option", { value: a.id, text: a.id })),
  );
  fillAgents();
}

function fillAgents() {
  const app = state.apps.find((a) => a.id === $("new-app").value);
  $("new-agent").replaceChildren(...(app ? app.agents : []).map((a) => el("option", { value: a.id, text: a.id })));
  aboutAgent();
}

/// What the chosen agent is for, and where other agents reach it (its A2A card).
function aboutAgent() {
  const app = state.apps.find((a) => a.id === $("new-app").value);
  const agent = app && app.agents.find((a) => a.id === $("new-agent").value);
  if (!agent) {
    $("new-agent-about").replaceChildren();
    return;
  }
  const card = `${location.origin}/a2a/${app.id}/${agent.id}/.well-known/agent-card.json`;
  $("new-agent-about").replaceChildren(
    ...(agent.description ? [el("span", { text: agent.description }), el("br")] : []),
    el("span", { text: "A2A: " }),
    el("code", { class: "a2a-card", text: card }),
  );
}

$("new-app").addEventListener("change", fillAgents);
$("new-agent").addEventListener("change", aboutAgent);
$("new-chat").addEventListener("click", () => {
  say("new-error", "");
  $("new-dialog").showModal();
  $("new-app").focus();
});
$("new-cancel").addEventListener("click", () => $("new-dialog").close());
$("new-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const body = { app: $("new-app").value, agent: $("new-agent").value };
  const instructions = $("new-instructions").value.trim();
  if (instructions) body.instructions = instructions;
  try {
    const view = await api("POST", "/v1/conversations", body);
    $("new-dialog").close();
    $("new-instructions").value = "";
    refreshListItem(view);
    location.hash = `#/c/${view.id}`;
  } catch (err) {
    say("new-error", err.message);
  }
});

// ---------- schedules ----------

// The caller's schedules: when each fires, its next firing, its latest firings with their
// outcomes (a fired one links to the session it started or fed).
async function loadSchedules() {
  say("schedules-status", "Loading…");
  const list = await api("GET", "/v1/schedules");
  const rows = list.schedules.map((s) => {
    const timing = s.cron ? `${s.cron} (${s.zone})` : `every ${s.every_seconds} s`;
    const firings = el("ul", { class: "firings" });
    for (const f of s.firings.slice(0, 5)) {
      const label = `${when(f.fire_ms)} ${f.outcome}`;
      firings.append(
        el(
          "li",
          {},
          f.conversation ? el("a", { href: `#/c/${f.conversation}`, text: label }) : label,
          f.reason ? el("span", { class: "meta", text: ` ${f.reason}` }) : "",
        ),
      );
    }
    return el(
      "tr",
      { dataset: { id: s.id } },
      el("td", {}, el("strong", { text: `${s.app} · ${s.agent}` }), el("span", { class: "meta", text: ` ${s.text}` })),
      el("td", { text: timing }),
      el("td", { text: s.next_ms ? when(s.next_ms) : "–" }),
      el("td", {}, firings),
      el("td", { text: s.paused ? "paused" : "active" }),
    );
  });
  $("schedules").querySelector("tbody").replaceChildren(...rows);
  say("schedules-status", rows.length ? "" : "No schedules yet: create one with turnpike schedule create or POST /v1/schedules.");
}

// ---------- routing ----------

function route() {
  if (!state.token) return;
  const hash = location.hash.slice(1) || "/";
  const [path, query] = hash.split("?");
  const params = new URLSearchParams(query || "");
  const parts = path.split("/").filter(Boolean);
  for (const v of ["home", "search-view", "chat", "versions-view", "schedules-view"]) show(v, false);
  $("app").classList.remove("in-chat");
  if (parts[0] === "c" && parts[1]) {
    $("app").classList.add("in-chat");
    if (parts[2] === "versions") {
      show("versions-view");
      openVersions(parts[1]).catch((e) => say("versions-status", e.message));
    } else {
      show("chat");
      openConversation(parts[1], params).catch((e) => {
        // Opened again from scratch next time.
        chat.id = null;
        flash(e.message);
      });
    }
  } else if (parts[0] === "schedules") {
    leaveConversation();
    show("schedules-view");
    loadSchedules().catch((e) => say("schedules-status", e.message));
  } else if (parts[0] === "search") {
    show("search-view");
    runSearch(params).catch((e) => say("search-status", e.message));
  } else {
    leaveConversation();
    show("home");
  }
}

window.addEventListener("hashchange", route);
document.querySelector(".skip").addEventListener("click", (e) => {
  e.preventDefault();
  $("main").focus();
});
$("back").addEventListener("click", () => (location.hash = "#/"));

// ---------- a conversation ----------

const chat = {
  id: null,
  rows: new Map(), // seq → row
  cursor: 0, // the highest seq read
  oldest: null, // prev_before of the oldest page read (null: the beginning is shown)
  completed: new Set(), // turns with a turn_complete row
  streaming: new Map(), // turn → element
  pending: { approvals: [], questions: [] },
  pendingReads: 0, // reads of what is pending asked so far (only the latest one's answer counts)
  confirmSend: false,
  ws: null,
  retry: 500,
  retryTimer: null,
  catching: null,
  again: false,
};

async function openConversation(id, params) {
  if (chat.id !== id) {
    closeStream();
    state.gen += 1;
    Object.assign(chat, {
      id,
      rows: new Map(),
      cursor: 0,
      oldest: null,
      completed: new Set(),
      streaming: new Map(),
      pending: { approvals: [], questions: [] },
      confirmSend: false,
    });
    $("transcript").replaceChildren();
    for (const m of ["send-error", "attach-error", "agent-note"]) say(m, "");
    show("warning", false);
    show("admin-result", false);
    $("attachments").replaceChildren();
    const gen = state.gen;
    const view = await api("GET", conversationPath(id));
    if (gen !== state.gen) return;
    setConversation(view);
    const page = await api("GET", conversationPath(id, `/messages?before=${view.through + 1}&limit=100`));
    if (gen !== state.gen) return;
    addRows(page.rows);
    chat.cursor = Math.max(chat.cursor, page.rows.length ? page.rows[page.rows.length - 1].seq : 0);
    chat.oldest = page.prev_before || null;
    show("load-earlier", chat.oldest !== null);
    scrollToEnd();
    await catchUp();
    connect(gen);
    refreshPending();
    refreshMeter();
  }
  const turn = params.get("turn");
  if (turn) await reveal(turn, params.get("kind") || "completion");
}

function setConversation(view) {
  // Reads of the open conversation may answer out of order: an older view (through fewer rows)
  // than the one shown is stale.
  if (state.conv && state.conv.id === view.id && view.through < state.conv.through) return;
  state.conv = view;
  say("chat-title", `${view.app} · ${view.agent}`);
  showStatus(view.status);
  const app = state.apps.find((a) => a.id === view.app);
  $("agent-select").replaceChildren(
    ...(app ? app.agents : []).map((a) => el("option", { value: a.id, text: a.id, selected: a.id === view.agent })),
  );
  for (const id of ["verify", "replay"]) show(id, !!(state.me && state.me.admin));
  refreshListItem(view);
}

function showStatus(status) {
  const pill = $("status");
  pill.textContent = status.replace("_", " ");
  pill.dataset.status = status;
}

async function refreshConversation() {
  const gen = state.gen;
  const view = await api("GET", conversationPath(chat.id));
  if (gen === state.gen) setConversation(view);
}

/// Reads every row after the cursor (one reader at a time; a call during a read runs again
/// after it, so nothing announced is missed).
async function catchUp() {
  if (chat.catching) {
    chat.again = true;
    return chat.catching;
  }
  const gen = state.gen;
  chat.catching = (async () => {
    try {
      do {
        chat.again = false;
        for (;;) {
          const page = await api("GET", conversationPath(chat.id, `/messages?after=${chat.cursor}&limit=500`));
          if (gen !== state.gen) return;
          const added = addRows(page.rows);
          if (page.rows.length) chat.cursor = Math.max(chat.cursor, page.rows[page.rows.length - 1].seq);
          if (added.length) afterRows(added);
          if (!page.next_after) break;
          chat.cursor = Math.max(chat.cursor, page.next_after);
        }
      } while (chat.again);
    } finally {
      chat.catching = null;
    }
  })();
  return chat.catching;
}

function afterRows(added) {
  const box = $("transcript-box");
  const nearEnd = box.scrollHeight - box.scrollTop - box.clientHeight < 120;
  if (nearEnd) scrollToEnd();
  const kinds = new Set(added.map((r) => r.kind));
  if (["turn_dispatched", "turn_complete", "idle_closed", "reopened", "agent_switched", "cancelled"].some((k) => kinds.has(k))) {
    refreshConversation().catch(() => {});
  }
  if (["approval_request", "approval_resolved", "question_request", "question_response", "turn_complete", "turn_dispatched"].some((k) => kinds.has(k))) {
    refreshPending();
  }
  if (kinds.has("usage") || kinds.has("turn_complete")) refreshMeter();
}

function scrollToEnd() {
  const box = $("transcript-box");
  box.scrollTop = box.scrollHeight;
}

/// Puts rows into the transcript in seq order; a row already shown is skipped. Returns the
/// rows that were new.
function addRows(rows) {
  const added = [];
  const list = $("transcript");
  for (const row of rows) {
    if (chat.rows.has(row.seq)) continue;
    let node;
    try {
      node = renderRow(row);
    } catch (e) {
      // A row this console cannot draw is still shown, so nothing goes missing.
      node = el("li", { class: "row meta", dataset: { seq: String(row.seq), kind: row.kind } }, `${row.kind} (not shown: ${e.message})`);
    }
    chat.rows.set(row.seq, row);
    let before = null;
    for (let n = list.lastElementChild; n; n = n.previousElementSibling) {
      if (n.dataset.seq === undefined) continue;
      if (Number(n.dataset.seq) < row.seq) break;
      before = n;
    }
    if (before) list.insertBefore(node, before);
    else {
      // Streamed text stays last, below every committed row.
      const firstStreaming = list.querySelector(".streaming");
      if (firstStreaming) list.insertBefore(node, firstStreaming);
      else list.append(node);
    }
    added.push(row);
    effects(row);
  }
  return added;
}

function effects(row) {
  const turn = row.turn;
  if (row.kind === "turn_dispatched" && !chat.completed.has(turn)) streamingFor(turn, true);
  if (row.kind === "turn_complete") {
    chat.completed.add(turn);
    dropStreaming(turn);
    // A parked turn resumes under the same turn id: its rows are still to come.
    if (row.data.outcome === "parked") chat.completed.delete(turn);
  }
  if (row.kind === "assistant_message") dropStreaming(turn);
  if (row.kind === "approval_resolved") updateApprovalCard(row.data);
}

function streamingFor(turn, thinking) {
  let node = chat.streaming.get(turn);
  if (!node) {
    node = el(
      "li",
      { class: "row streaming", dataset: { turn } },
      el("span", { class: "label", text: `Assistant · ${turn}` }),
      el("span", { class: "thinking", text: "thinking…" }),
      el("span", { class: "text" }),
    );
    chat.streaming.set(turn, node);
    $("transcript").append(node);
  }
  node.querySelector(".thinking").hidden = !thinking;
  return node;
}

function dropStreaming(turn) {
  const node = chat.streaming.get(turn);
  if (node) node.remove();
  chat.streaming.delete(turn);
}

function onDelta(turn, text) {
  if (chat.completed.has(turn)) return;
  const node = streamingFor(turn, false);
  node.querySelector(".text").append(text);
  const box = $("transcript-box");
  if (box.scrollHeight - box.scrollTop - box.clientHeight < 160) scrollToEnd();
}

function lastDispatchedBefore(seq) {
  let best = null;
  for (const [s, r] of chat.rows) if (r.kind === "turn_dispatched" && s < seq && (!best || s > best.seq)) best = r;
  return best;
}

function renderRow(row) {
  const d = row.data || {};
  const event = d.event || {};
  const ev = event.body || {};
  const base = { dataset: { seq: String(row.seq), kind: row.kind } };
  const by = event.address && event.address.identity;
  const who = by && state.me && by !== state.me.identity ? by : "You";
  const label = (t) => el("span", { class: "label", text: t });
  const meta = (text, extra = "") => el("li", { ...base, class: `row meta ${extra}` }, text);
  switch (row.kind) {
    case "user_message":
      return el("li", { ...base, class: "row user" }, label(who), linked(row.text || ""));
    case "follow_up": {
      const t = lastDispatchedBefore(row.seq);
      const into = t ? ` · folded into ${t.turn}` : "";
      return el("li", { ...base, class: "row user followup" }, label(`${who} · follow-up${into}`), linked(row.text || ""));
    }
    case "steer":
      return el("li", { ...base, class: "row user" }, label(`${who} · steer`), linked(row.text || ""));
    case "stop":
      return meta(`${who} asked to stop${ev.reason ? `: ${ev.reason}` : ""}`);
    case "attachment":
      return el(
        "li",
        { ...base, class: "row user attachment-row" },
        label(`${who} · attachment`),
        fileLink(ev.reference, ev.name),
        ` (${ev.media_type}, ${bytes(ev.size || 0)})`,
        ev.preview ? el("span", { class: "note", text: ` ${ev.preview}` }) : null,
      );
    case "approval_response":
      return meta(`${who} ${ev.approve ? "approved" : "rejected"} ${ev.request_id}${ev.reason ? `: ${ev.reason}` : ""}`);
    case "question_response":
      return el("li", { ...base, class: "row user" }, label(`${who} · answer`), linked(row.text || ""));
    case "switch_agent":
      return meta(`${who} asked to switch to ${ev.agent}`);
    case "compact":
      return meta(`${who} asked to compact the context`);
    case "assistant_message":
      return el("li", { ...base, class: "row assistant" }, label(`Assistant · ${row.turn}`), linked(row.text || ""));
    case "tool_call":
      return el(
        "li",
        { ...base, class: "row meta tool" },
        el("details", {}, el("summary", { text: `${d.tool} called` }), el("pre", { text: JSON.stringify(d.arguments, null, 2) })),
      );
    case "tool_result": {
      const out = JSON.stringify(d.output, null, 2);
      return el(
        "li",
        { ...base, class: "row meta tool" },
        el("details", {}, el("summary", { text: d.ok ? "result" : "failed" }), el("pre", {}, linked(out))),
      );
    }
    case "approval_request":
      return approvalCard(row);
    case "approval_resolved":
      return meta(
        `${d.request_id} ${d.approved ? "approved" : "rejected"}${d.automatic ? " automatically" : ""}${d.by ? ` by ${d.by}` : ""}${d.reason ? `: ${d.reason}` : ""}${d.refused ? ` (refused: ${d.refused})` : ""}`,
      );
    case "question_request":
      return questionCard(row);
    case "turn_complete": {
      const outcome = d.outcome;
      const cls = outcome === "cancelled" ? "cancelled" : outcome === "failed" ? "failed" : "";
      return meta(`${row.turn} ${outcome}`, `${cls} turn-end`);
    }
    case "cancelled":
      return meta(`${row.turn} cancelled${d.reason ? `: ${d.reason}` : ""}`, "cancelled");
    case "error":
      return meta(`Error: ${d.message}`, "failed");
    case "turn_ambiguous":
      return meta(`${row.turn}: what its tools did is unknown; it was not run again`, "failed");
    case "lane_parked":
      return meta(`An event was quarantined: ${d.reason}`, "failed quarantined");
    case "compaction_marker":
      return meta("The context was compacted here");
    case "agent_switched":
      return meta(`Agent switched from ${d.from} to ${d.to}`);
    case "idle_closed":
      return meta("Closed as idle (a message reopens it)");
    case "reopened":
      return meta("Reopened");
    default:
      return meta(row.kind, BOOKKEEPING.has(row.kind) ? "bookkeeping" : "");
  }
}

// ---------- approvals and questions ----------

// A call that needs the user's own connection to a service (an MCP server of the app): the
// user pastes their token, it is stored sealed (never shown again), and the call resumes.
function connectionCard(row) {
  const d = row.data;
  const token = el("input", { type: "password", class: "token", "aria-label": `Your token for ${d.connection}`, placeholder: "Your token", autocomplete: "off" });
  const reason = el("input", { type: "text", class: "reason", "aria-label": "Reason for rejecting", placeholder: "Reason (optional)" });
  const busy = (on) => {
    for (const b of card.querySelectorAll("button, input")) b.disabled = on;
  };
  const connectNow = async () => {
    if (!token.value.trim()) return flash("Paste your token first.");
    busy(true);
    try {
      const app = encodeURIComponent(state.conv.app);
      await api("PUT", `/v1/connections/${app}/${encodeURIComponent(d.connection)}`, { token: token.value.trim() });
      token.value = "";
      card.querySelector(".state").textContent = "connected: the call resumes…";
    } catch (e) {
      busy(false);
      flash(e.message);
    }
  };
  const reject = async () => {
    const body = { tool: d.tool, arguments: d.arguments };
    if (reason.value.trim()) body.reason = reason.value.trim();
    busy(true);
    try {
      await api("POST", conversationPath(chat.id, `/approvals/${encodeURIComponent(d.request_id)}/reject`), body, { idempotent: true });
      card.querySelector(".state").textContent = "rejecting…";
    } catch (e) {
      busy(false);
      flash(e.message);
    }
  };
  const card = el(
    "li",
    { class: "row card approval-card connection-card", dataset: { seq: String(row.seq), kind: row.kind, request: d.request_id } },
    el("span", { class: "label", text: `Connection needed · ${row.turn}` }),
    el("span", {}, "The agent wants to call ", el("strong", { class: "tool", text: d.tool }), ", which needs your own connection to ", el("strong", { text: d.connection }), ":"),
    el("pre", { class: "arguments", text: JSON.stringify(d.arguments, null, 2) }),
    el(
      "div",
      { class: "actions" },
      token,
      el("button", { type: "button", class: "approve primary", text: "Connect", onclick: connectNow }),
      reason,
      el("button", { type: "button", class: "reject", text: "Reject", onclick: reject }),
      el("span", { class: "state", role: "status", text: "" }),
    ),
  );
  return card;
}

function approvalCard(row) {
  const d = row.data;
  if (d.connection) return connectionCard(row);
  const reason = el("input", { type: "text", class: "reason", "aria-label": "Reason for rejecting", placeholder: "Reason (optional)" });
  const answer = async (approve) => {
    const body = { tool: d.tool, arguments: d.arguments };
    if (!approve && reason.value.trim()) body.reason = reason.value.trim();
    for (const b of card.querySelectorAll("button, input")) b.disabled = true;
    try {
      await api("POST", conversationPath(chat.id, `/approvals/${encodeURIComponent(d.request_id)}/${approve ? "approve" : "reject"}`), body, { idempotent: true });
      card.querySelector(".state").textContent = approve ? "approving…" : "rejecting…";
    } catch (e) {
      for (const b of card.querySelectorAll("button, input")) b.disabled = false;
      flash(e.message);
    }
  };
  const card = el(
    "li",
    { class: "row card approval-card", dataset: { seq: String(row.seq), kind: row.kind, request: d.request_id } },
    el("span", { class: "label", text: `Approval needed · ${row.turn}` }),
    el("span", {}, "The agent wants to call ", el("strong", { class: "tool", text: d.tool }), " with:"),
    el("pre", { class: "arguments", text: JSON.stringify(d.arguments, null, 2) }),
    el(
      "div",
      { class: "actions" },
      el("button", { type: "button", class: "approve primary", text: "Approve", onclick: () => answer(true) }),
      reason,
      el("button", { type: "button", class: "reject", text: "Reject", onclick: () => answer(false) }),
      el("span", { class: "state", role: "status", text: "" }),
    ),
  );
  return card;
}

function updateApprovalCard(resolved) {
  const card = $("transcript").querySelector(`.approval-card[data-request="${resolved.request_id}"]`);
  if (!card || resolved.refused) return;
  let text = resolved.approved ? "Approved" : "Rejected";
  if (resolved.automatic) text += " automatically";
  if (resolved.by) text += ` by ${resolved.by}`;
  if (resolved.reason) text += `: ${resolved.reason}`;
  card.querySelector(".state").textContent = text;
  card.dataset.resolved = resolved.approved ? "approved" : "rejected";
  for (const b of card.querySelectorAll("button, input")) b.disabled = true;
}

function questionCard(row) {
  const d = row.data;
  const box = el("textarea", { class: "answer-text", rows: "2", "aria-label": `Answer to: ${d.question}` });
  const card = el(
    "li",
    { class: "row card question-card", dataset: { seq: String(row.seq), kind: row.kind, request: d.request_id } },
    el("span", { class: "label", text: `Question · ${row.turn}` }),
    el("span", { text: d.question }),
    el(
      "div",
      { class: "actions" },
      box,
      el("button", {
        type: "button",
        class: "answer",
        text: "Answer",
        onclick: async () => {
          if (!box.value.trim()) return;
          try {
            await api("POST", conversationPath(chat.id, `/questions/${encodeURIComponent(d.request_id)}/answer`), { answer: box.value }, { idempotent: true });
            for (const b of card.querySelectorAll("button, textarea")) b.disabled = true;
          } catch (e) {
            flash(e.message);
          }
        },
      }),
    ),
  );
  return card;
}

async function refreshPending() {
  const gen = state.gen;
  // Only the latest read counts: an earlier one answering last would show what was pending then.
  const asked = ++chat.pendingReads;
  try {
    const pending = await api("GET", conversationPath(chat.id, "/pending"));
    if (gen !== state.gen || asked !== chat.pendingReads) return;
    chat.pending = pending;
  } catch (e) {
    return;
  }
  const open = new Set([...chat.pending.approvals, ...chat.pending.questions].map((p) => p.request_id));
  for (const card of $("transcript").querySelectorAll(".card")) {
    const live = open.has(card.dataset.request);
    for (const b of card.querySelectorAll("button, input, textarea")) b.disabled = !live || card.dataset.resolved !== undefined;
    if (!live && !card.dataset.resolved && card.classList.contains("approval-card")) {
      const s = card.querySelector(".state");
      if (!s.textContent) s.textContent = "No longer pending";
    }
  }
  say("agent-note", chat.pending.approvals.length ? "Switching agents rejects the pending approvals." : "");
  if (!chat.pending.approvals.length) {
    chat.confirmSend = false;
    show("warning", false);
  }
}

// ---------- the live stream ----------

function setBadge(s) {
  const b = $("badge");
  b.dataset.state = s;
  b.textContent = s;
}

function closeStream() {
  clearTimeout(chat.retryTimer);
  chat.retryTimer = null;
  if (chat.ws) {
    const ws = chat.ws;
    chat.ws = null;
    ws.onclose = null;
    ws.close();
  }
  setBadge("offline");
}

async function connect(gen) {
  if (gen !== state.gen) return;
  setBadge("connecting");
  let ticket;
  try {
    ticket = await api("POST", conversationPath(chat.id, "/stream-tickets"));
  } catch (e) {
    if (gen !== state.gen) return;
    setBadge("offline");
    return reconnectLater(gen);
  }
  if (gen !== state.gen) return;
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const ws = new WebSocket(`${scheme}//${location.host}${conversationPath(chat.id, `/stream?ticket=${encodeURIComponent(ticket.ticket)}`)}`);
  chat.ws = ws;
  ws.onmessage = (m) => {
    let frame;
    try {
      frame = JSON.parse(m.data);
    } catch (e) {
      return;
    }
    if (frame.type === "ready") {
      chat.retry = 500;
      setBadge("live");
      catchUp().catch(() => {});
    } else if (frame.type === "rows") {
      if (frame.through > chat.cursor) catchUp().catch(() => {});
    } else if (frame.type === "delta") {
      onDelta(frame.turn, frame.text);
    } else if (frame.type === "closed") {
      flash(frame.reason);
    }
  };
  ws.onclose = (e) => {
    if (chat.ws !== ws) return;
    chat.ws = null;
    setBadge("offline");
    if (e.code === 4403) return; // access revoked: nothing to come back to
    reconnectLater(gen);
  };
}

function reconnectLater(gen) {
  clearTimeout(chat.retryTimer);
  const wait = chat.retry;
  chat.retry = Math.min(chat.retry * 2, 4000);
  chat.retryTimer = setTimeout(() => connect(gen), wait);
}

// ---------- paging backwards ----------

$("load-earlier").addEventListener("click", () => loadEarlier().catch((e) => flash(e.message)));

async function loadEarlier() {
  if (chat.oldest === null) return false;
  const box = $("transcript-box");
  const fromBottom = box.scrollHeight - box.scrollTop;
  const page = await api("GET", conversationPath(chat.id, `/messages?before=${chat.oldest}&limit=100`));
  const added = addRows(page.rows);
  chat.oldest = page.prev_before || null;
  if (added.some((r) => r.kind === "approval_request" || r.kind === "question_request")) refreshPending();
  show("load-earlier", chat.oldest !== null);
  // Keep what the reader was looking at where it was.
  box.scrollTop = box.scrollHeight - fromBottom;
  return true;
}

/// Shows the row a search hit points at: the prompt that started `turn`, or its reply.
async function reveal(turn, kind) {
  for (let i = 0; i < 200; i++) {
    const target = findRow(turn, kind);
    if (target) {
      for (const n of $("transcript").querySelectorAll(".marked")) n.classList.remove("marked");
      target.classList.add("marked");
      target.setAttribute("tabindex", "-1");
      target.scrollIntoView({ block: "center" });
      target.focus();
      return;
    }
    if (!(await loadEarlier())) return;
  }
}

function findRow(turn, kind) {
  const list = $("transcript");
  if (kind === "prompt") {
    const dispatched = [...chat.rows.values()].find((r) => r.kind === "turn_dispatched" && r.turn === turn);
    if (!dispatched) return null;
    let best = null;
    for (const r of chat.rows.values()) if (r.kind === "user_message" && r.seq < dispatched.seq && (!best || r.seq > best.seq)) best = r;
    return best ? list.querySelector(`li[data-seq="${best.seq}"]`) : null;
  }
  const wanted = kind === "attachment" ? "attachment" : "assistant_message";
  const row = [...chat.rows.values()].find((r) => r.kind === wanted && (r.turn === turn || wanted === "attachment"));
  return row ? list.querySelector(`li[data-seq="${row.seq}"]`) : null;
}

// ---------- sending ----------

function composerText() {
  return $("input").value;
}

async function submit(kind) {
  say("send-error", "");
  const text = composerText();
  if (kind !== "stop" && !text.trim()) return;
  if (kind === "send" && chat.pending.approvals.length && !chat.confirmSend) {
    chat.confirmSend = true;
    say("warning", "A tool call is waiting for your approval. Sending a message now rejects it. Press Send again to send anyway.");
    show("warning");
    return;
  }
  const running = state.conv && state.conv.status === "running";
  let path;
  let body = { text };
  if (kind === "send") path = running ? "/follow-ups" : "/messages";
  else if (kind === "steer") path = "/steer";
  else {
    path = "/stop";
    body = {};
  }
  try {
    await api("POST", conversationPath(chat.id, path), body, { idempotent: true });
    if (kind !== "stop") $("input").value = "";
    chat.confirmSend = false;
    show("warning", false);
    if (path === "/messages" && state.conv) {
      state.conv.status = "running";
      showStatus("running");
    }
  } catch (e) {
    say("send-error", e.message);
  }
}

$("send").addEventListener("click", () => submit("send"));
$("steer").addEventListener("click", () => submit("steer"));
$("stop").addEventListener("click", () => submit("stop"));
$("input").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    submit("send");
  }
});

// ---------- agent, meter, compaction ----------

$("agent-switch").addEventListener("click", async () => {
  const agent = $("agent-select").value;
  if (!state.conv || agent === state.conv.agent) return;
  try {
    await api("POST", conversationPath(chat.id, "/agent"), { agent }, { idempotent: true });
    say("agent-note", chat.pending.approvals.length ? "Switching: the pending approvals will be rejected." : "Switching…");
  } catch (e) {
    say("send-error", e.message);
  }
});

$("compact").addEventListener("click", async () => {
  try {
    await api("POST", conversationPath(chat.id, "/compact"), undefined, { idempotent: true });
  } catch (e) {
    say("send-error", e.message);
  }
});

async function refreshMeter() {
  if (!state.conv) return;
  const gen = state.gen;
  let usage;
  try {
    usage = await api("GET", conversationPath(chat.id, "/usage"));
  } catch (e) {
    return;
  }
  if (gen !== state.gen) return;
  const app = state.apps.find((a) => a.id === state.conv.app);
  const agent = app && app.agents.find((a) => a.id === state.conv.agent);
  const length = (agent && agent.context_length) || 0;
  const used = usage.last_input_tokens || 0;
  const meter = $("meter");
  meter.max = Math.max(length, 1);
  meter.value = Math.min(used, meter.max);
  const estimate = usage.estimated_calls ? "~" : "";
  say("meter-text", length ? `${estimate}${used.toLocaleString()} / ${length.toLocaleString()} tokens` : `${estimate}${used.toLocaleString()} tokens`);
}

// ---------- attachments ----------

function checkFile(file) {
  if (file.size > MAX_ATTACHMENT) return `${file.name} is ${bytes(file.size)}: attachments are at most 8 MiB.`;
  if (!ATTACHABLE.includes(file.type)) return `${file.name}: only images (PNG, JPEG, GIF, WebP), PDFs and plain text can be attached.`;
  return null;
}

async function attach(files) {
  say("attach-error", "");
  for (const file of files) {
    const why = checkFile(file);
    if (why) {
      say("attach-error", why);
      continue;
    }
    const chip = el("div", { class: "attachment", dataset: { name: file.name } });
    if (file.type.startsWith("image/")) {
      const url = URL.createObjectURL(file);
      chip.append(el("img", { src: url, alt: `Preview of ${file.name}`, class: "preview" }));
    } else {
      chip.append(el("span", { class: "preview", text: file.type === "application/pdf" ? "PDF" : "TXT" }));
    }
    const status = el("span", { class: "status", text: `${file.name} · uploading…` });
    chip.append(status);
    $("attachments").append(chip);
    const form = new FormData();
    form.append("file", file, file.name);
    try {
      await api("POST", conversationPath(chat.id, "/attachments"), form, { idempotent: true });
      status.textContent = `${file.name} · attached`;
      chip.dataset.state = "attached";
    } catch (e) {
      status.textContent = `${file.name} · not attached`;
      chip.dataset.state = "failed";
      say("attach-error", e.message);
    }
  }
}

$("attach-input").addEventListener("change", (e) => {
  attach([...e.target.files]);
  e.target.value = "";
});
$("attach-button").addEventListener("keydown", (e) => {
  if (e.key === "Enter" || e.key === " ") {
    e.preventDefault();
    $("attach-input").click();
  }
});
const drop = $("chat");
drop.addEventListener("dragover", (e) => {
  e.preventDefault();
  $("drop").classList.add("dragging");
});
drop.addEventListener("dragleave", () => $("drop").classList.remove("dragging"));
drop.addEventListener("drop", (e) => {
  e.preventDefault();
  $("drop").classList.remove("dragging");
  if (e.dataTransfer && e.dataTransfer.files.length) attach([...e.dataTransfer.files]);
});

// ---------- search ----------

$("search-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const q = new URLSearchParams({ q: $("search-q").value });
  if ($("search-kind").value) q.set("kinds", $("search-kind").value);
  if ($("search-app").value) q.set("app", $("search-app").value);
  location.hash = `#/search?${q}`;
});

async function runSearch(params) {
  leaveConversation();
  $("search-results").replaceChildren();
  say("search-status", "Searching…");
  const q = new URLSearchParams({ q: params.get("q") || "", limit: "20" });
  for (const k of ["kinds", "app"]) if (params.get(k)) q.set(k, params.get(k));
  const results = await api("GET", `/v1/search?${q}`);
  say("search-status", results.hits.length ? `${results.hits.length} found` : "Nothing found.");
  for (const h of results.hits) {
    const kind = h.kind === "prompt" ? "prompt" : h.kind === "attachment" ? "attachment" : "completion";
    $("search-results").append(
      el(
        "li",
        { dataset: { conversation: h.conversation } },
        el("a", { href: `#/c/${h.conversation}?turn=${h.turn}&kind=${kind}`, class: "hit" }, `${h.app} · ${h.agent} · ${h.turn} · ${h.kind}`),
        el("span", { class: "snippet", text: h.snippet }),
      ),
    );
  }
}

// ---------- project versions ----------

$("open-versions").addEventListener("click", () => (location.hash = `#/c/${chat.id}/versions`));
$("versions-back").addEventListener("click", () => (location.hash = `#/c/${state.versionsOf}`));

async function openVersions(id) {
  state.versionsOf = id;
  say("versions-status", "");
  $("version-files").replaceChildren();
  $("diff").replaceChildren();
  const list = await api("GET", conversationPath(id, "/versions"));
  const options = () => list.versions.map((v) => el("option", { value: v.turn, text: `${v.turn} · ${when(v.at_ms)}` }));
  $("version-turn").replaceChildren(...options());
  $("diff-from").replaceChildren(...options());
  $("diff-to").replaceChildren(...options());
  if (!list.versions.length) {
    say("versions-status", "No turn has published a project version yet.");
    return;
  }
  const last = list.versions[list.versions.length - 1].turn;
  $("version-turn").value = last;
  $("diff-to").value = last;
  if (list.versions.length > 1) $("diff-from").value = list.versions[list.versions.length - 2].turn;
  await showFiles();
}

async function showFiles() {
  const turn = $("version-turn").value;
  const files = await api("GET", conversationPath(state.versionsOf, `/versions/${turn}`));
  $("version-files").replaceChildren(
    ...files.files.map((f) =>
      el("li", { dataset: { path: f.path } }, f.reference ? fileLink(f.reference, f.path) : f.path, ` · ${bytes(f.size)}`),
    ),
  );
}

$("version-turn").addEventListener("change", () => showFiles().catch((e) => say("versions-status", e.message)));
$("diff-show").addEventListener("click", async () => {
  try {
    const to = $("diff-to").value;
    const from = $("diff-from").value;
    const q = from && from !== to ? `?from=${from}` : "";
    const diff = await api("GET", conversationPath(state.versionsOf, `/versions/${to}/diff${q}`));
    const out = diff.changes.map((c) =>
      el(
        "div",
        { class: "change", dataset: { path: c.path, change: c.change } },
        el("h4", { text: `${c.path} (${c.change})` }),
        c.patch ? patchView(c.patch) : el("p", { class: "note", text: c.binary ? "binary file" : "too large to show" }),
      ),
    );
    $("diff").replaceChildren(...(out.length ? out : [el("p", { text: "No changes." })]));
  } catch (e) {
    say("versions-status", e.message);
  }
});

function patchView(patch) {
  const pre = el("pre");
  for (const line of patch.split("\n")) {
    const cls = line.startsWith("+") && !line.startsWith("+++") ? "added" : line.startsWith("-") && !line.startsWith("---") ? "removed" : "";
    pre.append(el("span", { class: cls, text: `${line}\n` }));
  }
  return pre;
}

// ---------- admin ----------

$("verify").addEventListener("click", async () => {
  try {
    const v = await api("POST", `/v1/admin/conversations/${encodeURIComponent(chat.id)}/verify`);
    const text = v.intact
      ? `Record intact: ${v.entries_checked} entries in ${v.batches_checked} batches checked.`
      : `Record NOT intact: ${v.failure}`;
    adminResult(text, v.intact ? "intact" : "broken");
  } catch (e) {
    adminResult(e.message, "error");
  }
});

$("replay").addEventListener("click", async () => {
  adminResult("Replaying…", "running");
  try {
    const r = await api("POST", `/v1/admin/conversations/${encodeURIComponent(chat.id)}/replay`);
    const box = $("admin-result");
    const first = r.turns.find((t) => !t.reproduced);
    box.replaceChildren(
      el("p", { text: r.reproduced ? `Replay reproduced all ${r.turns.length} turns.` : `Replay diverged at ${first.turn}: ${first.divergence || "no reason given"}` }),
      el("ul", {}, ...r.turns.map((t) => el("li", { text: `${t.turn}: ${t.reproduced ? "reproduced" : `diverged: ${t.divergence || ""}`}` }))),
    );
    box.dataset.result = r.reproduced ? "reproduced" : "diverged";
    show("admin-result");
  } catch (e) {
    adminResult(e.message, "error");
  }
});

function adminResult(text, result) {
  const box = $("admin-result");
  box.replaceChildren(el("p", { text }));
  box.dataset.result = result;
  show("admin-result");
}

// ---------- start ----------

const saved = sessionStorage.getItem(TOKEN_KEY);
if (saved) {
  signIn(saved).catch(() => signOut());
} else {
  signOut();
}
