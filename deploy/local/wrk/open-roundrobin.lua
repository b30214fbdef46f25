-- wrk script: opens the packets listed in $IDS (one ID per line) round robin,
-- each open by a fresh act_id, with the API key $REDCELL_API_KEY (else $KEY);
-- prints how many opens took a new claim ("repeat":false), and that count on
-- a line "REDCELL_FRESH <n>" for `redcell bench --external` (common.lua). Use:
--   IDS=var/wrk-packets.txt KEY=$(cat var/api-key) \
--     wrk -t2 -c64 -d10s -s deploy/local/wrk/open-roundrobin.lua http://127.0.0.1:8080
-- One packet's ID in $IDS opens that packet alone (the hot open, make-hot.sh).
dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "common.lua")
local ids = {}
for line in io.lines(os.getenv("IDS")) do ids[#ids + 1] = line end
what = "fresh claims"
function fresh(status, body) return status == 200 and string.find(body, '"repeat":false', 1, true) ~= nil end
function request()
  local act = next_id("w")
  return wrk.format(nil, "/v1/packets/" .. ids[(n % #ids) + 1] .. "/open", nil, '{"act_id":"' .. act .. '"}')
end
