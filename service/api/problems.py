"""OpenAPI documentation of the problem+json error responses every router shares."""

from typing import Any

from service.api.schemas.common import Problem
from service.errors import PROBLEM_MEDIA_TYPE

_PROBLEM_CONTENT = {PROBLEM_MEDIA_TYPE: {"schema": Problem.model_json_schema()}}

PROBLEM_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"description": "Malformed request (e.g. invalid JSON)", "content": _PROBLEM_CONTENT},
    404: {"description": "Not found", "content": _PROBLEM_CONTENT},
    409: {"description": "Conflict with stored state", "content": _PROBLEM_CONTENT},
    413: {"description": "Request body too large", "content": _PROBLEM_CONTENT},
    422: {
        "description": "Validation error; `errors` names each field and limit",
        "content": _PROBLEM_CONTENT,
    },
}
