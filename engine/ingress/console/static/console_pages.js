// The console's detail pages: one destination (stats, edit, bulk replay), the delivery log
// (filters kept in the URL, keyset paging), one delivery (payload, attempts, replay), the
// events and one event, and the tenants with their backlogs.
// Uses the helpers of console.js (classic scripts share their top-level names).
"use strict";

const STATUSES = ["pending", "in_flight", "delivered", "dead"];

function localInputToIso(value) { return value ? new Date(value).toISOString() : null; }

function isoToLocalInput(value) {
  if (!value) return "";
  const d = new Date(value);
  return new Date(d.getTime() - d.getTimezoneOffset() * 60000).toISOString().slice(0, 16);
}

// ---- Editing a destination: every field PATCH /v1/destinations/{id} takes but the
// switches (pause, disable, rotate), validated by the API alone (the form is novalidate),
// whose message is shown next to the field it names.

class FieldError extends Error {
  constructor(field, message) { super(message); this.field = field; }
}

function headerLines(headers) { return Object.entries(headers).map(([n, v]) => `${n}: ${v}`).join("\n"); }

function parseHeaders(text) {
  const headers = {};
  text.split("\n").forEach((line, index) => {
    if (!line.trim()) return;
    const colon = line.indexOf(":");
    if (colon < 1) throw new FieldError("headers", `headers: line ${index + 1} is not "Name: value"`);
    headers[line.slice(0, colon).trim()] = line.slice(colon + 1).trim();
  });
  return Object.keys(headers).length ? headers : null;
}

function editedFilter(text) {
  try { return filterField(text); } catch (error) { throw new FieldError("filter", error.message); }
}

function listOrNull(text) {
  const items = String(text).split(",").map(t => t.trim()).filter(Boolean);
  return items.length ? items : null;
}

// Numbers as numbers; anything else as typed, for the API to refuse with its own message.
function numberField(text) {
  const value = String(text).trim();
  if (value === "") return null;
  return Number.isFinite(Number(value)) ? Number(value) : value;
}

// The field an API validation message is about: "rate_limit: ...", "headers['X']: ...",
// "retry_schedule[0]: ...", "filter.a.$gt: ..." or msgspec's "... - at `$.timeout_ms`".
function fieldOf(message) {
  const match = /^([a-z_]+)[[:.]/.exec(message) || /`\$\.([a-z_]+)/.exec(message);
  return match ? match[1] : null;
}

function field(label, name, input, hint) {
  return el("label", { class: "field" }, label, input,
    hint ? el("span", { class: "hint" }, hint) : null,
    el("span", { class: "field-error", "data-error-for": name }));
}

function editForm(d) {
  const form = el("form", { class: "inline", id: "edit-destination", novalidate: true, "data-write": true },
    field("URL", "url", el("input", { name: "url", type: "url", size: 40, value: d.url })),
    field("event types", "event_types",
      el("input", { name: "event_types", value: (d.event_types || []).join(", ") }), "comma separated; empty: all"),
    field("max in flight", "max_in_flight",
      el("input", { name: "max_in_flight", type: "number", value: d.max_in_flight ?? "" }), "empty: no cap"),
    field("timeout ms", "timeout_ms", el("input", { name: "timeout_ms", type: "number", value: d.timeout_ms })),
    field("rate limit", "rate_limit",
      el("input", { name: "rate_limit", inputmode: "decimal", size: 8, value: d.rate_limit ?? "" }),
      "requests/s; empty: none"),
    field("retry schedule", "retry_schedule",
      el("input", { name: "retry_schedule", size: 24, value: (d.retry_schedule || []).join(", "),
                    placeholder: "10s, 1m, 10m" }), "comma separated; empty: the engine's"),
    field("extra headers", "headers",
      el("textarea", { name: "headers", rows: 3, cols: 32, placeholder: "X-Team: payments" },
        d.headers ? headerLines(d.headers) : ""), "one Name: value per line"),
    field("channels", "channels",
      el("input", { name: "channels", value: (d.channels || []).join(", ") }), "comma separated; empty: none"),
    field("filter", "filter",
      el("textarea", { name: "filter", rows: 3, cols: 40, placeholder: FILTER_EXAMPLE },
        d.filter ? JSON.stringify(d.filter, null, 1) : ""), "JSON over the payload; empty: every payload"),
    el("label", { class: "field check" },
      el("span", {}, el("input", { name: "ordered", type: "checkbox", checked: d.ordered }), " ordered"),
      el("span", { class: "hint" }, "one at a time per ordering key"),
      el("span", { class: "field-error", "data-error-for": "ordered" })),
    el("button", { type: "submit" }, "Save"));
  // Once something is typed, the live refresh leaves the form alone until it is saved.
  form.addEventListener("input", () => { busy = true; });
  form.addEventListener("submit", async event => {
    event.preventDefault();
    for (const slot of form.querySelectorAll(".field-error")) slot.textContent = "";
    for (const old of main.querySelectorAll(".notice:not(#new-secret, #replay-confirm)")) old.remove();
    const f = new FormData(form);
    try {
      const body = {
        url: f.get("url"), event_types: listOrNull(f.get("event_types")),
        max_in_flight: numberField(f.get("max_in_flight")), timeout_ms: numberField(f.get("timeout_ms")),
        rate_limit: numberField(f.get("rate_limit")), retry_schedule: listOrNull(f.get("retry_schedule")),
        headers: parseHeaders(String(f.get("headers"))), ordered: f.get("ordered") === "on",
        channels: listOrNull(f.get("channels")), filter: editedFilter(f.get("filter")),
      };
      await api("PATCH", `/v1/destinations/${d.id}`, body);
    } catch (error) {
      const name = error instanceof FieldError ? error.field : fieldOf(error.message);
      const slot = name && form.querySelector(`[data-error-for="${name}"]`);
      if (!slot) return act("Save", Promise.reject(error));
      busy = true;
      slot.textContent = error.message;
      return null;
    }
    return act("Save", Promise.resolve()).then(() => main.prepend(notice("Saved.")));
  });
  return form;
}

pages.destination = id => ({
  async load() {
    const [d, stats] = await Promise.all([
      api("GET", `/v1/destinations/${id}`), api("GET", `/v1/destinations/${id}/stats?window=1h`)]);
    const secretSlot = el("div", {});
    const edit = editForm(d);
    const since = el("input", { name: "since", type: "datetime-local" });
    const replaySlot = el("div", {});
    const replay = el("form", { class: "inline", id: "bulk-replay", "data-write": true },
      el("label", {}, "dead since (empty: all)", since),
      el("button", { type: "submit", class: "secondary" }, "Replay dead deliveries…"));
    replay.addEventListener("submit", async event => {
      event.preventDefault();
      const sinceIso = localInputToIso(since.value);
      const query = sinceIso ? `&dead_since=${encodeURIComponent(sinceIso)}` : "";
      let count;
      try {
        count = (await api("GET", `/v1/destinations/${id}/stats?window=1m${query}`)).dead;
      } catch (error) { return act("Count", Promise.reject(error)); }
      busy = true;
      const body = sinceIso ? { status: "dead", since: sinceIso } : { status: "dead" };
      replaySlot.replaceChildren(el("div", { class: "notice", id: "replay-confirm" },
        `Replay ${plural(count, "dead delivery", "dead deliveries")} of destination ${id}${sinceIso ? ` since ${time(sinceIso)}` : ""}? `,
        el("button", { type: "button", "data-action": "confirm-replay", onclick: async () => {
          const done = await act("Replay", api("POST", `/v1/destinations/${id}/replay`, body));
          if (done) main.prepend(notice(`Replayed ${plural(done.replayed, "delivery", "deliveries")}.`));
        } }, `Replay ${count}`), " ",
        el("button", { type: "button", class: "secondary", onclick: () => { replaySlot.replaceChildren(); busy = false; } }, "Cancel")));
    });
    const test = await testEventForm(d);
    const total = stats.attempts;
    show(
      el("h1", {}, `Destination ${d.id}`), secretSlot,
      el("dl", { class: "fields" },
        el("dt", {}, "tenant"), el("dd", { id: "destination-tenant" }, d.tenant),
        el("dt", {}, "url"), el("dd", {}, d.url),
        el("dt", {}, "state"), el("dd", { id: "destination-state" }, destinationState(d)),
        el("dt", {}, "consecutive failures"), el("dd", {}, d.consecutive_failures),
        el("dt", {}, "paused until"), el("dd", {}, time(d.paused_until)),
        el("dt", {}, "disabled reason"), el("dd", {}, d.disabled_reason || "–"),
        el("dt", {}, "event types"), el("dd", {}, d.event_types ? d.event_types.join(", ") : "all"),
        el("dt", {}, "max in flight / timeout"), el("dd", {}, `${d.max_in_flight ?? "no cap"} / ${d.timeout_ms} ms`),
        el("dt", {}, "rate limit / ordered"), el("dd", { id: "destination-rate" },
          `${d.rate_limit === null ? "no limit" : `${d.rate_limit} requests/s`} / ${d.ordered ? "ordered" : "not ordered"}`),
        el("dt", {}, "retry schedule"), el("dd", { id: "destination-schedule" },
          d.retry_schedule ? d.retry_schedule.join(", ") : "the engine's (--retry-schedule)"),
        el("dt", {}, "extra headers"), el("dd", { id: "destination-headers", class: "lines" },
          d.headers && Object.keys(d.headers).length ? headerLines(d.headers) : "none"),
        el("dt", {}, "channels"), el("dd", { id: "destination-channels" },
          d.channels ? d.channels.join(", ") : "none (receives events without channels)"),
        el("dt", {}, "filter"), el("dd", { id: "destination-filter", class: "lines" },
          d.filter ? JSON.stringify(d.filter) : "none (every payload)"),
        el("dt", {}, "backlog"), el("dd", {}, `${stats.pending} pending, ${stats.in_flight} in flight, ${stats.dead} dead`),
        el("dt", {}, "last hour"), el("dd", { id: "destination-stats" },
          `${total} attempts: ${stats.succeeded} succeeded, ${stats.http_error} HTTP errors, ${stats.transport_error} without answer`
          + (total ? ` (${(100 * stats.succeeded / total).toFixed(1)} % ok); p50 ${ms(stats.p50_ms)}, p90 ${ms(stats.p90_ms)}, p99 ${ms(stats.p99_ms)}` : ""))),
      el("p", {}, destinationActions(d, r => secretSlot.replaceChildren(secretNotice(r))), " ",
        el("a", { href: `#/deliveries?destination_id=${d.id}` }, "its deliveries"), " · ",
        el("a", { href: `#/deliveries?destination_id=${d.id}&status=dead` }, "its dead deliveries")),
      el("h2", {}, "Send a test event"), test,
      el("h2", {}, "Edit"), edit,
      el("h2", {}, "Bulk replay"), replay, replaySlot);
  },
});

// A test event of a type the destination takes (every catalogued one when it takes all),
// with the catalog's example as its payload unless one is typed (POST
// /v1/destinations/{id}/test); the event sent is linked.
async function testEventForm(d) {
  const catalog = await allEventTypes();
  const types = catalog.filter(t => !d.event_types || d.event_types.includes(t.name));
  const names = new Set(types.map(t => t.name));
  for (const name of d.event_types || []) if (!names.has(name)) types.push({ name, example: null });
  const select = el("select", { name: "type", id: "test-type" },
    types.map(t => el("option", { value: t.name }, t.deprecated ? `${t.name} (deprecated)` : t.name)));
  const payload = el("textarea", { name: "payload", rows: 4, cols: 48, id: "test-payload" });
  const example = () => {
    const chosen = types.find(t => t.name === select.value);
    payload.value = chosen && chosen.example !== null && chosen.example !== undefined
      ? JSON.stringify(chosen.example, null, 2) : "{}";
  };
  select.addEventListener("change", example);
  example();
  const form = el("form", { class: "inline", id: "test-event", "data-write": true },
    types.length ? field("event type", "type", select) : field("event type", "type",
      el("input", { name: "type", id: "test-type", value: "test.ping" })),
    field("payload", "payload", payload, "JSON; the catalog's example by default"),
    el("button", { type: "submit" }, "Send test event"));
  form.addEventListener("input", () => { busy = true; });
  form.addEventListener("submit", async event => {
    event.preventDefault();
    const f = new FormData(form);
    let body;
    try {
      body = { type: f.get("type"), payload: JSON.parse(String(f.get("payload")) || "{}") };
    } catch (error) {
      return act("Send", Promise.reject(new Error(`payload: not JSON (${error.message})`)));
    }
    const sent = await act("Send", api("POST", `/v1/destinations/${d.id}/test`, body));
    if (sent) main.prepend(el("div", { class: "notice", id: "test-sent" }, "Test event ",
      el("a", { href: `#/event/${sent.id}` }, sent.id), " sent."));
    return sent;
  });
  return form;
}

async function allEventTypes() {
  const types = [];
  let after = null;
  do {
    const page = await api("GET", `/v1/event-types?limit=1000${after ? `&after=${encodeURIComponent(after)}` : ""}`);
    types.push(...page.data);
    after = page.next;
  } while (after);
  return types;
}

// The event-type catalog (GET /v1/event-types): one per engine, read by every tenant.
pages["event-types"] = () => ({
  async load() {
    const types = await allEventTypes();
    const rows = types.map(t => el("tr", { "data-event-type": t.name },
      el("td", { class: "uid" }, t.name, t.deprecated ? [" ", el("span", { class: "badge disabled" }, "deprecated")] : null),
      el("td", {}, t.description || "–"),
      el("td", {}, t.schema ? el("pre", { class: "schema" }, JSON.stringify(t.schema, null, 2)) : el("span", { class: "muted" }, "any payload")),
      el("td", {}, t.example !== null && t.example !== undefined ? el("pre", { class: "example" }, JSON.stringify(t.example, null, 2)) : "–")));
    show(el("h1", {}, "Event types"),
      el("p", { class: "muted" }, "The events this engine sends, with the JSON Schema their payloads follow and an example."),
      types.length ? table(["name", "description", "schema", "example"], rows)
        : el("p", { class: "muted", id: "no-event-types" }, "No event types are catalogued."));
  },
});

function deliveriesHash(filters) {
  const query = new URLSearchParams();
  for (const [key, value] of Object.entries(filters)) if (value) query.set(key, value);
  const text = query.toString();
  return `#/deliveries${text ? `?${text}` : ""}`;
}

function deliveryRows(data) {
  return data.map(d => el("tr", { "data-delivery": d.id },
    el("td", {}, el("a", { href: `#/delivery/${d.id}` }, d.id)), tenantCell(d.tenant),
    el("td", { class: "num" }, el("a", { href: `#/event/${d.event_id}` }, d.event_id)),
    el("td", {}, el("a", { href: `#/destination/${d.destination_id}` }, d.destination_id)),
    el("td", {}, el("span", { class: `badge s-${d.status}` }, d.status)), el("td", { class: "num" }, d.attempt),
    el("td", {}, d.status === "pending" ? time(d.next_attempt_at) : "–"),
    errorCell(d.last_error), el("td", {}, time(d.created_at))));
}

pages.deliveries = (_, params) => ({
  async load() {
    const filters = {};
    for (const key of ["status", "destination_id", "event_type", "since", "until"]) filters[key] = params.get(key) || "";
    const query = new URLSearchParams({ limit: "50" });
    for (const [key, value] of Object.entries(filters)) if (value) query.set(key, value);
    if (params.get("after")) query.set("after", params.get("after"));
    const [page, list] = await Promise.all([api("GET", `/v1/deliveries?${query}`), api("GET", "/v1/destinations")]);
    const form = el("form", { class: "inline", id: "delivery-filters" },
      el("label", {}, "status", el("select", { name: "status" }, el("option", { value: "" }, "any"),
        STATUSES.map(s => el("option", { value: s, selected: s === filters.status }, s)))),
      el("label", {}, "destination", el("select", { name: "destination_id" }, el("option", { value: "" }, "any"),
        list.data.map(d => el("option", { value: d.id, selected: String(d.id) === filters.destination_id }, `${d.id} ${d.url}`)))),
      el("label", {}, "event type", el("input", { name: "event_type", value: filters.event_type })),
      el("label", {}, "events since", el("input", { name: "since", type: "datetime-local", value: isoToLocalInput(filters.since) })),
      el("label", {}, "until", el("input", { name: "until", type: "datetime-local", value: isoToLocalInput(filters.until) })),
      el("button", { type: "submit" }, "Filter"),
      el("a", { href: "#/deliveries" }, "clear"));
    form.addEventListener("submit", event => {
      event.preventDefault();
      const f = new FormData(form);
      location.hash = deliveriesHash({ status: f.get("status"), destination_id: f.get("destination_id"),
        event_type: String(f.get("event_type")).trim(), since: localInputToIso(f.get("since")),
        until: localInputToIso(f.get("until")) });
    });
    const pager = el("div", { class: "pager" },
      params.get("after") ? el("a", { href: deliveriesHash(filters) }, "← newest") : null,
      page.next ? el("a", { href: deliveriesHash({ ...filters, after: page.next }), id: "older" }, "older →") : null);
    show(el("h1", {}, "Deliveries ", tenantNote()), form,
      page.data.length ? table(["id", "tenant", "event#", "destination", "status", "attempt#", "next attempt", "last error", "created"],
        deliveryRows(page.data)) : el("p", { class: "muted" }, "No deliveries match."),
      pager);
  },
});

pages.delivery = id => ({
  async load() {
    const d = await api("GET", `/v1/deliveries/${id}`);
    const event = await api("GET", `/v1/events/${d.event_id}`);
    const attempts = d.attempts.slice().reverse().map(a => el("tr", { "data-attempt": a.attempt },
      el("td", { class: "num" }, a.attempt), el("td", {}, time(a.started_at)),
      el("td", { class: "num" }, ms(a.duration_ms)), el("td", { class: "num" }, a.status_code ?? "–"),
      errorCell(a.error),
      el("td", {}, a.response_body ? el("pre", { class: "response-body" }, a.response_body) : "–")));
    const replay = el("button", { type: "button", id: "replay", disabled: d.status === "in_flight",
      "data-action": "replay", onclick: () => act("Replay", api("POST", `/v1/deliveries/${id}/replay`)) }, "Replay");
    show(
      el("h1", {}, `Delivery ${d.id}`),
      el("dl", { class: "fields" },
        el("dt", {}, "tenant"), el("dd", { id: "delivery-tenant" }, d.tenant),
        el("dt", {}, "status"), el("dd", {}, el("span", { class: `badge s-${d.status}`, id: "delivery-status" }, d.status)),
        el("dt", {}, "destination"), el("dd", {}, el("a", { href: `#/destination/${d.destination_id}` }, d.destination_id)),
        el("dt", {}, "event"), el("dd", {}, el("a", { href: `#/event/${event.id}` }, event.id), ` (${event.type})`),
        el("dt", {}, "attempts made"), el("dd", {}, d.attempt),
        el("dt", {}, "next attempt"), el("dd", {}, d.status === "pending" ? time(d.next_attempt_at) : "–"),
        el("dt", {}, "last error"), el("dd", { class: "error" }, d.last_error || "–"),
        el("dt", {}, "created / completed"), el("dd", {}, `${time(d.created_at)} / ${time(d.completed_at)}`)),
      el("p", {}, replay, " ", el("span", { class: "muted" }, "sends it again as a first attempt")),
      el("h2", {}, "Event payload"), el("pre", { id: "payload" }, JSON.stringify(event.payload, null, 2)),
      el("h2", {}, `Attempts (${d.attempts.length})`),
      d.attempts.length ? table(["attempt#", "started", "duration#", "status#", "error", "response body"], attempts)
        : el("p", { class: "muted" }, "No attempt yet."));
  },
});

// A list page's hash: its query without the empty values.
function listHash(page, values) {
  const query = new URLSearchParams();
  for (const [key, value] of Object.entries(values)) if (value) query.set(key, value);
  const text = query.toString();
  return `#/${page}${text ? `?${text}` : ""}`;
}

pages.events = (_, params) => ({
  async load() {
    const type = params.get("type") || "";
    const query = new URLSearchParams({ limit: "50" });
    if (type) query.set("type", type);
    if (params.get("after")) query.set("after", params.get("after"));
    const page = await api("GET", `/v1/events?${query}`);
    const form = el("form", { class: "inline", id: "event-filters" },
      el("label", {}, "type", el("input", { name: "type", value: type })),
      el("button", { type: "submit" }, "Filter"), el("a", { href: "#/events" }, "clear"));
    form.addEventListener("submit", event => {
      event.preventDefault();
      location.hash = listHash("events", { type: String(new FormData(form).get("type")).trim() });
    });
    const rows = page.data.map(e => el("tr", { "data-event": e.id },
      el("td", {}, el("a", { href: `#/event/${e.id}` }, e.id)), tenantCell(e.tenant), el("td", {}, e.type),
      el("td", { class: "num" }, e.delivery_count),
      el("td", {}, e.ordering_key ?? "–"), el("td", {}, e.idempotency_key ?? "–"), el("td", {}, time(e.created_at))));
    const pager = el("div", { class: "pager" },
      params.get("after") ? el("a", { href: listHash("events", { type }) }, "← newest") : null,
      page.next ? el("a", { href: listHash("events", { type, after: page.next }), id: "older" }, "older →") : null);
    show(el("h1", {}, "Events ", tenantNote()), form,
      rows.length ? table(["id", "tenant", "type", "deliveries#", "ordering key", "idempotency key", "created"], rows)
        : el("p", { class: "muted" }, "No events match."),
      pager);
  },
});

pages.event = id => ({
  async load() {
    const e = await api("GET", `/v1/events/${id}`);
    show(
      el("h1", {}, `Event ${e.id}`),
      el("dl", { class: "fields" },
        el("dt", {}, "tenant"), el("dd", { id: "event-tenant" }, e.tenant),
        el("dt", {}, "type"), el("dd", {}, e.type),
        el("dt", {}, "ordering key"), el("dd", {}, e.ordering_key ?? "–"),
        el("dt", {}, "idempotency key"), el("dd", {}, e.idempotency_key ?? "–"),
        el("dt", {}, "created"), el("dd", {}, time(e.created_at))),
      el("h2", {}, "Payload"), el("pre", { id: "payload" }, JSON.stringify(e.payload, null, 2)),
      el("h2", {}, `Deliveries (${e.deliveries.length})`),
      e.deliveries.length ? table(["id", "tenant", "event#", "destination", "status", "attempt#", "next attempt", "last error", "created"],
        deliveryRows(e.deliveries)) : el("p", { class: "muted" }, "No deliveries: no destination took this event."));
  },
});

function tenantLimits(t) {
  const parts = [];
  if (t.max_in_flight !== null) parts.push(`${t.max_in_flight} in flight`);
  if (t.rate_limit !== null) parts.push(`${t.rate_limit}/s`);
  return parts.length ? parts.join(", ") : "–";
}

// The tenants by id with their backlog now (GET /v1/tenants: the admin's), `next` paging.
pages.tenants = (_, params) => ({
  async load() {
    const limit = params.get("limit") || "";
    const query = new URLSearchParams({ limit: limit || "50" });
    if (params.get("after")) query.set("after", params.get("after"));
    const page = await api("GET", `/v1/tenants?${query}`);
    const chosen = tenant();
    const rows = page.data.map(t => el("tr", { "data-tenant": t.uid },
      el("td", { class: "num" }, t.id), el("td", { class: "uid" }, t.uid), el("td", {}, t.name ?? "–"),
      el("td", {}, t.disabled ? el("span", { class: "badge disabled" }, "disabled") : el("span", { class: "badge ok" }, "active")),
      el("td", { class: "num pending" }, t.pending), el("td", { class: "num in-flight" }, t.in_flight),
      el("td", {}, tenantLimits(t)), el("td", {}, time(t.created_at)),
      el("td", {}, t.uid === chosen ? el("span", { class: "muted" }, "selected")
        : el("button", { type: "button", class: "secondary", "data-action": "select-tenant",
                         onclick: () => selectTenant(t.uid) }, "Select"))));
    const pager = el("div", { class: "pager" },
      params.get("after") ? el("a", { href: listHash("tenants", { limit }) }, "← first") : null,
      page.next ? el("a", { href: listHash("tenants", { limit, after: page.next }), id: "next-tenants" }, "next →") : null);
    show(el("h1", {}, "Tenants"),
      el("p", { class: "muted" }, "Each tenant's backlog now: deliveries pending and being sent."),
      table(["id#", "uid", "name", "state", "pending#", "in flight#", "limits", "created", ""], rows), pager);
  },
});

route();
