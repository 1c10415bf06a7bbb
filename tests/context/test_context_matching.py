"""Matching what was typed to what the cluster has: closeness first, then how broken a pod is."""

from __future__ import annotations

from bot.context import kube_objects as ko
from bot.context.entities import from_text
from bot.context.kube_snapshot import Snapshot
from bot.context.matching import by_severity, closeness, resolve
from bot.eval import kube_api


def test_closeness_ranks_same_names_short_names_parts_and_typos():
    assert closeness("checkout", "checkout") == 1.0
    assert closeness("ip-10-0-7-21", "ip-10-0-7-21.eu-west-1.compute.internal") == 0.95
    assert closeness("cart", "shop-cart-service") == 0.8
    assert closeness("api", "payments-api") == 0.6  # three letters: a weaker part
    assert 0.6 < closeness("paymnets-api", "payments-api") < 0.75
    assert 0.6 < closeness("chekout", "checkout") < 0.75
    assert closeness("ready", "redis") == closeness("db", "db-backup") == 0.0  # short or unlike: nothing


def _snapshot() -> Snapshot:
    crash = [
        kube_api.container_status(
            ready=False, restart_count=9, state={"waiting": {"reason": "CrashLoopBackOff"}}, last_state=None
        )
    ]
    pods = [
        # API order puts a healthy pod and a merely pending one first.
        kube_api.pod("checkout-5d9f8c7b6-aaaaa", "shop", owner=("ReplicaSet", "checkout-5d9f8c7b6")),
        kube_api.pod(
            "checkout-5d9f8c7b6-bbbbb",
            "shop",
            phase="Pending",
            statuses=[],
            node=None,
            owner=("ReplicaSet", "checkout-5d9f8c7b6"),
        ),
        kube_api.pod(
            "checkout-5d9f8c7b6-ccccc", "shop", statuses=crash, owner=("ReplicaSet", "checkout-5d9f8c7b6")
        ),
        kube_api.pod("kafka-2", "messaging", owner=("StatefulSet", "kafka")),
        kube_api.pod(
            "shop-cart-service-7c8d9-x1y2z",
            "storefront",
            labels={"app.kubernetes.io/name": "cart"},
            owner=("ReplicaSet", "shop-cart-service-7c8d9"),
        ),
        kube_api.pod(
            "web-1b2c3d4e5-qqqqq",
            "web",
            node="ip-10-0-7-21.eu-west-1.compute.internal",
            owner=("ReplicaSet", "web-1b2c3d4e5"),
        ),
    ]
    snap = Snapshot(pods=pods, nodes=[kube_api.node("ip-10-0-7-21.eu-west-1.compute.internal")])
    snap.namespaces = ["shop", "messaging", "storefront", "web", "ledger"]
    return snap.index()


def test_a_typo_picks_the_workload_and_its_most_broken_pod_first_not_api_order():
    focus = resolve(from_text("chekout is down"), _snapshot())
    assert ko.name(focus.pods[0]) == "checkout-5d9f8c7b6-ccccc"  # crash loop before pending before healthy
    assert [ko.name(p) for p in focus.pods[:3]][1] == "checkout-5d9f8c7b6-bbbbb"
    assert focus.matches[0].describe() == "'chekout' -> deployment shop/checkout (closest name)"


def test_an_ordinal_an_app_label_and_a_nodes_short_name_each_find_their_pods():
    snap = _snapshot()
    assert ko.name(resolve(from_text("kafka-2 keeps restarting"), snap).pods[0]) == "kafka-2"
    assert ko.name(resolve(from_text("is cart ok?"), snap).pods[0]) == "shop-cart-service-7c8d9-x1y2z"
    node = resolve(from_text("ip-10-0-7-21 looks unhappy"), snap)
    assert node.nodes == ["ip-10-0-7-21.eu-west-1.compute.internal"]
    assert ko.name(node.pods[0]) == "web-1b2c3d4e5-qqqqq"


def test_a_namespace_known_only_from_the_api_puts_its_pods_in_question():
    focus = resolve(from_text("anything wrong in messaging?"), _snapshot())
    assert focus.namespaces == ["messaging"] and ko.name(focus.pods[0]) == "kafka-2"
    assert resolve(from_text("how are things today?"), _snapshot()).pods == []


def test_with_nothing_named_the_most_broken_pods_lead():
    assert [ko.name(p) for p in by_severity(_snapshot().pods)] == [
        "checkout-5d9f8c7b6-ccccc",
        "checkout-5d9f8c7b6-bbbbb",
    ]


def test_an_ip_address_pasted_in_a_question_is_the_pod_service_or_node_it_belongs_to():
    pods = [
        kube_api.pod("chatty-6f7a8b9c0-k1", "b", owner=("ReplicaSet", "chatty-6f7a8b9c0"), ip="10.244.3.17"),
        kube_api.pod("quiet-1b2c3d4e5-k2", "a", owner=("ReplicaSet", "quiet-1b2c3d4e5"), ip="10.244.3.18"),
        kube_api.pod(
            "ledger-4c5d6e7f8-k3",
            "l",
            owner=("ReplicaSet", "ledger-4c5d6e7f8"),
            labels={"app": "ledger"},
            node="worker-9",
        ),
    ]
    ledger = kube_api.service("ledger", "l", cluster_ip="10.96.12.7")
    node = kube_api.node("worker-9")
    snapshot = Snapshot(pods=pods, services=[ledger], nodes=[node], namespaces=["a", "b", "l"]).index()
    node_ip = node["status"]["addresses"][0]["address"]

    def asked(text: str) -> tuple[list[str], list[str]]:
        focus = resolve(from_text(text), snapshot)
        return [ko.name(p) for p in focus.pods], [m.describe() for m in focus.matches]

    assert asked("who is 10.244.3.17? flooding our logs") == (
        ["chatty-6f7a8b9c0-k1"],
        ["'10.244.3.17' -> pod b/chatty-6f7a8b9c0-k1 (its IP address)"],
    )
    # A ClusterIP with a port, from a connection error: the pods the Service selects.
    assert asked("dial tcp 10.96.12.7:9090: i/o timeout")[0] == ["ledger-4c5d6e7f8-k3"]
    assert asked(f"node {node_ip} is slow")[1] == [f"'{node_ip}' -> node worker-9 (its IP address)"]
    # An address nobody has, or a version number, names nothing.
    assert asked("10.1.2.3 and v1.2.3 are down") == ([], [])
