// Fake webhook destination for the test suite and the benchmarks.
//
// One port plays many destinations: the URL path picks the behaviour and names
// the destination, and every delivery is counted per name (statuses, distinct
// and duplicate webhook-ids, Standard Webhooks signature checks, concurrency).
// Only node: built-ins, so the bench needs no npm install.
//
//   node engine/testing/fakedest.mjs --port 0 --host 127.0.0.1 [--secret whsec_...]...
//        [--seed N] [--keep 50] [--record-order] [--stats-file F]
//
// Prints {"port": N} on stdout once listening. Behaviours (<name> may contain "/"):
//   /fast/<name>  /slow/<ms>/<name>  /random/<min_ms>/<max_ms>/<name>  /flaky/<pct>/<name>
//   /dead/<name>  /status/<code>/<name>  /429/<seconds>/<name>  /down-until/<unix_ms>/<name>
//   /toggle/<name>  /bigbody/<bytes>/<name>  /drip/<ms>/<name>
// /random answers 200 after a latency drawn uniformly from [min, max] ms; /drip sends its
// 200 headers at once and then the body a byte at a time over <ms> (a slow reader's
// mirror: the client must wait for the whole answer). GET /_stats also reports the
// process's own CPU time (cpu_user_ms, cpu_system_ms) so a bench shows the fake was not
// its bottleneck.
// Control: GET /_stats, POST /_reset, POST /_control/<name> {"mode": "ok"|"fail"|"hang",
// "status"?: 500}, POST /_secrets/<name> {"secrets": [...]}, GET /_requests/<name>,
// GET /_arrivals/<name>, GET /_order/<name> (with --record-order).
//
// One process, one core: about 30-40k small POSTs/s on the 2-core dev machine (a bare
// Node server does ~45k), ~20k/s when it checks signatures (fakedest_wrk.lua beside this
// file measures it). There is no cluster mode:
// duplicate detection needs every webhook-id of a name in one place. Memory grows by
// one Map entry (~100 B) per distinct webhook-id, so millions per run are fine.

import { createHmac, timingSafeEqual } from "node:crypto";
import { writeFileSync } from "node:fs";
import { createServer } from "node:http";
import { parseArgs } from "node:util";

const { values: opts } = parseArgs({
  options: {
    port: { type: "string", default: "0" },
    host: { type: "string", default: "127.0.0.1" },
    secret: { type: "string", multiple: true, default: [] },
    seed: { type: "string" },
    keep: { type: "string", default: "50" },
    "record-order": { type: "boolean", default: false },
    "stats-file": { type: "string" },
  },
});

const KEEP = Number(opts.keep);
const RECORD_ORDER = opts["record-order"];
const DUPLICATE_SAMPLE = 20;
const JSON_HEADERS = { "content-type": "application/json" };
const startedAt = Date.now();

function decodeSecret(secret) {
  const raw = secret.startsWith("whsec_") ? secret.slice(6) : secret;
  return Buffer.from(raw, "base64");
}

// Secrets given on the command line apply to every name without its own.
const defaultKeys = opts.secret.map(decodeSecret);
// Runtime configuration survives /_reset; only observations are cleared.
const keysByName = new Map();
const toggles = new Map();

// mulberry32: tiny, seedable, good enough to pick failures reproducibly.
function mulberry32(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function fnv1a(text) {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    h = Math.imul(h ^ text.charCodeAt(i), 0x01000193);
  }
  return h >>> 0;
}

// One PRNG per name so a name's failure pattern does not depend on how other
// names' requests interleave with it.
function makeRandom(name) {
  return opts.seed === undefined ? Math.random : mulberry32(Number(opts.seed) ^ fnv1a(name));
}

const names = new Map();

function newState(name) {
  return {
    requests: 0,
    responses: {},
    // webhook-id -> arrival ms of its first 2xx-answered request, 0 until then.
    ids: new Map(),
    delivered: 0,
    missingId: 0,
    duplicates: 0,
    duplicateIds: [],
    sigOk: 0,
    sigBad: 0,
    sigUnchecked: 0,
    inFlight: 0,
    maxConcurrent: 0,
    bytesIn: 0,
    firstMs: 0,
    lastMs: 0,
    recent: [],
    order: [],
    random: makeRandom(name),
  };
}

function stateFor(name) {
  let s = names.get(name);
  if (s === undefined) {
    s = newState(name);
    names.set(name, s);
  }
  return s;
}

function checkSignature(s, name, headers, body) {
  const keys = keysByName.get(name) ?? defaultKeys;
  if (keys.length === 0) {
    s.sigUnchecked++;
    return;
  }
  const header = headers["webhook-signature"];
  if (header === undefined) {
    s.sigBad++;
    return;
  }
  const prefix = `${headers["webhook-id"]}.${headers["webhook-timestamp"]}.`;
  const given = [];
  for (const part of header.split(" ")) {
    if (part.startsWith("v1,")) given.push(Buffer.from(part.slice(3), "base64"));
  }
  for (const key of keys) {
    const expected = createHmac("sha256", key).update(prefix).update(body).digest();
    for (const sig of given) {
      if (sig.length === expected.length && timingSafeEqual(sig, expected)) {
        s.sigOk++;
        return;
      }
    }
  }
  s.sigBad++;
}

// Ends a request's time in flight exactly once: at its answer, or when the
// client hangs up on a request that is never answered (/dead, a hanging /toggle).
function finish(ctx) {
  if (!ctx.done) {
    ctx.done = true;
    ctx.s.inFlight--;
  }
}

function respond(ctx, status, headers, body) {
  respondHead(ctx, status, headers);
  ctx.res.end(body);
}

// Counts the answer and sends its status line and headers; the caller sends the body.
function respondHead(ctx, status, headers) {
  const { s, id, entry } = ctx;
  finish(ctx);
  s.responses[status] = (s.responses[status] ?? 0) + 1;
  if (entry !== null) entry.status = status;
  if (id !== undefined && status >= 200 && status < 300) {
    if (s.ids.get(id) > 0) {
      s.duplicates++;
      if (s.duplicateIds.length < DUPLICATE_SAMPLE && !s.duplicateIds.includes(id)) {
        s.duplicateIds.push(id);
      }
    } else {
      s.ids.set(id, ctx.arrivedMs);
      s.delivered++;
    }
  }
  ctx.res.writeHead(status, headers);
}

const ok = (ctx) => respond(ctx, 200, JSON_HEADERS, "{}");
const fail = (ctx, status) => respond(ctx, status, JSON_HEADERS, "{}");

const isStatus = (code) => Number.isInteger(code) && code >= 200 && code <= 599;

// kind -> [number of numeric parameters, parameter check, handler(ctx, params)]
const KINDS = {
  fast: [0, null, (ctx) => ok(ctx)],
  slow: [1, null, (ctx, [ms]) => setTimeout(ok, ms, ctx)],
  flaky: [1, null, (ctx, [pct]) => (ctx.s.random() * 100 < pct ? fail(ctx, 500) : ok(ctx))],
  dead: [0, null, () => {}],
  status: [
    1,
    ([code]) => isStatus(code),
    (ctx, [code]) => {
      // A redirect points back at this name, so a client that follows it shows up as a 2xx.
      const headers = code >= 300 && code < 400
        ? { ...JSON_HEADERS, location: `/fast/${ctx.name}` }
        : JSON_HEADERS;
      respond(ctx, code, headers, "{}");
    },
  ],
  429: [
    1,
    null,
    (ctx, [seconds]) => respond(ctx, 429, { ...JSON_HEADERS, "retry-after": String(seconds) }, "{}"),
  ],
  "down-until": [1, null, (ctx, [untilMs]) => (Date.now() < untilMs ? fail(ctx, 503) : ok(ctx))],
  toggle: [
    0,
    null,
    (ctx) => {
      const mode = toggles.get(ctx.name) ?? { mode: "ok" };
      if (mode.mode === "ok") ok(ctx);
      else if (mode.mode === "fail") fail(ctx, mode.status);
      // "hang": answer nothing, like /dead.
    },
  ],
  random: [
    2,
    ([low, high]) => low >= 0 && high >= low,
    (ctx, [low, high]) => setTimeout(ok, low + ctx.s.random() * (high - low), ctx),
  ],
  drip: [
    1,
    ([ms]) => ms >= 0 && ms <= 600_000,
    (ctx, [ms]) => {
      // Counted as answered when the status line goes out, like any 200.
      const { res } = ctx;
      const chunks = 10;
      respondHead(ctx, 200, JSON_HEADERS);
      let sent = 0;
      const timer = setInterval(() => {
        if (res.destroyed) return clearInterval(timer);
        sent++;
        if (sent < chunks) res.write(" ");
        else {
          clearInterval(timer);
          res.end("{}");
        }
      }, ms / chunks);
    },
  ],
  bigbody: [
    1,
    ([bytes]) => bytes >= 0 && bytes <= 2 ** 30,
    (ctx, [bytes]) => respond(ctx, 200, JSON_HEADERS, Buffer.alloc(bytes, 0x78)),
  ],
};

function handleDelivery(req, res, segments) {
  const kind = KINDS[segments[1]];
  const nParams = kind === undefined ? 0 : kind[0];
  const params = segments.slice(2, 2 + nParams).map(Number);
  const name = segments.slice(2 + nParams).join("/");
  const valid = kind !== undefined && name !== "" && params.every(Number.isFinite)
    && (kind[1] === null || kind[1](params));
  // Stray or malformed paths are counted too, so a test sees misrouted deliveries.
  const s = stateFor(valid ? name : "_unmatched");
  const now = Date.now();
  const id = req.headers["webhook-id"];
  const ctx = { s, name, id, res, arrivedMs: now, entry: null, done: false };

  s.requests++;
  if (s.firstMs === 0) s.firstMs = now;
  s.lastMs = now;
  if (id === undefined) s.missingId++;
  else {
    if (!s.ids.has(id)) s.ids.set(id, 0);
    if (RECORD_ORDER) s.order.push(id);
  }

  const chunks = [];
  req.on("data", (chunk) => chunks.push(chunk));
  req.on("end", () => {
    const body = chunks.length === 1 ? chunks[0] : Buffer.concat(chunks);
    s.bytesIn += body.length;
    checkSignature(s, name, req.headers, body);
    if (KEEP > 0) {
      ctx.entry = { at_ms: now, method: req.method, path: req.url, headers: req.headers, body, status: null };
      if (s.recent.push(ctx.entry) > KEEP) s.recent.shift();
    }
    // In flight from the full request to its answer. A 'close' listener on every
    // response costs ~10% throughput, so only those not answered at once get one.
    if (++s.inFlight > s.maxConcurrent) s.maxConcurrent = s.inFlight;
    if (valid) kind[2](ctx, params);
    else fail(ctx, kind === undefined ? 404 : 400);
    if (!ctx.done) res.once("close", () => finish(ctx));
  });
}

function nameStats(s) {
  return {
    requests: s.requests,
    responses: s.responses,
    distinct_ids: s.ids.size,
    delivered_ids: s.delivered,
    missing_id: s.missingId,
    duplicates: s.duplicates,
    duplicate_ids_sample: s.duplicateIds,
    sig_ok: s.sigOk,
    sig_bad: s.sigBad,
    sig_unchecked: s.sigUnchecked,
    in_flight: s.inFlight,
    max_concurrent: s.maxConcurrent,
    bytes_in: s.bytesIn,
    first_request_ms: s.firstMs,
    last_request_ms: s.lastMs,
  };
}

const SUMMED = [
  "requests", "distinct_ids", "delivered_ids", "missing_id", "duplicates",
  "sig_ok", "sig_bad", "sig_unchecked", "in_flight", "bytes_in",
];

function stats() {
  const totals = Object.fromEntries(SUMMED.map((k) => [k, 0]));
  totals.responses = {};
  const perName = {};
  for (const [name, s] of names) {
    const ns = nameStats(s);
    perName[name] = ns;
    for (const k of SUMMED) totals[k] += ns[k];
    for (const [code, n] of Object.entries(ns.responses)) {
      totals.responses[code] = (totals.responses[code] ?? 0) + n;
    }
  }
  const cpu = process.cpuUsage();
  return {
    uptime_ms: Date.now() - startedAt, started_at_ms: startedAt,
    cpu_user_ms: Math.round(cpu.user / 1000), cpu_system_ms: Math.round(cpu.system / 1000),
    totals, names: perName,
  };
}

function sendJson(res, status, value) {
  res.writeHead(status, JSON_HEADERS);
  res.end(JSON.stringify(value));
}

const MODES = new Set(["ok", "fail", "hang"]);

function handleControl(req, res, segments, body) {
  const op = segments[1];
  const name = segments.slice(2).join("/");
  let input = {};
  if (body.length > 0) {
    try {
      input = JSON.parse(body);
    } catch {
      return sendJson(res, 400, { error: "body is not JSON" });
    }
  }
  const s = names.get(name);
  if (req.method === "GET" && op === "_stats") return sendJson(res, 200, stats());
  if (req.method === "POST" && op === "_reset") {
    // Names with open requests (e.g. /dead) are reset in place: those requests
    // still hold their state object and decrement its in_flight when they close.
    for (const [n, old] of names) {
      if (old.inFlight === 0) names.delete(n);
      else Object.assign(old, newState(n), { inFlight: old.inFlight, maxConcurrent: old.inFlight });
    }
    return sendJson(res, 200, {});
  }
  if (name === "") return sendJson(res, 404, { error: "unknown control path" });
  if (req.method === "POST" && op === "_control") {
    const status = input.status ?? 500;
    if (!MODES.has(input.mode) || !isStatus(status)) {
      return sendJson(res, 400, { error: "mode must be ok, fail or hang; status 200-599" });
    }
    toggles.set(name, { mode: input.mode, status });
    return sendJson(res, 200, {});
  }
  if (req.method === "POST" && op === "_secrets") {
    if (!Array.isArray(input.secrets)) return sendJson(res, 400, { error: "secrets must be a list" });
    keysByName.set(name, input.secrets.map(decodeSecret));
    return sendJson(res, 200, {});
  }
  if (req.method === "GET" && op === "_requests") {
    const recent = s === undefined ? [] : s.recent;
    return sendJson(res, 200, recent.map((e) => ({ ...e, body: e.body.toString("base64") })));
  }
  if (req.method === "GET" && op === "_arrivals") {
    const arrivals = {};
    if (s !== undefined) for (const [id, ms] of s.ids) if (ms > 0) arrivals[id] = ms;
    return sendJson(res, 200, arrivals);
  }
  if (req.method === "GET" && op === "_order") {
    return sendJson(res, 200, s === undefined ? [] : s.order);
  }
  return sendJson(res, 404, { error: "unknown control path" });
}

const server = createServer((req, res) => {
  const q = req.url.indexOf("?");
  const segments = (q === -1 ? req.url : req.url.slice(0, q)).split("/");
  if (segments[1]?.startsWith("_")) {
    const chunks = [];
    req.on("data", (chunk) => chunks.push(chunk));
    req.on("end", () => handleControl(req, res, segments, Buffer.concat(chunks).toString()));
  } else {
    handleDelivery(req, res, segments);
  }
});

// Long keep-alive so the engine's connection reuse is what gets measured;
// no request timeout so /dead hangs until the client gives up.
server.keepAliveTimeout = 60_000;
server.headersTimeout = 65_000;
server.requestTimeout = 0;

function shutdown() {
  if (opts["stats-file"]) writeFileSync(opts["stats-file"], JSON.stringify(stats(), null, 2));
  process.exit(0);
}
process.on("SIGTERM", shutdown);
process.on("SIGINT", shutdown);

// A backlog above Node's default 511: two workers open ~1,000 connections at once at start.
server.listen({ port: Number(opts.port), host: opts.host, backlog: 4096 }, () => {
  process.stdout.write(`${JSON.stringify({ port: server.address().port })}\n`);
});
