"""deploy/Dockerfile, read with BuildKit's own parser. The shared loading, validators and
contracts are in
:mod:`tests.deploy.manifests`."""

from __future__ import annotations

import re
from functools import cache

import dockerfile
import pytest

from tests.deploy.manifests import (
    API_PORT,
    DOCKERFILE,
    METRICS_PORT,
    SERVE_COMMAND,
)

# ---------------------------------------------------------------------------
# deploy/Dockerfile
# ---------------------------------------------------------------------------


DOCKERFILE_INSTRUCTIONS = frozenset(
    {"FROM", "RUN", "CMD", "LABEL", "MAINTAINER", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME", "USER"}
    | {"WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL"}
)


def parse_dockerfile(text: str) -> tuple[dockerfile.Command, ...]:
    # BuildKit's own parser (Go, via the `dockerfile` package). It is lenient
    # (unknown instructions and malformed JSON arrays still parse), hence the
    # explicit checks in dockerfile_problems().
    commands: tuple[dockerfile.Command, ...] = dockerfile.parse_string(text)
    return commands


@cache
def dockerfile_commands() -> tuple[dockerfile.Command, ...]:
    return parse_dockerfile(DOCKERFILE.read_text())


def final_stage(cmds: tuple[dockerfile.Command, ...]) -> list[dockerfile.Command]:
    last_from = max(i for i, c in enumerate(cmds) if c.cmd == "FROM")
    return list(cmds[last_from:])


def dockerfile_problems(cmds: tuple[dockerfile.Command, ...]) -> list[str]:
    """Everything wrong with a parsed Dockerfile w.r.t. the image contract."""
    problems = []
    unknown = [c.cmd for c in cmds if c.cmd not in DOCKERFILE_INSTRUCTIONS]
    if unknown:
        problems.append(f"unknown instructions {unknown}")
    if cmds[0].cmd not in {"FROM", "ARG"}:
        problems.append("must start with FROM (or ARG)")
    if not any(c.cmd == "FROM" for c in cmds):
        return [*problems, "no FROM"]

    stage = final_stage(cmds)
    users = [c.value[0] for c in stage if c.cmd == "USER"]
    uid = users[-1].split(":")[0] if users else "root"
    if uid != "10001":  # k8s securityContext.runAsUser expects 10001
        problems.append(f"final stage runs as {uid!r}, expected non-root 10001")

    entrypoint = [c for c in stage if c.cmd == "ENTRYPOINT"]
    if entrypoint:
        # Compose/k8s override the command with a full `drcredit ...` argv,
        # which only works without an ENTRYPOINT.
        problems.append("ENTRYPOINT set")
    cmd = [c for c in stage if c.cmd == "CMD"]
    if len(cmd) != 1:
        problems.append(f"{len(cmd)} CMD instructions in the final stage")
    elif not cmd[0].json:
        problems.append("CMD not in exec (JSON) form: drcredit would not get SIGTERM")
    elif list(cmd[0].value) != SERVE_COMMAND:
        problems.append(f"CMD is {list(cmd[0].value)}")
    return problems


def test_dockerfile_meets_the_image_contract() -> None:
    assert dockerfile_problems(dockerfile_commands()) == []


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (
            'CMD ["drcredit", "serve", "--host", "0.0.0.0", "--port", "8000"]',
            'CMD ["drcredit", "serve", "--host", "0.0.0.0", "--port", "8000"',
        ),  # broken JSON
        (
            'CMD ["drcredit", "serve", "--host", "0.0.0.0", "--port", "8000"]',
            "CMD drcredit serve --host 0.0.0.0 --port 8000",
        ),  # shell form
        ("USER 10001:10001", "USER root"),
        ("USER 10001:10001", "USRE 10001:10001"),
        ("EXPOSE 8000 9100", 'EXPOSE 8000 9100\nENTRYPOINT ["python"]'),
    ],
    ids=["broken-json-cmd", "shell-form-cmd", "root-user", "unknown-instruction", "entrypoint"],
)
def test_dockerfile_checks_reject_tampering(old: str, new: str) -> None:
    text = DOCKERFILE.read_text()
    assert old in text
    assert dockerfile_problems(parse_dockerfile(text.replace(old, new))) != []


def test_dockerfile_parser_rejects_syntax_errors() -> None:
    with pytest.raises(dockerfile.GoParseError):
        parse_dockerfile("# no instructions at all\n")
    with pytest.raises(dockerfile.GoParseError):
        parse_dockerfile("FROM python:3.11-slim\nRUN <<EOF\necho unterminated heredoc\n")


def test_dockerfile_base_image_is_python_311_slim() -> None:
    cmds = dockerfile_commands()
    args: dict[str, str] = {}
    for c in cmds:
        if c.cmd == "ARG" and "=" in c.value[0]:
            k, v = c.value[0].split("=", 1)
            args.setdefault(k, v)
    froms = [c for c in cmds if c.cmd == "FROM"]
    assert froms
    for c in froms:
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], c.value[0])
        assert image == "python:3.11-slim"


def test_dockerfile_installs_the_repo() -> None:
    cmds = dockerfile_commands()
    copied = {src for c in cmds if c.cmd == "COPY" and not c.flags for src in c.value[:-1]}
    assert {"pyproject.toml", "shared/", "services/"} <= copied
    assert any("alembic.ini" in src for src in copied), "alembic.ini copied when present"
    assert any(c.cmd == "RUN" and re.search(r"\bpip install \.(\s|$)", c.value[0]) for c in cmds)


def test_dockerfile_exposes_api_and_metrics_ports() -> None:
    exposed = {p for c in final_stage(dockerfile_commands()) if c.cmd == "EXPOSE" for p in c.value}
    assert {str(API_PORT), str(METRICS_PORT)} <= exposed
