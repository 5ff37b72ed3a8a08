-- bench/apps/waitbench_pool.lua: pool-side helpers (required in the pool threads' states).
local ffi = require "ffi"
ffi.cdef [[
int poll(void *fds, unsigned long nfds, int timeout);
struct kh_wb_timespec { long tv_sec; long tv_nsec; };
int clock_gettime(int clk, struct kh_wb_timespec *ts);
]]
local ts = ffi.new("struct kh_wb_timespec")
local function now_ms()
    ffi.C.clock_gettime(1, ts)
    return tonumber(ts.tv_sec) * 1000 + tonumber(ts.tv_nsec) / 1e6
end
local M = {}
function M.sleep_ms(ms)
    local deadline = now_ms() + ms
    while true do
        local left = deadline - now_ms()
        if left <= 0 then break end
        ffi.C.poll(nil, 0, math.ceil(left))
    end
    return "done"
end
return M
