"""`GET /docs`: an API page rendered in the browser from the server's own `/openapi.json`.

The page, its style and its script ship inside the package (service/http/docs_page/) and go out as one HTML
document, so it works on a host with no internet access: nothing is fetched from a CDN.
"""

from __future__ import annotations

from importlib import resources

from starlette.requests import Request
from starlette.responses import HTMLResponse

ASSETS = "docs_page"
# The page runs only its own inline script and style and talks only to this server.
POLICY = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; "
          "img-src 'self' data:")


def page() -> str:
    """The HTML document with its stylesheet and script inlined."""
    folder = resources.files("glassbox.service.http") / ASSETS
    html = (folder / "docs.html").read_text(encoding="utf-8")
    style = (folder / "docs.css").read_text(encoding="utf-8")
    script = (folder / "docs.js").read_text(encoding="utf-8")
    return html.replace("/*STYLE*/", style).replace("/*SCRIPT*/", script)


class ApiDocs:
    """The endpoint (`serve`); the page is read once, when the app is built."""

    def __init__(self) -> None:
        self._body = page()

    async def serve(self, request: Request) -> HTMLResponse:
        return HTMLResponse(self._body, headers={"Content-Security-Policy": POLICY})
