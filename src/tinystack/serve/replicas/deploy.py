"""Start or join a Ray cluster and run the engine replicas as a Ray Serve deployment.

    connect(ray_address, replicas, replica_num_cpus)   "" starts a local cluster sized for the replicas
                                                       (at least this machine's cores); "auto" or an
                                                       address joins a running one (`ray start --head`)
    deploy(model_dir, cfg) -> DeploymentHandle        serve.run of the "engine" deployment: N x
                                                       EngineReplica (replica.py), routed by router.py
                                                       and health-checked every second. Run against a
                                                       deployment that is already up (another model, other
                                                       settings), it is Ray Serve's rolling update: the
                                                       replicas are replaced a few at a time (one of two),
                                                       each old one finishing its in-flight requests first
    gateway_adapter(handle, model_dir, cfg)           the gateway's engine adapter (adapter.py)
    shutdown(started_here)                            if this process started the (local) cluster: stop
                                                       Serve and Ray; a joined cluster keeps its replicas
                                                       (other gateways, the next rolling update use them)

Serve's HTTP proxy is not started: the gateway (the ordinary app, serve/app.py) is the only way in.

shutdown() turns Ray's auto-connect off for the rest of the process before it stops the cluster. Serve's router
thread in the gateway keeps re-polling the controller (every ~30 s, and when a poll fails); a re-poll that landed
while ray.shutdown() was disconnecting called ray.init() (auto-connect), which deadlocked the shutdown until the
exit deadline killed the gateway (status 1, seen once in CI) -- and one after it would start a new local cluster.
With auto-connect off, such a re-poll fails in the router thread, and nothing here starts Ray but connect().
"""
from __future__ import annotations

import logging
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tinystack.config import Config
from tinystack.serve import lora_modules

logger = logging.getLogger("tinystack.serve")
APP_NAME = "tinystack"
DEPLOYMENT = "engine"
# Ray Serve settings of each replica process, from Serve's own latency/throughput preset; each measured here
# against Serve's default in same-run A/B probes (2 busy cores, 1-token requests through the gateway):
REPLICA_ENV = {
    # user code on the replica's own event loop, not a second loop thread: generate() never blocks (the engine
    # steps on its own thread; info/stats/health are sync, so Serve runs them in its thread pool), and every
    # streamed message skips a thread hop (measured lower gateway overhead: BENCHMARKS.md, Replicas)
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
    # Serve's per-request access line in the replica is buffered, not flushed each request (tinystack's own
    # request log, in the gateway, names the replica): no worse in the probes, sometimes better
    "RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE": "1000",
    "RAY_SERVE_LOG_TO_STDERR": "0",  # Serve's log lines go to its log files only
}


def connect(ray_address: str, replicas: int, replica_num_cpus: float) -> bool:
    """Connect this process to Ray; True when it started the (local) cluster itself."""
    import ray

    if ray.is_initialized():
        return False
    if ray_address:
        ray.init(address=ray_address, log_to_driver=False)
        return False
    cpus = max(os.cpu_count() or 1, int(replicas * replica_num_cpus + 0.999))
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    return True


def deploy(model_dir: str | Path, cfg: Config) -> Any:
    """Run (or roll to) the engine deployment for `model_dir`; returns its handle (module docstring)."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from tinystack.serve.replicas.replica import EngineReplica
    from tinystack.serve.replicas.router import ROUTING_STATS_PERIOD_S, ReplicaRouter

    s = cfg.serve
    serve.start(proxy_location="Disabled")
    threads = max(1, int(s.replica_num_cpus))
    deployment = serve.deployment(EngineReplica).options(
        name=DEPLOYMENT, num_replicas=s.replicas,
        # each replica's bounded queue: what its engine runs plus what may wait for it, as one server's gate
        max_ongoing_requests=cfg.infer.max_num_seqs + s.max_queued_requests,
        max_queued_requests=s.max_queued_requests,  # waiting in the gateway for a replica: bounded too (429)
        ray_actor_options={"num_cpus": s.replica_num_cpus, "runtime_env": {"env_vars": REPLICA_ENV}},
        health_check_period_s=1.0, health_check_timeout_s=30.0,
        graceful_shutdown_wait_loop_s=0.2, graceful_shutdown_timeout_s=max(1.0, s.shutdown_grace_s),
        request_router_config=RequestRouterConfig(
            request_router_class=f"{ReplicaRouter.__module__}.{ReplicaRouter.__qualname__}",  # by name: imported here
            request_router_kwargs={"policy": s.routing, "overload": s.prefix_overload},
            request_routing_stats_period_s=ROUTING_STATS_PERIOD_S, request_routing_stats_timeout_s=5.0))
    # every replica loads them at its start, a replaced or rolled one too (a registry adapter: its version now)
    loras = tuple((name, str(lora_modules.resolve(spec, cfg.run.registry)[0])) for name, spec in lora_modules.parse(s))
    app = deployment.bind(str(model_dir), asdict(cfg.infer), cfg.run.device, threads, loras)
    logger.info("deploying %d replica(s) of %s", s.replicas, model_dir)
    return serve.run(app, name=APP_NAME, route_prefix=None, blocking=False)


def gateway_adapter(handle: Any, model_dir: str | Path, cfg: Config) -> Any:
    from tinystack.serve.replicas.adapter import ReplicaAdapter

    return ReplicaAdapter(handle, model_dir, replicas=cfg.serve.replicas, app_name=APP_NAME,
                          compile_timeout_s=cfg.infer.structured_compile_timeout_s)


def shutdown(started_here: bool) -> None:
    """Stop Serve and Ray when this process started the cluster; leave a joined cluster as it is."""
    import ray

    if not ray.is_initialized():
        return
    _no_auto_connect()  # also for a joined cluster: Ray's exit hook disconnects this process at exit
    if started_here:  # the gateway has drained: stopping the cluster ends the replicas (no Serve teardown)
        ray.shutdown()


def _no_auto_connect() -> None:
    """What RAY_ENABLE_AUTO_CONNECT=0 sets, for a process that imported ray before reading it (module docstring)."""
    from ray._private import auto_init_hook

    auto_init_hook.enable_auto_connect = False
