local k = require "khamsin"
k.get("/", function(req) return "Hello, World!" end)
