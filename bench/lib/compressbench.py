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

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("KHAMSIN_BIN", os.path.join(ROOT, "build-release", "khamsin"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
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
    cfgs = [{"server": "khamsin", "coding": None, "level": 0}]
    for coding, levels in (("gzip", (1, 5, 9)), ("br", (1, 4, 6)), ("zstd", (1, 3, 9))):
        for lv in levels:
            cfgs.append({"server": "khamsin", "coding": coding, "level": lv})
    cfgs.append({"server": "nginx", "coding": None, "level": 0})
    for lv in (1, 5, 9):
        cfgs.append({"server": "nginx", "coding": "gzip", "level": lv})
    for c in cfgs:
        c["name"] = f"{c['server']} {c['coding'] or 'identity'}{'-' + str(c['level']) if c['coding'] else ''}"
    kinds = ("json", "html")
    res = {(c["name"], k): [] for c in cfgs for k in kinds}
    size = {}
    for rnd in range(ROUNDS):
        order = cfgs if rnd % 2 == 0 else list(reversed(cfgs))  # alternate the order
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
                    res[(c["name"], k)].append((cpu / mb * 1e3, r["requests"] / cpu))
            finally:
                stop(p)
    print(f"payloads: json {sizes['json']} B, html {sizes['html']} B; {ROUNDS} rounds x {DURATION} s, "
          f"{CONNS} connections, server on core {SERVER_CORE}, wrk on core {WRK_CORE}")
    print("CPU ms per MB of payload (uncompressed MB served): median [min-max]; compression ms/MB = "
          "that minus the same server's identity; ratio = compressed/original size")
    for k in kinds:
        print(f"\n== {k} ==")
        print(f"{'config':<22}{'size':>8}{'ratio':>7}{'ms/MB':>9}{'[min-max]':>16}{'compr ms/MB':>13}{'req/CPU-s':>11}")
        base = {}
        for c in cfgs:
            v = res[(c["name"], k)]
            med = statistics.median(x[0] for x in v)
            if not c["coding"]:
                base[c["server"]] = med
        med_of = {}
        for c in cfgs:
            v = res[(c["name"], k)]
            med = statistics.median(x[0] for x in v)
            med_of[c["name"]] = med - base[c["server"]]
            rps = statistics.median(x[1] for x in v)
            n = size[(c["name"], k)]
            print(f"{c['name']:<22}{n:>8}{n / sizes[k]:>7.3f}{med:>9.2f}"
                  f"{'[%.2f-%.2f]' % (min(x[0] for x in v), max(x[0] for x in v)):>16}"
                  f"{med - base[c['server']]:>13.2f}{rps:>11.0f}")
        for lv in (1, 5, 9):
            a, b = med_of.get(f"khamsin gzip-{lv}"), med_of.get(f"nginx gzip-{lv}")
            if a and b:
                print(f"gzip-{lv}: compression ms/MB khamsin/nginx = {a / b:.2f}")


if __name__ == "__main__":
    main()
