"""Running the app with uvicorn: in the foreground (the CLI) or on a background thread (demo, tests).

Graceful shutdown (both ways), on SIGTERM / SIGINT (or leaving `run_in_background`):

    draining     the app's ServerState is marked draining at once: /ready answers 503; requests
                 are still served for `drain_delay_s` (load balancers see /ready fail and move away)
    refusing     then new generation requests get 503 server_shutting_down (OpenAI error shape,
                 Retry-After, Connection: close) -- the port stays open, so a late client is told
                 to go elsewhere rather than refused -- while in-flight ones get up to
                 `shutdown_grace_s` to finish
    cut          grace over: every generation still running ends at once (its sequences aborted)
                 as a 503 server_shutting_down, or in a stream as an error event and [DONE];
                 each request keeps its log line and metrics
    exit         the port closes, connections close once answered; anything still stuck is
                 cancelled (and still answered 503 by the middleware, if it had sent nothing)

A second signal exits at once. The CLI also bounds the whole exit (`exit_deadline_s`, armed by the first
signal): if draining, the grace and stopping the engine (or the Ray cluster) together take longer, every thread's
stack is written to stderr and the process exits with status 1 -- a shutdown never hangs.

`run_in_background` binds the listening socket itself, before uvicorn starts, so with
`port=0` the real port is known without reading uvicorn's internals, and a port that
is taken fails at once with a clear error; its connections stream without Nagle's delay,
as a host:port server's do (see `_bind`). The server thread is a daemon, so a stuck
shutdown can never keep the interpreter alive.
"""
from __future__ import annotations

import asyncio
import faulthandler
import math
import socket
import threading
import time
import warnings
from contextlib import contextmanager
from typing import Any, Iterator

import uvicorn


class DrainingServer(uvicorn.Server):
    """uvicorn.Server that marks the app draining on the first exit signal (see the module docstring)."""

    def __init__(self, config: uvicorn.Config, drain_delay_s: float = 0.0, grace_s: float | None = None,
                 exit_deadline_s: float | None = None) -> None:
        super().__init__(config)
        self.drain_delay_s = drain_delay_s
        # None: unbounded (run_in_background: the server thread is a daemon; never kill a host process)
        self.exit_deadline_s = exit_deadline_s
        self._deadline_armed = False
        # None: no limit (uvicorn's default), the in-flight requests are waited for however long they take
        self.grace_s = config.timeout_graceful_shutdown if grace_s is None else grace_s
        self._drain_timer: threading.Timer | None = None

    def _state(self) -> Any:
        return getattr(getattr(self.config.app, "state", None), "server", None)

    def mark_draining(self) -> None:
        state = self._state()
        if state is not None:
            state.draining = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Refuse new generation requests with 503 while the in-flight ones finish (the port stays
        open), cut what is left when the grace is over, then let uvicorn close (module docstring)."""
        state = self._state()
        wait_s = self.grace_s  # uvicorn's wait for open connections, after which it cancels their tasks
        if state is not None and not self.force_exit:
            state.draining = state.refusing = True
            loop = asyncio.get_running_loop()
            deadline = loop.time() + (math.inf if self.grace_s is None else self.grace_s)
            while state.gate.in_flight and loop.time() < deadline and not self.force_exit:
                await asyncio.sleep(POLL_S)
            if state.gate.in_flight:
                state.cut()
                cut_deadline = loop.time() + CUT_ANSWER_S  # the cut requests answer and log at once
                while state.gate.in_flight and loop.time() < cut_deadline and not self.force_exit:
                    await asyncio.sleep(POLL_S)
            # what is left is answers being written (or requests that do not generate): not a second grace
            wait_s = None if self.grace_s is None else max(1.0, deadline - loop.time())
        self.config.timeout_graceful_shutdown = wait_s  # uvicorn passes it to wait_for: a float works
        await super().shutdown(sockets)

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            yield
            # uvicorn re-raises the signal after shutting down (exit status -15); a graceful
            # drain is a normal exit for us, so the process ends with status 0
            getattr(self, "_captured_signals", []).clear()

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.mark_draining()
        if self.exit_deadline_s is not None and not self._deadline_armed:
            self._deadline_armed = True  # stacks to stderr and exit(1) unless the process stops in time
            faulthandler.dump_traceback_later(self.exit_deadline_s, exit=True)
        if self.drain_delay_s > 0 and self._drain_timer is None:
            self._drain_timer = threading.Timer(self.drain_delay_s, super().handle_exit, args=(sig, frame))
            self._drain_timer.daemon = True
            self._drain_timer.start()
            return
        super().handle_exit(sig, frame)


POLL_S = 0.02  # how often the shutdown looks whether in-flight requests are done
CUT_ANSWER_S = 2.0  # at most this long for the requests cut at the end of the grace to answer
STOP_MARGIN_S = 30.0  # stopping the engine or a local Ray cluster (a few seconds, measured) after the server

# Idle keep-alive connections are closed after this long. uvicorn's default (5 s) equals httpx's
# own pool expiry, so a client could reuse a connection in the very moment the server closed it:
# the request then fails with a read error (seen under load). Outlasting the clients (nginx uses
# 75 s) means the client always closes an idle connection first.
KEEP_ALIVE_S = 75


def serve_forever(app: Any, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info", *,
                  shutdown_grace_s: float = 10.0, drain_delay_s: float = 0.0,
                  exit_deadline_s: float | None = None) -> None:
    """Serve `app` on host:port until SIGTERM / Ctrl-C, then drain gracefully (see the module docstring).
    `exit_deadline_s`: from the first signal, the process ends within this long (the caller cancels it with
    `exit_deadline_met()` once it has stopped what it runs)."""
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_keep_alive=KEEP_ALIVE_S,
                            timeout_graceful_shutdown=max(1, int(round(shutdown_grace_s))))
    DrainingServer(config, drain_delay_s, shutdown_grace_s, exit_deadline_s).run()


def exit_deadline_for(drain_delay_s: float, shutdown_grace_s: float) -> float:
    """How long a foreground server may take from the first signal to exit: the drain, the grace, the cut
    requests' answers, and STOP_MARGIN_S to stop the engine or the Ray cluster."""
    return drain_delay_s + shutdown_grace_s + CUT_ANSWER_S + STOP_MARGIN_S


def exit_deadline_met() -> None:
    """Everything is stopped: disarm the exit deadline (a no-op when none was armed)."""
    faulthandler.cancel_dump_traceback_later()


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP, not the default 0: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on
    # connections whose socket says TCP, as a host:port server's do. With proto 0 and the plain asyncio
    # loop (uvicorn without uvloop), every streamed chunk after the first waited for the client's delayed
    # ACK: a short stream arrived in one piece, one delayed ACK late (client TTFT ~ e2e in `bench serve --model`).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise RuntimeError(f"cannot listen on {host}:{port}: {e}") from e
    sock.set_inheritable(True)
    return sock


def _url(host: str, port: int) -> str:
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@contextmanager
def run_in_background(app: Any, host: str = "127.0.0.1", port: int = 0, *, startup_timeout_s: float = 10.0,
                      shutdown_timeout_s: float = 10.0, log_level: str = "warning") -> Iterator[str]:
    """Serve `app` on a daemon thread; yields the base URL ("http://127.0.0.1:PORT").

    port=0 picks a free port. Waits at most `startup_timeout_s` for the server (and the
    app's lifespan startup) to be up, else raises RuntimeError. On exit asks uvicorn
    to stop, gives in-flight requests up to `shutdown_timeout_s`, and joins the thread.
    """
    sock = _bind(host, port)
    actual_port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level=log_level, lifespan="on", timeout_keep_alive=KEEP_ALIVE_S,
                            timeout_graceful_shutdown=max(1, int(shutdown_timeout_s)))
    server = DrainingServer(config, grace_s=shutdown_timeout_s)
    failure: list[BaseException] = []

    def target() -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as e:  # SystemExit from a failed lifespan startup included
            failure.append(e)

    thread = threading.Thread(target=target, name=f"uvicorn-{actual_port}", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + startup_timeout_s
        while not server.started:
            if not thread.is_alive():
                why = f": {failure[0]!r}" if failure else " (see the log above)"
                raise RuntimeError(f"server on {host}:{actual_port} exited during startup{why}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"server on {host}:{actual_port} did not start within {startup_timeout_s:g} s")
            time.sleep(0.01)
        yield _url(host, actual_port)
    finally:
        server.mark_draining()
        server.should_exit = True
        thread.join(shutdown_timeout_s + 5)
        if thread.is_alive():
            server.force_exit = True
            thread.join(5)
        if thread.is_alive():
            warnings.warn(f"server thread on port {actual_port} did not stop; leaving it (daemon)", RuntimeWarning,
                          stacklevel=3)
        sock.close()
