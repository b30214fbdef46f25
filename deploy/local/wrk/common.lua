-- Shared by the wrk scripts of this folder (loaded with dofile): the API key
-- ($REDCELL_API_KEY, which `redcell bench --external` sets, else $KEY), a run
-- ID ($RUN, else the clock) that keeps act_ids new from run to run, act_ids
-- of each thread's own, a count of the fresh answers per thread (the
-- script's fresh(status, body)), and the summary: "<what> N of M requests
-- (R/s), non-2xx K", then "REDCELL_FRESH N" for `redcell bench --external`.
-- A script sets what (a label) and fresh, and builds its requests on
-- next_id(prefix).
local key = os.getenv("REDCELL_API_KEY") or os.getenv("KEY")
local run = os.getenv("RUN") or tostring(os.time())
-- Globals, not locals: setup (in wrk's main state) sets each thread's tid,
-- and done reads each thread's count, through thread:set and thread:get.
threads, nthreads, tid, n, count = {}, 0, 0, 0, 0
function setup(thread)
  nthreads = nthreads + 1
  thread:set("tid", nthreads)
  table.insert(threads, thread)
end
function init(args) n = tid * 100000000 end -- each thread its own act_ids
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. key
function next_id(prefix)
  n = n + 1
  return prefix .. run .. "t" .. n
end
function response(status, headers, body)
  if fresh(status, body) then count = count + 1 end
end
function done(summary, latency, requests)
  local total = 0
  for _, t in ipairs(threads) do total = total + t:get("count") end
  io.write(string.format("%s %d of %d requests (%.1f/s), non-2xx %d\n", what, total, summary.requests,
    total / (summary.duration / 1e6), summary.errors.status))
  io.write(string.format("REDCELL_FRESH %d\n", total))
end
