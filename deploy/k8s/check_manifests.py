#!/usr/bin/env python3
"""Checks the Kubernetes manifests of deploy/k8s offline.

For the base and every overlay it
1. renders the kustomization with `kubectl kustomize` (kubectl is required: without it the check
   fails, it does not skip);
2. validates every rendered object strictly (unknown fields rejected) with kubernetes-validate
   against each Kubernetes version in KUBERNETES_VERSIONS. Only the kinds in CRD_KINDS (the
   Prometheus Operator's PodMonitor), whose schema kubernetes-validate does not ship, are left out
   of the schema validation; they get the structural checks below instead;
3. asserts the design: every broker group (StatefulSet) has exactly one PodDisruptionBudget
   selecting exactly its pods with maxUnavailable 1, a headless Service (its serviceName) that
   publishes not-ready addresses and whose name is the second label of the peer template, Parallel
   pod management, a grace period longer than the leadership drain, a volume claim mounted at the
   data dir, readiness different from liveness and a long startup probe; the nameservers have a
   ClusterIP and a headless Service; the production overlay has required anti-affinity; the
   two-groups overlay has two distinct groups; the monitoring overlay's PodMonitor selects every
   pod on a port it has.

Each failure is printed with what is wrong; the exit status is 1 when any check failed, 2 when
kubectl or kubernetes-validate is missing. Run it with the test venv's python:

    "$(scripts/python-env)" deploy/k8s/check_manifests.py
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

K8S_DIR = Path(__file__).resolve().parent
REPO = K8S_DIR.parent.parent
DOCUMENTED_CONFIG = REPO / "deploy" / "config" / "broker-node.toml"

# The oldest Kubernetes these manifests support (the preStop `sleep` action is on by default from
# 1.30) and the newest kubernetes-validate ships schemas for.
KUBERNETES_VERSIONS = ("1.30", "1.37")

# Custom resources whose schema kubernetes-validate does not ship: (apiVersion group, kind). Only
# these may go without schema validation.
CRD_KINDS = {("monitoring.coreos.com", "PodMonitor")}

# What each kustomization must contain. A new overlay must be added here.
TARGETS = {
    "base": {"groups": ["broker-a"], "anti_affinity": "preferred", "pod_monitor": False},
    "overlays/production": {"groups": ["broker-a"], "anti_affinity": "required", "pod_monitor": False},
    "overlays/two-groups": {"groups": ["broker-a", "broker-b"], "anti_affinity": "preferred", "pod_monitor": False},
    "overlays/monitoring": {"groups": ["broker-a"], "anti_affinity": "preferred", "pod_monitor": True},
    "overlays/secure": {"groups": ["broker-a"], "anti_affinity": "preferred", "pod_monitor": False, "tls": True},
}

NAMESERVER_PORT = 9876
DRAIN_MS_DEFAULT = 10000  # a leader's SIGTERM drain takes at most this long (shutdown_drain_ms)
STARTUP_WINDOW_MIN_SECS = 600  # the startup probe allows at least this long for a log replay
LIVENESS_WINDOW_MIN_SECS = 30  # a node is restarted only after this long without an answer
READY_SERVICE = "raftmq.v1.BrokerService"
# broker-node settings that exist only as environment variables (no key in the documented file).
ENV_ONLY_KEYS = {"config", "pod_name", "peer_template", "group_size", "shutdown_drain_ms", "flush_mode",
                 "leader_busy_msgs_per_sec", "log"}
# Per-node settings that a StatefulSet must leave unset: they would override the identity derived
# from the pod (node id from the ordinal, peers and advertised address from the template).
PER_NODE_KEYS = {"node_id", "peers", "advertise"}
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}


class Checks:
    """Counts checks per target and prints each failure."""

    def __init__(self) -> None:
        self.passed = 0
        self.failed = 0
        self.target = ""
        self.per_target: dict[str, list[int]] = {}

    def begin(self, target: str) -> None:
        self.target = target
        self.per_target[target] = [0, 0]

    def check(self, ok: bool, where: str, problem: str) -> bool:
        counts = self.per_target[self.target]
        if ok:
            self.passed += 1
            counts[0] += 1
        else:
            self.failed += 1
            counts[1] += 1
            print(f"FAIL {self.target}: {where}: {problem}")
        return ok


def die(message: str, status: int = 2) -> None:
    print(f"check_manifests: {message}", file=sys.stderr)
    sys.exit(status)


# ---------------------------------------------------------------------------------------------
# Helpers over rendered objects.


def kn(obj: dict) -> str:
    return f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"


def selector_matches(selector: dict | None, labels: dict) -> bool:
    """A LabelSelector (matchLabels and matchExpressions) against a label set. An empty or
    missing selector matches nothing here (Kubernetes would match everything, never intended)."""
    if not selector:
        return False
    match_labels = selector.get("matchLabels") or {}
    exprs = selector.get("matchExpressions") or []
    if not match_labels and not exprs:
        return False
    for k, v in match_labels.items():
        if labels.get(k) != v:
            return False
    for e in exprs:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def pod_templates(objs: list[dict]) -> dict[str, dict]:
    """Workload name -> its pod template's labels."""
    out = {}
    for o in objs:
        if o["kind"] in WORKLOAD_KINDS:
            out[kn(o)] = o["spec"]["template"].get("metadata", {}).get("labels", {}) or {}
    return out


def selected(selector: dict | None, templates: dict[str, dict], service_style: bool = False) -> set[str]:
    """Workloads whose pods a selector selects (a Service's selector is a plain label map)."""
    if service_style:
        selector = {"matchLabels": selector} if selector else None
    return {name for name, labels in templates.items() if selector_matches(selector, labels)}


def env_list(container: dict) -> list[dict]:
    return container.get("env") or []


def env_value(container: dict, name: str) -> str | None:
    for e in env_list(container):
        if e["name"] == name:
            return e.get("value")
    return None


def env_field_ref(container: dict, name: str) -> str | None:
    for e in env_list(container):
        if e["name"] == name:
            return ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
    return None


def named_port(container: dict, name: str) -> int | None:
    for p in container.get("ports") or []:
        if p.get("name") == name:
            return p.get("containerPort")
    return None


def probe_window(probe: dict) -> int:
    return int(probe.get("periodSeconds", 10)) * int(probe.get("failureThreshold", 3))


def probe_target(probe: dict) -> tuple[str, int | None, str | None]:
    """(mechanism, port, gRPC health service) of a probe: a built-in gRPC probe, or an exec of
    raftmq-health with --addr and --service."""
    if "grpc" in probe:
        return "grpc", probe["grpc"].get("port"), probe["grpc"].get("service", "") or ""
    if "exec" in probe:
        cmd = probe["exec"].get("command") or []
        if cmd and cmd[0].endswith("raftmq-health"):
            addr = cmd[cmd.index("--addr") + 1] if "--addr" in cmd else "127.0.0.1:10911"
            service = cmd[cmd.index("--service") + 1] if "--service" in cmd else ""
            return "exec raftmq-health", int(addr.rsplit(":", 1)[1]), service
    return "other", None, None


def anti_affinity_terms(pod_spec: dict, kind: str) -> list[dict]:
    paa = (pod_spec.get("affinity") or {}).get("podAntiAffinity") or {}
    if kind == "required":
        return paa.get("requiredDuringSchedulingIgnoredDuringExecution") or []
    return [t["podAffinityTerm"] for t in paa.get("preferredDuringSchedulingIgnoredDuringExecution") or []]


def documented_keys() -> tuple[set[str], dict]:
    """Top-level keys of deploy/config/broker-node.toml (commented-out ones included, such as
    `# node_id = 1`) and its parsed content (for the nested sections)."""
    text = DOCUMENTED_CONFIG.read_text()
    parsed = tomllib.loads(text)
    keys = set(parsed)
    for line in text.splitlines():
        if line.startswith("["):
            break
        m = re.match(r"#\s*([a-z_]+)\s*=", line)
        if m:
            keys.add(m.group(1))
    return keys, parsed


def rename(value, old: str, new: str):
    """A deep copy of `value` with `old` replaced by `new` in every string."""
    if isinstance(value, dict):
        return {rename(k, old, new): rename(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [rename(v, old, new) for v in value]
    if isinstance(value, str):
        return value.replace(old, new)
    return value


# ---------------------------------------------------------------------------------------------
# Rendering and schema validation.


def render(target: str) -> list[dict]:
    proc = subprocess.run(["kubectl", "kustomize", str(K8S_DIR / target)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {target} failed:\n{proc.stderr.strip()}")
    import yaml

    return [o for o in yaml.safe_load_all(proc.stdout) if o]


def validate_schemas(c: Checks, objs: list[dict]) -> tuple[int, list[str]]:
    """Strict schema validation of every object against every version. Returns the number of
    objects validated and the kinds left to the structural checks."""
    import kubernetes_validate
    from kubernetes_validate.utils import SchemaNotFoundError, ValidationError

    validated = 0
    skipped = []
    for o in objs:
        group = o.get("apiVersion", "").rsplit("/", 1)[0] if "/" in o.get("apiVersion", "") else ""
        ok = True
        for version in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(o, version, strict=True)
            except ValidationError as e:
                path = ".".join(str(p) for p in e.path)
                ok = c.check(False, kn(o), f"not valid for Kubernetes {version} (strict): {path}: {e.message}")
            except SchemaNotFoundError as e:
                if (group, o.get("kind")) in CRD_KINDS:
                    ok = None
                    break
                ok = c.check(False, kn(o), f"no schema ({e.message}); only {sorted(CRD_KINDS)} may go without")
        if ok is None:
            skipped.append(o["kind"])
        elif ok:
            c.check(True, kn(o), "valid")
            validated += 1
    return validated, skipped


# ---------------------------------------------------------------------------------------------
# Design checks.


def check_common(c: Checks, objs: list[dict]) -> None:
    for o in objs:
        c.check("namespace" not in o.get("metadata", {}), kn(o),
                f"hard-codes namespace {o['metadata'].get('namespace')!r}; the manifests are namespace-agnostic")
    for o in objs:
        if o["kind"] not in WORKLOAD_KINDS:
            continue
        spec = o["spec"]["template"]["spec"]
        c.check(spec.get("enableServiceLinks") is False, kn(o),
                "enableServiceLinks must be false: service links inject RAFTMQ_NAMESERVER_* variables "
                "into the nodes' own RAFTMQ_* configuration namespace")
        sel = o["spec"].get("selector") or {}
        labels = o["spec"]["template"].get("metadata", {}).get("labels", {})
        c.check(selector_matches(sel, labels), kn(o), "its selector does not match its own pod template")


def check_nameservers(c: Checks, objs: list[dict], expect: dict, templates: dict) -> None:
    deps = [o for o in objs if o["kind"] == "Deployment"
            and o["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component") == "nameserver"]
    if not c.check(len(deps) == 1, "nameserver", f"expected one nameserver Deployment, found {len(deps)}"):
        return
    dep = deps[0]
    me = kn(dep)
    c.check(dep["spec"].get("replicas") == 2, me, f"replicas is {dep['spec'].get('replicas')}, expected 2")
    spec = dep["spec"]["template"]["spec"]
    ctr = spec["containers"][0]
    cmd = (ctr.get("command") or []) + (ctr.get("args") or [])
    c.check(cmd[:1] == ["nameserver"] and "--listen" in cmd and cmd[cmd.index("--listen") + 1] == f"0.0.0.0:{NAMESERVER_PORT}",
            me, f"command is {cmd}, expected nameserver --listen 0.0.0.0:{NAMESERVER_PORT}")
    port = named_port(ctr, "grpc")
    c.check(port == NAMESERVER_PORT, me, f"container port `grpc` is {port}, expected {NAMESERVER_PORT}")
    services = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Service"}
    for name, headless in (("raftmq-nameserver", False), ("raftmq-nameserver-headless", True)):
        svc = services.get(name)
        if not c.check(svc is not None, me, f"no Service {name}"):
            continue
        s = svc["spec"]
        if headless:
            c.check(s.get("clusterIP") == "None", kn(svc), "must be headless (clusterIP: None)")
            c.check(s.get("publishNotReadyAddresses") is True, kn(svc), "must set publishNotReadyAddresses: true")
        else:
            c.check(s.get("type", "ClusterIP") == "ClusterIP" and s.get("clusterIP") != "None", kn(svc),
                    "must be a ClusterIP Service (not headless)")
        c.check(selected(s.get("selector"), templates, service_style=True) == {me}, kn(svc),
                f"selects {sorted(selected(s.get('selector'), templates, True))}, expected exactly {me}")
        c.check(any(p.get("port") == NAMESERVER_PORT for p in s.get("ports", [])), kn(svc), f"no port {NAMESERVER_PORT}")
    for kind in ("readinessProbe", "livenessProbe"):
        probe = ctr.get(kind)
        if c.check(probe is not None, me, f"no {kind}"):
            mech, p, _ = probe_target(probe)
            c.check(mech != "other" and p == NAMESERVER_PORT, me, f"{kind} is not a gRPC health check of port {NAMESERVER_PORT}")
    check_grace(c, me, spec, ctr, 0)
    pdbs = [o for o in objs if o["kind"] == "PodDisruptionBudget" and selected(o["spec"].get("selector"), templates) == {me}]
    c.check(len(pdbs) == 1, me, f"expected one PodDisruptionBudget selecting exactly its pods, found {len(pdbs)}")
    check_anti_affinity(c, me, spec, templates, expect["anti_affinity"])


def check_grace(c: Checks, me: str, spec: dict, ctr: dict, drain: int) -> None:
    grace = spec.get("terminationGracePeriodSeconds", 30)
    pre_stop = ((ctr.get("lifecycle") or {}).get("preStop") or {})
    sleep = (pre_stop.get("sleep") or {}).get("seconds", 0)
    c.check(not pre_stop or "sleep" in pre_stop, me, "the image has no shell: a preStop hook can only be `sleep:`")
    c.check(grace > drain + sleep, me,
            f"terminationGracePeriodSeconds {grace} must exceed the drain ({drain} s) plus the preStop sleep ({sleep} s)")


def check_anti_affinity(c: Checks, me: str, spec: dict, templates: dict, kind: str) -> None:
    terms = [t for t in anti_affinity_terms(spec, kind) if t.get("topologyKey") == "kubernetes.io/hostname"]
    own = [t for t in terms if selected(t.get("labelSelector"), templates) == {me}]
    c.check(bool(own), me, f"no {kind}DuringSchedulingIgnoredDuringExecution pod anti-affinity by "
            f"kubernetes.io/hostname selecting exactly its own pods")


def check_group(c: Checks, sts: dict, objs: list[dict], templates: dict, expect: dict, doc_keys: set[str], doc_cfg: dict) -> dict:
    """Checks one broker group; returns its identity for the cross-group checks."""
    me = kn(sts)
    name = sts["metadata"]["name"]
    s = sts["spec"]
    spec = s["template"]["spec"]
    containers = [x for x in spec["containers"] if (x.get("command") or [""])[0] == "broker-node"]
    if not c.check(len(containers) == 1, me, "expected one container running broker-node"):
        return {}
    ctr = containers[0]
    replicas = s.get("replicas", 1)

    c.check(s.get("podManagementPolicy") == "Parallel", me,
            f"podManagementPolicy is {s.get('podManagementPolicy', 'OrderedReady')!r}: must be Parallel "
            "(pod 0 cannot be Ready before a quorum exists)")
    upd = s.get("updateStrategy") or {}
    c.check(upd.get("type", "RollingUpdate") == "RollingUpdate"
            and not (upd.get("rollingUpdate") or {}).get("partition")
            and "maxUnavailable" not in (upd.get("rollingUpdate") or {}), me,
            "updateStrategy must be a plain RollingUpdate (one pod at a time, waiting for Ready)")
    c.check(replicas >= 3 and replicas % 2 == 1, me, f"replicas {replicas}: a Raft group needs an odd size of 3 or more")

    # PodDisruptionBudget: exactly one, selecting exactly this group's pods, maxUnavailable 1.
    pdbs = [o for o in objs if o["kind"] == "PodDisruptionBudget" and me in selected(o["spec"].get("selector"), templates)]
    if c.check(len(pdbs) == 1, me, f"expected exactly one PodDisruptionBudget selecting its pods, found {[kn(p) for p in pdbs]}"):
        pdb = pdbs[0]
        sel = selected(pdb["spec"].get("selector"), templates)
        c.check(sel == {me}, kn(pdb), f"selects {sorted(sel)}, expected exactly {me}")
        c.check(pdb["spec"].get("maxUnavailable") == 1 and "minAvailable" not in pdb["spec"], kn(pdb),
                f"maxUnavailable is {pdb['spec'].get('maxUnavailable')!r} (minAvailable {pdb['spec'].get('minAvailable')!r}), expected maxUnavailable: 1")

    # The headless Service named by serviceName.
    service_name = s.get("serviceName")
    services = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Service"}
    svc = services.get(service_name)
    port = named_port(ctr, "grpc")
    c.check(port is not None, me, "no container port named grpc")
    if c.check(svc is not None, me, f"serviceName {service_name!r} names no Service"):
        ss = svc["spec"]
        c.check(ss.get("clusterIP") == "None", kn(svc), "the StatefulSet's Service must be headless (clusterIP: None)")
        c.check(ss.get("publishNotReadyAddresses") is True, kn(svc),
                "must set publishNotReadyAddresses: true (peers resolve each other before any is Ready)")
        sel = selected(ss.get("selector"), templates, service_style=True)
        c.check(sel == {me}, kn(svc), f"selects {sorted(sel)}, expected exactly {me}")
        c.check(any(p.get("port") == port for p in ss.get("ports", [])), kn(svc), f"has no port {port}")

    # Identity from the pod.
    envs = [e["name"] for e in env_list(ctr)]
    c.check(env_field_ref(ctr, "POD_NAMESPACE") == "metadata.namespace", me, "POD_NAMESPACE must come from fieldRef metadata.namespace")
    c.check(env_field_ref(ctr, "RAFTMQ_POD_NAME") == "metadata.name", me, "RAFTMQ_POD_NAME must come from fieldRef metadata.name")
    for i, e in enumerate(env_list(ctr)):
        for ref in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", e.get("value") or ""):
            c.check(ref in envs[:i], me, f"{e['name']} uses $({ref}), which is not defined before it (Kubernetes leaves it unexpanded)")
    for key in PER_NODE_KEYS:
        c.check(f"RAFTMQ_{key.upper()}" not in envs, me, f"RAFTMQ_{key.upper()} is set: it would override the identity derived from the pod")
    for e in envs:
        if e.startswith("RAFTMQ_"):
            key = e[len("RAFTMQ_"):].lower()
            c.check(key in doc_keys or key in ENV_ONLY_KEYS, me,
                    f"{e} is no broker-node setting (not a key of deploy/config/broker-node.toml)")
    group_size = env_value(ctr, "RAFTMQ_GROUP_SIZE")
    c.check(group_size == str(replicas), me, f"RAFTMQ_GROUP_SIZE is {group_size!r} but replicas is {replicas}")
    broker = env_value(ctr, "RAFTMQ_BROKER")
    c.check(bool(broker), me, "RAFTMQ_BROKER is not set")
    c.check(bool(env_value(ctr, "RAFTMQ_CLUSTER")), me, "RAFTMQ_CLUSTER is not set")
    c.check(env_value(ctr, "RAFTMQ_LOG_JSON") == "true", me, "RAFTMQ_LOG_JSON must be \"true\"")
    listen = env_value(ctr, "RAFTMQ_LISTEN") or ""
    c.check(listen == f"0.0.0.0:{port}", me, f"RAFTMQ_LISTEN is {listen!r}, expected 0.0.0.0:{port} (the grpc port)")

    template = env_value(ctr, "RAFTMQ_PEER_TEMPLATE") or ""
    m = re.fullmatch(r"([^:]+):(\d+)", template)
    if c.check(m is not None and "{ordinal}" in template, me, f"RAFTMQ_PEER_TEMPLATE {template!r} is not HOST:PORT with {{ordinal}}"):
        host, tport = m.group(1).split("."), int(m.group(2))
        want = [f"{name}-{{ordinal}}", service_name, "$(POD_NAMESPACE)", "svc", "cluster", "local"]
        c.check(host == want, me,
                f"peer template host {m.group(1)!r} is not <pod>.<headless service>.$(POD_NAMESPACE).svc.cluster.local, "
                f"i.e. {'.'.join(want)!r}")
        c.check(tport == port, me, f"peer template port {tport} is not the grpc port {port}")

    nameservers = env_value(ctr, "RAFTMQ_NAMESERVERS") or ""
    entries = [x for x in nameservers.split(";") if x]
    c.check(bool(entries), me, "RAFTMQ_NAMESERVERS is empty")
    for entry in entries:
        m = re.fullmatch(r"dns:([a-z0-9-]+)\.\$\(POD_NAMESPACE\)\.svc\.cluster\.local:(\d+)", entry)
        if not c.check(m is not None, me, f"nameserver entry {entry!r} is not dns:<service>.$(POD_NAMESPACE).svc.cluster.local:PORT"):
            continue
        ns_svc = services.get(m.group(1))
        if c.check(ns_svc is not None, me, f"nameserver entry names no Service {m.group(1)!r}"):
            ss = ns_svc["spec"]
            c.check(ss.get("clusterIP") == "None" and ss.get("publishNotReadyAddresses") is True, kn(ns_svc),
                    "brokers register through it: it must be headless (every pod's address) and publish not-ready addresses")
            sel = selected(ss.get("selector"), templates, True)
            c.check(len(sel) == 1 and all(templates[w].get("app.kubernetes.io/component") == "nameserver" for w in sel),
                    kn(ns_svc), f"selects {sorted(sel)}, expected the nameserver Deployment")
            c.check(any(p.get("port") == int(m.group(2)) for p in ss.get("ports", [])), kn(ns_svc), f"has no port {m.group(2)}")

    # Configuration from the ConfigMap.
    mounts = {vm["name"]: vm for vm in ctr.get("volumeMounts") or []}
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    config_path = env_value(ctr, "RAFTMQ_CONFIG") or ""
    configmaps = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ConfigMap"}
    found = False
    shared_cfg: dict = {}
    for vname, vol in volumes.items():
        if "configMap" not in vol or vname not in mounts:
            continue
        mount = mounts[vname]["mountPath"].rstrip("/")
        if not config_path.startswith(mount + "/"):
            continue
        found = True
        key = config_path[len(mount) + 1:]
        cm = configmaps.get(vol["configMap"]["name"])
        if not c.check(cm is not None, me, f"volume {vname} names ConfigMap {vol['configMap']['name']!r}, which is not rendered"):
            break
        text = (cm.get("data") or {}).get(key)
        if not c.check(text is not None, kn(cm), f"has no key {key!r} (RAFTMQ_CONFIG={config_path})"):
            break
        try:
            cfg = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            c.check(False, kn(cm), f"{key} is not valid TOML: {e}")
            break
        shared_cfg = cfg
        for k, v in cfg.items():
            if isinstance(v, dict):
                doc_section = doc_cfg.get(k)
                if not c.check(isinstance(doc_section, dict), kn(cm), f"section [{k}] is not in deploy/config/broker-node.toml"):
                    continue
                for sub in v:
                    c.check(sub in doc_section, kn(cm), f"key {k}.{sub} is not in deploy/config/broker-node.toml")
            else:
                c.check(k in doc_keys, kn(cm), f"key {k} is not in deploy/config/broker-node.toml")
                c.check(k not in PER_NODE_KEYS, kn(cm), f"key {k} is per node: it cannot be in a ConfigMap every pod shares")
    c.check(found, me, f"RAFTMQ_CONFIG {config_path!r} is not a file of a mounted ConfigMap volume")

    # Data: one claim per pod, mounted at the data dir.
    data_dir = env_value(ctr, "RAFTMQ_DATA_DIR")
    claims = [t["metadata"]["name"] for t in s.get("volumeClaimTemplates") or []]
    c.check(bool(claims), me, "no volumeClaimTemplates: a pod's log would not survive it")
    c.check(bool(data_dir), me, "RAFTMQ_DATA_DIR is not set")
    data_mounts = [n for n in claims if n in mounts and mounts[n]["mountPath"].rstrip("/") == (data_dir or "").rstrip("/")]
    c.check(len(data_mounts) == 1, me, f"no volume claim template mounted at the data dir {data_dir!r} (claims {claims})")
    for t in s.get("volumeClaimTemplates") or []:
        c.check(bool(((t.get("spec") or {}).get("resources") or {}).get("requests", {}).get("storage")), me,
                f"claim template {t['metadata']['name']} requests no storage")
        c.check(t["metadata"]["name"] not in volumes, me, f"pod volume {t['metadata']['name']} shadows the claim template")

    # Probes.
    probes = {k: ctr.get(k) for k in ("startupProbe", "livenessProbe", "readinessProbe")}
    for k, p in probes.items():
        c.check(p is not None, me, f"no {k}")
    if all(probes.values()):
        live, ready, start = probes["livenessProbe"], probes["readinessProbe"], probes["startupProbe"]
        lt, rt, st = probe_target(live), probe_target(ready), probe_target(start)
        c.check(lt != rt, me, "the readiness probe checks the same thing as the liveness probe")
        c.check(rt[0] != "other" and rt[1] == port and rt[2] == READY_SERVICE, me,
                f"readiness must check gRPC health service {READY_SERVICE} on port {port}, checks {rt}")
        c.check(lt[0] != "other" and lt[1] == port and lt[2] == "", me,
                f"liveness must check the whole server (service \"\") on port {port}, checks {lt}")
        c.check(st[0] != "other" and st[1] == port, me, f"startup probe must be a gRPC health check of port {port}, is {st}")
        c.check(probe_window(start) >= STARTUP_WINDOW_MIN_SECS, me,
                f"startup probe allows {probe_window(start)} s (period x failureThreshold) for a log replay, "
                f"less than {STARTUP_WINDOW_MIN_SECS} s")
        c.check(probe_window(live) >= LIVENESS_WINDOW_MIN_SECS, me,
                f"liveness restarts after {probe_window(live)} s without an answer, less than {LIVENESS_WINDOW_MIN_SECS} s")

    # The leadership drain on SIGTERM: environment > ConfigMap > documented default.
    drain_ms = env_value(ctr, "RAFTMQ_SHUTDOWN_DRAIN_MS") or shared_cfg.get("shutdown_drain_ms") \
        or doc_cfg.get("shutdown_drain_ms") or DRAIN_MS_DEFAULT
    check_grace(c, me, spec, ctr, -(-int(drain_ms) // 1000))
    check_anti_affinity(c, me, spec, templates, expect["anti_affinity"])

    ann = s["template"]["metadata"].get("annotations") or {}
    c.check(ann.get("prometheus.io/scrape") == "true" and ann.get("prometheus.io/port") == str(port)
            and ann.get("prometheus.io/path") == "/metrics", me,
            f"Prometheus annotations must be scrape \"true\", port \"{port}\", path /metrics; are {ann}")
    res = ctr.get("resources") or {}
    for part in ("requests", "limits"):
        for r in ("cpu", "memory"):
            c.check(r in (res.get(part) or {}), me, f"no {part}.{r}")
    return {"name": name, "broker": broker, "service": service_name, "sts": sts}


def check_groups(c: Checks, objs: list[dict], expect: dict, templates: dict) -> list[str]:
    doc_keys, doc_cfg = documented_keys()
    stss = [o for o in objs if o["kind"] == "StatefulSet"
            and o["spec"]["template"]["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "broker"]
    names = sorted(o["metadata"]["name"] for o in stss)
    c.check(names == sorted(expect["groups"]), "groups", f"broker StatefulSets are {names}, expected {expect['groups']}")
    groups = [check_group(c, o, objs, templates, expect, doc_keys, doc_cfg) for o in stss]
    groups = [g for g in groups if g]
    for field in ("broker", "service"):
        values = [g[field] for g in groups]
        c.check(len(set(values)) == len(values), "groups", f"two groups share a {field}: {values}")
    # A group added by copying broker-a must differ from it in its name only.
    by_name = {g["name"]: g["sts"] for g in groups}
    if "broker-a" in by_name:
        for g in groups:
            if g["name"] == "broker-a":
                continue
            as_a = rename(copy.deepcopy(g["sts"]), g["name"], "broker-a")
            c.check(as_a == by_name["broker-a"], kn(g["sts"]),
                    "differs from broker-a in more than its name (keep the groups' settings in step, or change this check)")
    return names


def check_pod_monitor(c: Checks, objs: list[dict], expect: dict, templates: dict) -> None:
    pms = [o for o in objs if o["kind"] == "PodMonitor"]
    if not expect["pod_monitor"]:
        c.check(not pms, "monitoring", f"unexpected {[kn(p) for p in pms]}")
        return
    if not c.check(len(pms) == 1, "monitoring", f"expected one PodMonitor, found {len(pms)}"):
        return
    pm = pms[0]
    me = kn(pm)
    c.check(pm["apiVersion"] == "monitoring.coreos.com/v1", me, f"apiVersion {pm['apiVersion']}, expected monitoring.coreos.com/v1")
    spec = pm.get("spec") or {}
    sel = selected(spec.get("selector"), templates)
    c.check(sel == set(templates), me, f"selects {sorted(sel)}, expected every raftmq workload {sorted(templates)}")
    endpoints = spec.get("podMetricsEndpoints") or []
    c.check(bool(endpoints), me, "no podMetricsEndpoints")
    workloads = {kn(o): o for o in objs if o["kind"] in WORKLOAD_KINDS}
    for ep in endpoints:
        c.check(ep.get("path") == "/metrics", me, f"endpoint path {ep.get('path')!r}, expected /metrics")
        for w in sel:
            ports = [named_port(x, ep.get("port")) for x in workloads[w]["spec"]["template"]["spec"]["containers"]]
            c.check(any(ports), me, f"endpoint port {ep.get('port')!r} is no named container port of {w}")
    c.check(set(spec) <= {"selector", "podMetricsEndpoints", "podTargetLabels", "jobLabel", "namespaceSelector"}, me,
            f"unexpected spec fields {sorted(set(spec))} (not schema-validated: keep to the known ones)")


# ---------------------------------------------------------------------------------------------


def check_tls(c: Checks, objs: list[dict], expect: dict) -> None:
    """With "tls" expected: every broker node and nameserver serves TLS from a mounted Secret with
    auth on and its admin secret from a Secret, and every probe checks over TLS (raftmq-health
    trusting RAFTMQ_TLS_CA), since the kubelet's gRPC probes cannot. Without it: no TLS settings."""
    want = bool(expect.get("tls"))
    for o in objs:
        if o["kind"] not in ("StatefulSet", "Deployment"):
            continue
        me = kn(o)
        pod = o["spec"]["template"]["spec"]
        ctr = pod["containers"][0]
        ns = o["kind"] == "Deployment"
        prefix = "RAFTMQ_NS_" if ns else "RAFTMQ_"
        keys = [f"{prefix}TLS_CA", f"{prefix}TLS_CERT", f"{prefix}TLS_KEY"]
        have = [env_value(ctr, k) for k in keys]
        if not want:
            c.check(not any(have), me, f"TLS settings {keys} outside a TLS overlay")
            continue
        c.check(all(have), me, f"TLS needs {keys}, has {have}")
        c.check(env_value(ctr, f"{prefix}AUTH") == "true", me, f"{prefix}AUTH is not \"true\"")
        secret = [e for e in env_list(ctr) if e["name"] == f"{prefix}ADMIN_SECRET_KEY"]
        c.check(bool(secret) and "secretKeyRef" in (secret[0].get("valueFrom") or {}), me,
                f"{prefix}ADMIN_SECRET_KEY must come from a Secret")
        mounts = [m["mountPath"] for m in ctr.get("volumeMounts") or []]
        c.check(all(v and any(v.startswith(m.rstrip("/") + "/") for m in mounts) for v in have), me,
                f"TLS files {have} are not under a mounted volume {mounts}")
        c.check(any("secret" in v for v in pod.get("volumes") or []), me, "no Secret volume for the TLS files")
        c.check(env_value(ctr, "RAFTMQ_TLS_CA") is not None, me, "probes (raftmq-health) need RAFTMQ_TLS_CA")
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            probe = ctr.get(kind)
            if probe is not None:
                c.check(probe_target(probe)[0] == "exec raftmq-health", me,
                        f"{kind} must run raftmq-health (a gRPC probe cannot speak TLS)")


def main() -> int:
    if shutil.which("kubectl") is None:
        die("kubectl not found on PATH: it renders the kustomizations (`kubectl kustomize`). "
            "Install kubectl (it includes kustomize) and run again.")
    try:
        import kubernetes_validate  # noqa: F401
        import yaml  # noqa: F401
    except ImportError as e:
        die(f"{e}: run with the test venv's python: \"$(scripts/python-env)\" deploy/k8s/check_manifests.py")
    from kubernetes_validate.version import __version__ as kv_version

    found = {str(p.parent.relative_to(K8S_DIR)) for p in K8S_DIR.glob("overlays/*/kustomization.yaml")}
    found.add("base")
    c = Checks()
    rows = []
    unknown = sorted(found - set(TARGETS))
    missing = sorted(set(TARGETS) - found)
    c.begin("deploy/k8s")
    c.check(not unknown, "deploy/k8s", f"overlays {unknown} have no expectations in TARGETS of check_manifests.py")
    c.check(not missing, "deploy/k8s", f"TARGETS lists {missing}, which do not exist")

    for target, expect in TARGETS.items():
        if target not in found:
            continue
        c.begin(target)
        try:
            objs = render(target)
        except RuntimeError as e:
            c.check(False, "kubectl kustomize", str(e))
            rows.append((target, "-", "render failed", "-", "-", "-", "render failed"))
            continue
        validated, skipped = validate_schemas(c, objs)
        templates = pod_templates(objs)
        check_common(c, objs)
        check_nameservers(c, objs, expect, templates)
        groups = check_groups(c, objs, expect, templates)
        check_pod_monitor(c, objs, expect, templates)
        check_tls(c, objs, expect)
        passed, failed = c.per_target[target]
        rows.append((
            target,
            str(len(objs)),
            f"{validated}/{len(objs)}",
            ",".join(skipped) or "-",
            ",".join(groups),
            "hard" if expect["anti_affinity"] == "required" else "soft",
            f"{passed} passed, {failed} failed",
        ))

    kubectl_version = subprocess.run(["kubectl", "version", "--client"], capture_output=True, text=True).stdout
    kustomize = re.search(r"Kustomize Version: (\S+)", kubectl_version)
    print(f"kubernetes-validate {kv_version} (strict) against Kubernetes {', '.join(KUBERNETES_VERSIONS)}; "
          f"kustomize {kustomize.group(1) if kustomize else 'unknown'} (kubectl kustomize)")
    header = ("target", "objects", "schema-valid", "CRD (no schema)", "broker groups", "anti-affinity", "checks")
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    for r in [header] + rows:
        print("  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip())
    print(f"check_manifests: {c.passed} passed, {c.failed} failed")
    return 1 if c.failed else 0


if __name__ == "__main__":
    sys.exit(main())
