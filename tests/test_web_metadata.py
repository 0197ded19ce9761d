"""The page's forms take their options, limits and help from the OpenAPI document (app.js,
applyApiFields), checked here without a browser and without walking the document: index.html writes
no option list of its own into a control it sends, the forms send JSON bodies of operations the
document has, and the units the page types in are ones app.js converts. That every control names a
field of its request body, and each enum's select shows the document's values, is checked in a
browser by the page's own walk (tests/test_web_page.py,
test_every_control_that_names_an_api_field_is_one_the_page_finds_in_the_document)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache
from html.parser import HTMLParser
from pathlib import Path

from service.openapi import openapi_document

WEB = Path(__file__).resolve().parents[1] / "service" / "web"
SCRIPT = (WEB / "app.js").read_text()
# The ids that name an API field: the request body's top-level fields, the run form's "run." ones
API_ID = re.compile(r"^(model\.|cluster\.|training\.|constraints\.|run\.|launchers$)")
# Fields whose values the document states no enum for, offered by the page as its own checkboxes:
# the LoRA target modules (free module names in the API, checked by the service)
FREE_VALUES = {"training.lora_targets"}


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


def test_the_page_reads_the_document_the_service_serves() -> None:
    from service.main import create_app
    from service.settings import Settings

    url = json.loads(script_const("OPENAPI_URL"))
    assert create_app(Settings(database_url="sqlite://")).openapi_url == url
    assert {form for form, _, _ in FORMS} == {"plan-form", "run-form"}


def test_each_form_sends_a_json_body_of_an_operation_of_the_document() -> None:
    doc = openapi_document()
    for form, operation, _ in FORMS:
        assert any(c.tag == "form" and c.id == form for c in page().values()), f"index.html has no #{form}"
        assert "application/json" in doc["paths"][operation]["post"]["requestBody"]["content"]


def test_the_page_writes_no_values_of_its_own_into_the_fields_it_sends() -> None:
    """The forms' selects start empty but for the page's own empty option (its values come from the
    OpenAPI document, or the catalog): a value list written back into index.html fails here. Whether
    each control's field is in the document, and its select shows the document's enum, is the
    page's own walk in a browser (tests/test_web_page.py), not re-done here."""
    sent = [c for c in page().values() if API_ID.match(c.id) and c.tag in ("select", "fieldset")]
    offered = {"training.precision", "training.attention", "training.method", "launchers", "run.format"}
    assert offered <= {c.id for c in sent}  # the parse found the controls the document fills
    written = {c.id: c.values for c in sent if c.values and c.id not in FREE_VALUES}
    assert not written, f"index.html writes values the OpenAPI document states: {written}"


def test_the_units_the_page_types_in_are_ones_app_js_converts() -> None:
    units = set(re.findall(r'"?([\w/]+)"?\s*:', script_const("UNITS")))
    for control in page().values():
        unit = control.attrs.get("data-unit")
        assert unit is None or unit in units, f"#{control.id}: app.js's UNITS has no {unit}"


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
