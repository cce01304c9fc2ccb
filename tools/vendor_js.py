"""Fetch the JavaScript libraries that bertviz needs, so its views work without internet.

bertviz 1.4.1 loads require.js 2.3.6, d3 5.7.0 and jQuery 2.0.0 from cdnjs. The course ships copies
in courselib/static/ (courselib.visualize inlines them). This script re-creates those copies from
the npm registry with `npm pack` and checks them against pins, so anyone can prove that the committed
files are the published ones:

    python tools/vendor_js.py           # fetch, verify, write courselib/static/ (needs npm and the registry)
    python tools/vendor_js.py --check   # verify the committed files against SHA256SUMS (offline)
    python tools/vendor_js.py --repin   # after changing a version below: fetch and rewrite SHA256SUMS

jQuery 2.0.0 was never published to npm (jQuery's npm releases start at 2.1.0) nor bundled by a PyPI
package, so the course ships 2.2.4, the last 2.x release: same major version, same API for bertviz.
The requirejs npm package does not contain its LICENSE file; requirejs-2.3.6/LICENSE is kept by hand
(the copyright line of require.js's header and the MIT licence text that the header names).
"""
import argparse
import base64
import hashlib
import pathlib
import subprocess
import sys
import tarfile
import tempfile

STATIC_DIR = pathlib.Path(__file__).resolve().parent.parent / "courselib" / "static"
SUMS = STATIC_DIR / "SHA256SUMS"

# package, version, npm's sha512 of the tarball, {file in the tarball: file under courselib/static/}
PACKAGES = [
    ("requirejs", "2.3.6",
     "sha512-ipEzlWQe6RK3jkzikgCupiTbTvm4S0/CAU5GlgptkN5SO6F3u0UD0K18wy6ErDqiCyP4J4YYe1HuAShvsxePLg==",
     {"package/require.js": "requirejs-2.3.6/require.js"}),
    ("d3", "5.7.0",
     "sha512-8KEIfx+dFm8PlbJN9PI0suazrZ41QcaAufsKE9PRcqYPWLngHIyWJZX96n6IQKePGgeSu0l7rtlueSSNq8Zc3g==",
     {"package/dist/d3.min.js": "d3-5.7.0/d3.min.js",
      "package/LICENSE": "d3-5.7.0/LICENSE"}),
    ("jquery", "2.2.4",
     "sha512-lBHj60ezci2u1v2FqnZIraShGgEXq35qCzMv4lITyHGppTnA13rwR0MgwyNJh9TnDs3aXUvd1xjAotfraMHX/Q==",
     {"package/dist/jquery.min.js": "jquery-2.2.4/jquery.min.js",
      "package/LICENSE.txt": "jquery-2.2.4/LICENSE.txt",
      # jquery.min.js bundles the Sizzle selector engine, which has its own licence file
      "package/external/sizzle/LICENSE.txt": "jquery-2.2.4/sizzle-LICENSE.txt"}),
]
KEPT_BY_HAND = ["requirejs-2.3.6/LICENSE"]


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def read_sums():
    """{path under courselib/static/: sha256} from SHA256SUMS (the `sha256sum` format)."""
    sums = {}
    for line in SUMS.read_text().splitlines():
        if line.strip():
            digest, name = line.split(maxsplit=1)
            sums[name.lstrip("*")] = digest
    return sums


def check():
    """Problems with the committed files, as sentences; empty when all match their pins."""
    sums = read_sums()
    expected = {dest for *_, files in PACKAGES for dest in files.values()} | set(KEPT_BY_HAND)
    problems = [f"SHA256SUMS has no pin for {name}" for name in sorted(expected - set(sums))]
    problems += [f"SHA256SUMS pins {name}, which no package here provides"
                 for name in sorted(set(sums) - expected)]
    for name, digest in sorted(sums.items()):
        path = STATIC_DIR / name
        if not path.is_file():
            problems.append(f"{path} is missing")
        elif sha256(path.read_bytes()) != digest:
            problems.append(f"{path} differs from its pin in SHA256SUMS (edited by hand?)")
    return problems


def npm_pack(package, version, integrity, workdir):
    """The tarball that the npm registry serves for package@version, checked against its pinned sha512."""
    out = subprocess.run(["npm", "pack", f"{package}@{version}", "--pack-destination", str(workdir), "--silent"],
                         capture_output=True, text=True, check=True).stdout.split()
    tarball = workdir / out[-1]
    actual = "sha512-" + base64.b64encode(hashlib.sha512(tarball.read_bytes()).digest()).decode()
    if actual != integrity:
        sys.exit(f"{package}@{version}: the registry's tarball has integrity {actual}, pinned {integrity}")
    return tarball


def fetch(repin=False):
    sums = {} if repin else read_sums()
    fetched = {}
    with tempfile.TemporaryDirectory() as tmp:
        for package, version, integrity, files in PACKAGES:
            with tarfile.open(npm_pack(package, version, integrity, pathlib.Path(tmp))) as tar:
                for member, dest in files.items():
                    data = tar.extractfile(member).read()
                    if not repin and sums.get(dest) != sha256(data):
                        sys.exit(f"{package}@{version} {member}: sha256 {sha256(data)} is not the pin "
                                 f"{sums.get(dest)} for {dest}; nothing written")
                    fetched[dest] = data
    for dest, data in fetched.items():
        (STATIC_DIR / dest).parent.mkdir(parents=True, exist_ok=True)
        (STATIC_DIR / dest).write_bytes(data)
        print(f"wrote courselib/static/{dest} ({len(data)} bytes)")
    if repin:
        for name in KEPT_BY_HAND:
            fetched[name] = (STATIC_DIR / name).read_bytes()
        SUMS.write_text("".join(f"{sha256(data)}  {name}\n" for name, data in sorted(fetched.items())))
        print(f"rewrote {SUMS}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="verify the committed files (no network)")
    mode.add_argument("--repin", action="store_true", help="fetch and rewrite SHA256SUMS")
    args = parser.parse_args()
    if not args.check:
        fetch(repin=args.repin)
    problems = check()
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        sys.exit(1)
    print(f"courselib/static/: {len(read_sums())} files match SHA256SUMS")
