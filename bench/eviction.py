"""Delete -> eviction on another gateway (run by bench/eviction.sh).

Sandboxes are created through gateway A in batches; gateway B serves one
data-plane request for each, so B caches its route. Then each is deleted
through A, one at a time, and B's `GET /_warren/v1/routes/{id}` is polled
until B no longer has the route cached: B learns of the delete only from
the scheduler's WatchBindings stream. Prints p50/p99/max of delete-sent ->
evicted on B and delete-answered -> evicted on B. Nothing asserts on them.
"""

import argparse
import http.client
import json
import math
import threading
import time


def pct(values, p):
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(p / 100 * len(s)) - 1))
    return s[k] * 1000


class Client:
    def __init__(self, addr, key):
        host, port = addr.rsplit(":", 1)
        self.conn = http.client.HTTPConnection(host, int(port), timeout=60)
        self.key = key

    def call(self, method, path, body=None, headers=None):
        h = {"X-API-Key": self.key}
        if body is not None:
            h["Content-Type"] = "application/json"
            body = json.dumps(body)
        h.update(headers or {})
        self.conn.request(method, path, body=body, headers=h)
        r = self.conn.getresponse()
        data = r.read()
        return r.status, data


def create_batch(a_addr, key, n, threads):
    made, errors, lock = [], [], threading.Lock()
    left = [n]

    def worker():
        c = Client(a_addr, key)
        while True:
            with lock:
                if left[0] == 0:
                    return
                left[0] -= 1
            status, data = c.call("POST", "/sandboxes", {"templateID": "base", "timeout": 600})
            with lock:
                if status == 201:
                    made.append(json.loads(data))
                else:
                    errors.append((status, data[:200]))

    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise SystemExit(f"creates failed: {errors[:3]}")
    return made


def cached_on(b, sid):
    status, data = b.call("GET", f"/_warren/v1/routes/{sid}")
    if status != 200:
        raise SystemExit(f"route of {sid} on B: {status} {data[:200]!r}")
    return json.loads(data)["cached"] is not None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True)
    ap.add_argument("--b", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--total", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--threads", type=int, default=8)
    args = ap.parse_args()
    a, b = Client(args.a, args.key), Client(args.b, args.key)
    from_sent, from_answer, polls = [], [], []
    done = 0
    while done < args.total:
        batch = create_batch(args.a, args.key, min(args.batch, args.total - done), args.threads)
        for s in batch:
            sid = s["sandboxID"]
            headers = {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "49983"}
            if s.get("envdAccessToken"):
                headers["X-Access-Token"] = s["envdAccessToken"]
            status, _ = b.call("GET", "/health", headers=headers)
            if status >= 300 or not cached_on(b, sid):
                raise SystemExit(f"B did not cache {sid} (status {status})")
        for s in batch:
            sid = s["sandboxID"]
            t0 = time.perf_counter()
            status, data = a.call("DELETE", f"/sandboxes/{sid}")
            t1 = time.perf_counter()
            if status != 204:
                raise SystemExit(f"delete {sid}: {status} {data[:200]!r}")
            n = 0
            while cached_on(b, sid):
                n += 1
                time.sleep(0.0005)
            t2 = time.perf_counter()
            from_sent.append(t2 - t0)
            from_answer.append(t2 - t1)
            polls.append(n)
        done += len(batch)
        print(f"bench: {done} of {args.total} deletes measured", flush=True)
    print()
    print("| deletes | from | p50 ms | p99 ms | max ms |")
    print("|---:|---|---:|---:|---:|")
    for label, v in (("delete sent", from_sent), ("delete answered", from_answer)):
        print(f"| {len(v)} | {label} | {pct(v, 50):.1f} | {pct(v, 99):.1f} | {max(v) * 1000:.1f} |")
    print(f"\n(B's route endpoint was polled every ~0.5 ms: {sum(polls) / len(polls):.1f} polls per "
          f"delete on average, each one request to B and one GetSandbox from B to the scheduler.)")


if __name__ == "__main__":
    main()
