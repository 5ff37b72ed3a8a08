-- khamsin-scm-1.rockspec: installs khamsin from a checkout into a LuaRocks tree.
--   luarocks --lua-version=5.1 --tree=DIR make LUA_INCDIR=/usr/include/luajit-2.1
-- (offline; LUA_INCDIR where no Lua 5.1 headers are found, as on Debian with only LuaJIT).
-- DIR/bin/khamsin is the server (its Lua modules built in as bytecode, nothing read from the
-- checkout: KH_RELOCATABLE); DIR/lib/lua/5.1/khamsin/khamsin-tls.so its TLS module (found
-- relative to the binary, core/kh_tls_load.c); DIR/share/lua/5.1/khamsin.lua and khamsin/*
-- the modules as source, khamsin/test.lua the busted helper (require "khamsin.test") and
-- khamsin/library/khamsin.lua the LuaLS annotations.
-- scm: a checkout builds what it holds; the version khamsin reports comes from CMakeLists.txt.
rockspec_format = "3.0"
package = "khamsin"
version = "scm-1"
source = {
   url = "git+https://example.invalid/khamsin.git", -- not used by `luarocks make`
}
description = {
   summary = "HTTP/1.1, HTTP/2 and TLS 1.3 server whose services are Lua scripts (LuaJIT)",
   detailed = [[
khamsin is an HTTP engine in C (libuv, nghttp2, OpenSSL for the TLS 1.3 handshake) embedding
LuaJIT: a service is a Lua script of routes and handlers. The rock installs the khamsin binary,
its TLS module, khamsin.test (start an app from busted specs and make requests over h1 and h2)
and LuaLS annotations for editors.]],
   labels = { "http", "http2", "server", "luajit" },
}
-- the binary embeds LuaJIT; "lua" is only what the Lua modules (khamsin.test) run on
dependencies = { "lua >= 5.1" }
build = {
   type = "cmake",
   variables = {
      CMAKE_INSTALL_PREFIX = "$(PREFIX)",
      CMAKE_BUILD_TYPE = "RelWithDebInfo",
      KH_LUA_DIR = "$(LUADIR)",
      KH_TLS_MODULE_DIR = "$(LIBDIR)/khamsin",
      KH_RELOCATABLE = "ON",
      KH_TESTS = "OFF",
   },
}
