"""The Kubernetes deployment (deploy/): rendering, strict schemas, a kubectl dry run, and the
properties a review would check by hand (least privilege, hardening, network policy wiring)."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from deploy import validate

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
BASE = DEPLOY / "kubernetes" / "base"
OVERLAYS = {"overlays/spot-sandboxes", "overlays/gvisor"}

SYSTEM_NS = "orchard-system"
SANDBOX_NS = "orchard-sandboxes"
ORCHESTRATOR = {"app.kubernetes.io/name": "orchard-orchestrator"}
SANDBOX_POD = {"app.kubernetes.io/managed-by": "orchard"}
PLACEHOLDER = "replace-me"

Manifest = dict[str, Any]


@pytest.fixture(scope="module")
def kubectl() -> str:
    try:
        return validate.find_kubectl()
    except validate.ToolMissing as exc:  # fail, not skip: a skip would pass unvalidated YAML
        pytest.fail(str(exc))


@pytest.fixture(scope="module")
def rendered(kubectl: str) -> dict[str, list[Manifest]]:
    """Every kustomization's documents, by path relative to deploy/kubernetes."""
    with validate.renderable_tree() as tree:
        return {rel.as_posix(): validate.documents(validate.render(kubectl, tree / rel))
                for rel in validate.kustomizations(tree)}


def find(docs: list[Manifest], kind: str, name: str, namespace: str | None = None) -> Manifest:
    matches = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name
               and (namespace is None or d["metadata"].get("namespace") == namespace)]
    assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
    return matches[0]


def find_prefixed(docs: list[Manifest], kind: str, prefix: str) -> Manifest:
    """A generated object, whose name is ``prefix`` plus kustomize's content hash."""
    matches = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].startswith(prefix)]
    assert len(matches) == 1, f"expected one {kind} {prefix}*, found {len(matches)}"
    return matches[0]


def config(docs: list[Manifest]) -> dict[str, Any]:
    data = find_prefixed(docs, "ConfigMap", "orchard-config-")["data"]
    assert set(data) == {"orchard.yaml"}
    parsed = yaml.safe_load(data["orchard.yaml"])
    assert isinstance(parsed, dict)
    return parsed


POD_KINDS = {"Pod", "ReplicaSet", "Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob"}


def workloads(docs: list[Manifest]) -> list[Manifest]:
    """Everything that makes pods; only Deployments and StatefulSets are expected."""
    found = [d for d in docs if d["kind"] in POD_KINDS]
    assert {d["kind"] for d in found} <= {"Deployment", "StatefulSet"}
    return found


def pod_spec(workload: Manifest) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


# --- the validation itself ---------------------------------------------------------------------


def test_every_kustomization_renders(rendered: dict[str, list[Manifest]]) -> None:
    assert set(rendered) == {"base", *OVERLAYS}
    for docs in rendered.values():
        assert all({"apiVersion", "kind", "metadata"} <= doc.keys() for doc in docs)


def test_strict_schema_of_every_document(rendered: dict[str, list[Manifest]]) -> None:
    errors = [e for docs in rendered.values() for d in docs if (e := validate.schema_error(d))]
    assert errors == []


def test_strict_schema_rejects_a_misspelled_field(rendered: dict[str, list[Manifest]]) -> None:
    deployment = copy.deepcopy(find(rendered["base"], "Deployment", "orchard-orchestrator"))
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    error = validate.schema_error(deployment)
    assert error is not None and "readinesProbe" in error


def test_a_broken_manifest_fails_the_whole_run(kubectl: str, tmp_path: Path) -> None:
    tree = tmp_path / "kubernetes"
    shutil.copytree(DEPLOY / "kubernetes", tree,
                    ignore=shutil.ignore_patterns(validate.SECRET_ENV.name))
    manifest = tree / "base" / "orchestrator.yaml"
    manifest.write_text(manifest.read_text().replace("revisionHistoryLimit:", "revisionHistory:"))
    checks = validate.validate_all(kubectl, None, manifests=tree)
    failed = {(c.target, c.name) for c in checks if not c.ok}
    # The base and every overlay built on it.
    assert {target for target, _ in failed} == {"base", *OVERLAYS}
    assert all(name.startswith("schema") for _, name in failed)
    assert all("revisionHistory" in c.detail for c in checks if not c.ok)


def test_script_dry_runs_against_the_fake_api_server(kubectl: str) -> None:
    """`python deploy/validate.py`, as `make validate-manifests` runs it: every check passes,
    the kubectl client dry run included (against tests/fakekube, started by the script)."""
    proc = subprocess.run([sys.executable, str(DEPLOY / "validate.py")], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for target in ("base", *OVERLAYS):
        assert re.search(rf"^{target} +dry-run \(client\) +ok ", proc.stdout, re.MULTILINE), \
            proc.stdout
    assert "FAILED" not in proc.stdout


def test_dry_run_rejects_a_kind_the_cluster_does_not_serve(kubectl: str, tmp_path: Path) -> None:
    from tests.fakekube.apiserver import FakeApiServer

    widget = "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w\n"
    with FakeApiServer() as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        with pytest.raises(validate.CheckFailed, match="Widget"):
            validate.dry_run(kubectl, kubeconfig, widget)


def test_dry_run_failure_is_reported(kubectl: str, tmp_path: Path) -> None:
    unreachable = tmp_path / "kubeconfig"
    unreachable.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "none",
        "clusters": [{"name": "none", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "none", "user": {"token": "x"}}],
        "contexts": [{"name": "none", "context": {"cluster": "none", "user": "none"}}],
    }))
    checks = validate.validate_all(kubectl, unreachable)
    dry_runs = [c for c in checks if c.name.startswith("dry-run")]
    assert len(dry_runs) == 1 + len(OVERLAYS)
    assert not any(c.ok for c in dry_runs)


# --- secrets -----------------------------------------------------------------------------------


def test_secret_templates_hold_only_placeholders() -> None:
    env_lines = [line for line in (BASE / "secret.env.example").read_text().splitlines()
                 if line.strip() and not line.startswith("#")]
    env = dict(line.split("=", 1) for line in env_lines)
    template = yaml.safe_load((BASE / "secret.example.yaml").read_text())
    assert template["kind"] == "Secret" and "data" not in template
    for values in (env, template["stringData"]):
        assert set(values) == {"ORCHARD_API_KEYS", "ORCHARD_AGENT_SECRET", "REDIS_PASSWORD",
                               "ORCHARD_STATE", "ORCHARD_PROXY_KEY"}
        assert all(PLACEHOLDER in value for value in values.values()), values
        # The URL must carry the same password Redis is started with.
        assert f":{values['REDIS_PASSWORD']}@" in values["ORCHARD_STATE"]
    assert validate.schema_error(template) is None


def test_templates_are_not_applied_and_real_secrets_are_ignored() -> None:
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    assert "secret.example.yaml" not in kustomization["resources"]
    assert kustomization["secretGenerator"][0]["envs"] == ["secret.env"]
    assert "secret.env" in (BASE / ".gitignore").read_text().splitlines()


def test_no_secret_material_in_deploy_files() -> None:
    """Nothing resembling a generated key (long hex or base64) in the shipped files."""
    token = re.compile(r"\b[0-9a-fA-F]{32,}\b|[A-Za-z0-9+/]{40,}={0,2}")
    files = [p for p in DEPLOY.rglob("*") if p.is_file() and p.name != "secret.env"
             and "__pycache__" not in p.parts]
    files.append(REPO / "docs" / "deploy-kubernetes.md")
    hits = {str(p.relative_to(REPO)): token.findall(p.read_text()) for p in files}
    assert {path: found for path, found in hits.items() if found} == {}


def test_secret_values_reach_only_the_containers_that_need_them(
        rendered: dict[str, list[Manifest]]) -> None:
    docs = rendered["base"]
    secret = find_prefixed(docs, "Secret", "orchard-secrets-")["metadata"]["name"]

    def secret_keys(workload: Manifest) -> set[str]:
        keys = set()
        for container in pod_spec(workload)["containers"]:
            assert "envFrom" not in container  # every key by name, nothing wholesale
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["name"] == secret  # the generated name, hash included
                    keys.add(ref["key"])
        return keys

    assert secret_keys(find(docs, "Deployment", "orchard-orchestrator")) == {
        "ORCHARD_API_KEYS", "ORCHARD_AGENT_SECRET", "ORCHARD_STATE"}
    assert secret_keys(find(docs, "StatefulSet", "orchard-redis")) == {"REDIS_PASSWORD"}
    assert secret_keys(find(docs, "StatefulSet", "orchard-proxy")) == {"ORCHARD_PROXY_KEY"}


# --- RBAC --------------------------------------------------------------------------------------


def test_role_grants_exactly_what_the_orchestrator_needs(
        rendered: dict[str, list[Manifest]]) -> None:
    for docs in rendered.values():
        kinds = {d["kind"] for d in docs}
        assert not kinds & {"ClusterRole", "ClusterRoleBinding"}
        roles = [d for d in docs if d["kind"] == "Role"]
        assert [(r["metadata"]["name"], r["metadata"]["namespace"]) for r in roles] == [
            ("orchard-orchestrator", SANDBOX_NS)]
        grants = {(group, resource, verb)
                  for rule in roles[0]["rules"]
                  for group in rule["apiGroups"]
                  for resource in rule["resources"]
                  for verb in rule["verbs"]}
        assert not any("resourceNames" in rule or "nonResourceURLs" in rule
                       for rule in roles[0]["rules"])
        assert grants == {
            *(("", "pods", verb) for verb in ("get", "list", "watch", "create", "delete")),
            *(("networking.k8s.io", "networkpolicies", verb)
              for verb in ("get", "list", "create", "delete")),
        }
        bindings = [d for d in docs if d["kind"] == "RoleBinding"]
        assert len(bindings) == 1
        assert bindings[0]["metadata"]["namespace"] == SANDBOX_NS
        assert bindings[0]["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                          "kind": "Role", "name": "orchard-orchestrator"}
        assert bindings[0]["subjects"] == [{"kind": "ServiceAccount",
                                            "name": "orchard-orchestrator",
                                            "namespace": SYSTEM_NS}]


def test_only_the_orchestrator_mounts_an_api_token(rendered: dict[str, list[Manifest]]) -> None:
    docs = rendered["base"]
    accounts = {(d["metadata"]["namespace"], d["metadata"]["name"]): d
                for d in docs if d["kind"] == "ServiceAccount"}
    assert accounts[(SANDBOX_NS, "default")]["automountServiceAccountToken"] is False
    for workload in workloads(docs):
        spec = pod_spec(workload)
        account = accounts[(workload["metadata"]["namespace"], spec["serviceAccountName"])]
        mounts = spec.get("automountServiceAccountToken",
                          account.get("automountServiceAccountToken", True))
        assert mounts is (workload["metadata"]["name"] == "orchard-orchestrator")


# --- pods --------------------------------------------------------------------------------------


def test_every_container_is_hardened(rendered: dict[str, list[Manifest]]) -> None:
    for docs in rendered.values():
        found = workloads(docs)
        assert {w["metadata"]["name"] for w in found} == {"orchard-orchestrator", "orchard-redis",
                                                          "orchard-proxy"}
        for workload in found:
            spec = pod_spec(workload)
            pod_security = spec.get("securityContext", {})
            assert pod_security.get("seccompProfile") == {"type": "RuntimeDefault"}
            assert spec.get("hostNetwork") is not True and spec.get("hostPID") is not True
            assert spec.get("enableServiceLinks") is False
            for container in spec["containers"] + spec.get("initContainers", []):
                context = container.get("securityContext", {})
                where = f"{workload['metadata']['name']}/{container['name']}"
                assert context.get("capabilities", {}).get("drop") == ["ALL"], where
                assert "add" not in context.get("capabilities", {}), where
                assert context.get("allowPrivilegeEscalation") is False, where
                assert context.get("privileged") is not True, where
                assert context.get("readOnlyRootFilesystem") is True, where
                assert context.get("runAsNonRoot", pod_security.get("runAsNonRoot")), where
                assert context.get("runAsUser", pod_security.get("runAsUser", 0)) > 0, where
                assert {"requests", "limits"} <= container.get("resources", {}).keys(), where
                assert "readinessProbe" in container and "livenessProbe" in container, where


def test_orchestrator_deployment(rendered: dict[str, list[Manifest]]) -> None:
    docs = rendered["base"]
    deployment = find(docs, "Deployment", "orchard-orchestrator", SYSTEM_NS)
    spec = deployment["spec"]
    assert spec["replicas"] >= 2
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    template = spec["template"]
    assert selects(spec["selector"]["matchLabels"], template["metadata"]["labels"])
    assert selects(ORCHESTRATOR, template["metadata"]["labels"])
    pod = template["spec"]
    assert pod["terminationGracePeriodSeconds"] >= 15  # preStop sleep + uvicorn's 10 s drain
    spread = pod["topologySpreadConstraints"]
    assert any(c["topologyKey"] == "kubernetes.io/hostname"
               and selects(c["labelSelector"]["matchLabels"], template["metadata"]["labels"])
               for c in spread)
    [container] = pod["containers"]
    assert container["image"] == "orchard-orchestrator:0.1.0"
    assert container["args"] == ["serve", "--config", "/etc/orchard/orchard.yaml",
                                 "--host", "0.0.0.0", "--port", "8000"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8000}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] == "/health" and ports[get["port"]] == 8000, probe
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    configmap = find_prefixed(docs, "ConfigMap", "orchard-config-")
    assert volumes[mounts["/etc/orchard"]]["configMap"]["name"] == configmap["metadata"]["name"]
    assert "emptyDir" in volumes[mounts["/tmp"]]
    assert config(docs)["data_dir"].startswith("/tmp/")  # writable: the root fs is read-only
    assert pod["securityContext"]["runAsUser"] == 10001  # the image's user


def test_service_and_disruption_budget_select_the_orchestrator(
        rendered: dict[str, list[Manifest]]) -> None:
    docs = rendered["base"]
    labels = find(docs, "Deployment", "orchard-orchestrator")["spec"]["template"]["metadata"][
        "labels"]
    service = find(docs, "Service", "orchard-orchestrator", SYSTEM_NS)["spec"]
    assert service["type"] == "ClusterIP" and selects(service["selector"], labels)
    assert [(p["port"], p["targetPort"]) for p in service["ports"]] == [(80, "http")]
    pdb = find(docs, "PodDisruptionBudget", "orchard-orchestrator", SYSTEM_NS)["spec"]
    assert pdb["minAvailable"] == 1 and selects(pdb["selector"]["matchLabels"], labels)


def test_redis_is_persistent_and_password_protected(rendered: dict[str, list[Manifest]]) -> None:
    docs = rendered["base"]
    redis = find(docs, "StatefulSet", "orchard-redis", SYSTEM_NS)["spec"]
    assert redis["replicas"] == 1
    [container] = redis["template"]["spec"]["containers"]
    args = container["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    assert args[args.index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
    [claim] = redis["volumeClaimTemplates"]
    assert {"name": claim["metadata"]["name"], "mountPath": "/data"} in container["volumeMounts"]
    service = find(docs, "Service", "orchard-redis", SYSTEM_NS)["spec"]
    assert service["type"] == "ClusterIP"
    assert selects(service["selector"], redis["template"]["metadata"]["labels"])
    # The example state URL names this Service and port.
    state_url = yaml.safe_load((BASE / "secret.example.yaml").read_text())["stringData"][
        "ORCHARD_STATE"]
    assert f"@orchard-redis.{SYSTEM_NS}.svc:{service['ports'][0]['port']}/" in state_url


def test_docker_images_match_the_manifests(rendered: dict[str, list[Manifest]]) -> None:
    orchestrator = (DEPLOY / "docker" / "orchestrator.Dockerfile").read_text()
    assert "USER 10001:10001" in orchestrator
    cmd = re.search(r"^CMD (\[.*\])$", orchestrator, re.MULTILINE)
    assert cmd is not None
    deployment = find(rendered["base"], "Deployment", "orchard-orchestrator")
    assert yaml.safe_load(cmd.group(1)) == deployment["spec"]["template"]["spec"][
        "containers"][0]["args"]
    injector = (DEPLOY / "docker" / "agent-injector.Dockerfile").read_text()
    stages = re.findall(r"^FROM (\S+)", injector, re.MULTILINE)
    assert stages[-1] == "scratch"
    assert "COPY --from=build /out/bundle /.orchard/bundle" in injector
    assert "orchard agent-bundle /out/bundle" in injector


# --- configuration -----------------------------------------------------------------------------


def test_config_file(rendered: dict[str, list[Manifest]]) -> None:
    docs = rendered["base"]
    settings = config(docs)
    assert settings["backend"] == "kubernetes"
    kube = settings["kubernetes"]
    assert kube["namespace"] == SANDBOX_NS
    namespace = find(docs, "Namespace", SANDBOX_NS)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"
    assert kube["agent_port"] == 9090
    assert (kube["node_selector"], kube["tolerations"], kube["runtime_class"]) == ({}, [], None)
    # Isolation beyond the defaults' is opted out of, never into: a user namespace per pod,
    # cloud metadata blocked whatever a sandbox's allow-list says.
    assert kube["host_users"] is False
    assert "169.254.0.0/16" in kube["blocked_egress"]
    # The agent bundle must come from the same release as the orchestrator.
    orchestrator_image = find(docs, "Deployment", "orchard-orchestrator")["spec"]["template"][
        "spec"]["containers"][0]["image"]
    assert kube["agent_image"].rpartition(":")[2] == orchestrator_image.rpartition(":")[2]


def test_model_proxy_config_names_the_proxy_service(rendered: dict[str, list[Manifest]]) -> None:
    """What model_proxy sandboxes are let through to (orchard-allow-model-proxy, made from
    these settings) must be the proxy's pods, and the URL they get must reach its Service."""
    for docs in rendered.values():
        settings, kube = config(docs), config(docs)["kubernetes"]
        url = httpx.URL(settings["model_proxy"])
        service = find(docs, "Service", "orchard-proxy", SYSTEM_NS)
        assert url.host == f"orchard-proxy.{SYSTEM_NS}.svc"
        port = service["spec"]["ports"][0]
        assert url.port == port["port"]
        proxy = find(docs, "StatefulSet", "orchard-proxy", SYSTEM_NS)["spec"]["template"]
        assert kube["model_proxy_namespace"] == SYSTEM_NS
        assert selects(kube["model_proxy_pod_labels"], proxy["metadata"]["labels"])
        assert selects(service["spec"]["selector"], proxy["metadata"]["labels"])
        container = proxy["spec"]["containers"][0]
        named = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert kube["model_proxy_port"] == named[port["targetPort"]]
        assert str(kube["model_proxy_port"]) == container["args"][container["args"].index(
            "--port") + 1]
        # The proxy admits the sandboxes' side of that path, from the sandbox namespace.
        policy = find(docs, "NetworkPolicy", "orchard-proxy", SYSTEM_NS)
        [rule] = policy["spec"]["ingress"]
        assert rule["ports"] == [{"protocol": "TCP", "port": kube["model_proxy_port"]}]
        sandboxes = [peer for peer in rule["from"] if "namespaceSelector" in peer]
        assert [peer["namespaceSelector"]["matchLabels"] for peer in sandboxes] == [
            {"kubernetes.io/metadata.name": kube["namespace"]}]


def test_spot_overlay_pins_sandboxes_to_the_tainted_pool(
        rendered: dict[str, list[Manifest]]) -> None:
    kube = config(rendered["overlays/spot-sandboxes"])["kubernetes"]
    assert kube["node_selector"] == {"orchard.dev/pool": "sandboxes"}
    tolerations = {(t["key"], t.get("value"), t["effect"]) for t in kube["tolerations"]}
    assert ("orchard.dev/pool", "sandboxes", "NoSchedule") in tolerations
    assert ("cloud.google.com/gke-spot", "true", "NoSchedule") in tolerations
    assert ("kubernetes.azure.com/scalesetpriority", "spot", "NoSchedule") in tolerations
    for toleration in kube["tolerations"]:
        assert validate.schema_error({  # each is a valid Kubernetes toleration
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"},
            "spec": {"containers": [{"name": "c", "image": "i"}], "tolerations": [toleration]},
        }) is None


def test_gvisor_overlay_sets_the_runtime_class(rendered: dict[str, list[Manifest]]) -> None:
    kube = config(rendered["overlays/gvisor"])["kubernetes"]
    assert kube["runtime_class"] == "gvisor"
    # The kubelet refuses hostUsers: false for runsc, which does not announce user namespaces.
    assert kube["host_users"] is True


@pytest.mark.parametrize(("overlay", "changed"), [
    ("overlays/spot-sandboxes", {"node_selector", "tolerations"}),
    # runsc cannot run pods with hostUsers: false.
    ("overlays/gvisor", {"runtime_class", "host_users"}),
])
def test_overlays_change_only_their_own_settings(
        rendered: dict[str, list[Manifest]], overlay: str, changed: set[str]) -> None:
    """An overlay's orchard.yaml is a full copy of the base's: it must not drift from it."""
    base, mine = config(rendered["base"]), config(rendered[overlay])
    base_kube, my_kube = base.pop("kubernetes"), mine.pop("kubernetes")
    assert mine == base
    assert {key for key in base_kube.keys() | my_kube.keys()
            if base_kube.get(key) != my_kube.get(key)} == changed
    # Everything else is the base's, untouched but for the ConfigMap's hashed name.
    base_name = find_prefixed(rendered["base"], "ConfigMap", "orchard-config-")["metadata"]["name"]
    my_name = find_prefixed(rendered[overlay], "ConfigMap", "orchard-config-")["metadata"]["name"]
    others = [d for d in rendered[overlay] if d["kind"] != "ConfigMap"]
    assert yaml.safe_load(yaml.safe_dump(others).replace(my_name, base_name)) == [
        d for d in rendered["base"] if d["kind"] != "ConfigMap"]


# --- network policies --------------------------------------------------------------------------


def test_sandboxes_accept_connections_only_from_the_orchestrator_on_the_agent_port(
        rendered: dict[str, list[Manifest]]) -> None:
    docs = rendered["base"]
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"
                and d["metadata"]["namespace"] == SANDBOX_NS]
    # Egress belongs to the orchestrator, which creates orchard-deny-egress itself.
    assert all("Egress" not in p["spec"]["policyTypes"] for p in policies)
    assert "orchard-deny-egress" not in {p["metadata"]["name"] for p in policies}
    deny = [p for p in policies if p["spec"]["podSelector"] == {}]
    assert len(deny) == 1 and "ingress" not in deny[0]["spec"]
    [allow] = [p for p in policies if p["spec"]["podSelector"] != {}]
    assert allow["spec"]["podSelector"]["matchLabels"] == SANDBOX_POD
    [rule] = allow["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": config(docs)["kubernetes"]["agent_port"]}]
    [peer] = rule["from"]
    assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": SYSTEM_NS}
    labels = find(docs, "Deployment", "orchard-orchestrator")["spec"]["template"]["metadata"][
        "labels"]
    assert selects(peer["podSelector"]["matchLabels"], labels)


def test_system_namespace_policies(rendered: dict[str, list[Manifest]]) -> None:
    docs = rendered["base"]
    policies = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "NetworkPolicy"
                and d["metadata"]["namespace"] == SYSTEM_NS}
    assert any(p["podSelector"] == {} and "ingress" not in p for p in policies.values())
    orchestrator_labels = find(docs, "Deployment", "orchard-orchestrator")["spec"]["template"][
        "metadata"]["labels"]
    redis_labels = find(docs, "StatefulSet", "orchard-redis")["spec"]["template"]["metadata"][
        "labels"]
    # Redis: only from orchestrator pods of this namespace, only on its port.
    [redis] = [p for p in policies.values() if p["podSelector"] != {}
               and selects(p["podSelector"]["matchLabels"], redis_labels)]
    [rule] = redis["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 6379}]
    assert [set(peer) for peer in rule["from"]] == [{"podSelector"}]
    assert selects(rule["from"][0]["podSelector"]["matchLabels"], orchestrator_labels)
    # The API: port 8000 only.
    [api] = [p for p in policies.values() if p["podSelector"] != {}
             and selects(p["podSelector"]["matchLabels"], orchestrator_labels)]
    assert [r["ports"] for r in api["ingress"]] == [[{"protocol": "TCP", "port": 8000}]]


def test_networked_pods_reach_the_public_side_and_dns_only() -> None:
    from orchard.env.backends.base import SandboxSpec
    from orchard.env.backends.kubernetes.config import KubernetesConfig
    from orchard.env.backends.kubernetes.manifests import allow_egress_policy

    config = KubernetesConfig()
    policy = allow_egress_policy(SandboxSpec("sb-1", "python:3.12", block_network=False),
                                 config)
    rules = policy["spec"]["egress"]
    block = rules[0]["to"][0]["ipBlock"]
    assert block["cidr"] == "0.0.0.0/0"
    assert set(block["except"]) == {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
                                    "100.64.0.0/10", "169.254.0.0/16"}
    assert rules[1]["ports"] == [{"protocol": "UDP", "port": 53},
                                 {"protocol": "TCP", "port": 53}]
    listed = allow_egress_policy(SandboxSpec("sb-2", "python:3.12", block_network=False,
                                             egress=["10.1.2.0/24", "192.0.2.7"]), config)
    assert [p["ipBlock"] for p in listed["spec"]["egress"][0]["to"]] == [
        {"cidr": "10.1.2.0/24"}, {"cidr": "192.0.2.7/32"}]
    assert listed["spec"]["podSelector"] == {"matchLabels": {"orchard.dev/sandbox-id": "sb-2"}}


def test_blocked_ranges_are_cut_out_of_every_egress_policy() -> None:
    from orchard.env.backends.base import SandboxSpec
    from orchard.env.backends.kubernetes.config import KubernetesConfig
    from orchard.env.backends.kubernetes.manifests import allow_egress_policy

    config = KubernetesConfig(blocked_egress=["10.128.0.0/20", "203.0.113.10", "169.254.0.0/16",
                                              "2001:db8:1::/48"])
    default = allow_egress_policy(SandboxSpec("sb-1", "python:3.12", block_network=False),
                                  config)
    [block] = [peer["ipBlock"] for peer in default["spec"]["egress"][0]["to"]]
    assert block["cidr"] == "0.0.0.0/0"
    # 10.128.0.0/20 is inside 10.0.0.0/8 already; a public load balancer is added.
    assert set(block["except"]) == {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
                                    "100.64.0.0/10", "169.254.0.0/16", "203.0.113.10/32"}

    def opened(*egress: str) -> list[dict[str, object]]:
        spec = SandboxSpec("sb-2", "python:3.12", block_network=False, egress=list(egress))
        rules = allow_egress_policy(spec, config)["spec"]["egress"]
        return [peer["ipBlock"] for rule in rules for peer in rule["to"] if "ipBlock" in peer]

    # An allow-list covering a blocked range opens it minus that range, family by family.
    assert opened("0.0.0.0/0", "10.128.0.0/16", "2001:db8::/32", "198.51.100.0/24") == [
        {"cidr": "0.0.0.0/0", "except": ["10.128.0.0/20", "169.254.0.0/16", "203.0.113.10/32"]},
        {"cidr": "10.128.0.0/16", "except": ["10.128.0.0/20"]},
        {"cidr": "2001:db8::/32", "except": ["2001:db8:1::/48"]},
        {"cidr": "198.51.100.0/24"}]
    # One inside a blocked range opens nothing (the backend answers 400 before this is built).
    assert opened("10.128.0.5/32", "203.0.113.10/32") == []


def test_blocked_egress_settings_are_checked() -> None:
    from pydantic import ValidationError

    from orchard.env.backends.kubernetes.config import KubernetesConfig

    assert KubernetesConfig(blocked_egress=[" 10.0.0.5/16", "2001:db8::1"]).blocked_egress == [
        "10.0.0.0/16", "2001:db8::1/128"]
    with pytest.raises(ValidationError, match="'nodes' is not an IP address or CIDR network"):
        KubernetesConfig(blocked_egress=["nodes"])
    with pytest.raises(ValidationError, match="egress_cidr 203.0.113.0/25 lies inside "
                                              "blocked_egress 203.0.113.0/24"):
        KubernetesConfig(egress_cidr="203.0.113.0/25", blocked_egress=["203.0.113.0/24"])
    with pytest.raises(ValidationError, match="egress_cidr 'everywhere' is not a CIDR network"):
        KubernetesConfig(egress_cidr="everywhere")
