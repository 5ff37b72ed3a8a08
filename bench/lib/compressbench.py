#!/usr/bin/env python3
"""bench/lib/compressbench.py: driver of bench/compress.sh (see there).

Server CPU per MB of payload, for khamsin (compress=1 at each coding and level, and compress=0)
and nginx (static file, gzip on at each gzip_comp_level, and gzip off), same payloads, same run,
servers alternated round by round, each pinned (server on SERVER_CORE, wrk on WRK_CORE).
Compression CPU per MB = CPU per MB at a level minus the same server's CPU per MB uncompressed.
"""
import json, os, socket, statistics, subprocess, sys, tempfile, time, zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402
import method  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("KHAMSIN_BIN", os.path.join(ROOT, "build-release", "khamsin"))
DURATION = int(os.environ.get("DURATION", "5"))
CONNS = int(os.environ.get("CONNS", "8"))
SERVER_CORE = os.environ.get("SERVER_CORE", "1")
WRK_CORE = os.environ.get("WRK_CORE", "0")
PORT = int(os.environ.get("BASE_PORT", "24080"))


def payloads(d):
    items = [{"id": i, "name": f"user {i}", "email": f"user{i}@example.com", "active": i % 3 == 0,
              "roles": ["reader", "writer"][: 1 + i % 2], "score": round(i * 1.37, 2),
              "bio": "Lorem ipsum dolor sit amet, consectetur adipiscing elit " * (1 + i % 3)}
             for i in range(120)]
    js = json.dumps({"items": items, "total": len(items)}, separators=(",", ":")).encode()
    rows = "".join(f"<tr><td>{i}</td><td><a href=\"/users/{i}\">user {i}</a></td>"
                   f"<td class=\"email\">user{i}@example.com</td><td>{i * 1.37:.2f}</td></tr>\n"
                   for i in range(200))
    html = ("<!doctype html><html><head><meta charset=\"utf-8\"><title>Users</title>"
            "<link rel=\"stylesheet\" href=\"/s.css\"></head><body><h1>Users</h1><table>\n"
            + rows + "</table></body></html>\n").encode()
    for name, data in (("payload.json", js), ("payload.html", html)):
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    return {"json": len(js), "html": len(html)}


def khamsin_app(d):
    app = os.path.join(d, "app.lua")
    with open(app, "w") as f:
        f.write(f"""local k = require "khamsin"
local function slurp(p) local f = assert(io.open(p, "rb")); local s = f:read("*a"); f:close(); return s end
local js, html = slurp("{d}/payload.json"), slurp("{d}/payload.html")
k.get("/payload.json", function(req, res) res.headers["Content-Type"] = "application/json"; return js end)
k.get("/payload.html", function(req, res) res.headers["Content-Type"] = "text/html; charset=utf-8"; return html end)
""")
    return app


def nginx_dir(d, level):
    nd = os.path.join(d, f"nginx-{level}")
    os.makedirs(nd, exist_ok=True)
    gz = (f"gzip on; gzip_comp_level {level}; gzip_min_length 1024; gzip_vary on;"
          " gzip_types application/json text/html;") if level else "gzip off;"
    user = "user root;" if os.getuid() == 0 else ""
    with open(os.path.join(nd, "nginx.conf"), "w") as f:
        f.write(f"""{user}
worker_processes 1; daemon off; master_process on; pid {nd}/nginx.pid;
error_log {nd}/error.log warn;
events {{ worker_connections 1024; }}
http {{
  access_log off; keepalive_requests 1000000;
  client_body_temp_path {nd}/cb; proxy_temp_path {nd}/p; fastcgi_temp_path {nd}/f;
  uwsgi_temp_path {nd}/u; scgi_temp_path {nd}/s;
  types {{ application/json json; text/html html; }}
  server {{ listen 127.0.0.1:{PORT}; root {d}; {gz} }}
}}
""")
    return nd


def start(cfg, d):
    if cfg["server"] == "khamsin":
        cmd = ["taskset", "-c", SERVER_CORE, BIN, "--workers", "1", "--listen", f"127.0.0.1:{PORT}",
               "--limit", f"compress={1 if cfg['coding'] else 0}"]
        if cfg["coding"]:
            cmd += ["--limit", f"compress_{cfg['coding']}_level={cfg['level']}"]
        cmd.append(khamsin_app(d))
    else:
        nd = nginx_dir(d, cfg["level"])
        cmd = ["taskset", "-c", SERVER_CORE, "nginx", "-p", nd, "-c", os.path.join(nd, "nginx.conf")]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", PORT), timeout=0.2).close()
            return p
        except OSError:
            time.sleep(0.05)
    p.kill()
    raise SystemExit(f"{cfg['name']} did not start")


def stop(p):
    pids = benchlib.tree(p.pid)
    for pid in pids:
        try:
            os.kill(pid, 15)
        except OSError:
            pass
    try:
        p.wait(5)
    except subprocess.TimeoutExpired:
        for pid in pids:
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        p.wait()
    time.sleep(0.2)


def one_response(path, ae):
    out = subprocess.run(["curl", "-s", "-D", "-", "-o", "/dev/stdout", "-H", f"Accept-Encoding: {ae}",
                          f"http://127.0.0.1:{PORT}{path}"], capture_output=True).stdout
    head, _, body = out.partition(b"\r\n\r\n")
    ce = [l.split(b":", 1)[1].strip().decode() for l in head.split(b"\r\n")
          if l.lower().startswith(b"content-encoding:")]
    return (ce[0] if ce else "identity"), len(body)


def wrk(path, ae, secs=None):
    lua = os.path.join(tempfile.gettempdir(), f"khcb-{os.getpid()}.lua")
    with open(lua, "w") as f:
        f.write(f'wrk.path = "{path}"\nwrk.headers["Accept-Encoding"] = "{ae}"\n')
    cmd = ["taskset", "-c", WRK_CORE, "wrk", "-t1", f"-c{CONNS}", f"-d{secs or DURATION}s", "--timeout", "10s", "-s", lua,
           f"http://127.0.0.1:{PORT}{path}"]
    out = subprocess.run(cmd, capture_output=True, text=True).stdout
    return benchlib.parse_wrk(out)


def main():
    d = tempfile.mkdtemp(prefix="khcompress-")
    sizes = payloads(d)
    # CODINGS narrows the set (all.sh runs "gzip"): the codings khamsin runs; nginx runs gzip.
    want = os.environ.get("CODINGS", "gzip br zstd").split()
    glevels = tuple(int(x) for x in os.environ.get("GZIP_LEVELS", "1 5 9").split())
    cfgs = [{"server": "khamsin", "coding": None, "level": 0}]
    for coding, levels in (("gzip", glevels), ("br", (1, 4, 6)), ("zstd", (1, 3, 9))):
        if coding in want:
            for lv in levels:
                cfgs.append({"server": "khamsin", "coding": coding, "level": lv})
    cfgs.append({"server": "nginx", "coding": None, "level": 0})
    for lv in glevels:
        cfgs.append({"server": "nginx", "coding": "gzip", "level": lv})
    for c in cfgs:
        c["name"] = f"{c['server']} {c['coding'] or 'identity'}{'-' + str(c['level']) if c['coding'] else ''}"
    # PAYLOADS narrows the payloads (all.sh runs "json": html gave the same ratio, x0.94 vs x0.95
    # on 2026-12-02, summary-20261202-0452.md)
    kinds = tuple(k for k in os.environ.get("PAYLOADS", "json html").split() if k in ("json", "html")) or ("json", "html")
    size = {}
    rows = []
    print(f"# khamsin bench: compression CPU per MB (bench/compress.sh)")
    print(f"date:     {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}")
    print(f"command:  ROUNDS={os.environ.get('ROUNDS', '')} DURATION={DURATION} CONNS={CONNS} CODINGS=\"{' '.join(want)}\" "
          f"GZIP_LEVELS=\"{' '.join(map(str, glevels))}\" PAYLOADS=\"{' '.join(kinds)}\" bench/compress.sh; binary {BIN}")
    print(f"git:      {subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True).stdout.strip()}")
    print(f"cpu:      {method.cpu_model()}")
    rounds = method.Rounds(d)
    print(rounds.line(), flush=True)
    for rnd in rounds:
        print(f"round {rnd}", flush=True)
        order = cfgs if rnd % 2 else list(reversed(cfgs))  # alternate the order
        base = {}
        got_rows = []
        for c in order:
            p = start(c, d)
            try:
                for k in kinds:
                    path = f"/payload.{k}"
                    ae = c["coding"] or "identity"
                    got, n = one_response(path, ae)
                    if got != ae:
                        raise SystemExit(f"{c['name']}: asked {ae}, got {got}")
                    size[(c["name"], k)] = n
                    wrk(path, ae, 1)  # warm-up
                    before = benchlib.cpu_snapshot(p.pid)
                    r = wrk(path, ae)
                    after = benchlib.cpu_snapshot(p.pid)
                    cpu, _ = benchlib.cpu_delta_seconds(before, after)
                    if not r["requests"] or any("Non-2xx" in e for e in r["errors"]):
                        raise SystemExit(f"{c['name']} {k}: wrk failed {r}")
                    mb = r["requests"] * sizes[k] / 1e6
                    ms_mb = cpu / mb * 1e3
                    if not c["coding"]:
                        base[(c["server"], k)] = ms_mb
                    got_rows.append((c, k, ms_mb, r["requests"] / cpu))
                    print(f"  {c['name']:<20} {k}: {ms_mb:.2f} CPU ms/MB, {r['requests'] / cpu:.0f} req/CPU-s", flush=True)
            finally:
                stop(p)
        for c, k, ms_mb, rpc in got_rows:
            if not c["coding"]:
                continue
            # the anchor's name is the server's name; the case names the coding and level, so
            # khamsin gzip-5 pairs with nginx gzip-5 in the same round
            rows.append({"round": rnd, "server": "khamsin" if c["server"] == "khamsin" else "nginx-gzip",
                         "case": f"{k} {c['coding']}-{c['level']}", "ms_per_mb": ms_mb,
                         "compr_ms_per_mb": ms_mb - base[(c["server"], k)], "req_per_cpu": rpc})
    print(f"\npayloads: json {sizes['json']} B, html {sizes['html']} B; {DURATION} s windows, "
          f"{CONNS} connections, server on core {SERVER_CORE}, wrk on core {WRK_CORE}")
    print("compr_ms_per_mb = server CPU ms per MB of (uncompressed) payload served at that coding and level, minus the "
          "same server's identity figure of the same round; sizes (compressed/original):")
    for c in cfgs:
        if c["coding"]:
            print("  " + c["name"] + ": " + ", ".join(f"{k} {size[(c['name'], k)] / sizes[k]:.3f}" for k in kinds))
    method.summarize(rows, rounds, metric=["compr_ms_per_mb"], lower=["compr_ms_per_mb"], group="case",
                     anchor="nginx-gzip", label="compression CPU per MB (vs nginx gzip)")
    print("## Appendix: rows")
    for r in rows:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
