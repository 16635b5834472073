"""Compiling Java function code: find the JDK and gson, build the SDK and the function's sources.

Everything compiled is cached in a directory named by the hash of what went in (the sources,
the SDK, the JDK's version), so a redeploy of unchanged code and every later worker start
compile nothing. Each failure is a DeployError that says what to install or what to fix.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import DeployError

__all__ = ("SDK_SOURCES", "JavaCode", "Jdk", "cache_root", "classpath_for", "find_jdk", "java_unavailable")

SDK_SOURCES = Path(__file__).resolve().parent / "sdk"
GSON_CANDIDATES = ("/usr/share/java/gson.jar",)
INSTALL_HINT = ("install a JDK 17 or later and gson "
                "(Debian: apt-get install openjdk-17-jdk-headless libgoogle-gson-java)")
MIN_JDK = 17
COMPILE_SECONDS = 300.0
_ERROR_RE = re.compile(r"^(?P<file>.+?\.java):(?P<line>\d+): error: (?P<msg>.*)$", re.MULTILINE)


@dataclass(frozen=True)
class Jdk:
    java: str
    javac: str
    version: str   # javac's own words, e.g. "javac 17.0.15"
    gson: str      # the gson jar


def _major(version: str) -> int:
    match = re.search(r"(\d+)(?:\.(\d+))?", version)
    if match is None:
        return 0
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major  # "1.8" is Java 8


@functools.cache
def _probe(javac: str) -> str:
    out = subprocess.run([javac, "-version"], capture_output=True, text=True, timeout=60)
    return (out.stdout or out.stderr).strip()


def find_jdk(function: str) -> Jdk:
    """The JDK and gson jar to run Java functions with, or a DeployError naming what to install."""
    java_home = os.environ.get("JAVA_HOME")
    search = os.pathsep.join(p for p in (str(Path(java_home) / "bin") if java_home else "", os.environ.get("PATH", ""))
                             if p)
    javac, java = shutil.which("javac", path=search), shutil.which("java", path=search)
    if javac is None or java is None:
        raise DeployError(f"function {function!r}: no JDK found (javac and java are not on PATH); {INSTALL_HINT}")
    try:
        version = _probe(javac)
    except (OSError, subprocess.SubprocessError) as exc:
        raise DeployError(f"function {function!r}: cannot run {javac}: {exc}; {INSTALL_HINT}") from None
    if _major(version.removeprefix("javac ")) < MIN_JDK:
        raise DeployError(f"function {function!r}: {javac} is {version!r}; fnstream runs Java functions on JDK "
                          f"{MIN_JDK} or later: {INSTALL_HINT}")
    gson = os.environ.get("FNSTREAM_GSON_JAR") or next((g for g in GSON_CANDIDATES if Path(g).is_file()), None)
    if gson is None or not Path(gson).is_file():
        raise DeployError(f"function {function!r}: gson is not installed (no {GSON_CANDIDATES[0]}; or set "
                          f"FNSTREAM_GSON_JAR); {INSTALL_HINT}")
    return Jdk(java=java, javac=javac, version=version, gson=gson)


def cache_root() -> Path:
    base = os.environ.get("FNSTREAM_JAVA_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "fnstream", "java")
    return Path(base)


def _digest(files: list[Path], root: Path, *extra: str) -> str:
    h = hashlib.sha256()
    for part in extra:
        h.update(part.encode() + b"\0")
    for path in files:
        h.update(str(path.relative_to(root)).encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()[:24]


def _compile(jdk: Jdk, sources: list[Path], root: Path, classpath: list[str], key: str, function: str,
             what: str) -> Path:
    """`sources` compiled into the cache entry `key` (built once, then reused; atomic)."""
    out = cache_root() / key
    if (out / ".done").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=out.parent))
    try:
        args = staging / "sources.txt"
        args.write_text("\n".join('"' + str(p).replace("\\", "\\\\").replace('"', '\\"') + '"' for p in sources))
        cmd = [jdk.javac, "-encoding", "UTF-8", "-nowarn", "-g", "-d", str(staging / "classes"),
               "-cp", os.pathsep.join(classpath), f"@{args}"]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_SECONDS, cwd=root)
        except subprocess.TimeoutExpired:
            raise DeployError(f"function {function!r}: javac did not finish within {COMPILE_SECONDS:g} s") from None
        if done.returncode != 0:
            raise DeployError(_compile_error(function, what, root, done.stdout + done.stderr))
        (staging / "classes" / ".done").write_text(jdk.version)
        try:
            (staging / "classes").rename(out)
        except OSError:
            if not (out / ".done").exists():  # not another deploy that got there first
                raise
        return out
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _compile_error(function: str, what: str, root: Path, output: str) -> str:
    first = _ERROR_RE.search(output)
    text = output.strip()
    if len(text) > 4000:
        text = text[:4000] + "\n..."
    if first is None:
        return f"function {function!r}: javac failed on {what}:\n{text}"
    try:
        name = str(Path(first["file"]).resolve().relative_to(root))
    except ValueError:
        name = first["file"]
    return (f"function {function!r}: {name}, line {first['line']}: {first['msg']} "
            f"(javac, compiling {what}):\n{text}")


def sdk_classes(jdk: Jdk, function: str) -> Path:
    """The SDK and worker program, compiled (once per content and JDK)."""
    sources = sorted(SDK_SOURCES.rglob("*.java"))
    key = "sdk-" + _digest(sources, SDK_SOURCES, jdk.version, jdk.gson)
    return _compile(jdk, sources, SDK_SOURCES, [jdk.gson], key, function, "fnstream's Java SDK")


@dataclass(frozen=True)
class JavaCode:
    classpath: list[str]   # what the JVM gets: the function's entries, the SDK, gson
    own: list[str]         # the function's entries (its compiled sources, codePath, its jars)
    key: str               # the hash of all of it: same key, same classes


def classpath_for(jdk: Jdk, function: str, code_path: Path) -> JavaCode:
    """`code_path`'s sources compiled, its .class tree and its jars, with the SDK and gson.
    A compile error is a DeployError naming the file, the line and javac's message."""
    sdk = sdk_classes(jdk, function)
    jars = sorted(code_path.rglob("*.jar"))
    classes = sorted(code_path.rglob("*.class"))
    sources = sorted(code_path.rglob("*.java"))
    own = [str(code_path), *(str(j) for j in jars)]
    key = _digest([*sources, *classes, *jars], code_path, jdk.version, str(sdk))
    if sources:
        compiled = _compile(jdk, sources, code_path, [str(sdk), jdk.gson, *own], f"fn-{key}", function,
                            f"codePath {code_path}")
        own.insert(0, str(compiled))
    return JavaCode([*own, str(sdk), jdk.gson], own, key)


def java_unavailable(function: str) -> str | None:
    """Why Java functions cannot run here (no JDK, no gson), or None."""
    try:
        find_jdk(function)
    except DeployError as exc:
        return exc.message
    return None
