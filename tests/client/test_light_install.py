"""The client installs alone: a fresh virtual environment with `tracestore-client` only.

Built from client/ in this checkout (a wheel, by hatchling, a dev dependency) and
installed by pip into a new venv; what pip pulled in is checked against what the client
imports, and the installed client posts to a live server, spools while it is down and
replays with its own `python -m tracestore_client spool` command.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import httpx
import orjson
import pytest

from tests.conftest import LiveServer, free_port, minimal_rollout

ROOT = Path(__file__).resolve().parents[2]
# What httpx brings with it (typing-extensions and exceptiongroup only on older Pythons).
ALLOWED = {
    "tracestore-client",
    "httpx",
    "httpcore",
    "h11",
    "anyio",
    "idna",
    "certifi",
    "sniffio",
    "typing-extensions",
    "exceptiongroup",
}
# The server's weight, which a task app must not get.
FORBIDDEN = {"tracestore", "duckdb", "pyarrow", "sqlalchemy", "fastapi", "orjson", "psycopg"}


def _run(python: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    # No PYTHONPATH or the like: the venv sees what was installed into it, nothing else.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "TRACESTORE_"))}
    return subprocess.run(
        [str(python), *args], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def light(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The python of a new venv holding tracestore-client and what pip pulled in for it."""
    if importlib.util.find_spec("hatchling") is None:
        pytest.fail("hatchling (a dev dependency) is needed to build the client's wheel")
    tmp = tmp_path_factory.mktemp("light")
    # hatchling builds the project in its working directory: client/, not the server.
    built = subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(tmp)],
        cwd=ROOT / "client",
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp.glob("tracestore_client-*.whl")
    target = tmp / "venv"
    venv.create(target, with_pip=False)  # this venv's pip installs into it (faster)
    python = target / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet"]
    installed = subprocess.run(
        [*pip, str(wheel)], capture_output=True, text=True, timeout=600, check=False
    )
    assert installed.returncode == 0, f"pip could not install the client: {installed.stderr}"
    return python


def _distributions(python: Path) -> set[str]:
    listed = _run(
        python,
        "-c",
        "import importlib.metadata as m, json; "
        "print(json.dumps(sorted({d.metadata['Name'] for d in m.distributions()})))",
    )
    assert listed.returncode == 0, listed.stderr
    return {name.lower().replace("_", "-") for name in json.loads(listed.stdout)}


def test_the_client_installs_with_only_what_it_imports(light: Path) -> None:
    names = _distributions(light)
    assert "tracestore-client" in names
    assert names & FORBIDDEN == set()
    assert names <= ALLOWED, f"unexpected distributions: {sorted(names - ALLOWED)}"
    # Importing the client loads nothing beyond the standard library and httpx's stack.
    probe = _run(
        light,
        "-c",
        "import sys, json, tracestore_client, tracestore_client.cli; "
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} "
        "- set(sys.stdlib_module_names))))",
    )
    assert probe.returncode == 0, probe.stderr
    # Less the interpreter's own start-up hooks: Debian's python3 imports its
    # /usr/lib/python3.11/sitecustomize.py when the environment is empty (`env -i`).
    startup = {"__main__", "_distutils_hack", "sitecustomize", "usercustomize"}
    modules = set(json.loads(probe.stdout)) - startup - {"tracestore_client"}
    assert modules <= {"httpx", "httpcore", "h11", "anyio", "idna", "certifi", "sniffio"}


_PRODUCER = textwrap.dedent(
    """
    import json, math, sys
    from tracestore_client import NonFiniteNumberError, TracestoreClient

    url, down, spool, doc = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    with TracestoreClient(down, spool=spool, max_retries=0) as client:
        spooled = client.post_rollout({**doc, "run_id": doc["run_id"] + "-spooled"})
    with TracestoreClient(url, replay_on_contact=False) as client:
        try:
            client.post_rollout({**doc, "metrics": {"mean_return": math.nan}})
        except NonFiniteNumberError as exc:
            refused = str(exc)
        posted = client.post_rollout(doc)
    print(json.dumps({"spooled": spooled["status"], "refused": refused, "posted": posted}))
    """
)


def test_the_light_install_posts_spools_and_replays(
    light: Path, server: LiveServer, http: httpx.Client, tmp_path: Path
) -> None:
    doc = minimal_rollout("light-run")
    spool = tmp_path / "light.spool"
    down = f"http://127.0.0.1:{free_port()}"
    done = _run(light, "-c", _PRODUCER, server.url, down, str(spool), json.dumps(doc))
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["spooled"] == "spooled"
    assert "NaN at $.metrics.mean_return" in out["refused"]
    assert (out["posted"]["run_id"], out["posted"]["status"]) == ("light-run", "created")
    assert orjson.loads(http.get("/v1/rollouts/light-run").content) == doc

    status = _run(light, "-m", "tracestore_client", "spool", "status", str(spool), "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["pending"] == 1
    replay = _run(
        light, "-m", "tracestore_client", "spool", "replay", str(spool), "--url", server.url
    )
    assert replay.returncode == 0, replay.stderr
    assert "1 delivered, 0 rejected, 0 still spooled" in replay.stdout
    stored = http.get("/v1/rollouts/light-run-spooled")
    assert orjson.loads(stored.content) == {**doc, "run_id": "light-run-spooled"}
