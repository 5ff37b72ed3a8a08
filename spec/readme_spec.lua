-- The README's limits table is a copy of `khamsin --print-limits` (style.md "Limits"): a limit
-- added or changed in core/kh_limits.h without updating the README fails here.
local server = require "helpers.server"

describe("README", function()
    it("shows the limits table exactly as --print-limits prints it", function()
        local r = server.run { args = { "--print-limits" } }
        assert.are.equal(0, r.code)
        local readme = assert(server.read_file("README.md"), "run busted from the repository root")
        local block = readme:match("From `khamsin %-%-print%-limits`:%s*```\n(.-)```")
        assert.is_truthy(block, "README has no print-limits block")
        assert.are.equal(r.stdout, block)
    end)

    it("opens with make run and make test", function()
        local readme = assert(server.read_file("README.md"))
        local head = readme:sub(1, 1500)
        assert.is_truthy(head:find("make run", 1, true))
        assert.is_truthy(head:find("make test", 1, true))
    end)
end)
