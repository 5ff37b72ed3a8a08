-- spec/helpers/app_snippets.lua: Lua source shared by the apps that specs hand to khamsin (the
-- app runs inside the server, so it cannot require this file; the spec pastes the snippet in).
local M = {}

-- r(...): a handler's results as a JSON list, nil as "nil" (needs `json` = k.json in scope).
M.RESULTS = [[
local function r(...) -- results as a JSON list (nil -> "nil")
    local t = { n = select("#", ...), ... }
    local out = {}
    for i = 1, t.n do out[i] = t[i] == nil and "nil" or t[i] end
    return json.encode(out)
end
]]

return M
