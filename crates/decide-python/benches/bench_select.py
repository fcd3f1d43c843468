"""Times `Decider.select` on the decision `cargo bench -p decide-filter --bench filter` times
(benches/filter.rs: a 10-message conversation against 100 tools, tool embeddings cached), and
its throughput from 1, 2 and 4 Python threads sharing one Decider. With `--serve BIN` it also
times the same decision as `POST /v1/select` to `BIN serve` (started here, on a free port),
the way a Python client of the server makes it, interleaved with the in-process calls.

    python crates/decide-python/benches/bench_select.py [--reps 200] [--seconds 10] [--dtype f32]
        [--serve target/release/decide]

Not named select.py: the script's folder comes first on sys.path, and a select.py there would
shadow the standard library's `select`, which subprocess imports.
"""

from __future__ import annotations

import argparse
import json
import http.client
import socket
import statistics
import subprocess
import threading
import time
from typing import Any, Dict, List

import decide

TOPICS = [
    "weather forecasts",
    "calendar events",
    "email messages",
    "files on disk",
    "GitHub issues",
    "Slack channels",
    "SQL databases",
    "web pages",
    "maps and directions",
    "music playback",
]


def tools(n: int) -> List[Dict[str, str]]:
    """benches/filter.rs's `tools(n)`."""
    out = []
    for i in range(n):
        topic = TOPICS[i % len(TOPICS)]
        out.append(
            {
                "name": f"tool_{i}",
                "description": f"Operation {i} on {topic}: lists, reads or updates {topic} for the user",
            }
        )
    return out


def conversation() -> List[Dict[str, str]]:
    """benches/filter.rs's `conversation()`."""
    messages = [{"role": "system", "content": "You are a helpful assistant with tools."}]
    for i in range(4):
        messages.append({"role": "user", "content": f"Question {i}: what is on my calendar this week?"})
        messages.append({"role": "assistant", "content": f"Answer {i}: you have three meetings."})
    messages.append({"role": "user", "content": "And will it rain in Paris on Friday?"})
    return messages


def percentile(xs: List[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def throughput(decider: decide.Decider, threads: int, seconds: float) -> float:
    """Decisions per second from `threads` threads, each calling select in a loop."""
    catalogue, messages = tools(100), conversation()
    stop = time.perf_counter() + seconds
    counts = [0] * threads

    def loop(k: int) -> None:
        while time.perf_counter() < stop:
            decider.select(messages, catalogue)
            counts[k] += 1

    started = time.perf_counter()
    workers = [threading.Thread(target=loop, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(counts) / (time.perf_counter() - started)


class Server:
    """`decide serve` on a free local port, stopped on exit."""

    def __init__(self, binary: str, dtype: str) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.process = subprocess.Popen(
            [binary, "--dtype", dtype, "serve", "--addr", f"127.0.0.1:{self.port}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 120
        while True:
            try:
                self.connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
                self.connection.connect()
                break
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.close()
                    raise SystemExit(f"{binary} serve did not start")
                time.sleep(0.2)

    def select(self, body: bytes) -> None:
        self.connection.request(
            "POST", "/v1/select", body=body, headers={"Content-Type": "application/json"}
        )
        response = self.connection.getresponse()
        payload = response.read()
        if response.status != 200:
            raise SystemExit(f"/v1/select answered {response.status}: {payload[:200]!r}")

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def summary(ms: List[float]) -> Dict[str, float]:
    return {"p50": statistics.median(ms), "p95": percentile(ms, 0.95)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--dtype", default="f32")
    parser.add_argument("--threads", default="1,2,4")
    parser.add_argument("--serve", metavar="BIN", help="also time POST /v1/select to BIN serve")
    args = parser.parse_args()
    decider = decide.Decider(dtype=args.dtype)
    catalogue, messages = tools(100), conversation()
    server = Server(args.serve, args.dtype) if args.serve else None
    body = json.dumps({"messages": messages, "tools": catalogue}).encode()
    for _ in range(10):  # the tools' embeddings into the cache, as an agent's first call does
        decider.select(messages, catalogue)
        if server is not None:
            server.select(body)
    local: List[float] = []
    served: List[float] = []
    try:
        # Interleaved, so that both see the same load on a shared machine.
        for _ in range(args.reps):
            started = time.perf_counter()
            decider.select(messages, catalogue)
            local.append((time.perf_counter() - started) * 1000)
            if server is not None:
                started = time.perf_counter()
                server.select(body)
                served.append((time.perf_counter() - started) * 1000)
    finally:
        if server is not None:
            server.close()
    result: Dict[str, Any] = {
        "dtype": args.dtype,
        "reps": args.reps,
        "python_select_100_tools_ms": summary(local),
    }
    if served:
        result["server_select_100_tools_ms"] = summary(served)
    result["python_decisions_per_s"] = {
        t: throughput(decider, int(t), args.seconds) for t in args.threads.split(",")
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
