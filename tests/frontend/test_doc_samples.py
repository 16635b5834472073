"""The code samples of the guide stay true. The README's first function runs in test_readme.py;
the guide's samples are fragments (several handler variants in one block, a manifest excerpt, a
client that needs a running server), so here each one at least parses, and the YAML ones that are
whole manifests or config sections are validated as fnstream reads them."""
from __future__ import annotations

import ast
import json
import re

import pytest
import yaml

from runtime.config import Config
from runtime.manifest import FunctionSpec
from tests.support.servers import ROOT

PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md", ROOT / "CONTRIBUTING.md"]
FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```$", re.M | re.S)


def samples(lang: str) -> list:
    """Each fenced block of `lang` in the pages, as a pytest param named page:line."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in FENCE.finditer(text):
            indent, block_lang, body = match.groups()
            if block_lang == lang:
                where = f"{page.name}:{text.count(chr(10), 0, match.start()) + 1}"
                code = "\n".join(line[len(indent):] for line in body.splitlines())
                found.append(pytest.param(where, code, id=where))
    return found


@pytest.mark.parametrize("where, code", samples("python"))
def test_python_samples_parse(where, code):
    ast.parse(code, filename=where)


@pytest.mark.parametrize("where, text", samples("json"))
def test_json_samples_parse(where, text):
    json.loads(text)


@pytest.mark.parametrize("where, text", samples("yaml"))
def test_yaml_samples_are_what_fnstream_accepts(where, text):
    data = yaml.safe_load(text)
    assert isinstance(data, dict), where
    if "name" in data and "handler" in data:
        FunctionSpec.model_validate(data)  # a whole manifest
    elif set(data) <= set(Config.model_fields):
        Config.model_validate(data)  # a config file (or a section of one)
    else:  # a manifest excerpt: every key is a manifest field
        assert set(data) <= set(FunctionSpec.model_fields), (where, set(data) - set(FunctionSpec.model_fields))


def test_the_samples_were_found():
    assert len(samples("python")) >= 5 and len(samples("yaml")) >= 4 and samples("json")
