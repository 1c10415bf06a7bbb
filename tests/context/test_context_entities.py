"""Entity extraction from questions and Alertmanager payloads."""

from __future__ import annotations

from bot.context.entities import extract, from_alert, from_text


def test_explicit_kinds_in_word_flag_and_slash_forms_are_found():
    found = from_text("why is deploy/api slow in namespace payments? check node worker-3 and svc web -n shop")
    assert found.deployments == ["api"]
    assert "payments" in found.namespaces and "shop" in found.namespaces
    assert found.nodes == ["worker-3"]
    assert found.services == ["web"]


def test_a_pod_name_with_replicaset_hash_is_a_pod_and_bare_names_are_candidates():
    found = from_text("/rca api-gateway is slow and api-7f9c8d6b5-x2x9q keeps restarting")
    assert found.pods == ["api-7f9c8d6b5-x2x9q"]
    assert "api-gateway" in found.names


def test_configured_namespaces_are_recognised_as_plain_words():
    found = from_text("which pods are in CrashLoopBackOff in production?", known_namespaces=["production"])
    assert found.namespaces == ["production"]
    assert found.alert_names == []


def test_alert_names_are_found_in_camel_case_but_not_pod_states():
    found = from_text("KubePodCrashLooping fired, pods are in CrashLoopBackOff and OOMKilled")
    assert found.alert_names == ["KubePodCrashLooping"]


def test_a_plain_question_names_nothing():
    assert from_text("how is the cluster doing today?").is_empty()


def test_alert_labels_give_the_entities_of_an_alert():
    payload = {
        "commonLabels": {"alertname": "KubePodCrashLooping", "namespace": "payments"},
        "alerts": [{"labels": {"pod": "api-7f9c8d6b5-x2x9q", "container": "app", "deployment": "api"}}],
    }
    found = from_alert(payload)
    assert found.alert_names == ["KubePodCrashLooping"]
    assert found.namespaces == ["payments"] and found.pods == ["api-7f9c8d6b5-x2x9q"]
    assert found.deployments == ["api"] and found.containers == ["app"]
    merged = extract("and node worker-2?", payload)
    assert merged.nodes == ["worker-2"] and merged.pods == ["api-7f9c8d6b5-x2x9q"]


def test_a_short_kind_word_names_a_pod_and_a_bare_ordinal_is_a_candidate_name():
    assert from_text("why is pod cache-0 not ready?").pods == ["cache-0"]
    assert from_text("kafka-2 keeps restarting").names == ["kafka-2"]


def test_alert_label_text_is_not_taken_for_a_namespace_deployment_or_service():
    text = "Common labels: alertname=KubePodCrashLooping container=app namespace=shop service=search"
    found = from_text(text)
    assert found.namespaces == ["shop"]
    assert found.deployments == found.services == []
    assert from_text("container=kube-state-metrics deployment=mailer").deployments == []


def test_a_plural_kind_word_takes_only_a_name_like_word_and_states_are_not_alert_names():
    assert from_text("lots of services fail DNS lookups").services == []
    assert from_text("pods on node worker-2 are evicted").nodes == ["worker-2"]
    assert from_text("pod web-1 is stuck in ContainerCreating").alert_names == []


def test_plain_words_that_may_name_something_are_kept_for_matching_and_common_words_are_not():
    found = from_text("payments is down!! whats up with the chekout pods?")
    assert found.words == ["payments", "chekout"]
    assert not found.has_objects()  # words are matched against the cluster, not trusted as names
