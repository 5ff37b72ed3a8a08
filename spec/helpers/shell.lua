-- spec/helpers/shell.lua: running a shell command from a spec.
--   out(cmd): its stdout (stderr not captured), whatever the exit status.
--   run(cmd): its stdout+stderr and its exit code (0 on success).
local M = {}

function M.out(cmd)
    local p = assert(io.popen(cmd, "r"))
    local out = p:read("*a")
    p:close()
    return out
end

function M.run(cmd)
    local p = assert(io.popen(cmd .. " 2>&1", "r"))
    local out = p:read("*a")
    local ok, _, code = p:close()
    if type(ok) == "number" then code = ok end
    return out, (ok == true or code == 0) and 0 or code
end

return M
