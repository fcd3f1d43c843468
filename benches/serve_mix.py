#!/usr/bin/env python3
"""A small decision's latency beside bulk work, on one `decide serve`.

    python3 benches/serve_mix.py [--decide target/release/decide] [--model decide-tools-minilm]
                                 [--tools 27] [--bulk 4] [--texts 1000] [--rounds 2] [--idle 60]

Starts `decide serve` on a free loopback port, then:

1. idle: `--idle` selections of `--tools` tools of the own catalogue, one after another;
2. mixed: `--bulk` clients each send `--rounds` `/v1/embeddings` requests of `--texts` texts
   (one after another per client, all clients at once), while one client sends the same
   selections, one after another, until the last embedding request is answered.

Prints p50 and p99 of the selections in each phase, their ratio, and every status the two kinds
of request got (200, 503 when the bulk lane's admission refuses, 504 past `--timeout`). Standard
library only; the server and the clients share the machine's cores, as they would on a
developer's machine, so compare the two phases of one run, not runs on different machines.
"""
import argparse
import collections
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = ("order shipment invoice refund customer account password weather forecast calendar meeting "
         "repository branch commit deploy cluster database query table index vector search email "
         "message channel ticket priority report quarterly revenue budget flight hotel booking "
         "translate summary document folder file upload download image video playlist").split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict, timeout: float) -> tuple[int, float]:
    data = json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
            status = response.status
    except urllib.error.HTTPError as error:
        error.read()
        status = error.code
    except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
        print(f"serve_mix.py: {url}: {error}", file=sys.stderr)
        status = 0
    return status, time.perf_counter() - started


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def wait_ready(base: str, server: subprocess.Popen) -> None:
    deadline = time.time() + 120
    while time.time() < deadline:
        if server.poll() is not None:
            sys.exit(f"serve_mix.py: decide serve exited with {server.returncode}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=2):
                return
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.2)
    sys.exit("serve_mix.py: decide serve did not answer /health within 120 s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--decide", default=os.path.join(ROOT, "target/release/decide"))
    parser.add_argument("--model", default="decide-tools-minilm")
    parser.add_argument("--tools", type=int, default=27)
    parser.add_argument("--bulk", type=int, default=4)
    parser.add_argument("--texts", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--idle", type=int, default=60)
    parser.add_argument("--timeout", type=float, default=30.0, help="decide serve's --timeout, seconds")
    parser.add_argument("--serve-arg", action="append", default=[], help="another decide serve argument")
    args = parser.parse_args()
    if not os.access(args.decide, os.X_OK):
        sys.exit(f"serve_mix.py: {args.decide}: not an executable (cargo build --release -p decide-cli)")

    catalogue = json.load(open(os.path.join(ROOT, "crates/decide-eval/data/own/catalogue.json")))["tools"]
    tools = catalogue[: args.tools]
    select = {"messages": [{"role": "user", "content": "what's the weather in Lisbon tomorrow, and mail it to Ana"}],
              "tools": tools}
    rng = random.Random(7)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(12, 40))) for _ in range(args.texts)]
    embed = {"model": args.model, "input": texts}

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = [args.decide, "--model", args.model, "serve", "--addr", f"127.0.0.1:{port}",
               "--timeout", f"{args.timeout:g}"] + args.serve_arg
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_ready(base, server)
        for _ in range(5):
            post(base + "/v1/select", select, args.timeout + 10)
        idle = []
        idle_status = collections.Counter()
        for _ in range(args.idle):
            status, seconds = post(base + "/v1/select", select, args.timeout + 10)
            idle_status[status] += 1
            idle.append(seconds)

        bulk_status = collections.Counter()
        bulk_seconds = []
        lock = threading.Lock()

        def bulk_client() -> None:
            for _ in range(args.rounds):
                status, seconds = post(base + "/v1/embeddings", embed, args.timeout + 30)
                with lock:
                    bulk_status[status] += 1
                    bulk_seconds.append(seconds)

        clients = [threading.Thread(target=bulk_client) for _ in range(args.bulk)]
        started = time.perf_counter()
        for c in clients:
            c.start()
        mixed = []
        mixed_status = collections.Counter()
        time.sleep(0.2)
        while any(c.is_alive() for c in clients):
            status, seconds = post(base + "/v1/select", select, args.timeout + 10)
            mixed_status[status] += 1
            mixed.append(seconds)
        for c in clients:
            c.join()
        wall = time.perf_counter() - started
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()

    ms = lambda s: f"{s * 1000:.0f} ms"  # noqa: E731
    print(f"decide serve {' '.join(command[1:])}")
    print(f"{args.tools}-tool /v1/select; {args.bulk} clients x {args.rounds} /v1/embeddings of {args.texts} texts")
    print("| phase | selections | p50 | p99 | statuses |")
    print("|---|---:|---:|---:|---|")
    print(f"| idle | {len(idle)} | {ms(statistics.median(idle))} | {ms(percentile(idle, 0.99))} | {dict(idle_status)} |")
    if mixed:
        print(f"| beside the embeddings | {len(mixed)} | {ms(statistics.median(mixed))} | "
              f"{ms(percentile(mixed, 0.99))} | {dict(mixed_status)} |")
        print(f"p99 beside the embeddings / idle p99: {percentile(mixed, 0.99) / percentile(idle, 0.99):.1f}x")
    ok = [s for s in bulk_seconds]
    print(f"embeddings: {dict(bulk_status)}, median {statistics.median(ok):.1f} s, longest {max(ok):.1f} s, "
          f"all done in {wall:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
