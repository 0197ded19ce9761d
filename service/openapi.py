"""Write the OpenAPI document of the app: `python -m service.openapi` (or `make openapi`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from service.main import create_app
from service.settings import Settings

OPENAPI_PATH = Path(__file__).resolve().parents[1] / "openapi" / "openapi.json"


def openapi_document() -> dict[str, Any]:
    # The document does not depend on the database; an in-memory URL keeps this side-effect free.
    return create_app(Settings(database_url="sqlite://")).openapi()


def render() -> str:
    return json.dumps(openapi_document(), indent=2, sort_keys=True) + "\n"


def main() -> int:
    OPENAPI_PATH.parent.mkdir(exist_ok=True)
    OPENAPI_PATH.write_text(render())
    print(f"wrote {OPENAPI_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
