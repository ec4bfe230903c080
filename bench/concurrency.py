"""bench/concurrency.sh's parts: `upstream PORT MS` (a threaded HTTP/1.1
server that answers after MS ms and counts what it has in flight; GET /peak
answers the most it had at once, and resets it) and `load PORTS THREADS
SECONDS UPSTREAM` (keep-alive GET / from THREADS threads over the
gateways' PORTS; prints "requests 429s peak")."""
import http.client
import http.server
import socketserver
import sys
import threading
import time


def upstream(port, ms):
    state = {"now": 0, "peak": 0}
    lock = threading.Lock()

    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_GET(self):
            if self.path == "/peak":
                with lock:
                    body = str(state["peak"]).encode()
                    state["peak"] = 0
            else:
                with lock:
                    state["now"] += 1
                    state["peak"] = max(state["peak"], state["now"])
                time.sleep(ms / 1000)
                with lock:
                    state["now"] -= 1
                body = b"ok"
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
        daemon_threads = True
        allow_reuse_address = True

    S(("127.0.0.1", port), H).serve_forever()


def load(ports, threads, seconds, upstream_port):
    counts = [[0, 0] for _ in range(threads)]
    stop = time.monotonic() + seconds

    def worker(i):
        port = ports[i % len(ports)]
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        while time.monotonic() < stop:
            c.request("GET", "/")
            r = c.getresponse()
            r.read()
            counts[i][0] += 1
            if r.status == 429:
                counts[i][1] += 1
                time.sleep(0.005)

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    c = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=5)
    c.request("GET", "/peak")
    peak = c.getresponse().read().decode()
    print(sum(x[0] for x in counts), sum(x[1] for x in counts), peak)


if sys.argv[1] == "upstream":
    upstream(int(sys.argv[2]), float(sys.argv[3]))
else:
    load([int(p) for p in sys.argv[2].split(",")], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]))
