"""`GET /docs`: the API page ships with the package and needs no network; its script renders every route of the
server's own /openapi.json (run for real under node, against a small stand-in for the browser's DOM)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from glassbox.service.app import create_app
from glassbox.service.http.api_docs import ASSETS
from tests.service.apptools import app_settings, ready_client

# A minimal DOM: enough for docs.js (createElement, append, setAttribute, textContent, replaceChildren,
# getElementById) and a fetch that answers the document given on stdin. Prints what was rendered.
HARNESS = r"""
const fs = require("fs");
const doc = JSON.parse(fs.readFileSync(0, "utf8"));
const created = [];
class Node {
  constructor(tag) { this.tag = tag; this.attrs = {}; this.children = []; this.text = ""; created.push(this); }
  setAttribute(key, value) { this.attrs[key] = String(value); }
  append(...nodes) { this.children.push(...nodes); }
  replaceChildren(...nodes) { this.children = nodes; }
  set textContent(value) { this.text = String(value); this.children = []; }
  get textContent() { return this.text + this.children.map((c) => c.textContent).join(""); }
}
class Text extends Node { constructor(value) { super("#text"); this.text = value; } }
const byId = {};
for (const id of ["title", "summary", "index", "operations", "schemas"]) byId[id] = new Node("section");
global.document = { createElement: (tag) => new Node(tag), createTextNode: (value) => new Text(value),
                    getElementById: (id) => byId[id] };
global.fetch = async (url) => ({ ok: url === "openapi.json", status: 404, json: async () => doc });
require(process.argv[2]);
setTimeout(() => {
  const operations = created.filter((n) => n.tag === "details").map((n) => n.attrs.id);
  const schemas = created.filter((n) => n.tag === "h3").map((n) => n.attrs.id);
  console.log(JSON.stringify({ title: byId.title.textContent, operations, schemas,
                               error: byId.summary.textContent.includes("answered") }));
}, 50);
"""


@pytest.fixture(scope="module")
def client(tiny_model_dir: Path) -> Iterator[TestClient]:
    with ready_client(create_app(app_settings(tiny_model_dir))) as test_client:
        yield test_client


def test_docs_is_one_self_contained_page(client: TestClient) -> None:
    response = client.get("/docs")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    page = response.text
    assert "/*SCRIPT*/" not in page and "/*STYLE*/" not in page  # the shipped style and script are inlined
    assert 'fetch("openapi.json"' in page
    # Offline: no script, stylesheet, font or image from anywhere else, and the browser is told so.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page), "the page loads something remote"
    assert "http://" not in page and "https://" not in page
    assert "default-src 'none'" in response.headers["content-security-policy"]
    assert "connect-src 'self'" in response.headers["content-security-policy"]


def test_the_assets_are_package_data() -> None:
    folder = resources.files("glassbox.service.http") / ASSETS
    assert {entry.name for entry in folder.iterdir()} >= {"docs.html", "docs.css", "docs.js"}
    pyproject = (Path(__file__).parents[3] / "pyproject.toml").read_text()
    # so a wheel (not only an editable install) carries them
    assert '"glassbox.service" = ["http/docs_page/*"]' in pyproject


def test_the_script_renders_every_route_of_the_document(client: TestClient, tmp_path: Path) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    document = client.get("/openapi.json").json()
    script = tmp_path / "docs.js"
    script.write_text((resources.files("glassbox.service.http") / ASSETS / "docs.js").read_text(encoding="utf-8"))
    harness = tmp_path / "harness.js"
    harness.write_text(HARNESS)
    run = subprocess.run([node, str(harness), str(script)], input=json.dumps(document), capture_output=True,
                         text=True, timeout=60, check=True)
    rendered = json.loads(run.stdout)
    expected = [f"op-{op['operationId']}" for item in document["paths"].values() for op in item.values()]
    assert rendered["operations"] == expected and len(expected) > 20
    assert rendered["schemas"] == [f"schema-{name}" for name in document["components"]["schemas"]]
    assert rendered["title"] == f"glassbox {document['info']['version']}"
    assert not rendered["error"]
