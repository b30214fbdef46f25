-- wrk script: asks for one coupon of batch $BATCH (default bench-cold-1, a
-- large stock) per request, each for a fresh act_id under its own serial
-- number, with the API key $REDCELL_API_KEY (else $KEY); prints how many
-- were accepted (202), and that count on a line "REDCELL_FRESH <n>" for
-- `redcell bench --external` (common.lua). Use:
--   KEY=$(cat var/api-key) wrk -t2 -c16 -d10s -s deploy/local/wrk/coupon.lua http://127.0.0.1:8080
-- Real coupons from the batch's real stock: use it on a test cluster.
dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "common.lua")
local batch = os.getenv("BATCH") or "bench-cold-1"
what = "accepted"
function fresh(status, body) return status == 202 end
function request()
  local id = next_id("wc")
  return wrk.format(nil, "/v1/coupons/issue", nil, '{"act_id":"' .. id .. '","batch_id":"' .. batch .. '","serial_no":"' .. id .. '"}')
end
