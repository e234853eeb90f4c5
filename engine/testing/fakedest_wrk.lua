-- Load check for fakedest.mjs (beside this file): keep-alive POSTs with a distinct webhook-id each.
--   wrk -t1 -c64 -d5s -s engine/testing/fakedest_wrk.lua http://127.0.0.1:PORT/fast/load
local n = 0
wrk.method = "POST"
wrk.body = '{"type":"load.test","data":{"n":1,"text":"' .. string.rep("x", 200) .. '"}}'
wrk.headers["content-type"] = "application/json"
wrk.headers["webhook-timestamp"] = "1700000000"
wrk.headers["webhook-signature"] = "v1,AAAA"

request = function()
  n = n + 1
  -- The random part keeps ids distinct across wrk threads, which each run this script.
  wrk.headers["webhook-id"] = "msg_" .. n .. "_" .. math.random(1e9)
  return wrk.format()
end
