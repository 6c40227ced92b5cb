"""Benchmark: one clip end to end through the local engine, stage by stage.

    .venv/bin/python bench/reference.py                 # SD 416x736, 5 s, 6 steps, CPU
    .venv/bin/python bench/reference.py --spec tiny     # the embedded demo's size
    .venv/bin/python bench/reference.py --device cuda --degree 4   # NCCL Ulysses, int8 GEMM

Prints the wall time of each stage (encode, offload, sample, load + verify, video
decode, audio decode, H.264 + AAC mux), then the INT8 / fp32 video-decode time ratio
(median of --repeat runs, measured in this run) and the INT8 decoder's PSNR against
fp32. Figures only: nothing here passes or fails.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from h3flow.core.batch import Clip
from h3flow.core.specs import AUDIO_RATE, FPS
from h3flow.engines.local import LocalEngine
from h3flow.handoff.format import load_latent
from h3flow.media.mux import mux_mp4
from h3flow.reference.audio import decode_audio
from h3flow.reference.vae import Fp32Decoder, Int8Decoder, decode_video, psnr


def timed(label: str, fn: Callable[[], Any], rows: list[tuple[str, float]]) -> Any:
    start = time.perf_counter()
    result = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    rows.append((label, time.perf_counter() - start))
    return result


def decode_all(video: torch.Tensor, frames: int, decoder: Fp32Decoder) -> list[torch.Tensor]:
    return [chunk.cpu() for chunk in decode_video(video, frames, decoder)]


def median_times(fns: dict[str, Callable[[], Any]], repeat: int) -> dict[str, float]:
    """Median wall time of each function, run in turn (a, b, c, a, b, c, ...) so that load
    from other processes hits them alike."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", default="sd", choices=["tiny", "sd", "hd"])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--degree", type=int, default=1, help="Ulysses degree (processes / GPUs)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeat", type=int, default=5, help="runs per decoder for the INT8/fp32 ratio")
    args = parser.parse_args()

    clip = Clip(
        id="bench",
        prompt="slow pan right over the lake, calm evening",
        image=ROOT / "examples/images/landscape.png",
        spec=args.spec,
        seconds=5,
        seed=1,
        steps=args.steps,
    )
    engine = LocalEngine(degree=args.degree, device=args.device)
    rows: list[tuple[str, float]] = []
    print(
        f"# {args.spec} {clip.resolved_spec.height}x{clip.resolved_spec.width}, {clip.frames} frames, {args.steps} steps, "
        f"device {args.device}, Ulysses degree {args.degree}, torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cond = timed("encode", lambda: engine.encode(clip, work / "c.cond"), rows)
        timed("offload", engine.offload, rows)
        latent_ref = timed("sample", lambda: engine.sample(clip, cond, work / "l.h3latent"), rows)
        latent = timed("load + verify latent", lambda: load_latent(latent_ref.path, latent_ref.sha256), rows)
        int8 = Int8Decoder(args.device)
        frames = timed("video decode (INT8)", lambda: decode_all(latent.video, clip.frames, int8), rows)
        wave = timed("audio decode", lambda: decode_audio(latent.audio, clip.frames * AUDIO_RATE // FPS), rows)
        mp4 = timed("H.264 + AAC mux", lambda: mux_mp4(work / "out.mp4", frames, wave), rows)
        total = sum(t for _, t in rows)
        for label, seconds in rows:
            print(f"{label:<24} {seconds:8.3f} s")
        print(f"{'total':<24} {total:8.3f} s   ({mp4.size / 1e6:.2f} MB MP4)")

        fp32 = Fp32Decoder(args.device)
        int_mm = Int8Decoder(args.device, int_mm=True)
        int8_name = f"INT8 ({'int_mm' if int8.int_mm else 'dequantised weights'})"
        decoders = {"fp32": fp32, int8_name: int8, "INT8 (int_mm forced)": int_mm}
        runs = {name: (lambda d=d: decode_all(latent.video, clip.frames, d)) for name, d in decoders.items()}
        medians = median_times(runs, args.repeat)
        ref = torch.cat(decode_all(latent.video, clip.frames, fp32))
        print(f"video decode, median of {args.repeat} interleaved runs:")
        for name, decoder in decoders.items():
            ratio = medians[name] / medians["fp32"]
            line = f"  {name:<32} {medians[name]:7.3f} s   time / fp32 {ratio:.2f}"
            if decoder is not fp32:
                line += f"   PSNR vs fp32 {psnr(torch.cat(decode_all(latent.video, clip.frames, decoder)), ref):.1f} dB"
            print(line)


if __name__ == "__main__":
    main()
