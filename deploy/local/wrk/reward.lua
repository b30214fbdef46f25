-- wrk script: issues one 1-cent cash reward of demo-festival/rain per
-- request, each to a fresh act_id, with the API key $REDCELL_API_KEY (else
-- $KEY); prints how many were new ("repeat":false), and that count on a line
-- "REDCELL_FRESH <n>" for `redcell bench --external` (common.lua). Use:
--   KEY=$(cat var/api-key) wrk -t2 -c16 -d10s -s deploy/local/wrk/reward.lua http://127.0.0.1:8080
-- Real rewards into real wallets: use it on a test cluster.
dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "common.lua")
what = "new rewards"
function fresh(status, body) return status == 200 and string.find(body, '"repeat":false', 1, true) ~= nil end
function request()
  return wrk.format(nil, "/v1/rewards", nil, '{"parent_activity_id":"demo-festival","scene_id":"rain","rain_id":"r1",' ..
    '"award_type":"cash","amount":1,"act_id":"' .. next_id("wr") .. '"}')
end
