#!/usr/bin/env bash
# The container image and the Kubernetes manifests, tested with podman on this machine (root, no
# systemd), after `cargo test --workspace` has built target/debug/decide:
#
#   bash deploy/ci.sh [BINARY]          # default target/debug/decide, or $DECIDE_BINARY
#   bash deploy/ci.sh --scaling [BINARY]   # then decisions/s with 1, 2 and 3 replicas
#
# 1. builds the image (deploy/rootfs, then deploy/Containerfile FROM scratch), runs it read-only
#    and non-root, decides /v1/select through the published port, checks the Host and key checks
#    and that SIGTERM ends it cleanly;
# 2. validates every manifest of deploy/kubernetes against the Kubernetes schemas, offline;
# 3. `podman kube play`s the Secret and the Deployment and decides through the pod;
# 4. puts three replicas behind nginx (an upstream that retries on the next replica, as a
#    Service's clients or an ingress would) and runs 32 clients for 30 s, during which one replica
#    gets SIGTERM and comes back, and another gets SIGKILL and comes back: every request must get
#    the right answer.
# Installs podman, runc, catatonit and nginx from Debian when missing. Cleans up what it started.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scaling=0
if [[ ${1:-} == --scaling ]]; then scaling=1; shift; fi
binary=${1:-${DECIDE_BINARY:-target/debug/decide}}
work=target/deploy
image=localhost/decide:latest
base_port=${DECIDE_DEPLOY_PORT:-28080}   # nginx; the replicas take the next ports
key=ci-$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')
load_seconds=${DECIDE_DEPLOY_LOAD_SECONDS:-30}
# 0: nginx sends a POST that got no answer to no other replica (its default), to see which
# requests that loses.
retry_post=${DECIDE_DEPLOY_RETRY_POST:-1}

passed=0 failed=0
pass() { passed=$((passed + 1)); echo "ok: $*"; }
fail() { failed=$((failed + 1)); echo "FAILED: $*"; }
check() { # check DESCRIPTION COMMAND...: one check, counted
    local what=$1; shift
    if "$@"; then pass "$what"; else fail "$what"; fi
}
log() { echo "== $*"; }

# --- tools -------------------------------------------------------------------------------------
missing=()
command -v podman >/dev/null || missing+=(podman)
command -v runc >/dev/null || missing+=(runc)
[[ -x /usr/bin/catatonit || -x /usr/libexec/podman/catatonit ]] || missing+=(catatonit)
command -v nginx >/dev/null || [[ -x /usr/sbin/nginx ]] || missing+=(nginx)
command -v curl >/dev/null || missing+=(curl)
if ((${#missing[@]})); then
    log "installing ${missing[*]} from Debian"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" netavark iptables >/dev/null
fi
nginx=$(command -v nginx || echo /usr/sbin/nginx)
mkdir -p "$work"

# This machine: root without systemd, cgroup v1 with a cgroup2 mount that holds a controller
# (crun refuses that "hybrid" layout; runc runs it), and no CAP_SYS_RESOURCE, so the containers'
# limits may not exceed ours (podman's own default asks for 1048576 open files). A config of this
# script's own, not the machine's.
export CONTAINERS_CONF=$PWD/$work/containers.conf
nofile=$(ulimit -Hn)
nproc=$(ulimit -Hu)
[[ $nproc == unlimited || $nproc -gt 32768 ]] && nproc=32768   # podman lowers its own to this
cat >"$CONTAINERS_CONF" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF

# --- cleanup -----------------------------------------------------------------------------------
load_pid=
cleanup() {
    set +e
    [[ -n $load_pid ]] && kill "$load_pid" 2>/dev/null
    if [[ -f $work/nginx/nginx.pid ]]; then
        kill "$(cat "$work/nginx/nginx.pid")" 2>/dev/null
        rm -f "$work/nginx/nginx.pid"
    fi
    if [[ -f $work/play.yaml ]]; then
        podman kube down "$work/play.yaml" >/dev/null 2>&1
        podman secret rm decide-api-key >/dev/null 2>&1
        podman volume rm -f decide-ci-tmp >/dev/null 2>&1
        rm -f "$work/play.yaml"
    fi
    for c in $(podman ps -a --filter name='^decide-ci-' --format '{{.Names}}'); do
        podman rm -f -t 0 "$c" >/dev/null 2>&1
    done
}
trap cleanup EXIT
cleanup

# Waits until URL's /health answers, 60 s at most.
wait_healthy() {
    local url=$1 i
    for i in $(seq 1 300); do
        curl -fsS -o /dev/null --max-time 1 "$url/health" 2>/dev/null && return 0
        sleep 0.2
    done
    echo "no answer from $url/health" >&2
    return 1
}
# A container's main process, seen from here.
pid_of() { podman inspect --format '{{.State.Pid}}' "$1"; }
# Whether a container's process runs as uid 10001 with no capabilities, no new privileges, a
# seccomp filter and a read-only root.
confined() {
    local s=/proc/$(pid_of "$1")/status
    grep -Eq '^Uid:\s+10001\s' "$s" && grep -Eq '^CapEff:\s+0+$' "$s" &&
        grep -Eq '^NoNewPrivs:\s+1$' "$s" && grep -Eq '^Seccomp:\s+2$' "$s" &&
        test "$(podman inspect --format '{{.HostConfig.ReadonlyRootfs}}' "$1")" = true
}

# --- 1. the image ------------------------------------------------------------------------------
log "image from $binary"
# The README's command, with the binary already built.
DECIDE_CONTAINER_TOOL=podman deploy/image --binary "$binary" --tag "$image" >"$work/image.log" 2>&1 ||
    { cat "$work/image.log"; exit 1; }
size=$(podman image inspect --format '{{.Size}}' "$image")
echo "image $image: $((size / 1000000)) MB ($size bytes)"
check "image runs as uid 10001" test "$(podman image inspect --format '{{.Config.User}}' "$image")" = 10001:10001

one_port=$((base_port + 10))
podman run -d --name decide-ci-one --read-only --tmpfs /tmp:rw,size=16m,mode=1777 \
    --cap-drop ALL --security-opt no-new-privileges -p "127.0.0.1:$one_port:8080" \
    -e DECIDE_API_KEY="$key" "$image" >/dev/null
one=http://127.0.0.1:$one_port
if wait_healthy "$one"; then pass "container: /health answers on the published port"; else
    fail "container: /health answers on the published port"; podman logs decide-ci-one | tail -20
fi
pid=$(pid_of decide-ci-one)
check "container: uid 10001, no capabilities, no new privileges, seccomp filter, read-only root" \
    confined decide-ci-one
check "container: the model check's record went to the tmpfs (HOME=/tmp)" \
    test -s "/proc/$pid/root/tmp/.cache/decide/verified"
check "container: /v1/select selects the right tool for 8 requests" \
    python3 deploy/load.py --url "$one" --key "$key" --check --clients 0 --seconds 0 -q
status() { curl -s -o /dev/null -w '%{http_code}' "$@"; }
body='{"text":"Will it rain in Paris tomorrow?","tools":[{"name":"get_forecast","description":"Get the weather forecast"}]}'
check "container: no key, 401" test "$(status -X POST "$one/v1/select" -H 'Content-Type: application/json' -d "$body")" = 401
check "container: a Host that is not this server's, 403" \
    test "$(status -X POST "$one/v1/select" -H 'Content-Type: application/json' -H "Authorization: Bearer $key" -H 'Host: rebind.example' -d "$body")" = 403
started=$(date +%s.%N)
podman stop -t 15 decide-ci-one >/dev/null
stopped=$(date +%s.%N)
check "container: SIGTERM ends it cleanly (exit 0, 'stopped' logged) in $(awk "BEGIN {printf \"%.1f\", $stopped - $started}") s" \
    bash -c "test \"\$(podman inspect --format '{{.State.ExitCode}}' decide-ci-one)\" = 0 && podman logs decide-ci-one 2>&1 | grep -q 'decide serve: stopped'"
podman rm -f decide-ci-one >/dev/null

# --- 2. the manifests, offline -----------------------------------------------------------------
log "manifests against the Kubernetes schemas"
if [[ ! -x $work/venv/bin/kubernetes-validate ]]; then
    python3 -m venv "$work/venv"
    "$work/venv/bin/pip" install -q --disable-pip-version-check kubernetes-validate==1.37.0
fi
for f in deploy/kubernetes/*.yaml; do
    check "$f is valid (Kubernetes 1.37 schemas, strict)" \
        "$work/venv/bin/kubernetes-validate" --strict --quiet "$f"
done

# --- 3. podman kube play -----------------------------------------------------------------------
log "podman kube play"
# The Deployment and its Secret as they are, but for what podman 4.3 lacks (deploy/podman-play.py
# says what and why); the pod's port is published on 127.0.0.1 only.
pod_ip=10.88.200.$((RANDOM % 200 + 20))
play_port=$((base_port + 20))
podman secret rm decide-api-key >/dev/null 2>&1 || true
"$work/venv/bin/python" deploy/podman-play.py "$key" "$pod_ip" "$play_port" "$work/play-secret.json" >"$work/play.yaml"
podman secret create decide-api-key "$work/play-secret.json" >/dev/null
rm -f "$work/play-secret.json"
# The probes become podman health checks, which need systemd's timers: podman says so and goes on.
if podman kube play --network podman --ip "$pod_ip" "$work/play.yaml" >"$work/play.log" 2>&1; then
    pass "podman kube play: the Deployment starts, its key from the Secret"
    played=http://127.0.0.1:$play_port
    if wait_healthy "$played"; then pass "kube play: /health answers on the pod's port"; else
        fail "kube play: /health answers on the pod's port"; podman logs decide-pod-0-decide 2>&1 | tail -20
    fi
    check "kube play: /v1/select by the Service's name (Host: decide.default.svc) selects the right tools" \
        python3 deploy/load.py --url "$played" --host decide.default.svc --key "$key" --check --clients 0 --seconds 0 -q
    check "kube play: the key comes from the Secret (no key, 401)" \
        test "$(status -X POST "$played/v1/select" -H 'Content-Type: application/json' -H 'Host: decide' -d "$body")" = 401
    check "kube play: the key comes from the Secret (the key, 200)" \
        test "$(status -X POST "$played/v1/select" -H 'Content-Type: application/json' -H 'Host: decide' -H "Authorization: Bearer $key" -d "$body")" = 200
    check "kube play: /metrics by the pod's IP, as Prometheus scrapes it (Host: $pod_ip:8080)" \
        test "$(status "http://$pod_ip:8080/metrics" -H "Authorization: Bearer $key")" = 200
    # podman cannot schedule the probes; they are sent here as the kubelet sends them (the pod's
    # IP, the named port, the manifest's headers and timeouts), while clients keep the model busy.
    python3 deploy/load.py --url "$played" --host decide.default.svc --key "$key" --clients 16 \
        --seconds 8 -q >"$work/probe-load.log" 2>&1 &
    probe_load=$!
    sleep 2
    check "kube play: the startup, readiness and liveness probes answer within their timeouts while 16 clients load the pod" \
        "$work/venv/bin/python" deploy/probes.py deploy/kubernetes/deployment.yaml "$pod_ip" --rounds 5
    wait "$probe_load" || { echo "the load beside the probes failed:"; cat "$work/probe-load.log"; }
    check "kube play: uid 10001, no capabilities, no new privileges, seccomp filter, read-only root" \
        confined decide-pod-0-decide
    # The limits of the manifest (Mi and whole CPUs), as podman applied them.
    limits=$("$work/venv/bin/python" -c '
import sys, yaml
c = yaml.safe_load(open(sys.argv[1]))["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
print(int(c["memory"].removesuffix("Mi")) << 20, "%d/100000" % (float(c["cpu"]) * 100000))' deploy/kubernetes/deployment.yaml)
    check "kube play: the manifest's memory and CPU limits are applied ($limits)" \
        test "$(podman inspect --format '{{.HostConfig.Memory}} {{.HostConfig.CpuQuota}}/{{.HostConfig.CpuPeriod}}' decide-pod-0-decide)" = "$limits"
    started=$(date +%s.%N)
    podman kube down "$work/play.yaml" >/dev/null 2>&1 || true
    echo "kube down (SIGTERM, drain, exit) took $(awk "BEGIN {printf \"%.1f\", $(date +%s.%N) - $started}") s"
else
    fail "podman kube play: the Deployment starts, its key from the Secret"
    cat "$work/play.log"
fi
podman secret rm decide-api-key >/dev/null 2>&1 || true
podman volume rm -f decide-ci-tmp >/dev/null 2>&1 || true
rm -f "$work/play.yaml"

# --- 4. replicas behind nginx, one SIGTERMed and one SIGKILLed under load ----------------------
start_replica() { # start_replica N
    podman run -d --name "decide-ci-r$1" --read-only --tmpfs /tmp:rw,size=16m,mode=1777 \
        --cap-drop ALL --security-opt no-new-privileges -p "127.0.0.1:$((base_port + $1)):8080" \
        -e DECIDE_API_KEY="$key" "$image" \
        --addr 0.0.0.0:8080 --allowed-hosts decide --shutdown-timeout 10 >/dev/null
}
start_nginx() { # start_nginx N: nginx in front of replicas 1..N
    local n=$1 i servers=
    mkdir -p "$work/nginx"
    : >"$work/nginx/error.log"
    [[ -f $work/nginx/nginx.pid ]] && { kill "$(cat "$work/nginx/nginx.pid")"; sleep 0.5; }
    for i in $(seq 1 "$n"); do
        servers+="        server 127.0.0.1:$((base_port + i)) max_fails=1 fail_timeout=2s;"$'\n'
    done
    # The Host the replicas see is a Service's name. A decision is a pure function of the
    # request, so a POST that got no answer is safe to send again (non_idempotent); a 503 (over
    # --max-concurrent-requests) goes to the next replica too.
    local retry="error timeout http_502 http_503"
    ((retry_post)) && retry+=" non_idempotent"
    cat >"$work/nginx/nginx.conf" <<EOF
worker_processes 1;
user root;
pid $PWD/$work/nginx/nginx.pid;
error_log $PWD/$work/nginx/error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path $PWD/$work/nginx/body;
    proxy_temp_path $PWD/$work/nginx/proxy;
    fastcgi_temp_path $PWD/$work/nginx/fastcgi;
    uwsgi_temp_path $PWD/$work/nginx/uwsgi;
    scgi_temp_path $PWD/$work/nginx/scgi;
    upstream decide {
$servers        keepalive 64;
    }
    server {
        listen 127.0.0.1:$base_port;
        client_max_body_size 2m;
        location / {
            proxy_pass http://decide;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host decide;
            proxy_next_upstream $retry;
            proxy_next_upstream_tries 3;
            proxy_connect_timeout 1s;
            proxy_read_timeout 35s;
        }
    }
}
EOF
    "$nginx" -p "$PWD/$work/nginx" -c "$PWD/$work/nginx/nginx.conf"
}
rss_kb() { awk '/^VmHWM/ {print $2}' "/proc/$(pid_of "$1")/status"; }

log "3 replicas behind nginx, $load_seconds s of 32 clients, SIGTERM and SIGKILL on the way"
for i in 1 2 3; do start_replica "$i"; done
for i in 1 2 3; do wait_healthy "http://127.0.0.1:$((base_port + i))"; done
start_nginx 3
front=http://127.0.0.1:$base_port
wait_healthy "$front"
python3 deploy/load.py --url "$front" --key "$key" --check --clients 32 --seconds "$load_seconds" >"$work/load.json" &
load_pid=$!
load_start=$(date +%s.%N)
since() { awk "BEGIN {printf \"%.1f\", $(date +%s.%N) - $1}"; }
sleep $((load_seconds / 4))
t0=$(date +%s.%N)
echo "replica 1: SIGTERM at $(since "$load_start") s"
podman kill -s TERM decide-ci-r1 >/dev/null
term_exit=$(podman wait decide-ci-r1)
echo "replica 1: exited $term_exit after $(since "$t0") s; restarting"
podman start decide-ci-r1 >/dev/null
wait_healthy "http://127.0.0.1:$((base_port + 1))"
echo "replica 1: answering again at $(since "$load_start") s"
sleep $((load_seconds / 4))
echo "replica 2: SIGKILL at $(since "$load_start") s"
podman kill -s KILL decide-ci-r2 >/dev/null
kill_exit=$(podman wait decide-ci-r2)
echo "replica 2: exited $kill_exit; restarting"
podman start decide-ci-r2 >/dev/null
wait_healthy "http://127.0.0.1:$((base_port + 2))"
echo "replica 2: answering again at $(since "$load_start") s"
load_ok=0
wait "$load_pid" || load_ok=$?
load_pid=
cat "$work/load.json"
read -r sent right wrong lost rate < <(python3 -c '
import json, sys; r = json.load(open(sys.argv[1]))
print(r["sent"], r["right"], r["wrong"], r["lost"], r["decisions_per_s"])' "$work/load.json")
check "load: the load client ran (each case right before the load)" test "$load_ok" = 0
check "load: a SIGTERMed replica drains and exits 0" test "$term_exit" = 0
check "load: $sent requests sent, $right answered right ($rate decisions/s), $wrong wrong, $lost lost" \
    test "$sent" -gt 0 -a "$right" = "$sent"
check "load: the restarted replicas answer through nginx again" \
    python3 deploy/load.py --url "http://127.0.0.1:$((base_port + 2))" --host decide --key "$key" --check --clients 0 --seconds 0 -q
echo "peak resident set of the replicas (kB): $(for i in 1 2 3; do rss_kb "decide-ci-r$i"; done | tr '\n' ' ')(1 and 2 since their restart)"
# The upstream errors nginx met, by replica and kind (with POST retries, each went to another).
grep -E '\[error\].*upstream: ' "$work/nginx/error.log" |
    sed -E 's/.*\[error\] [^ ]+ [^ ]+ (.*) while .*upstream: "http:\/\/([^/]+)\/.*/\2: \1/; s/connect\(\) failed \([0-9]+: ([^)]*)\)/connect failed: \1/' |
    sort | uniq -c | sed 's/^ */nginx, upstream errors: /' || true

# --- scaling (on request) ----------------------------------------------------------------------
if ((scaling)); then
    # Rounds interleaved, so that each replica count sees the same load from the rest of the
    # machine; the load average is printed with each.
    for round in 1 2; do
        for n in 1 2 3; do
            start_nginx "$n"
            wait_healthy "$front"
            python3 deploy/load.py --url "$front" --key "$key" --clients 32 --seconds 20 >"$work/scaling-$n-$round.json"
            echo "scaling: $n replica(s), round $round, load average $(cut -d' ' -f1-3 /proc/loadavg): $(cat "$work/scaling-$n-$round.json")"
        done
    done
    echo "peak resident set of the replicas (kB): $(for i in 1 2 3; do rss_kb "decide-ci-r$i"; done | tr '\n' ' ')"
    echo "resident set now (kB): $(for i in 1 2 3; do awk '/^VmRSS/ {print $2}' "/proc/$(pid_of "decide-ci-r$i")/status"; done | tr '\n' ' ')"
fi

echo "deploy/ci.sh: $passed passed, $failed failed"
((failed == 0))
