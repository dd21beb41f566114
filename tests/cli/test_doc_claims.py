"""What the README and docs say about the project agrees with the project (issue 28:
stale claims a newcomer tripped over)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from nsqx.client import codec

REPO = Path(__file__).resolve().parents[2]


def read(rel: str) -> str:
    return (REPO / rel).read_text()


def test_the_readme_says_what_a_full_make_test_needs() -> None:
    """Every package a skipped test asks for (``apt-get install X``) is named in the
    README, with .ci/run, which installs them."""
    wanted = set()
    for path in (REPO / "tests").rglob("*.py"):
        wanted |= set(re.findall(r"apt-get install (?:-y )?([a-z][\w.-]*)", path.read_text()))
    assert {"etcd-server", "chromium"} <= wanted
    readme = read("README.md")
    missing = [pkg for pkg in sorted(wanted) if f"apt-get install {pkg}" not in readme]
    assert not missing, f"README.md does not say that make test needs {missing}"
    assert ".ci/run" in readme
    assert "root" in readme  # the network namespace tests


def test_nsqlookupds_replicator_errors_are_the_codes() -> None:
    """The replicator errors docs/nsqlookupd.md quotes are the ones nsqlookupd answers
    (replication exists: no more "replicator must be 1")."""
    doc = read("docs/nsqlookupd.md")
    code = "".join(p.read_text() for p in (REPO / "src/nsqx/lookupd").glob("*.py"))
    quoted = set(re.findall(r"`(INVALID_ARG_TOPIC_REPLICATOR [^`]+)`", doc))
    assert quoted, "the meta/update refusal is documented"
    for text in quoted:
        assert text in code, f"docs/nsqlookupd.md quotes an error nsqlookupd never answers: {text}"
    assert "replication is not available" not in doc
    assert "1-5; only 1" not in doc


def test_the_client_doc_says_snappy_and_deflate_work() -> None:
    for name in ("snappy", "deflate"):
        stream = codec.codec_factory(name)(6)
        assert stream.decompress(stream.compress(b"hello")) == b"hello"
    doc = read("docs/client.md")
    assert "until it lands" not in doc and "until then" not in doc


def test_the_license_is_an_spdx_expression() -> None:
    """setuptools 77+ warns about ``project.license`` as a table (three times per
    build); an SPDX string needs that setuptools at build time."""
    meta = tomllib.loads(read("pyproject.toml"))
    assert meta["project"]["license"] == "MIT"
    (setuptools,) = [r for r in meta["build-system"]["requires"] if r.startswith("setuptools")]
    assert setuptools == "setuptools>=77"
