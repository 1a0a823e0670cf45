"""What a set of Kubernetes NetworkPolicies lets through, evaluated offline as the API
documents it (networking.k8s.io/v1), for the manifests' tests.

A pod that no policy of a direction selects is open in that direction; a pod that some policy
selects takes only what one of those policies' rules allows: a rule matches when one of its
peers matches the other end (no peers: any end) and one of its ports matches the port (no
ports: any port). Peers: `podSelector` alone is pods of the policy's namespace,
`namespaceSelector` alone every pod of the matching namespaces, both together the matching
pods in the matching namespaces, `ipBlock` addresses (pods' addresses too: a pod given no
address is taken to match every ipBlock, the worst case). Connections need both ends to allow them:
the source's egress and the destination's ingress.
Only `matchLabels` selectors are supported; anything else fails loudly.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Pod:
    labels: dict[str, str]
    namespace: str = "default"
    namespace_labels: dict[str, str] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)  # named container ports
    ip: str | None = None  # its address; None: any (it matches every ipBlock)

    def __post_init__(self) -> None:
        self.namespace_labels.setdefault("kubernetes.io/metadata.name", self.namespace)

    def __hash__(self) -> int:
        return hash((tuple(sorted(self.labels.items())), self.namespace))


@dataclass(frozen=True)
class Address:
    """An end outside the cluster's pods (the internet, a node, the metadata service)."""

    ip: str


End = Pod | Address


def _matches(selector: dict, labels: dict[str, str]) -> bool:
    unsupported = set(selector) - {"matchLabels"}
    assert not unsupported, f"selector fields not supported here: {unsupported}"
    return all(labels.get(key) == value for key, value in (selector.get("matchLabels") or {}).items())


def _peer_matches(peer: dict, end: End, policy_namespace: str) -> bool:
    if "ipBlock" in peer:
        if end.ip is None:
            return True  # a pod of no given address may fall in any block: assume it does
        address = ipaddress.ip_address(end.ip)
        block = peer["ipBlock"]
        network = ipaddress.ip_network(block["cidr"])
        if address.version != network.version:
            return False
        return address in network and not any(address in ipaddress.ip_network(cidr) for cidr in block.get("except", []))
    if isinstance(end, Address):
        return False
    if "namespaceSelector" in peer:
        if not _matches(peer["namespaceSelector"], end.namespace_labels):
            return False
    elif end.namespace != policy_namespace:
        return False
    return _matches(peer.get("podSelector", {}), end.labels)


def _port_matches(rule_port: dict, port: int, protocol: str, destination: End) -> bool:
    if rule_port.get("protocol", "TCP") != protocol:
        return False
    if "port" not in rule_port:
        return True
    wanted = rule_port["port"]
    if isinstance(wanted, str):  # a named port of the destination's containers
        return isinstance(destination, Pod) and destination.ports.get(wanted) == port
    return wanted <= port <= rule_port.get("endPort", wanted)


def _allows(policies: list[dict], pod: Pod, direction: str, other: End, port: int, protocol: str, destination: End) -> bool:
    kind, peers_key = ("Ingress", "from") if direction == "ingress" else ("Egress", "to")
    selecting = [
        p
        for p in policies
        if p["metadata"].get("namespace", "default") == pod.namespace
        and kind in p["spec"].get("policyTypes", ["Ingress"])
        and _matches(p["spec"]["podSelector"], pod.labels)
    ]
    if not selecting:
        return True
    for policy in selecting:
        namespace = policy["metadata"].get("namespace", "default")
        for rule in policy["spec"].get(direction) or []:
            peers = rule.get(peers_key)
            if peers and not any(_peer_matches(peer, other, namespace) for peer in peers):
                continue
            ports = rule.get("ports")
            if ports and not any(_port_matches(p, port, protocol, destination) for p in ports):
                continue
            return True
    return False


def allowed(policies: list[dict], source: End, destination: End, port: int, protocol: str = "TCP") -> bool:
    """Whether `source` may open a connection to `destination`'s `port`."""
    egress = not isinstance(source, Pod) or _allows(policies, source, "egress", destination, port, protocol, destination)
    ingress = not isinstance(destination, Pod) or _allows(policies, destination, "ingress", source, port, protocol, destination)
    return egress and ingress


def admits(policies: list[dict], source: End, destination: Pod, port: int, protocol: str = "TCP") -> bool:
    """Whether `destination`'s ingress lets `source` in on `port` (whatever the source's egress)."""
    return _allows(policies, destination, "ingress", source, port, protocol, destination)
