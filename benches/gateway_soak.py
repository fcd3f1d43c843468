#!/usr/bin/env python3
"""A soak of `decide mcp --http`: memory under session churn, shutdown time and orphans.

Starts the release gateway in front of two real npm MCP servers (server-everything run by node,
server-memory run through npx, which adds a process in between), then for --duration seconds
opens MCP sessions (initialize, notifications/initialized) and drops them without a DELETE,
while a few slow sockets hold half-sent requests. It then waits until those sessions have
expired, opens an event stream (GET with Accept: text/event-stream) on a fresh session, and
sends SIGTERM.

It reports the gateway's resident set (VmRSS of /proc/PID/status) at idle, at its peak and once
the sessions have expired; the time from SIGTERM to exit; and whether any process the gateway
started (recorded before SIGTERM, plus anything still in its process group or session) is alive
afterwards. The targets: RSS back within 20 MB of idle, exit within the shutdown deadline, no
orphaned process. Exit status 1 when a target is missed.

Python 3 standard library only. Run from the repository root after `cargo build --release` and
`npm install --prefix target/mcp-servers @modelcontextprotocol/server-everything
@modelcontextprotocol/server-memory`:

    python3 benches/gateway_soak.py [--duration 60] [--idle-timeout 15]
"""

import argparse
import http.client
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVERS = os.path.join(ROOT, "target", "mcp-servers")
EVERYTHING = os.path.join(
    SERVERS, "node_modules", "@modelcontextprotocol", "server-everything", "dist", "index.js"
)
PROTOCOL = "2025-06-18"


def rss_mb(pid):
    """The resident set of `pid` in MB, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def stat_of(pid):
    """(parent pid, process group, session, start time, state) of `pid`, or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces: the fields follow its last ')'.
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19]), fields[0]


def command_of(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def all_pids():
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def family(root):
    """Processes descended from `root`, or in its process group or session: {pid: start time}."""
    stats = {pid: stat_of(pid) for pid in all_pids()}
    stats = {pid: s for pid, s in stats.items() if s is not None}
    found = {}
    changed = True
    while changed:
        changed = False
        for pid, (ppid, pgid, sid, start, _) in stats.items():
            if pid == root or pid in found:
                continue
            if ppid == root or ppid in found or pgid == root or sid == root:
                found[pid] = start
                changed = True
    return found


def alive(recorded, root):
    """The recorded processes still running (same pid and start time, not a zombie), and any
    other process still in the gateway's group or session."""
    left = {}
    for pid, start in recorded.items():
        s = stat_of(pid)
        if s is not None and s[3] == start and s[4] != "Z":
            left[pid] = command_of(pid)
    for pid in all_pids():
        s = stat_of(pid)
        if s is not None and (s[1] == root or s[2] == root) and s[4] != "Z" and pid != root:
            left.setdefault(pid, command_of(pid))
    return left


def rpc(method, params=None, id_=None):
    message = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        message["params"] = params
    if id_ is not None:
        message["id"] = id_
    return json.dumps(message).encode()


HEADERS = {
    "Content-Type": "application/json",
    "Accept": "application/json, text/event-stream",
}


def initialize(port, timeout=30):
    """Opens a session; its id, or None when the gateway refused (503 at the session cap)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        body = rpc(
            "initialize",
            {
                "protocolVersion": PROTOCOL,
                "capabilities": {},
                "clientInfo": {"name": "gateway-soak", "version": "1"},
            },
            id_=1,
        )
        conn.request("POST", "/mcp", body, HEADERS)
        response = conn.getresponse()
        session = response.getheader("Mcp-Session-Id")
        response.read()
        if response.status != 200 or not session:
            return None
        conn.request(
            "POST",
            "/mcp",
            rpc("notifications/initialized"),
            dict(HEADERS, **{"Mcp-Session-Id": session, "Mcp-Protocol-Version": PROTOCOL}),
        )
        conn.getresponse().read()
        return session
    finally:
        conn.close()


def status_of_ping(port, session):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(
            "POST",
            "/mcp",
            rpc("ping", id_=2),
            dict(HEADERS, **{"Mcp-Session-Id": session, "Mcp-Protocol-Version": PROTOCOL}),
        )
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


class Sampler(threading.Thread):
    """Samples the gateway's RSS every `every` seconds."""

    def __init__(self, pid, every=0.25):
        super().__init__(daemon=True)
        self.pid, self.every = pid, every
        self.samples = []
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            value = rss_mb(self.pid)
            if value is not None:
                self.samples.append((time.monotonic(), value))
            self.stop.wait(self.every)

    def peak(self):
        return max(v for _, v in self.samples)


class SlowSockets(threading.Thread):
    """Holds `count` connections that send half a request and stop: half the headers on even
    ones, whole headers and half the body on odd ones. A socket the gateway closes is opened
    again, so that `count` are held for as long as this runs."""

    def __init__(self, port, count):
        super().__init__(daemon=True)
        self.port, self.count = port, count
        self.stop = threading.Event()
        self.closed_by_gateway = 0
        self.opened = 0

    def open(self, i):
        s = socket.create_connection(("127.0.0.1", self.port))
        s.setblocking(False)
        body = rpc("ping", id_=9)
        head = (
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
            f"Content-Length: {len(body)}\r\n"
        )
        if i % 2 == 0:
            s.sendall(head[: len(head) // 2].encode())
        else:
            s.sendall((head + "\r\n").encode() + body[: len(body) // 2])
        self.opened += 1
        return s

    def run(self):
        sockets = [self.open(i) for i in range(self.count)]
        while not self.stop.is_set():
            for i, s in enumerate(sockets):
                try:
                    s.recv(4096)
                except BlockingIOError:
                    continue
                except OSError:
                    pass
                # Closed, or answered (a 408 for a half body) before closing: open another.
                self.closed_by_gateway += 1
                s.close()
                try:
                    sockets[i] = self.open(i)
                except OSError:
                    # The gateway has gone (after SIGTERM).
                    self.stop.set()
                    break
            self.stop.wait(0.2)
        for s in sockets:
            s.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", default=os.path.join(ROOT, "target", "release", "decide"))
    parser.add_argument("--duration", type=float, default=60, help="seconds of session churn")
    parser.add_argument("--clients", type=int, default=2, help="threads opening sessions")
    parser.add_argument("--slow", type=int, default=4, help="slow sockets held")
    parser.add_argument(
        "--idle-timeout", type=float, default=15, help="--session-idle-timeout of the gateway"
    )
    parser.add_argument("--shutdown-timeout", type=float, default=10)
    parser.add_argument("--rss-target-mb", type=float, default=20)
    args = parser.parse_args()
    if not os.path.exists(EVERYTHING):
        sys.exit(f"server-everything is not installed at {EVERYTHING}")

    memory_file = tempfile.NamedTemporaryFile(prefix="gateway-soak-", suffix=".jsonl", delete=False)
    memory_file.close()
    env = dict(os.environ, MEMORY_FILE_PATH=memory_file.name)
    command = [
        os.path.abspath(args.binary), "mcp", "--http", "127.0.0.1:0",
        "--mcp", f"node {EVERYTHING} stdio",
        "--mcp", "npx --no-install mcp-server-memory",
        "--session-idle-timeout", str(args.idle_timeout),
        "--shutdown-timeout", str(args.shutdown_timeout),
    ]
    # A session of its own: whatever the gateway starts stays in it unless it leaves on purpose,
    # and npx finds server-memory in target/mcp-servers without the network.
    gateway = subprocess.Popen(
        command, cwd=SERVERS, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    log = []
    listening = threading.Event()
    port_box = []

    def drain():
        for line in gateway.stderr:
            log.append(line.rstrip())
            m = re.search(r"listening on http://[^:]+:(\d+)/mcp", line)
            if m and not port_box:
                port_box.append(int(m.group(1)))
                listening.set()

    threading.Thread(target=drain, daemon=True).start()
    if not listening.wait(120):
        gateway.kill()
        sys.exit("the gateway never listened:\n" + "\n".join(log))
    port = port_box[0]
    pid = gateway.pid
    print(f"gateway pid {pid} on port {port}")

    sampler = Sampler(pid)
    sampler.start()
    time.sleep(5)
    idle = statistics.median(v for _, v in sampler.samples[-8:])
    print(f"idle RSS: {idle:.1f} MB")

    # Churn.
    counts = {"opened": 0, "refused": 0, "failed": 0}
    first_sessions = []
    lock = threading.Lock()
    end = time.monotonic() + args.duration

    def churn():
        while time.monotonic() < end:
            try:
                session = initialize(port)
            except OSError:
                with lock:
                    counts["failed"] += 1
                continue
            with lock:
                if session is None:
                    counts["refused"] += 1
                else:
                    counts["opened"] += 1
                    if len(first_sessions) < 3:
                        first_sessions.append(session)

    slow = SlowSockets(port, args.slow)
    slow.start()
    started = time.monotonic()
    clients = [threading.Thread(target=churn) for _ in range(args.clients)]
    for c in clients:
        c.start()
    for c in clients:
        c.join()
    churned = time.monotonic() - started
    slow.stop.set()
    slow.join()
    peak = sampler.peak()
    print(
        f"churn: {counts['opened']} sessions opened and dropped in {churned:.0f} s "
        f"({counts['opened'] / churned:.0f}/s), {counts['refused']} refused, "
        f"{counts['failed']} failed; slow sockets opened {slow.opened}, "
        f"closed by the gateway {slow.closed_by_gateway}"
    )
    print(f"peak RSS: {peak:.1f} MB")

    # Expiry: every churned session is idle from here on.
    expire_wait = args.idle_timeout * 2 + 10
    time.sleep(expire_wait)
    expired = [status_of_ping(port, s) for s in first_sessions]
    settled = statistics.median(v for _, v in sampler.samples[-8:])
    print(
        f"after {expire_wait:.0f} s idle: RSS {settled:.1f} MB "
        f"({settled - idle:+.1f} MB from idle); a churned session's ping answers {expired}"
    )

    # Shutdown with an open event stream, a half-sent request and a session in place.
    session = initialize(port)
    stream = socket.create_connection(("127.0.0.1", port))
    stream.sendall(
        (
            "GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n"
            f"Mcp-Session-Id: {session}\r\nMcp-Protocol-Version: {PROTOCOL}\r\n\r\n"
        ).encode()
    )
    stream.settimeout(10)
    status_line = stream.recv(4096).split(b"\r\n", 1)[0].decode(errors="replace")
    print(f"event stream: {status_line}")
    held = SlowSockets(port, 1)
    held.start()
    time.sleep(0.5)
    children = family(pid)
    print(
        f"gateway's processes before SIGTERM: "
        + ", ".join(f"{p} ({command_of(p)[:60]})" for p in sorted(children))
    )
    stream.settimeout(None)
    stream_end = []

    def watch_stream():
        try:
            while stream.recv(4096):
                pass
        except OSError:
            pass
        stream_end.append(time.monotonic())

    threading.Thread(target=watch_stream, daemon=True).start()
    sent = time.monotonic()
    gateway.send_signal(signal.SIGTERM)
    try:
        gateway.wait(args.shutdown_timeout + 30)
    except subprocess.TimeoutExpired:
        pass
    exited = gateway.poll() is not None
    exit_s = time.monotonic() - sent
    sampler.stop.set()
    held.stop.set()
    time.sleep(1)
    left = alive(children, pid)
    stream_s = (stream_end[0] - sent) if stream_end else None
    print(
        f"SIGTERM to exit: {exit_s:.2f} s (exit status {gateway.returncode}); "
        f"event stream ended after {stream_s if stream_s is None else round(stream_s, 2)} s"
    )
    print(f"processes alive 1 s after exit: {left or 'none'}")

    misses = []
    if settled - idle > args.rss_target_mb:
        misses.append(f"RSS {settled - idle:.1f} MB above idle (target {args.rss_target_mb})")
    if not exited or exit_s > args.shutdown_timeout:
        misses.append(f"exit took {exit_s:.2f} s (deadline {args.shutdown_timeout} s)")
    if left:
        misses.append(f"orphans: {left}")
    summary = {
        "idle_rss_mb": round(idle, 1),
        "peak_rss_mb": round(peak, 1),
        "expired_rss_mb": round(settled, 1),
        "sessions_opened": counts["opened"],
        "sessions_refused": counts["refused"],
        "sigterm_to_exit_s": round(exit_s, 2),
        "children_before_sigterm": len(children),
        "orphans": sorted(left),
        "targets_missed": misses,
    }
    print(json.dumps(summary))
    # Cleanup of anything the gateway left: processes this run started.
    for p in left:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    if not exited:
        gateway.kill()
    os.unlink(memory_file.name)
    if misses:
        print("missed: " + "; ".join(misses))
        sys.exit(1)
    print("all targets met")


if __name__ == "__main__":
    main()
