-- wrk script: issues one 1-cent cash reward of demo-festival/rain per
-- request, each to a fresh act_id, with the API key $REDCELL_API_KEY (else
-- $KEY); prints how many were new ("repeat":false), and that
-- count on a line "REDCELL_FRESH <n>" for `redcell bench --external`. Use:
--   KEY=$(cat var/api-key) RUN=$RANDOM wrk -t2 -c16 -d10s -s deploy/local/wrk/reward.lua http://127.0.0.1:8080
-- Real rewards into real wallets: use it on a test cluster.
-- Under `redcell bench --external` the cluster's key wins; RUN (else the clock) keeps act_ids new.
local key = os.getenv("REDCELL_API_KEY") or os.getenv("KEY")
local run = os.getenv("RUN") or tostring(os.time())
threads, nthreads, tid, n, fresh = {}, 0, 0, 0, 0
function setup(thread)
  nthreads = nthreads + 1
  thread:set("tid", nthreads)
  table.insert(threads, thread)
end
function init(args) n = tid * 100000000 end
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. key
function request()
  n = n + 1
  return wrk.format(nil, "/v1/rewards", nil, '{"parent_activity_id":"demo-festival","scene_id":"rain","rain_id":"r1",' ..
    '"award_type":"cash","amount":1,"act_id":"wr' .. run .. "t" .. n .. '"}')
end
function response(status, headers, body)
  if status == 200 and string.find(body, '"repeat":false', 1, true) then fresh = fresh + 1 end
end
function done(summary, latency, requests)
  local total = 0
  for _, t in ipairs(threads) do total = total + t:get("fresh") end
  io.write(string.format("new rewards %d of %d requests (%.1f/s), non-2xx %d\n", total, summary.requests,
    total / (summary.duration / 1e6), summary.errors.status))
  io.write(string.format("REDCELL_FRESH %d\n", total))
end
