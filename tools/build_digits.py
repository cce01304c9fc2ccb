"""Rebuild courselib/data/digits/digits.npz, the UCI handwritten digits that notebook 12 trains on.

    python tools/build_digits.py                      # from scikit-learn's copy, if scikit-learn is installed
    python tools/build_digits.py --csv digits.csv.gz  # from that file (sklearn/datasets/data/digits.csv.gz)
    python tools/build_digits.py --check              # rebuild in memory and compare with the committed file

The course does not depend on scikit-learn: it ships the 1,797 images (8x8 pixels, 0..16) and their labels as
one small .npz. scikit-learn's `load_digits` reads `sklearn/datasets/data/digits.csv.gz`, 1,797 rows of 64
pixels and a label; without scikit-learn installed, that file can be taken from its wheel, which is a zip:
`pip download --no-deps scikit-learn` and `unzip <wheel> sklearn/datasets/data/digits.csv.gz`.

The .npz is written byte for byte the same on every run (fixed zip timestamps, fixed order), so that
README.md's sha256 of it holds after a rebuild.
"""
import argparse
import gzip
import hashlib
import io
import pathlib
import sys
import zipfile

import numpy as np

REPO = pathlib.Path(__file__).resolve().parent.parent
OUT = REPO / "courselib" / "data" / "digits" / "digits.npz"
SOURCE_SHA256 = "09f66e6debdee2cd2b5ae59e0d6abbb73fc2b0e0185d2e1957e9ebb51e23aa22"  # scikit-learn 1.9.1's digits.csv.gz


def from_csv(path):
    raw = pathlib.Path(path).read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    if digest != SOURCE_SHA256:
        print(f"note: {path} has sha256 {digest}, not the {SOURCE_SHA256} this file was built from", file=sys.stderr)
    table = np.loadtxt(io.StringIO(gzip.decompress(raw).decode()), delimiter=",")
    return table[:, :-1].reshape(-1, 8, 8), table[:, -1]


def from_sklearn():
    from sklearn.datasets import load_digits
    digits = load_digits()
    return digits.images, digits.target


def npz_bytes(images, labels):
    """images (1797, 8, 8) uint8 and labels (1797,) uint8 in a deflated zip with fixed timestamps."""
    images, labels = np.asarray(images), np.asarray(labels)
    if images.shape != (1797, 8, 8) or labels.shape != (1797,):
        raise ValueError(f"unexpected shapes {images.shape}, {labels.shape}")
    if not (np.all(images == np.round(images)) and images.min() >= 0 and images.max() <= 16):
        raise ValueError("pixels should be integers 0..16")
    if set(np.unique(labels).tolist()) != set(range(10)):
        raise ValueError("labels should be the digits 0..9")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, array in (("images", images.astype(np.uint8)), ("labels", labels.astype(np.uint8))):
            member = io.BytesIO()
            np.lib.format.write_array(member, array, allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, member.getvalue(), compresslevel=9)
    return buffer.getvalue()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", help="scikit-learn's digits.csv.gz (default: import scikit-learn)")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--check", action="store_true", help="compare with the committed file, write nothing")
    args = parser.parse_args(argv)
    images, labels = from_csv(args.csv) if args.csv else from_sklearn()
    data = npz_bytes(images, labels)
    print(f"{len(labels)} images, {len(data):,} bytes, sha256 {hashlib.sha256(data).hexdigest()}")
    if args.check:
        same = pathlib.Path(args.out).read_bytes() == data
        print("the committed file is exactly this build" if same else "the committed file DIFFERS from this build")
        return 0 if same else 1
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_bytes(data)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
