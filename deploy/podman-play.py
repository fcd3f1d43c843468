#!/usr/bin/env python3
"""Writes what `podman kube play` is given in deploy/ci.sh: the Deployment of deploy/kubernetes and
its Secret (with the run's key), with only the changes podman 4.3 needs, each said here:

* the Secret's data goes to a file of its own for `podman secret create`, as the JSON object of
  base64 values that podman 4.3 reads for a secretKeyRef (its kube play stores a Secret document
  as the YAML it was given, then fails to read it back);

* `status.podIP` and `metadata.namespace` are fields podman cannot give an environment variable:
  POD_IP gets the address the pod is given with `podman kube play --ip`, POD_NAMESPACE `default`
  (podman has no namespaces; `default` is Kubernetes' own when none is named);
* podman does not expand `$(NAME)` in a container's args as the kubelet does: it is expanded
  here, by the kubelet's rule, from the container's env (a name it does not define stays as is);
* podman starts a pod for each replica, and they would all publish the same port: one replica;
* podman makes an emptyDir a named volume, of the manifest's name (`tmp`), which another's
  volume may have: it is named `decide-ci-tmp`;
* podman publishes a containerPort on the host, by default on every address at the same port:
  the port is published on 127.0.0.1 at HOST_PORT instead, so the test takes no common port.

    deploy/podman-play.py KEY POD_IP HOST_PORT SECRET.json > play.yaml     (needs PyYAML)
"""

import base64
import json
import os
import re
import sys

import yaml

key, pod_ip, host_port, secret_file = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kubernetes")
with open(os.path.join(here, "secret.yaml")) as f:
    secret = yaml.safe_load(f)
with open(os.path.join(here, "deployment.yaml")) as f:
    deployment = yaml.safe_load(f)

secret["stringData"]["api-key"] = key
data = {k: base64.b64encode(v.encode()).decode() for k, v in secret["stringData"].items()}
container = deployment["spec"]["template"]["spec"]["containers"][0]
fields = {"status.podIP": pod_ip, "metadata.namespace": "default"}
for env in container["env"]:
    field = env.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
    if field in fields:
        env.pop("valueFrom")
        env["value"] = fields[field]
def expand(text, values):
    return re.sub(r"\$\((\w+)\)", lambda m: values.get(m.group(1), m.group(0)), text)


values = {e["name"]: e["value"] for e in container["env"] if "value" in e}
container["args"] = [expand(arg, values) for arg in container.get("args", [])]
deployment["spec"]["replicas"] = 1
pod = deployment["spec"]["template"]["spec"]
for volume in pod["volumes"]:
    if "emptyDir" in volume:
        for mount in container["volumeMounts"]:
            if mount["name"] == volume["name"]:
                mount["name"] = "decide-ci-" + volume["name"]
        volume["name"] = "decide-ci-" + volume["name"]
for port in container["ports"]:
    port["hostIP"] = "127.0.0.1"
    port["hostPort"] = host_port

with open(secret_file, "w") as f:
    json.dump(data, f)
yaml.safe_dump(deployment, sys.stdout, sort_keys=False)
