"""The eval's fake Kubernetes API serves the kinds a real cluster has, in shapes the real client reads
(its generated models, with their required-field checks on)."""

from __future__ import annotations

from pathlib import Path

from kubernetes_asyncio import client, config

from bot.eval import kube_api
from bot.eval.kube_api import KubernetesSnapshotServer


def _cluster() -> KubernetesSnapshotServer:
    server = KubernetesSnapshotServer(namespaces=["shop", "data"])
    server.pods = [
        kube_api.pod(
            "api-7f9c8d6b5-x2x9q",
            "shop",
            labels={"app": "api"},
            owner=("ReplicaSet", "api-7f9c8d6b5"),
            container_specs={"app": {"readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}}}},
            volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "api-data"}}],
            init_statuses=[
                kube_api.container_status(
                    "migrate", state={"terminated": {"exitCode": 0, "reason": "Completed"}}, ready=False
                )
            ],
        ),
        kube_api.pod(
            "api-7f9c8d6b5-b3c4d", "shop", labels={"app": "api"}, owner=("ReplicaSet", "api-7f9c8d6b5")
        ),
        kube_api.pod("postgres-0", "data", labels={"app": "postgres"}, owner=("StatefulSet", "postgres")),
    ]
    server.services = [
        kube_api.service("api", "shop", ports=[8080]),
        kube_api.service("postgres", "data", ports=[5432]),
    ]
    server.configmaps = [kube_api.config_map("api-config", "shop", data={"settings.yaml": "a: 1"})]
    server.secrets = [kube_api.secret("api-db", "shop", keys=["password"])]
    server.persistentvolumeclaims = [kube_api.persistent_volume_claim("api-data", "shop", phase="Pending")]
    server.persistentvolumes = [kube_api.persistent_volume("pv-1", claim=("data", "pg-data-postgres-0"))]
    server.storageclasses = [kube_api.storage_class("gp3", default=True)]
    server.horizontalpodautoscalers = [kube_api.horizontal_pod_autoscaler("api", "shop", current_replicas=10)]
    server.cronjobs = [kube_api.cronjob("backup", "data")]
    server.jobs = [
        kube_api.job(
            "backup-29012340",
            "data",
            cronjob_name="backup",
            failed=4,
            condition=("Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit"),
        )
    ]
    server.daemonsets = [kube_api.daemonset("node-agent", desired=3, ready=2)]
    server.nodes = [kube_api.node("worker-1", allocatable={"cpu": "3920m"})]
    return server


async def test_every_kind_is_listed_in_the_real_clients_models_and_endpoint_slices_follow_the_pods(
    tmp_path: Path,
):
    server = _cluster()
    await server.start()
    configuration = client.Configuration()
    await config.load_kube_config(
        config_file=str(server.write_kubeconfig(tmp_path / "kubeconfig")),
        client_configuration=configuration,
        persist_config=False,
    )
    api = client.ApiClient(configuration=configuration)
    try:
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        pods = await core.list_namespaced_pod("shop")
        first = pods.items[0]
        assert first.spec.containers[0].readiness_probe.http_get.path == "/ready"
        assert first.spec.volumes[0].persistent_volume_claim.claim_name == "api-data"
        assert first.status.init_container_statuses[0].name == "migrate" and first.status.pod_ip
        slices = await client.DiscoveryV1Api(api).list_namespaced_endpoint_slice("shop")
        (api_slice,) = slices.items
        assert api_slice.metadata.labels["kubernetes.io/service-name"] == "api"
        assert sorted(e.target_ref.name for e in api_slice.endpoints) == [
            "api-7f9c8d6b5-b3c4d",
            "api-7f9c8d6b5-x2x9q",
        ]
        assert (await core.list_service_for_all_namespaces()).items[1].spec.ports[0].port == 5432
        cm = (await core.list_namespaced_config_map("shop")).items[0]
        assert list(cm.data) == ["settings.yaml"]
        assert (await core.list_namespaced_persistent_volume_claim("shop")).items[0].status.phase == "Pending"
        assert (await core.list_persistent_volume()).items[0].spec.claim_ref.name == "pg-data-postgres-0"
        assert (await client.StorageV1Api(api).list_storage_class()).items[0].provisioner == "ebs.csi.aws.com"
        hpa = (await client.AutoscalingV2Api(api).list_namespaced_horizontal_pod_autoscaler("shop")).items[0]
        assert hpa.spec.max_replicas == 10 and hpa.status.current_replicas == 10
        batch = client.BatchV1Api(api)
        assert (await batch.list_namespaced_cron_job("data")).items[0].spec.schedule == "0 2 * * *"
        failed_job = (await batch.list_namespaced_job("data")).items[0]
        assert failed_job.metadata.owner_references[0].kind == "CronJob"
        assert failed_job.status.conditions[0].reason == "BackoffLimitExceeded"
        assert (await apps.list_daemon_set_for_all_namespaces()).items[0].status.number_ready == 2
        node = (await core.list_node()).items[0]
        assert node.status.allocatable["cpu"] == "3920m"
    finally:
        await api.close()
        await server.stop()
    # The served state holds the Secret's planted value, so a test can prove it never reaches a prompt.
    assert "api-db" in server.state_text()
