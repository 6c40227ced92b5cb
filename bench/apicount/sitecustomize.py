"""Counts the HTTP requests a process sends, for bench/orchestration.py (a measurement shim).

Python imports ``sitecustomize`` at start-up from ``sys.path``; the benchmark puts this
folder on ``PYTHONPATH`` for everything it starts (the CLI, the workers, their flow runs)
and names a folder in ``H3FLOW_BENCH_COUNT_DIR``. Each process then counts the requests
its httpx clients send (Prefect's client is httpx), per endpoint (method and path, ids
blanked) with the answers' status codes and the seconds they took, and writes
``<pid>.json`` there every half second and at exit. Version-independent: it measures any
h3flow checkout the same way.
"""

import os

_DIR = os.environ.get("H3FLOW_BENCH_COUNT_DIR")

if _DIR:
    import atexit
    import json
    import re
    import threading
    import time

    _counts: dict = {"requests": 0, "endpoints": {}}
    _lock = threading.Lock()
    _ID = re.compile(r"/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|/\d+(?=/|$)")

    def _flush() -> None:
        path = os.path.join(_DIR, f"{os.getpid()}.json")
        with _lock:
            data = json.dumps(_counts)
        try:
            with open(path + ".tmp", "w") as handle:
                handle.write(data)
            os.replace(path + ".tmp", path)
        except OSError:
            pass

    def _count(request: object, status: int | None, seconds: float) -> None:
        key = f"{request.method} {_ID.sub('/ID', request.url.path)}"  # type: ignore[attr-defined]
        with _lock:
            _counts["requests"] += 1
            row = _counts["endpoints"].setdefault(key, {"n": 0, "s": 0.0, "status": {}})
            row["n"] += 1
            row["s"] += seconds
            code = str(status)
            row["status"][code] = row["status"].get(code, 0) + 1

    def _install() -> None:
        import httpx

        sync_send, async_send = httpx.Client.send, httpx.AsyncClient.send

        def send(self, request, *args, **kwargs):  # type: ignore[no-untyped-def]
            tick, status = time.monotonic(), None
            try:
                response = sync_send(self, request, *args, **kwargs)
                status = response.status_code
                return response
            finally:
                _count(request, status, time.monotonic() - tick)

        async def asend(self, request, *args, **kwargs):  # type: ignore[no-untyped-def]
            tick, status = time.monotonic(), None
            try:
                response = await async_send(self, request, *args, **kwargs)
                status = response.status_code
                return response
            finally:
                _count(request, status, time.monotonic() - tick)

        httpx.Client.send = send  # type: ignore[method-assign]
        httpx.AsyncClient.send = asend  # type: ignore[method-assign]

    def _flusher() -> None:
        while True:
            time.sleep(0.5)  # a writer's period
            _flush()

    try:
        _install()
    except ImportError:  # a Python without httpx: nothing to count
        pass
    else:
        atexit.register(_flush)
        threading.Thread(target=_flusher, daemon=True, name="h3flow-bench-count").start()
