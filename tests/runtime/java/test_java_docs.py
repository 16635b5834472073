"""docs/java.md shows the seed's Java handler as deployed: the text of functions/java_demo, verbatim."""
from __future__ import annotations

import re
from pathlib import Path

from tests.support.servers import FUNCTIONS

DOCS = Path(__file__).resolve().parents[3] / "docs" / "java.md"


def test_the_docs_example_is_the_deployed_seed_text():
    first_java = re.search(r"```java\n(.*?)```", DOCS.read_text(), re.S)
    assert first_java is not None
    demo = (FUNCTIONS / "java_demo" / "org" / "yuanrong" / "demo" / "Demo.java").read_text()
    assert first_java.group(1) == demo
