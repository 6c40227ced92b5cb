"""Counts the HTTP requests a process sends, for bench/orchestration.py (a measurement shim).

Python imports ``sitecustomize`` at start-up from ``sys.path``; the benchmark puts this
folder on ``PYTHONPATH`` for everything it starts (the CLI, the workers, their flow runs)
and names a folder in ``H3FLOW_BENCH_COUNT_DIR``. Each process then counts the requests
its httpx clients send (Prefect's client is httpx) and writes ``<pid>.json`` there every
half second and at exit. Version-independent: it measures any h3flow checkout the same way.
"""

import os

_DIR = os.environ.get("H3FLOW_BENCH_COUNT_DIR")

if _DIR:
    import atexit
    import json
    import threading

    _counts = {"requests": 0}
    _lock = threading.Lock()

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

    def _count(*_args: object) -> None:
        with _lock:
            _counts["requests"] += 1

    def _install() -> None:
        import httpx

        sync_send, async_send = httpx.Client.send, httpx.AsyncClient.send

        def send(self, request, *args, **kwargs):  # type: ignore[no-untyped-def]
            _count()
            return sync_send(self, request, *args, **kwargs)

        async def asend(self, request, *args, **kwargs):  # type: ignore[no-untyped-def]
            _count()
            return await async_send(self, request, *args, **kwargs)

        httpx.Client.send = send  # type: ignore[method-assign]
        httpx.AsyncClient.send = asend  # type: ignore[method-assign]

    def _flusher() -> None:
        import time

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
