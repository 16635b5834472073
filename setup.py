"""Package data that lives at the top of the repository, mapped into the wheel.

`config/default.yaml` stays the one source of the default configuration and `functions/` +
`deploy/` the one source of the bundled examples; the build maps those directories into
`runtime._defaults` and `frontend._examples` so an installed fnstream carries them (read through
`importlib.resources`). Everything else about the project is in pyproject.toml.
"""
from setuptools import find_packages, setup

EXAMPLES = "frontend._examples"
example_packages = [f"{EXAMPLES}.functions.{p}" for p in find_packages("functions")]

setup(
    packages=[*find_packages(include=["runtime", "runtime.*", "frontend", "frontend.*"]),
              "frontend.console", "runtime._defaults", f"{EXAMPLES}.functions", f"{EXAMPLES}.deploy",
              *example_packages],
    package_dir={"runtime._defaults": "config", f"{EXAMPLES}.functions": "functions",
                 f"{EXAMPLES}.deploy": "deploy"},
    package_data={"runtime._defaults": ["default.yaml"], f"{EXAMPLES}.deploy": ["*.yaml"],
                  "frontend.console": ["*"],  # the web console's static files (a data-only package)
                  # Java: the SDK's sources (compiled on first use) and the bundled Java example
                  "runtime.java": ["sdk/**/*.java"], f"{EXAMPLES}.functions": ["java_demo/**/*.java"]},
)
