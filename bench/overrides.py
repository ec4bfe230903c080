"""The driver of bench/overrides.sh: PUTs an override on the first admin
port, polls every port's GET /overrides until it shows the new rate, and
prints when each had it."""
import http.client
import json
import statistics
import sys
import threading
import time

ports = [int(p) for p in sys.argv[1].split(",")]
changes = int(sys.argv[2])
token = sys.argv[3]
auth = {"Authorization": f"Bearer {token}"}


def call(port, method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    c.request(method, path, body=body, headers=auth)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def shows(port, rate):
    status, data = call(port, "GET", "/overrides")
    if status != 200:
        return False
    return any(o["rate"] == rate for o in json.loads(data)["overrides"])


lasts, arrivals = [], []
for n in range(changes):
    rate = f"{1000 + n}/min"
    seen = {}
    done = threading.Event()

    def watch(port):
        while not done.is_set():
            if shows(port, rate):
                seen[port] = time.monotonic()
                return
            time.sleep(0.002)

    status, body = call(ports[0], "PUT", "/overrides/per_client/key:acme", json.dumps({"rate": rate}))
    put_at = time.monotonic()
    assert status == 200, body
    threads = [threading.Thread(target=watch, args=(p,)) for p in ports]
    for t in threads:
        t.start()
    deadline = put_at + 10
    while len(seen) < len(ports) and time.monotonic() < deadline:
        time.sleep(0.01)
    done.set()
    for t in threads:
        t.join()
    if len(seen) < len(ports):
        print(f"change {n}: only {len(seen)} of {len(ports)} instances within 10 s")
        sys.exit(1)
    times = [max(0.0, seen[p] - put_at) * 1000 for p in ports]
    arrivals += times
    lasts.append(max(times))
    print(f"change {n:2}: last of {len(ports)} instances after {max(times):7.1f} ms (median {statistics.median(times):6.1f})")
    # Land the next PUT at another point of the instances' poll cycles.
    time.sleep(0.137)

print()
print(f"all {len(ports)} instances had it: median {statistics.median(lasts):.1f} ms, "
      f"min {min(lasts):.1f}, max {max(lasts):.1f} (over {changes} changes)")
print(f"any one instance: median {statistics.median(arrivals):.1f} ms, max {max(arrivals):.1f}")
