#!/usr/bin/env python3
"""Sends the Deployment's probes as the kubelet would, since podman 4.3 cannot schedule them.

    probes.py DEPLOYMENT_YAML POD_IP [--rounds N]

For every startupProbe, readinessProbe and livenessProbe of the first container: an HTTP GET of
the probe's path on POD_IP and the probe's port (a named port resolved through the container's
ports, as the kubelet resolves it), with the probe's httpHeaders and no API key, that must
answer 200-399 within the probe's timeoutSeconds (Kubernetes' default: 1 s). Each probe is sent
--rounds times. The kubelet follows no redirect to another host and reads no body, and neither
does this. Prints one line a probe with its slowest answer; exit status 1 when one failed,
2 when the manifest has no HTTP probe to send.

Needs PyYAML (the CI's venv has it through kubernetes-validate).
"""

import argparse
import http.client
import sys
import time

import yaml

KINDS = ("startupProbe", "readinessProbe", "livenessProbe")


def port_of(probe, container):
    port = probe["httpGet"]["port"]
    if isinstance(port, int):
        return port
    for p in container.get("ports", []):
        if p.get("name") == port:
            return p["containerPort"]
    raise SystemExit(f"probes.py: the probe's port {port!r} names no port of the container")


def send(ip, port, probe):
    get = probe["httpGet"]
    headers = {h["name"]: h["value"] for h in get.get("httpHeaders", [])}
    timeout = probe.get("timeoutSeconds", 1)
    started = time.monotonic()
    conn = http.client.HTTPConnection(ip, port, timeout=timeout)
    try:
        # putrequest without skip_host would add a Host of its own beside the probe's.
        conn.putrequest("GET", get.get("path", "/"), skip_host="Host" in headers)
        for name, value in headers.items():
            conn.putheader(name, value)
        conn.endheaders()
        status = conn.getresponse().status
    except OSError as e:
        return None, f"{type(e).__name__}: {e}", time.monotonic() - started
    finally:
        conn.close()
    return status, None, time.monotonic() - started


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("deployment")
    p.add_argument("pod_ip")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    with open(args.deployment) as f:
        container = yaml.safe_load(f)["spec"]["template"]["spec"]["containers"][0]
    probes = [(k, container[k]) for k in KINDS if "httpGet" in container.get(k, {})]
    if not probes:
        print(f"probes.py: {args.deployment}: no HTTP probe in the first container", file=sys.stderr)
        return 2
    failed = False
    for kind, probe in probes:
        port = port_of(probe, container)
        timeout = probe.get("timeoutSeconds", 1)
        slowest = 0.0
        for _ in range(args.rounds):
            status, error, took = send(args.pod_ip, port, probe)
            slowest = max(slowest, took)
            if error or not 200 <= status < 400 or took > timeout:
                failed = True
                print(f"{kind}: GET {probe['httpGet'].get('path', '/')} on {args.pod_ip}:{port}: "
                      f"{error or status} after {took:.3f} s (timeout {timeout} s)")
                break
        else:
            print(f"{kind}: {args.rounds} x 2xx/3xx, slowest {slowest * 1000:.1f} ms (timeout {timeout} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
