"""Serving beyond one process: engine replicas on Ray Serve, with the ordinary server as their gateway.

deploy.py (start/join Ray, the Serve deployment, rolling updates), replica.py (one replica: an engine),
router.py (Serve's request router with our policies), routing.py (the policies, pure functions),
adapter.py (the gateway's engine adapter: requests to replicas, retries, the replica header).
Needs the [dist] extra (ray[serve]); nothing here is imported unless replicas are asked for.
"""
