-- wrk script: opens the packets listed in $IDS (one ID per line) round robin,
-- each open by a fresh act_id, with the API key $REDCELL_API_KEY (else $KEY);
-- prints how many opens took a new claim ("repeat":false), and that count on
-- a line "REDCELL_FRESH <n>" for `redcell bench --external`. Use:
--   IDS=var/wrk-packets.txt KEY=$(cat var/api-key) RUN=$RANDOM \
--     wrk -t2 -c64 -d10s -s deploy/local/wrk/open-roundrobin.lua http://127.0.0.1:8080
-- One packet's ID in $IDS opens that packet alone (the hot open, make-hot.sh).
local ids = {}
for line in io.lines(os.getenv("IDS")) do ids[#ids + 1] = line end
-- Under `redcell bench --external` the cluster's key wins; RUN (else the clock) keeps act_ids new.
local key = os.getenv("REDCELL_API_KEY") or os.getenv("KEY")
local run = os.getenv("RUN") or tostring(os.time())
-- Globals, not locals: setup (in wrk's main state) sets each thread's tid,
-- and done reads each thread's fresh, through thread:set and thread:get.
threads, nthreads, tid, n, fresh = {}, 0, 0, 0, 0
function setup(thread)
  nthreads = nthreads + 1
  thread:set("tid", nthreads)
  table.insert(threads, thread)
end
function init(args) n = tid * 100000000 end -- each thread its own act_ids
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. key
function request()
  n = n + 1
  local id = ids[(n % #ids) + 1]
  return wrk.format(nil, "/v1/packets/" .. id .. "/open", nil, '{"act_id":"w' .. run .. "t" .. n .. '"}')
end
function response(status, headers, body)
  if status == 200 and string.find(body, '"repeat":false', 1, true) then fresh = fresh + 1 end
end
function done(summary, latency, requests)
  local total = 0
  for _, t in ipairs(threads) do total = total + t:get("fresh") end
  io.write(string.format("fresh claims %d of %d requests (%.1f/s), non-2xx %d\n", total, summary.requests,
    total / (summary.duration / 1e6), summary.errors.status))
  io.write(string.format("REDCELL_FRESH %d\n", total))
end
