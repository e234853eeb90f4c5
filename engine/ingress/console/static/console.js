// The engine console: plain JavaScript over the /v1 API, no build step, nothing fetched
// from elsewhere. Every value from the server reaches the page through text nodes
// (el() below), never as markup, so a payload holding <script> shows as text.
"use strict";

const TOKEN_KEY = "engine.api_token";
const TENANT_KEY = "engine.tenant";
const REFRESH_MS = 5000;
const main = document.getElementById("main");
let current = null;  // {load, refresh}: the page shown, reloaded by the live refresh
let busy = false;    // a confirmation or an edit is open: the refresh must not wipe it
// False for a tenant key's console: /v1/tenants is the admin's, and the unscoped paths
// already mean the key's own tenant.
let tenantScoped = true;
// The customer portal (GET /portal/{tenant}) is this console restricted to one tenant:
// its token comes in the link (and leaves the address bar at once), the token's tenant
// and scopes restrict every answer of the API, and a read-only link's write controls are
// disabled here as the API refuses them there.
const PORTAL = document.documentElement.dataset.mode === "portal";
let readOnly = false;
if (PORTAL) {
  const token = new URLSearchParams(location.search).get("token");
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  history.replaceState(null, "", location.pathname + location.hash);
  for (const hidden of ["overview", "tenants"]) document.querySelector(`header nav a[data-page="${hidden}"]`).hidden = true;
  document.getElementById("forget-token").hidden = true;
  document.querySelector(".brand").textContent = "Webhooks";
}

// ---- DOM helpers ---------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs, ...children) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
  for (const child of children) node.append(child);
  return node;
}

function show(...nodes) {
  main.replaceChildren(...nodes);
  if (readOnly) {
    for (const control of main.querySelectorAll("[data-write] :is(input, select, textarea, button), button[data-action]")) {
      control.disabled = true;
      control.title = "This portal link is read-only.";
    }
  }
}

function time(value) {
  if (!value) return "–";
  return new Date(value).toISOString().replace("T", " ").slice(0, 19) + "Z";
}

function age(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 120) return `${Math.round(seconds)} s`;
  if (seconds < 7200) return `${Math.round(seconds / 60)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

function ms(value) { return value === null || value === undefined ? "–" : `${Math.round(value)} ms`; }

function card(id, label, value) {
  return el("div", { class: "card" },
    el("div", { class: "value", id }, value), el("div", { class: "label" }, label));
}

function table(headers, rows) {
  return el("table", {},
    el("thead", {}, el("tr", {}, headers.map(h =>
      el("th", { class: h.endsWith("#") ? "num" : null }, h.replace(/#$/, ""))))),
    el("tbody", {}, rows));
}

// An error in red; none as a muted dash.
function errorCell(error) {
  return error ? el("td", { class: "error" }, error) : el("td", { class: "muted" }, "–");
}

function plural(count, one, many) { return `${count} ${count === 1 ? one : many}`; }

function notice(text, kind) { return el("div", { class: `notice ${kind || ""}` }, text); }

function destinationState(d) {
  const states = [el("span", { class: `badge b-${d.breaker}` }, `breaker ${d.breaker}`)];
  if (d.paused) states.push(" ", el("span", { class: "badge paused" }, "paused"));
  if (d.disabled) states.push(" ", el("span", { class: "badge disabled" }, "disabled"));
  return states;
}

// ---- Tenants: every view shows the selected tenant's objects -------------------------

function tenant() { return sessionStorage.getItem(TENANT_KEY) || "default"; }

// The API's tenant-scoped routes, asked for the selected tenant under /v1/tenants/{uid}/.
const TENANT_SCOPED = /^\/v1\/(destinations|events|deliveries)(?=[/?]|$)/;

function scoped(path) {
  return tenantScoped && TENANT_SCOPED.test(path)
    ? `/v1/tenants/${encodeURIComponent(tenant())}/${path.slice("/v1/".length)}` : path;
}

// "tenant acme" after a page's title: whose objects these are.
function tenantNote() {
  return tenantScoped ? el("span", { class: "tenant-note", id: "tenant-note" }, `tenant ${tenant()}`) : null;
}

function tenantCell(uid) { return el("td", { class: "tenant" }, uid); }

// ---- API -----------------------------------------------------------------------------

class Unauthorized extends Error {}  // its message: the API's reason

async function api(method, path, body) {
  const headers = { accept: "application/json" };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.authorization = `Bearer ${token}`;
  if (body !== undefined) headers["content-type"] = "application/json";
  const response = await fetch(scoped(path), {
    method, headers, body: body === undefined ? undefined : JSON.stringify(body),
    cache: "no-store",
  });
  const text = await response.text();
  const data = text && (response.headers.get("content-type") || "").startsWith("application/json") ? JSON.parse(text) : null;
  if (response.status === 401) throw new Unauthorized(data && data.error ? data.error.message : "");
  if (!response.ok) {
    const message = data && data.error ? data.error.message : `HTTP ${response.status}`;
    const error = new Error(message);
    error.status = response.status;
    throw error;
  }
  return data;
}

function askToken(message) {
  current = null;
  show();
  document.getElementById("token-message").textContent = message;
  document.getElementById("token-prompt").hidden = false;
  document.getElementById("token-input").focus();
}

document.getElementById("token-form").addEventListener("submit", event => {
  event.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, document.getElementById("token-input").value);
  document.getElementById("token-input").value = "";
  document.getElementById("token-prompt").hidden = true;
  route();
});

document.getElementById("forget-token").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  askToken("Enter the API token (ENGINE_API_TOKEN).");
});

// Every tenant, for the selector: pages of 1000 while `next` says there are more.
async function allTenants() {
  const tenants = [];
  let after = null;
  do {
    const page = await api("GET", `/v1/tenants?limit=1000${after ? `&after=${encodeURIComponent(after)}` : ""}`);
    tenants.push(...page.data);
    after = page.next;
  } while (after);
  return tenants;
}

async function refreshTenantSelect() {
  const select = document.getElementById("tenant-select");
  if (PORTAL) {
    tenantScoped = false;
    select.parentNode.hidden = true;
    const session = await api("GET", "/v1/session");
    readOnly = session.read_only;
    document.body.classList.toggle("read-only", readOnly);
    document.getElementById("refreshed").dataset.tenant = session.tenant;
    return;
  }
  let tenants;
  try {
    tenants = await allTenants();
  } catch (error) {
    if (error.status !== 403) throw error;
    tenantScoped = false;  // a tenant key: no selector, its own tenant's paths
    select.parentNode.hidden = true;
    return;
  }
  tenantScoped = true;
  select.parentNode.hidden = false;
  // A tenant deleted since it was chosen: back to the default one.
  if (!tenants.some(t => t.uid === tenant())) sessionStorage.removeItem(TENANT_KEY);
  const chosen = tenant();
  select.replaceChildren(...tenants.map(t => el("option", { value: t.uid, selected: t.uid === chosen },
    t.name && t.name !== t.uid ? `${t.uid} (${t.name})` : t.uid)));
}

// Switch tenant: an object's page belongs to the tenant it was opened in, and a list's
// filters name that tenant's objects, so the view goes to its plain list.
function selectTenant(uid) {
  sessionStorage.setItem(TENANT_KEY, uid);
  const { page } = parseHash();
  const list = { destination: "destinations", delivery: "deliveries", event: "events" }[page] || page;
  const hash = `#/${list}`;
  if (location.hash !== hash) location.hash = hash;
  else route();
}

document.getElementById("tenant-select").addEventListener("change", event => selectTenant(event.target.value));

async function run(page, first) {
  try {
    if (first) await refreshTenantSelect();
    await page.load(first);
    document.getElementById("refreshed").textContent = `updated ${time(new Date())}`;
  } catch (error) {
    if (error instanceof Unauthorized && PORTAL) {
      current = null;
      show(el("h1", {}, "This portal link cannot be used"),
        notice(`${error.message || "The link was refused"}. Portal links are short-lived: ask whoever sent it for a new one.`, "error"));
    } else if (error instanceof Unauthorized) {
      const had = sessionStorage.getItem(TOKEN_KEY);
      sessionStorage.removeItem(TOKEN_KEY);
      askToken(had ? "That token was refused. Enter the API token (ENGINE_API_TOKEN)."
        : "This engine asks for its API token (ENGINE_API_TOKEN).");
    } else if (first) {
      show(notice(`Could not load: ${error.message}`, "error"));
    } else {
      document.getElementById("refreshed").textContent = `refresh failed: ${error.message}`;
    }
  }
}

// An action (pause, replay...): its error shown above the page, then the page reloaded.
async function act(what, promise) {
  try {
    const result = await promise;
    busy = false;
    await run(current, true);
    return result;
  } catch (error) {
    if (error instanceof Unauthorized) return run({ load() { throw error; } }, true);
    main.prepend(notice(`${what} failed: ${error.message}`, "error"));
    return null;
  }
}

// ---- Overview ------------------------------------------------------------------------

function chart(minutes) {
  const width = 720, height = 160, pad = 20, barWidth = (width - pad) / minutes.length;
  const top = Math.max(1, ...minutes.map(m => m.succeeded + m.failed));
  const scale = (height - 2 * pad) / top;
  const bars = [];
  minutes.forEach((m, i) => {
    const x = pad + i * barWidth, okHeight = m.succeeded * scale, badHeight = m.failed * scale;
    const title = svg("title", {});
    title.textContent = `${time(m.minute)}: ${m.succeeded} succeeded, ${m.failed} failed`;
    bars.push(svg("g", {},
      svg("rect", { class: "ok", x, width: barWidth - 1, y: height - pad - okHeight,
                    height: okHeight }),
      svg("rect", { class: "bad", x, width: barWidth - 1,
                    y: height - pad - okHeight - badHeight, height: badHeight }),
      title));
  });
  const label = (x, y, text) => { const t = svg("text", { x, y }); t.textContent = text; return t; };
  return svg("svg", { class: "chart", id: "per-minute", viewBox: `0 0 ${width} ${height}`,
                      width, height, role: "img" },
    ...bars, label(2, pad - 6, `${top}/min`), label(pad, height - 5, "60 min ago"),
    label(width - 40, height - 5, "now"));
}

const overview = {
  async load() {
    const [o, list] = await Promise.all([api("GET", "/v1/overview"), api("GET", "/v1/destinations")]);
    const names = new Map(list.data.map(d => [d.id, d]));
    const q = o.queue, b = o.breakers;
    const failed = o.per_minute.reduce((n, m) => n + m.failed, 0);
    const succeeded = o.per_minute.reduce((n, m) => n + m.succeeded, 0);
    const down = o.destinations.filter(d => names.has(d.id) && names.get(d.id).breaker !== "closed");
    show(
      el("h1", {}, "Overview"),
      el("p", { class: "muted" }, "Queue, attempts and warnings of every tenant; breakers of the selected tenant's destinations."),
      el("div", { class: "cards" },
        card("depth-pending", "pending", q.pending), card("depth-due", "due now", q.pending_due),
        card("depth-retrying", "retrying", q.retrying), card("depth-in_flight", "in flight", q.in_flight),
        card("depth-dead", "dead", q.dead), card("oldest-pending", "oldest pending", age(q.oldest_pending_age_s)),
        card("breakers-open", "breakers open", b.open + b.half_open),
        card("destinations-paused", "paused / disabled", `${b.paused} / ${b.disabled}`)),
      el("h2", {}, "Attempts per minute, last hour"),
      el("p", { class: "legend" }, el("span", { class: "ok" }, `■ succeeded ${succeeded}`),
        el("span", { class: "bad" }, `■ failed ${failed}`)),
      chart(o.per_minute),
      el("h2", {}, "Warnings"),
      o.warnings.length ? el("ul", { class: "warnings", id: "warnings" }, o.warnings.map(w => el("li", {}, w)))
        : el("p", { class: "muted", id: "warnings" }, "No warnings."),
      el("h2", {}, "Breakers not closed"),
      down.length ? table(["destination", "url", "state", "failures#", "paused until", "last error"],
        down.map(d => { const x = names.get(d.id); return el("tr", {},
          el("td", {}, el("a", { href: `#/destination/${d.id}` }, d.id)), el("td", {}, x.url),
          el("td", {}, destinationState(x)), el("td", { class: "num" }, x.consecutive_failures),
          el("td", {}, time(x.paused_until)), errorCell(d.last_error)); }))
        : el("p", { class: "muted" }, "All breakers are closed."));
  },
};

// ---- Destinations --------------------------------------------------------------------

function patchDestination(id, change, what) {
  return act(what, api("PATCH", `/v1/destinations/${id}`, change));
}

function destinationActions(d, onSecret) {
  const buttons = [];
  buttons.push(d.paused
    ? el("button", { type: "button", "data-action": "resume", onclick: () => patchDestination(d.id, { paused: false }, "Resume") }, "Resume")
    : el("button", { type: "button", class: "secondary", "data-action": "pause", onclick: () => patchDestination(d.id, { paused: true }, "Pause") }, "Pause"));
  buttons.push(d.disabled
    ? el("button", { type: "button", "data-action": "enable", onclick: () => patchDestination(d.id, { disabled: false }, "Enable") }, "Enable")
    : el("button", { type: "button", class: "danger", "data-action": "disable", onclick: () => {
        if (confirm(`Disable destination ${d.id}? Its deliveries wait until it is enabled.`)) patchDestination(d.id, { disabled: true }, "Disable");
      } }, "Disable"));
  buttons.push(el("button", { type: "button", class: "secondary", "data-action": "rotate", onclick: async () => {
    if (!confirm(`Rotate the secret of destination ${d.id}? The old one keeps signing for 24 h.`)) return;
    const rotated = await act("Rotate", api("PATCH", `/v1/destinations/${d.id}`, { rotate_secret: true }));
    if (rotated) onSecret(rotated);
  } }, "Rotate secret"));
  buttons.push(el("button", { type: "button", class: "danger", "data-action": "delete", onclick: async () => {
    if (!confirm(`Delete destination ${d.id}? Its deliveries are kept but no longer sent.`)) return;
    const deleted = await act("Delete", api("DELETE", `/v1/destinations/${d.id}`).then(() => true));
    if (deleted) location.hash = "#/destinations";
  } }, "Delete"));
  return buttons;
}

function secretNotice(d) {
  busy = true;  // kept on screen until dismissed: it is shown this once only
  return el("div", { class: "notice", id: "new-secret" },
    `New secret of destination ${d.id} (shown once, copy it now): `,
    el("span", { class: "secret" }, d.secret), " ",
    el("button", { type: "button", class: "secondary", onclick: e => { e.target.parentNode.remove(); busy = false; } }, "Done"));
}

// A destination's filter (SPEC "Routing") as typed: JSON, or nothing for no filter. The
// API validates it (operators, paths, depth, size); here only the JSON text is read.
const FILTER_EXAMPLE = '{"customer.tier": {"$eq": "gold"}}';

function filterField(text) {
  const value = String(text ?? "").trim();
  if (value === "") return null;
  try { return JSON.parse(value); } catch (error) { throw new Error(`filter: not valid JSON: ${error.message}`); }
}

const destinations = {
  async load() {
    // The overview is the admin's: a tenant key's list goes without the per-destination numbers.
    const overviewOrNone = api("GET", "/v1/overview").catch(error => {
      if (error.status === 403) return { destinations: [] };
      throw error;
    });
    const [list, o] = await Promise.all([api("GET", "/v1/destinations"), overviewOrNone]);
    const stats = new Map(o.destinations.map(d => [d.id, d]));
    const secretSlot = el("div", {});
    const onSecret = d => secretSlot.replaceChildren(secretNotice(d));
    const create = el("form", { class: "inline", id: "create-destination", "data-write": true },
      el("label", {}, "URL", el("input", { name: "url", type: "url", required: true, size: 40, placeholder: "https://example.com/hook" })),
      el("label", {}, "event types (comma separated, empty: all)", el("input", { name: "event_types" })),
      el("label", {}, "max in flight", el("input", { name: "max_in_flight", type: "number", min: 1 })),
      el("label", {}, "timeout ms", el("input", { name: "timeout_ms", type: "number", min: 1 })),
      el("label", {}, "channels (comma separated, empty: none)", el("input", { name: "channels" })),
      el("label", {}, "filter (JSON, empty: every payload)",
        el("textarea", { name: "filter", rows: 2, cols: 40, placeholder: FILTER_EXAMPLE })),
      el("button", { type: "submit" }, "Create destination"));
    create.addEventListener("submit", async event => {
      event.preventDefault();
      const f = new FormData(create);
      const types = String(f.get("event_types")).split(",").map(t => t.trim()).filter(Boolean);
      const body = { url: f.get("url") };
      if (types.length) body.event_types = types;
      if (f.get("max_in_flight")) body.max_in_flight = Number(f.get("max_in_flight"));
      if (f.get("timeout_ms")) body.timeout_ms = Number(f.get("timeout_ms"));
      const channels = String(f.get("channels")).split(",").map(t => t.trim()).filter(Boolean);
      if (channels.length) body.channels = channels;
      try {
        const filter = filterField(f.get("filter"));
        if (filter !== null) body.filter = filter;
      } catch (error) { return act("Create", Promise.reject(error)); }
      const created = await act("Create", api("POST", "/v1/destinations", body));
      if (created) onSecret(created);
    });
    const rows = list.data.map(d => {
      const s = stats.get(d.id) || { pending: 0, in_flight: 0, attempts: 0, succeeded: 0 };
      const rate = s.attempts ? `${(100 * s.succeeded / s.attempts).toFixed(1)} %` : "–";
      return el("tr", { "data-destination": d.id },
        el("td", {}, el("a", { href: `#/destination/${d.id}` }, d.id)), tenantCell(d.tenant), el("td", {}, d.url),
        el("td", { class: "state" }, destinationState(d)),
        el("td", { class: "num backlog" }, `${s.pending} / ${s.in_flight}`),
        el("td", { class: "num rate" }, rate), el("td", { class: "num" }, ms(s.p99_ms)),
        errorCell(s.last_error),
        el("td", { class: "actions" }, destinationActions(d, onSecret),
          el("a", { href: `#/deliveries?destination_id=${d.id}&status=dead` }, "dead deliveries")));
    });
    show(el("h1", {}, "Destinations ", tenantNote()), secretSlot, create,
      table(["id", "tenant", "url", "state", "pending / in flight#", "success 1h#", "p99 1h#", "last error 1h", ""], rows));
  },
};

// console_pages.js adds the destination, deliveries, delivery, events, event and tenants pages (both files are
// classic scripts: their top-level names are shared) and starts the first route.
const pages = { overview, destinations };

// ---- Routing and live refresh ----------------------------------------------------------

function parseHash() {
  const [path, query] = location.hash.replace(/^#\/?/, "").split("?");
  const [page, id] = path.split("/");
  const fallback = PORTAL ? "destinations" : "overview";
  const known = page && (!PORTAL || !["overview", "tenants"].includes(page));
  return { page: known ? page : fallback, id, params: new URLSearchParams(query || "") };
}

function route() {
  busy = false;
  const { page, id, params } = parseHash();
  const make = pages[page] || pages.overview;
  current = typeof make === "function" ? make(id, params) : make;
  for (const link of document.querySelectorAll("header nav a")) {
    link.classList.toggle("active", link.dataset.page === page
      || (page === "destination" && link.dataset.page === "destinations")
      || (page === "delivery" && link.dataset.page === "deliveries")
      || (page === "event" && link.dataset.page === "events"));
  }
  return run(current, true);
}

window.addEventListener("hashchange", route);
setInterval(() => {
  const editing = main.contains(document.activeElement) && document.activeElement.matches("input, select, textarea");
  if (current && !busy && !editing && document.visibilityState === "visible") run(current, false);
}, REFRESH_MS);

