#!/usr/bin/python3
"""Drives headless Chromium over the DevTools protocol (python3-websockets) for
spec/chat_spec.lua: opens URL, waits until the page's #ws-log and #sse-log hold WANT (a
substring), and prints what the page shows as JSON: {"proto", "ws_state", "sse_state",
"ws_log": [...], "sse_log": [...]}. --dump-dom cannot be used: the page keeps a WebSocket and an
EventSource open, so it never settles. Flags from /work/wt/shared/platform.md.

  chromium.py URL WANT TIMEOUT_S [--spki BASE64]
"""
import asyncio, json, os, shutil, subprocess, sys, tempfile, time, urllib.request

import websockets


async def main(url, want, timeout, extra):
    prof = tempfile.mkdtemp(prefix="khchr.")
    args = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--user-data-dir=" + prof,
            "--remote-debugging-port=0", "--ignore-certificate-errors"] + extra + ["about:blank"]
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = os.path.join(prof, "DevToolsActivePort")
        deadline = time.time() + timeout
        while not os.path.exists(port_file) or os.path.getsize(port_file) == 0:
            if time.time() > deadline:
                raise RuntimeError("chromium did not start")
            await asyncio.sleep(0.1)
        port = open(port_file).read().split()[0]
        targets = json.load(urllib.request.urlopen("http://127.0.0.1:%s/json/list" % port, timeout=10))
        page = [t for t in targets if t["type"] == "page"][0]
        async with websockets.connect(page["webSocketDebuggerUrl"], max_size=None) as ws:
            n = 0

            async def call(method, **params):
                nonlocal n
                n += 1
                my = n
                await ws.send(json.dumps({"id": my, "method": method, "params": params}))
                while True:
                    m = json.loads(await ws.recv())
                    if m.get("id") == my:
                        return m.get("result")

            await call("Page.navigate", url=url)
            expr = """JSON.stringify({proto: document.getElementById('proto') && document.getElementById('proto').textContent,
              ws_state: document.getElementById('ws-state') && document.getElementById('ws-state').textContent,
              sse_state: document.getElementById('sse-state') && document.getElementById('sse-state').textContent,
              ws_log: Array.from(document.querySelectorAll('#ws-log li')).map(e => e.textContent),
              sse_log: Array.from(document.querySelectorAll('#sse-log li')).map(e => e.textContent)})"""
            shown = {}
            while time.time() < deadline:
                r = await call("Runtime.evaluate", expression=expr, returnByValue=True)
                try:
                    shown = json.loads(r["result"]["value"])
                except (KeyError, TypeError, ValueError):
                    shown = {}
                if any(want in x for x in shown.get("ws_log", [])) and any(want in x for x in shown.get("sse_log", [])):
                    break
                await asyncio.sleep(0.2)
            print(json.dumps(shown))
    finally:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
        shutil.rmtree(prof, ignore_errors=True)


asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4:]))
