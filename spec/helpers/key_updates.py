#!/usr/bin/env python3
"""spec/helpers/key_updates.py HOST PORT N: a TLS 1.3 request through openssl s_client in which
the client asks for a KeyUpdate (update_requested: s_client's "K" command) N times, each time
followed by a header line (data under its new key), while the server sends nothing; prints
"sent S received R status C": the KeyUpdates the client sent and received (from -msg) and the
response's status code (0: none). RFC 8446 4.6.3 wants one KeyUpdate from a server that was
silent through all of them."""
import re
import select
import subprocess
import sys
import time

host, port, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
p = subprocess.Popen(["openssl", "s_client", "-connect", "%s:%s" % (host, port), "-msg", "-crlf",
                      "-quiet", "-no_ign_eof"],
                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
out = b""


def pump(seconds):
    global out
    end = time.time() + seconds
    while time.time() < end:
        r, _, _ = select.select([p.stdout], [], [], 0.02)
        if r:
            b = p.stdout.read1(65536)
            if not b:
                return False
            out += b
    return True


def send(line):
    # one line per read of s_client (it takes a command only at the start of what it reads)
    p.stdin.write(line.encode() + b"\n")
    p.stdin.flush()
    pump(0.03)


# the handshake first: s_client prints the server's Finished when it has it
end = time.time() + 10
while not re.search(rb"<<< TLS 1\.3, Handshake \[length [0-9a-f]+\], Finished", out):
    if time.time() > end or not pump(0.05):
        break
send("GET / HTTP/1.1")
send("Host: localhost")
for i in range(n):
    send("K")
    send("X-Pad-%d: 1" % i)
send("Connection: close")
send("")
end = time.time() + 10
while b"HTTP/1.1 " not in out and time.time() < end and pump(0.05):
    pass
pump(0.2)
p.kill()
p.wait()
t = out.decode("latin1")
status = 0
i = t.find("HTTP/1.1 ")
if i >= 0:
    status = int(t[i + 9:i + 12])
print("sent %d received %d status %d" % (t.count(">>> TLS 1.3, Handshake [length 0005], KeyUpdate"),
                                         t.count("<<< TLS 1.3, Handshake [length 0005], KeyUpdate"), status))
