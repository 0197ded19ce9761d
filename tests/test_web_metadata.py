"""The page's forms take their options, limits and help from the OpenAPI document (app.js,
applyApiFields), without a browser: every control whose id names an API field names one that the
request body it is sent in has, and index.html states no enum's values itself. A field renamed in the
API, or an option list written back into the page, fails here."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from service.openapi import openapi_document

WEB = Path(__file__).resolve().parents[1] / "service" / "web"
SCRIPT = (WEB / "app.js").read_text()
# The ids that name an API field: the request body's top-level fields, the run form's "run." ones
API_ID = re.compile(r"^(model\.|cluster\.|training\.|constraints\.|run\.|launchers$)")


@dataclass
class Control:
    id: str
    tag: str
    attrs: dict[str, str]
    form: str | None
    values: list[str] = field(default_factory=list)  # the non-empty option or checkbox values in it


class Page(HTMLParser):
    """index.html's elements with an id, each with its form and the values written inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.controls: dict[str, Control] = {}
        self.form: str | None = None
        self.open: list[Control] = []  # the selects and fieldsets the parser is inside
        self.option: dict[str, str | None] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = {key: value or "" for key, value in attrs}
        if tag == "form":
            self.form = named.get("id")
        if "id" in named:
            self.controls[named["id"]] = Control(named["id"], tag, named, self.form)
            if tag in ("select", "fieldset"):
                self.open.append(self.controls[named["id"]])
        if tag == "option":
            self.option = {"value": named.get("value"), "text": ""}
        if tag == "input" and named.get("type") in ("checkbox", "radio") and named.get("value"):
            for holder in self.open:
                holder.values.append(named["value"])

    def handle_data(self, data: str) -> None:
        if self.option is not None:
            self.option["text"] = (self.option["text"] or "") + data

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self.form = None
        if tag == "option" and self.option is not None:
            # an option without a value attribute sends its text
            value = self.option["value"] if self.option["value"] is not None else self.option["text"]
            if value and value.strip():
                for holder in self.open:
                    holder.values.append(value.strip())
            self.option = None
        if tag in ("select", "fieldset") and self.open and self.open[-1].tag == tag:
            self.open.pop()


@cache
def page() -> dict[str, Control]:
    parser = Page()
    parser.feed((WEB / "index.html").read_text())
    return parser.controls


def script_const(name: str) -> str:
    found = re.search(rf"^const {name} = (.+?);$", SCRIPT, re.MULTILINE | re.DOTALL)
    assert found, f"app.js has no const {name}"
    return found.group(1)


# app.js's forms: [form id, the operation whose request body it sends, the ids' prefix]
FORMS: list[list[str]] = json.loads(script_const("FORMS"))


def resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """As app.js's resolveSchema: $ref followed, allOf merged, a lone non-null anyOf/oneOf branch
    merged in (the referring schema's own keys win)."""
    own = {k: v for k, v in schema.items() if k not in ("$ref", "allOf", "anyOf", "oneOf")}
    merged: dict[str, Any] = {}
    if "$ref" in schema:
        target: Any = doc
        for key in schema["$ref"].split("/")[1:]:
            target = target[key]
        merged = resolve(doc, target)
    for part in schema.get("allOf", []):
        merged |= resolve(doc, part)
    every = schema.get("anyOf") or schema.get("oneOf") or []
    branches = [resolve(doc, b) for b in every if b.get("type") != "null"]
    if len(branches) == 1:
        merged |= branches[0]
    elif branches:
        merged["anyOf"] = branches
    return merged | own


def field_schema(doc: dict[str, Any], body: dict[str, Any], path: list[str]) -> dict[str, Any] | None:
    node = resolve(doc, body)
    for name in path:
        owners = [b for b in node.get("anyOf", [node]) if name in b.get("properties", {})]
        if not owners:
            return None
        node = resolve(doc, owners[0]["properties"][name])
    return node


def enum_of(doc: dict[str, Any], schema: dict[str, Any]) -> list[Any] | None:
    items = resolve(doc, schema["items"]) if "items" in schema else {}
    return schema.get("enum") or items.get("enum")


@cache
def api_controls() -> list[tuple[Control, dict[str, Any] | None]]:
    """Each control whose id names an API field, with that field's schema (None: no such field)."""
    doc = openapi_document()
    out = []
    for control in page().values():
        if not API_ID.match(control.id):
            continue
        form = next((f for f in FORMS if f[0] == control.form), None)
        assert form is not None, f"#{control.id} is in no form app.js sends ({control.form})"
        _, operation, prefix = form
        assert control.id.startswith(prefix), f"#{control.id} is in #{form[0]}, whose ids start {prefix!r}"
        body = doc["paths"][operation]["post"]["requestBody"]["content"]["application/json"]["schema"]
        path = control.attrs.get("data-field") or control.id.removeprefix(prefix)
        out.append((control, field_schema(doc, body, path.split("."))))
    return out


def test_the_page_reads_the_document_the_service_serves() -> None:
    from service.main import create_app
    from service.settings import Settings

    url = json.loads(script_const("OPENAPI_URL"))
    assert create_app(Settings(database_url="sqlite://")).openapi_url == url
    assert {form for form, _, _ in FORMS} == {"plan-form", "run-form"}


def test_every_control_that_names_an_api_field_names_one_of_its_request_body() -> None:
    controls = api_controls()
    missing = [c.attrs.get("data-field") or c.id for c, schema in controls if schema is None]
    assert not missing, f"index.html sends fields its request schema does not have: {missing}"
    # the page's own units name a unit app.js converts
    units = set(re.findall(r'"?([\w/]+)"?\s*:', script_const("UNITS")))
    for control, _ in controls:
        unit = control.attrs.get("data-unit")
        assert unit is None or unit in units, f"#{control.id}: app.js's UNITS has no {unit}"


def test_no_enum_of_the_document_is_written_in_the_page() -> None:
    doc = openapi_document()
    with_enum = {c.id: c for c, schema in api_controls() if schema and enum_of(doc, schema)}
    # the fields whose values the page offers, all from the document (a sanity check of the parse)
    assert {
        "training.precision",
        "training.attention",
        "training.method",
        "constraints.objective",
        "launchers",
        "run.format",
    } <= set(with_enum)
    written = {name: c.values for name, c in with_enum.items() if c.values}
    assert not written, f"index.html writes values the OpenAPI document states: {written}"


def test_the_parser_sees_options_written_in_the_page() -> None:
    """The check above would pass vacuously if the parser missed options: it sees them."""
    parser = Page()
    parser.feed(
        '<form id="plan-form"><select id="training.method"><option value="">default</option>'
        '<option>full</option><option value="lora">LoRA</option></select>'
        '<fieldset id="training.lora_targets"><input type="checkbox" value="q_proj"></fieldset></form>'
    )
    assert parser.controls["training.method"].values == ["full", "lora"]
    assert parser.controls["training.lora_targets"].values == ["q_proj"]
    assert parser.controls["training.method"].form == "plan-form"
