-- spec/helpers/output.lua: busted output handler.
-- Prints busted's normal terminal output (utfTerminal on a tty, plainTerminal otherwise), then,
-- once the whole run is over, one line exactly "N passed, N failed" that CI parses.
-- "failed" counts failures and errors (an error in a setup/teardown or a spec that raised).
-- Pending specs are in neither count. busted itself exits non-zero when anything failed.
return function(options)
    local busted = require "busted"
    local term = require "term"
    local isatty = io.type(io.stdout) == "file" and term.isatty(io.stdout)
    local inner = isatty and "utfTerminal" or "plainTerminal"
    local handler = require("busted.outputHandlers." .. inner)(options)

    -- KHAMSIN_SPEC_SLOW=<seconds>: list the specs slower than that at the end (keep the suite fast)
    local slow_limit = tonumber(os.getenv("KHAMSIN_SPEC_SLOW") or "")
    local clock = os.clock
    do
        local ok, socket = pcall(require, "socket")
        if ok then clock = socket.gettime end
    end
    local started, slow = {}, {}

    local subscribe = handler.subscribe
    handler.subscribe = function(h, opts)
        subscribe(h, opts)
        if slow_limit then
            busted.subscribe({ "test", "start" }, function(element)
                started[element] = clock()
                return nil, true
            end)
            busted.subscribe({ "test", "end" }, function(element)
                local t0 = started[element]
                if t0 and clock() - t0 >= slow_limit then
                    slow[#slow + 1] = string.format("%6.2f s  %s", clock() - t0, handler.getFullName(element))
                end
                return nil, true
            end)
        end
        busted.subscribe({ "exit" }, function()
            if #slow > 0 then
                io.stdout:write("\nslow specs:\n" .. table.concat(slow, "\n") .. "\n")
            end
            local passed = handler.successesCount
            local failed = handler.failuresCount + handler.errorsCount
            io.stdout:write(string.format("\n%d passed, %d failed\n", passed, failed))
            io.stdout:flush()
            return nil, true
        end)
    end
    return handler
end
