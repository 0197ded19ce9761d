"""GET / and /ui/*: the page for people (service/web/), a client of this same API."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

from service.errors import NotFound

WEB = Path(__file__).resolve().parents[1] / "web"
# Only these files are served: a name from the URL never reaches the filesystem.
FILES = {"app.js": "text/javascript", "style.css": "text/css"}

router = APIRouter(include_in_schema=False)


@router.get("/")
def page() -> FileResponse:
    return FileResponse(WEB / "index.html", media_type="text/html; charset=utf-8")


@router.get("/ui/{name}")
def asset(name: str) -> FileResponse:
    media_type = FILES.get(name)
    if media_type is None:
        raise NotFound(f"no page asset named {name!r}")
    return FileResponse(WEB / name, media_type=f"{media_type}; charset=utf-8")
