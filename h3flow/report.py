"""A run's report: planned vs actual per clip and stage, makespan, clips per hour."""

from __future__ import annotations

from typing import Any

from h3flow.manifest import STAGES, Manifest


def report_rows(manifest: Manifest) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for rec in manifest.clips.values():
        row: dict[str, Any] = {"clip": rec.clip.id, "spec": rec.clip.spec, "pool": rec.pool, "state": rec.state}
        for stage in STAGES:
            got = rec.stages.get(stage)
            row[f"{stage}_s"] = None if got is None or got.seconds is None else round(got.seconds, 2)
            if stage in rec.planned:
                row[f"{stage}_planned_s"] = round(rec.planned[stage], 2)
        row["output"] = rec.output
        rows.append(row)
    return rows


def summary(manifest: Manifest) -> dict[str, Any]:
    makespan = (manifest.finished or 0) - (manifest.started or 0) if manifest.finished else None
    n = len(manifest.delivered)
    return {
        "run_id": manifest.run_id,
        "state": manifest.state,
        "delivered": n,
        "failed": len(manifest.failed),
        "clips": len(manifest.clips),
        "makespan_s": round(makespan, 2) if makespan else None,
        "clips_per_hour": round(n / makespan * 3600, 2) if makespan and n else None,
        "planned_makespan_s": manifest.planned_makespan,
    }
