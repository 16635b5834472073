"""docs/configuration.md is generated from runtime/config.py: a key added or described anew without
regenerating the page (scripts/gen-config-docs) fails here, and so does a key with no description."""
from __future__ import annotations

from pydantic import Field, create_model

from runtime.config import Config
from tests.support import config_docs


def test_the_configuration_page_is_what_the_config_models_render():
    assert config_docs.PAGE.read_text() == config_docs.render(), "docs/configuration.md is stale: " \
        "run scripts/gen-config-docs and commit the page"


def test_every_config_key_says_what_it_means():
    assert config_docs.undescribed() == []


def test_a_key_without_a_description_is_reported():
    extended = create_model("Extended", __base__=Config, newKey=(int, Field(1)))
    assert config_docs.undescribed(extended) == ["newKey"]


def test_every_key_has_a_row():
    page = config_docs.render()
    for section, model in Config.model_fields.items():
        for key in getattr(model.annotation, "model_fields", {}):
            assert f"`{section}.{key}`" in page
