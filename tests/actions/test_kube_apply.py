"""The write client against the fake API server's write routes: dry runs change nothing and show
the diff, applies do what kubectl does, and the read-only credentials cannot write."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from fakes.actions_world import NS, WRITE_TOKEN, actions_settings, applied, cluster

from bot.actions.catalog import ActionSpec
from bot.actions.kube_apply import RESTARTED_AT, ApplyError, KubeApply
from bot.actions.verify import rollout_done
from bot.eval.kube_api import KubernetesSnapshotServer

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def server() -> AsyncIterator[KubernetesSnapshotServer]:
    async with cluster() as srv:
        yield srv


@pytest.fixture
async def kube(server: KubernetesSnapshotServer, tmp_path: Path) -> AsyncIterator[KubeApply]:
    client = KubeApply(actions_settings(server, tmp_path))
    try:
        yield client
    finally:
        await client.close()


def _deploy(server: KubernetesSnapshotServer) -> dict:
    return server.deployments[0]


async def test_a_dry_run_restart_shows_the_annotation_diff_and_changes_nothing(
    server: KubernetesSnapshotServer, kube: KubeApply
) -> None:
    spec = ActionSpec("rollout_restart", {"kind": "deployment", "namespace": NS, "name": "api"})
    before = repr(_deploy(server))
    dry = await kube.run(spec, dry_run=True)
    assert RESTARTED_AT in dry.diff and dry.diff.count("\n+") >= 1
    assert repr(_deploy(server)) == before
    assert applied(server) == []
    assert any("dryRun=All" in r for r in server.requests if r.startswith("PATCH"))


async def test_an_applied_restart_patches_the_template_and_the_rollout_completes(
    server: KubernetesSnapshotServer, kube: KubeApply
) -> None:
    spec = ActionSpec("rollout_restart", {"kind": "deployment", "namespace": NS, "name": "api"})
    await kube.run(spec, dry_run=False)
    deploy = _deploy(server)
    assert RESTARTED_AT in deploy["spec"]["template"]["metadata"]["annotations"]
    assert deploy["metadata"]["generation"] == 3
    assert deploy["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "3"
    assert rollout_done("deployment", deploy)[0]
    assert applied(server) == [f"PATCH /apis/apps/v1/namespaces/{NS}/deployments/api"]


async def test_rollback_puts_the_previous_revisions_template_back_as_kubectl_undo_does(
    server: KubernetesSnapshotServer, kube: KubeApply
) -> None:
    spec = ActionSpec("rollback", {"kind": "deployment", "namespace": NS, "name": "api"})
    dry = await kube.run(spec, dry_run=True)
    assert "app:1.0" in dry.diff and "app:2.0" in dry.diff
    done = await kube.run(spec, dry_run=False)
    deploy = _deploy(server)
    image = deploy["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image.endswith("app:1.0")
    assert "pod-template-hash" not in deploy["spec"]["template"]["metadata"]["labels"]
    # the old ReplicaSet is reused and becomes the newest revision, as the controller does it
    revisions = {
        rs["metadata"]["name"]: rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"]
        for rs in server.replicasets
    }
    assert revisions == {"api-aaa111": "3", "api-bbb222": "2"}
    assert done.inverse == ActionSpec("rollback", {**spec.params, "revision": 2})
    back = await kube.run(done.inverse, dry_run=False)
    assert _deploy(server)["spec"]["template"]["spec"]["containers"][0]["image"].endswith("app:2.0")
    assert back.inverse is not None


async def test_rollback_to_a_revision_that_does_not_exist_is_refused(kube: KubeApply) -> None:
    spec = ActionSpec("rollback", {"kind": "deployment", "namespace": NS, "name": "api", "revision": 9})
    with pytest.raises(ApplyError, match="no revision 9"):
        await kube.run(spec, dry_run=True)


async def test_scale_goes_through_the_scale_subresource_and_offers_the_old_count_back(
    server: KubernetesSnapshotServer, kube: KubeApply
) -> None:
    spec = ActionSpec("scale", {"kind": "statefulset", "namespace": NS, "name": "db", "replicas": 0})
    dry = await kube.run(spec, dry_run=True)
    assert dry.summary == "replicas 2 -> 0" and server.statefulsets[0]["spec"]["replicas"] == 2
    done = await kube.run(spec, dry_run=False)
    assert server.statefulsets[0]["spec"]["replicas"] == 0
    assert applied(server) == [f"PATCH /apis/apps/v1/namespaces/{NS}/statefulsets/db/scale"]
    assert done.inverse is not None and done.inverse.params["replicas"] == 2


async def test_deleting_a_pod_leaves_its_replicaset_to_make_a_new_one(
    server: KubernetesSnapshotServer, kube: KubeApply
) -> None:
    spec = ActionSpec("delete_pod", {"kind": "pod", "namespace": NS, "name": "api-bbb222-0"})
    dry = await kube.run(spec, dry_run=True)
    assert "ReplicaSet/api-bbb222" in dry.summary and len(server.pods) == 3
    await kube.run(spec, dry_run=False)
    names = [p["metadata"]["name"] for p in server.pods]
    assert "api-bbb222-0" not in names and len(names) == 3


async def test_cordon_and_uncordon_flip_unschedulable_and_are_each_others_inverse(
    server: KubernetesSnapshotServer, kube: KubeApply
) -> None:
    cordon = ActionSpec("cordon", {"kind": "node", "name": "worker-1"})
    done = await kube.run(cordon, dry_run=False)
    assert server.nodes[0]["spec"]["unschedulable"] is True
    assert done.inverse == ActionSpec("uncordon", {"kind": "node", "name": "worker-1"})
    await kube.run(done.inverse, dry_run=False)
    assert server.nodes[0]["spec"]["unschedulable"] is False


async def test_the_read_only_credentials_are_refused_every_write(
    server: KubernetesSnapshotServer, tmp_path: Path
) -> None:
    read_only = server.write_kubeconfig(tmp_path / "read-only.json")  # the context provider's token
    kube = KubeApply(actions_settings(server, tmp_path).model_copy(update={"kubeconfig": read_only}))
    try:
        spec = ActionSpec("cordon", {"kind": "node", "name": "worker-1"})
        with pytest.raises(ApplyError, match="HTTP 403"):
            await kube.run(spec, dry_run=True)
    finally:
        await kube.close()
    assert "unschedulable" not in server.nodes[0].get("spec", {})


async def test_an_invalid_dry_run_value_and_a_bad_patch_are_refused_by_the_server(
    server: KubernetesSnapshotServer, kube: KubeApply
) -> None:
    path = f"/apis/apps/v1/namespaces/{NS}/deployments/api"
    with pytest.raises(ApplyError, match="HTTP 400"):
        await kube.call(
            "PATCH", path, body={}, content_type="application/merge-patch+json", query={"dryRun": "Some"}
        )
    with pytest.raises(ApplyError, match="HTTP 422"):
        await kube.call(
            "PATCH",
            path + "/scale",
            body={"spec": {"replicas": -1}},
            content_type="application/merge-patch+json",
        )
    # the client library refuses to send an unknown patch type; the server refuses it too
    headers = {"Authorization": f"Bearer {WRITE_TOKEN}", "Content-Type": "application/yaml"}
    async with (
        aiohttp.ClientSession() as session,
        session.patch(server.url + path, data="{}", headers=headers) as resp,
    ):
        assert resp.status == 415
    assert applied(server) == []
