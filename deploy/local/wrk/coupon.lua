-- wrk script: asks for one coupon of batch $BATCH (default bench-cold-1, a
-- large stock) per request, each for a fresh act_id under its own serial
-- number, with the API key $REDCELL_API_KEY (else $KEY); prints how many
-- were accepted (202), and that count on a line "REDCELL_FRESH <n>" for
-- `redcell bench --external`. Use:
--   KEY=$(cat var/api-key) RUN=$RANDOM wrk -t2 -c16 -d10s -s deploy/local/wrk/coupon.lua http://127.0.0.1:8080
-- Real coupons from the batch's real stock: use it on a test cluster.
-- Under `redcell bench --external` the cluster's key wins; RUN (else the clock) keeps act_ids new.
local key = os.getenv("REDCELL_API_KEY") or os.getenv("KEY")
local run = os.getenv("RUN") or tostring(os.time())
local batch = os.getenv("BATCH") or "bench-cold-1"
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
  local id = "wc" .. run .. "t" .. n
  return wrk.format(nil, "/v1/coupons/issue", nil, '{"act_id":"' .. id .. '","batch_id":"' .. batch .. '","serial_no":"' .. id .. '"}')
end
function response(status, headers, body)
  if status == 202 then fresh = fresh + 1 end
end
function done(summary, latency, requests)
  local total = 0
  for _, t in ipairs(threads) do total = total + t:get("fresh") end
  io.write(string.format("accepted %d of %d requests (%.1f/s), non-2xx %d\n", total, summary.requests,
    total / (summary.duration / 1e6), summary.errors.status))
  io.write(string.format("REDCELL_FRESH %d\n", total))
end
