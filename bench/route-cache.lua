-- wrk script for bench/route-cache.sh: every request names one of the
-- seeded sandboxes `b{i:019}` by the E2B headers. MODE=seq walks the ids
-- START..IDS-1 and around (each thread its share, to fill the gateway's
-- cache); anything else picks one at random per request.
local threads = 0
function setup(thread)
  thread:set("tid", threads)
  threads = threads + 1
end

function init(args)
  n = tonumber(os.getenv("IDS"))
  sequential = os.getenv("MODE") == "seq"
  step = tonumber(os.getenv("WRK_THREADS") or "2")
  local start = tonumber(os.getenv("START") or "0")
  i = math.floor(start / step) * step + tid
  if i >= n then i = tid end
  math.randomseed(tid * 7919 + os.time())
end

function request()
  local k
  if sequential then
    k = i
    i = i + step
    if i >= n then i = tid end
  else
    k = math.random(0, n - 1)
  end
  return wrk.format("GET", "/health", {
    ["E2b-Sandbox-Id"] = string.format("b%019d", k),
    ["E2b-Sandbox-Port"] = "49983",
  })
end
