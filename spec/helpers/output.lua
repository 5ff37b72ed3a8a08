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
    -- KHAMSIN_SPEC_FILES=1: the wall time of each spec file (its setup, servers and all), the
    -- slowest first, at the end: where the suite's time goes
    local file_times = os.getenv("KHAMSIN_SPEC_FILES")
    file_times = file_times ~= nil and file_times ~= "" and file_times ~= "0"
    local started, slow = {}, {}
    local file_started, files = {}, {}

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
        if file_times then
            busted.subscribe({ "file", "start" }, function(element)
                file_started[element] = clock()
                return nil, true
            end)
            busted.subscribe({ "file", "end" }, function(element)
                local t0 = file_started[element]
                if t0 then files[#files + 1] = { clock() - t0, element.name } end
                return nil, true
            end)
        end
        busted.subscribe({ "exit" }, function()
            if #files > 0 then
                table.sort(files, function(a, b) return a[1] > b[1] end)
                local lines, total = {}, 0
                for _, f in ipairs(files) do
                    total = total + f[1]
                    lines[#lines + 1] = string.format("%7.1f s  %s", f[1], f[2])
                end
                io.stdout:write(string.format("\nspec files (%.1f s in all):\n%s\n", total,
                    table.concat(lines, "\n")))
            end
            if #slow > 0 then
                io.stdout:write("\nslow specs:\n" .. table.concat(slow, "\n") .. "\n")
            end
            -- the failures again, a line each, right above the summary: a CI log that keeps only
            -- its last lines still names what failed (.ci/test.sh repeats these lines at its end)
            local names = {}
            for _, list in ipairs({ handler.failures, handler.errors }) do
                for _, f in ipairs(list) do
                    local where = f.trace and f.trace.short_src and
                        (f.trace.short_src .. ":" .. tostring(f.trace.currentline)) or "?"
                    names[#names + 1] = "FAILED SPEC: " .. tostring(f.name) .. " (" .. where .. ")"
                end
            end
            if #names > 0 then io.stdout:write("\n" .. table.concat(names, "\n") .. "\n") end
            local passed = handler.successesCount
            local failed = handler.failuresCount + handler.errorsCount
            io.stdout:write(string.format("\n%d passed, %d failed\n", passed, failed))
            io.stdout:flush()
            return nil, true
        end)
    end
    return handler
end
