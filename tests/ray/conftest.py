"""The one Ray cluster of tests/ray: a head and a second node (`ray start` processes on loopback, 1 CPU and one
replica slot each), started once for the package and stopped after its last test, with the proxy's URL. Starting
a cluster costs tens of seconds on 2 cores, so every test file here deploys on this one and deletes its
applications when done (Serve's proxy keeps the first deployment's port: every app uses `url`)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="package")
def cluster():
    ray = pytest.importorskip("ray", reason="the [ray] extra is not installed")
    pytest.importorskip("ray.serve", reason="the [ray] extra is not installed")
    from gptedge.serve.ray_local import LocalCluster, NodeSpec

    from ..support.ray_cluster import CLUSTER_ENV, SLOT, disconnect

    c = LocalCluster([NodeSpec(1, {"head": 1, SLOT: 1}), NodeSpec(1, {"node2": 1, SLOT: 1})], env=CLUSTER_ENV)
    c.start()
    try:
        ray.init(address=c.address, log_to_driver=False, namespace="serve")
        nodes = {n["NodeID"]: ("head" if "head" in n["Resources"] else "node2") for n in ray.nodes() if n["Alive"]}
        c.node_names = nodes
        yield c
    finally:
        disconnect()
        c.stop()
        assert not c.own_pids(), "Ray processes outlived the cluster"


@pytest.fixture(scope="package")
def url(cluster) -> str:
    """The base URL of Serve's HTTP proxy (on the head), the same for every application deployed here."""
    from gptedge.serve.ray_local import free_port

    return f"http://127.0.0.1:{free_port()}"
