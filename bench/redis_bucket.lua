-- The same token bucket as the Postgres competitors: KEYS[1] the bucket, ARGV[1] rate per
-- second, ARGV[2] capacity. Returns 1 when a token was taken, 0 when denied.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local rate, capacity = tonumber(ARGV[1]), tonumber(ARGV[2])
local s = redis.call('HMGET', KEYS[1], 'v', 'ts')
local v = tonumber(s[1]) or capacity
local ts = tonumber(s[2]) or now
v = math.min(capacity, v + (now - ts) * rate)
if v < 1 then
  return 0
end
redis.call('HSET', KEYS[1], 'v', v - 1, 'ts', now)
return 1
