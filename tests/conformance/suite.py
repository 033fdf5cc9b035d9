"""llama.cpp's server test suite, fetched at test time and never committed.

The suite is the `tools/server/tests/` folder of the llama.cpp tree vendored in the source distribution of
`llama-cpp-python==0.3.36`, got with `pip download` and cached under `~/.cache/shoal/conformance` (or
`$SHOAL_CONFORMANCE_CACHE`; the sdist itself is deleted once the suite is out): a second run reads the
cache and needs no network.
"""

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGE = "llama-cpp-python"
VERSION = "0.3.36"
# Where the server tests live inside the sdist, below its top folder.
SUITE_IN_SDIST = "vendor/llama.cpp/tools/server/tests/"


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "shoal" / "conformance"
    return Path(os.environ.get("SHOAL_CONFORMANCE_CACHE", default))


def _download_sdist(into: Path) -> Path:
    """The sdist of PACKAGE==VERSION in `into` (downloaded once). Only this package is built from source:
    its build tools (cmake, scikit-build-core) come as wheels, for pip prepares the sdist's metadata."""
    found = sorted(into.glob(f"{PACKAGE.replace('-', '_')}-{VERSION}.tar.gz"))
    if found:
        return found[0]
    into.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q", "--no-deps",
         "--no-binary", PACKAGE, f"{PACKAGE}=={VERSION}", "-d", str(into)],
        check=True,
    )
    found = sorted(into.glob(f"{PACKAGE.replace('-', '_')}-{VERSION}.tar.gz"))
    if not found:
        raise RuntimeError(f"pip download left no {PACKAGE}-{VERSION} sdist in {into}")
    return found[0]


def llama_server_tests() -> Path:
    """The folder holding llama.cpp's `utils.py`, `conftest.py` and `unit/` (extracted once)."""
    root = cache_dir()
    suite = root / f"llama.cpp-server-tests-{PACKAGE}-{VERSION}"
    if (suite / "utils.py").is_file() and (suite / "unit").is_dir():
        return suite
    sdist = _download_sdist(root / "sdist")
    staging = Path(tempfile.mkdtemp(prefix="suite-", dir=root))
    try:
        with tarfile.open(sdist) as tar:
            members = []
            for member in tar.getmembers():
                _, _, inner = member.name.partition("/")
                if inner.startswith(SUITE_IN_SDIST) and (member.isfile() or member.isdir()):
                    member.name = inner[len(SUITE_IN_SDIST):] or "."
                    members.append(member)
            if not members:
                raise RuntimeError(f"{sdist} has no {SUITE_IN_SDIST}")
            tar.extractall(staging, members=members, filter="data")
        if suite.exists():
            shutil.rmtree(suite)
        staging.rename(suite)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    shutil.rmtree(sdist.parent, ignore_errors=True)  # 75 MB, of which the suite is a few hundred kB
    return suite


if __name__ == "__main__":
    print(llama_server_tests())
