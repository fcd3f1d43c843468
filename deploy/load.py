#!/usr/bin/env python3
"""A bounded load test of `decide serve`'s /v1/select, standard library only.

    python3 deploy/load.py --url http://127.0.0.1:8080 --clients 32 --seconds 30 [--key KEY]

Every client (a thread with one keep-alive connection) sends, one after another until the time
is up, a conversation's last message with the 27 tools of examples/tools.json, cycling through
CASES, and checks each answer: a 200 whose most probable selected tool is the case's. A request
is never retried here: one that gets no answer (the connection reset, closed or timed out) is
counted as lost, one answered with another status or another tool as wrong. With --check, each
case is first asked once and its answer must be right, else the run stops with status 2.

Prints one JSON object: requests sent, right, wrong, lost, their kinds, decisions/s (right
answers a second), latency p50/p99 in ms, the CPU seconds this client used (on a shared machine,
taken from the servers), and a timeline of the failures (seconds from the start), so a failure
can be matched with what happened to the servers at that moment.
"""

import argparse
import http.client
import json
import os
import resource
import sys
import threading
import time
import urllib.parse

# A message and the tool it needs, among examples/tools.json's 27.
CASES = [
    ("What's the weather forecast for Paris for the next two days?", "get_forecast"),
    ("Are there any active weather alerts for Texas right now?", "get_alerts"),
    ("Send an email to Anna with the quarterly report attached", "send_email"),
    ("Post a message to the #general channel on Slack saying the build is fixed", "slack_post_message"),
    ("Open a pull request from my feature branch into main on GitHub", "create_pull_request"),
    ("Take a screenshot of the page in the browser", "puppeteer_screenshot"),
    ("Put a meeting with Bob in my calendar for Friday at 3pm", "create_event"),
    ("File a GitHub issue about the crash on startup", "create_issue"),
]


def parse_args():
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--key", default=os.environ.get("DECIDE_API_KEY"))
    p.add_argument("--host", help="the Host header to send (default: the URL's)")
    p.add_argument("--tools", default=os.path.join(here, "..", "examples", "tools.json"))
    p.add_argument("--timeout", type=float, default=35.0, help="seconds to wait for an answer")
    p.add_argument("--check", action="store_true", help="ask each case once first; stop unless right")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing but a failed check")
    return p.parse_args()


class Client:
    """One keep-alive connection; reconnects after a failure."""

    def __init__(self, url, timeout, headers):
        u = urllib.parse.urlsplit(url)
        self.host, self.port = u.hostname, u.port or 80
        self.timeout, self.headers = timeout, headers
        self.conn = None

    def post(self, path, body):
        """(status, parsed JSON or None) or raises on a connection failure."""
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            self.conn.request("POST", path, body=body, headers=self.headers)
            r = self.conn.getresponse()
            data = r.read()
            if r.getheader("connection", "").lower() == "close":
                self.close()
        except BaseException:
            self.close()
            raise
        try:
            return r.status, json.loads(data)
        except ValueError:
            return r.status, None

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def top_tool(answer):
    selected = (answer or {}).get("selected") or []
    if not selected:
        return None
    return max(selected, key=lambda s: s.get("probability", 0)).get("name")


def main():
    a = parse_args()
    with open(a.tools) as f:
        tools = json.load(f)
    tools = tools["tools"] if isinstance(tools, dict) else tools
    bodies = [json.dumps({"text": text, "tools": tools}).encode() for text, _ in CASES]
    headers = {"Content-Type": "application/json"}
    if a.key:
        headers["Authorization"] = "Bearer " + a.key
    if a.host:
        headers["Host"] = a.host

    if a.check:
        c = Client(a.url, a.timeout, headers)
        for (text, tool), body in zip(CASES, bodies):
            status, answer = c.post("/v1/select", body)
            if status != 200 or top_tool(answer) != tool:
                print(json.dumps({"check": "failed", "text": text, "expected": tool,
                                  "status": status, "answer": answer}), file=sys.stderr)
                sys.exit(2)
        c.close()

    lock = threading.Lock()
    totals = {"sent": 0, "right": 0, "wrong": 0, "lost": 0}
    kinds = {}
    failures = []  # (seconds from start, kind)
    latencies = []
    started = time.monotonic()
    deadline = started + a.seconds

    def count(kind, failed, ms=None):
        with lock:
            totals["sent"] += 1
            if ms is not None:
                latencies.append(ms)
            if failed:
                kinds[kind] = kinds.get(kind, 0) + 1
                failures.append((round(time.monotonic() - started, 2), kind))
            totals[failed or "right"] += 1

    def client(n):
        c = Client(a.url, a.timeout, headers)
        i = n
        while time.monotonic() < deadline:
            case = i % len(CASES)
            i += 1
            t = time.monotonic()
            try:
                status, answer = c.post("/v1/select", bodies[case])
            except (OSError, http.client.HTTPException) as e:
                count(type(e).__name__, "lost")
                time.sleep(0.05)
                continue
            ms = (time.monotonic() - t) * 1000
            if status != 200:
                count(f"status {status}", "wrong", ms)
            elif top_tool(answer) != CASES[case][1]:
                count(f"tool {top_tool(answer)} for {CASES[case][1]}", "wrong", ms)
            else:
                count(None, None, ms)
        c.close()

    threads = [threading.Thread(target=client, args=(n,)) for n in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    latencies.sort()

    def pct(p):
        return round(latencies[min(len(latencies) - 1, int(p * len(latencies)))], 1) if latencies else None

    if a.quiet:
        return
    print(json.dumps({
        **totals,
        "seconds": round(elapsed, 1),
        "clients": a.clients,
        "decisions_per_s": round(totals["right"] / elapsed, 1),
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "client_cpu_s": round(sum(resource.getrusage(resource.RUSAGE_SELF)[:2]), 1),
        "failures": kinds,
        "failure_times": failures[:50],
    }))


if __name__ == "__main__":
    main()
