-- a module for k.blocking("poolmod.fn") specs: required in the pool threads' own states
local ffi = require "ffi"
ffi.cdef [[
int poll(void *fds, unsigned long nfds, int timeout);
struct kh_spec_timespec { long tv_sec; long tv_nsec; };
int clock_gettime(int clk, struct kh_spec_timespec *ts);
]]
local ts = ffi.new("struct kh_spec_timespec")
local function now_ms()
    ffi.C.clock_gettime(1, ts) -- CLOCK_MONOTONIC
    return tonumber(ts.tv_sec) * 1000 + tonumber(ts.tv_nsec) / 1e6
end

local M = {}
function M.add(a, b) return a + b end
function M.echo(...) return ... end
function M.fail() error("failed by name") end
-- blocks this pool thread for ms milliseconds without using the CPU
function M.sleep_ms(ms, result)
    local deadline = now_ms() + ms
    while true do
        local left = deadline - now_ms()
        if left <= 0 then break end
        ffi.C.poll(nil, 0, math.ceil(left))
    end
    return result or "done"
end
-- holds this pool thread until the file dir/release exists; appends a line to dir/started
-- first, so that a spec knows a thread took the job (no guessed sleeps)
function M.hold(dir, result)
    local f = assert(io.open(dir .. "/started", "a"))
    f:write("started\n")
    f:close()
    while true do
        local r = io.open(dir .. "/release", "r")
        if r then r:close() break end
        ffi.C.poll(nil, 0, 10)
    end
    return result or "done"
end
return M
