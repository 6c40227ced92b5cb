"""Generate the three example reference images in examples/images/ (736x416 PNG).

Procedural, no inputs, deterministic: ``python examples/make_images.py`` rewrites the
same bytes (Pillow's PNG encoder at its default settings).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

W, H = 736, 416
OUT = Path(__file__).resolve().parent / "images"


def landscape() -> Image.Image:
    """Dusk sky gradient, two mountain ridges, a lake reflecting the sky."""
    y = np.linspace(0, 1, H)[:, None, None]
    sky = (1 - y) * np.array([40, 70, 150]) + y * np.array([250, 170, 110])
    img = np.broadcast_to(sky, (H, W, 3)).copy()
    x = np.linspace(0, 1, W)
    for base, amp, freq, colour in ((0.55, 0.12, 3.0, (70, 60, 90)), (0.66, 0.08, 5.0, (40, 45, 60))):
        ridge = (base - amp * (0.6 * np.sin(freq * np.pi * x) + 0.4 * np.sin(2.3 * freq * np.pi * x + 1))) * H
        mask = np.arange(H)[:, None] > ridge[None, :]
        img[mask] = colour
    lake = int(0.74 * H)
    img[lake:] = 0.55 * img[lake - 1 : 2 * lake - H - 1 : -1][: H - lake] + 0.45 * np.array([30, 60, 110])
    return Image.fromarray(img.clip(0, 255).astype(np.uint8)).filter(ImageFilter.GaussianBlur(1.5))


def shapes() -> Image.Image:
    """Soft circles, a rectangle and a triangle on a diagonal gradient."""
    yy, xx = np.mgrid[0:H, 0:W] / np.array([H, W])[:, None, None]
    img = np.stack([200 - 120 * xx, 120 + 80 * yy, 90 + 140 * xx * yy], -1)
    im = Image.fromarray(img.clip(0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(im)
    draw.ellipse((80, 70, 300, 290), fill=(230, 60, 50))
    draw.ellipse((460, 180, 640, 360), fill=(40, 90, 210))
    draw.rectangle((320, 40, 520, 170), fill=(250, 210, 60))
    draw.polygon([(120, 390), (300, 320), (380, 400)], fill=(30, 150, 90))
    return im.filter(ImageFilter.GaussianBlur(2.0))


def checker_sun() -> Image.Image:
    """A 92-pixel checkerboard floor under a sky with a glowing sun."""
    yy, xx = np.mgrid[0:H, 0:W].astype(np.float64)
    sky = np.stack([120 + 100 * yy / H, 170 + 50 * yy / H, 240 - 30 * yy / H], -1)
    glow = np.exp(-((xx - 540) ** 2 + (yy - 110) ** 2) / (2 * 70.0**2))[..., None]
    img = sky * (1 - glow) + np.array([255, 230, 120]) * glow
    floor = yy >= 230
    checker = (xx // 92 + (yy - 230) // 46) % 2 == 0
    img[floor & checker] = (235, 235, 225)
    img[floor & ~checker] = (60, 70, 90)
    return Image.fromarray(img.clip(0, 255).astype(np.uint8)).filter(ImageFilter.GaussianBlur(1.0))


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, make in (("landscape", landscape), ("shapes", shapes), ("checker-sun", checker_sun)):
        path = OUT / f"{name}.png"
        make().save(path, optimize=True)
        print(path, path.stat().st_size, "bytes")


if __name__ == "__main__":
    main()
