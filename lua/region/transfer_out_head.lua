-- Transfer out (the primary's side of a transfer), around the acquire
-- script of the key's algorithm (token_bucket.lua or sliding_window.lua,
-- pasted in between this head and transfer_out_tail.lua at build time, so
-- the bucket math exists once).
--
-- KEYS[1]: the bucket; KEYS[2]: the transfer's record.
-- ARGV[1..6]: the acquire script's own arguments, `want` being the tokens
-- asked for, nothing given back and nothing reserved (ARGV[6] = 0: a
-- transfer takes only what the bucket holds); ARGV[7]: how long to
-- remember the transfer, in ms; ARGV[8]: `keep`, what the primary keeps
-- for its own traffic; ARGV[9]: where `want` is among ARGV (4 for the
-- token bucket, 3 for the windows).
--
-- Takes up to `want` tokens from the primary's own bucket, as a request
-- would, never leaving it fewer than `keep` (a first pass asks for none,
-- to read what the bucket holds now), and records the answer under the
-- transfer's id: a retried transfer gets the first answer and takes
-- nothing more. Reply: {granted, remaining, 0, 0, replayed (0 or 1)}.

local recorded = redis.call('GET', KEYS[2])
if recorded then return {tonumber(recorded), 0, 0, 0, 1} end
local remember = tonumber(ARGV[7])
local at = tonumber(ARGV[9] or 4)
local want = tonumber(ARGV[at])
local keep = tonumber(ARGV[8] or 0)
-- The acquire scripts read a cost's charge and need after their own
-- arguments, where this script's are: a transfer charges nothing and
-- needs no more than any grant.
ARGV[7], ARGV[8], ARGV[9] = nil, nil, nil

local function take()
