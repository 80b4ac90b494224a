"""What a CNI that enforces NetworkPolicy lets through, for tests that meet a policy the way a
connection would: the semantics of networking.k8s.io/v1 NetworkPolicy.

- A pod is isolated for a direction once any policy of its namespace selects it with that
  policy type; then only what some rule of those policies admits gets through (the union).
- A peer with ``podSelector`` only means pods of the policy's own namespace; with
  ``namespaceSelector`` only, every pod of the matching namespaces; with both, pods matching
  both. ``ipBlock`` matches addresses in ``cidr`` and in none of its ``except`` ranges.
- A rule with no ``from``/``to`` admits every peer; with no ``ports``, every port.
- ``policyTypes`` left out means Ingress, plus Egress when the policy has egress rules.

Named ports are not modelled (Orchard's policies name numbers).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]
NAMESPACE_NAME = "kubernetes.io/metadata.name"


@dataclass(frozen=True)
class Endpoint:
    """One end of a connection: a pod (``namespace`` and ``labels``), or an address outside
    the cluster (``ip`` only). A pod's ``ip`` is matched by ipBlock peers."""

    namespace: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    ip: str | None = None
    namespace_labels: dict[str, str] | None = None  # default: only the name label

    def ns_labels(self) -> dict[str, str]:
        if self.namespace_labels is not None:
            return self.namespace_labels
        return {NAMESPACE_NAME: self.namespace} if self.namespace else {}


def selects(selector: Obj | None, labels: dict[str, str]) -> bool:
    """A LabelSelector: every matchLabels pair and every matchExpressions entry holds."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        held = {"In": key in labels and labels[key] in values,
                "NotIn": key not in labels or labels[key] not in values,
                "Exists": key in labels, "DoesNotExist": key not in labels}[op]
        if not held:
            return False
    return True


def _types(spec: Obj) -> set[str]:
    if "policyTypes" in spec:
        return set(spec["policyTypes"])
    return {"Ingress", *(("Egress",) if "egress" in spec else ())}


def _peer_matches(peer: Obj, policy_ns: str, other: Endpoint) -> bool:
    if "ipBlock" in peer:
        if other.ip is None:
            return False
        address = ipaddress.ip_address(other.ip)
        block = peer["ipBlock"]
        return (address in ipaddress.ip_network(block["cidr"])
                and not any(address in ipaddress.ip_network(e) for e in block.get("except", [])))
    if other.namespace is None:  # an outside address: only ipBlocks reach it
        return False
    ns_selector, pod_selector = peer.get("namespaceSelector"), peer.get("podSelector")
    in_namespace = (other.namespace == policy_ns if ns_selector is None
                    else selects(ns_selector, other.ns_labels()))
    return in_namespace and (pod_selector is None or selects(pod_selector, other.labels))


def _port_matches(ports: list[Obj] | None, port: int, protocol: str) -> bool:
    if not ports:
        return True
    for p in ports:
        if isinstance(p.get("port"), str):
            raise ValueError(f"named port {p['port']!r}: not modelled; give its number")
        if p.get("protocol", "TCP") != protocol:
            continue
        low = p.get("port")
        if low is None or low <= port <= p.get("endPort", low):
            return True
    return False


def _admits(policies: list[Obj], pod: Endpoint, other: Endpoint, port: int, protocol: str,
            direction: str) -> bool:
    key, peers_key = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
    mine = [p for p in policies
            if p["metadata"].get("namespace") == pod.namespace
            and direction in _types(p["spec"]) and selects(p["spec"]["podSelector"], pod.labels)]
    if not mine:
        return True  # not isolated in this direction
    return any(
        (not rule.get(peers_key)
         or any(_peer_matches(peer, p["metadata"]["namespace"], other)
                for peer in rule[peers_key]))
        and _port_matches(rule.get("ports"), port, protocol)
        for p in mine for rule in p["spec"].get(key) or [])


def admits_ingress(policies: list[Obj], target: Endpoint, source: Endpoint, port: int,
                   protocol: str = "TCP") -> bool:
    """May ``source`` open a connection to pod ``target`` on ``port``?"""
    return _admits(policies, target, source, port, protocol, "Ingress")


def admits_egress(policies: list[Obj], source: Endpoint, destination: Endpoint, port: int,
                  protocol: str = "TCP") -> bool:
    """May pod ``source`` open a connection to ``destination`` on ``port``? (Only the
    source's egress side: the destination's ingress policies are a separate question.)"""
    return _admits(policies, source, destination, port, protocol, "Egress")
