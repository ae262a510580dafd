"""Write a synthetic cell-segmentation data set: python -m mylab.make_data ROOT [--num N]."""

import argparse
from pathlib import Path

import numpy as np


def make_dataset(root, num: int = 512, size: int = 64, seed: int = 0) -> Path:
    """ROOT/images.npy and ROOT/masks.npy: bright discs on noise, written one sample at a
    time (the arrays are memory-mapped, so any size fits in memory)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    shape = (num, size, size)
    images = np.lib.format.open_memmap(root / "images.npy", "w+", np.uint8, shape)
    masks = np.lib.format.open_memmap(root / "masks.npy", "w+", np.uint8, shape)
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:size, :size]
    for i in range(num):
        mask = np.zeros((size, size), dtype=bool)
        for _ in range(rng.integers(1, 6)):
            cy, cx = rng.uniform(0, size, 2)
            radius = rng.uniform(size / 16, size / 6)
            mask |= (yy - cy) ** 2 + (xx - cx) ** 2 < radius**2
        brightness = rng.uniform(40, 120)
        images[i] = np.clip(rng.normal(60, 30, (size, size)) + brightness * mask, 0, 255)
        masks[i] = mask
    images.flush()
    masks.flush()
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("root", help="folder to write images.npy and masks.npy into")
    parser.add_argument("--num", type=int, default=512, help="number of images")
    parser.add_argument("--size", type=int, default=64, help="image height and width")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    root = make_dataset(args.root, args.num, args.size, args.seed)
    megabytes = sum(p.stat().st_size for p in root.glob("*.npy")) / 2**20
    print(f"wrote {args.num} images of {args.size}x{args.size} to {root} ({megabytes:.1f} MB)")


if __name__ == "__main__":
    main()
