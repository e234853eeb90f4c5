-- wrk load for the ingress API, a cross-check of the locust figures with a load generator
-- that costs almost no CPU (driven by the ingress scenario, ingress.py).
--   BENCH_MODE=single|batch BENCH_BATCH=1000 BENCH_PAYLOAD=1024 \
--   wrk -t2 -c64 -d10s --latency -s bench/harness/ingress_wrk.lua http://127.0.0.1:8080
local mode = os.getenv("BENCH_MODE") or "single"
local batch = tonumber(os.getenv("BENCH_BATCH") or "1000")
local payload_bytes = tonumber(os.getenv("BENCH_PAYLOAD") or "1024")

local event = '{"type": "order.created", "payload": {"order": 42, "note": "'
  .. string.rep("x", math.max(0, payload_bytes - 30)) .. '"}}'

wrk.method = "POST"
wrk.headers["content-type"] = "application/json"
local token = os.getenv("BENCH_TOKEN")
if token and token ~= "" then
  wrk.headers["authorization"] = "Bearer " .. token
end
if mode == "batch" then
  local events = {}
  for i = 1, batch do
    events[i] = event
  end
  wrk.path = "/v1/events/batch"
  wrk.body = '{"events": [' .. table.concat(events, ", ") .. "]}"
else
  wrk.path = "/v1/events"
  wrk.body = event
end

-- BENCH_DELAY_MS > 0: each connection waits that long after an answer (a paced load).
local delay_ms = tonumber(os.getenv("BENCH_DELAY_MS") or "0")
if delay_ms > 0 then
  function delay()
    return delay_ms
  end
end
