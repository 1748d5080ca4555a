"""Runs the A2A conformance kit's pytest and records one JSON line per test (scripts/conformance.ts).

Usage, from the kit's checkout: python conformance-kit-recorder.py <results.jsonl> <pytest arguments...>

The kit reports per requirement; `npm run conformance` counts per test case and per transport, so
this records each test with the transport and requirement the kit itself attributes it to: the
`transport` parameter or a transport marker (as tests/compatibility/conftest.py reads them), else
what the test recorded in the kit's compatibility collector, else its name's suffix (`_jsonrpc`,
`_rest`); the requirement a `requirement` parameter, what the test recorded, or the first ID in its
docstring.
"""

from __future__ import annotations

import json
import os
import re
import sys

import pytest

TRANSPORT_MARKERS = ("grpc", "jsonrpc", "http_json")
LEVEL_MARKERS = ("must", "should", "may")
# The kit's own pattern for a requirement ID in a docstring (tests/compatibility/conftest.py).
REQUIREMENT_ID = re.compile(r"([A-Z][A-Z0-9_]+-[A-Z]+-\d+)")
# Worst first: a failed teardown after a passed call still fails the test.
SEVERITY = {"failed": 3, "skipped": 2, "passed": 1}


# Test names that end in a transport name, for tests that carry neither parameter nor marker.
NAME_SUFFIXES = {"_jsonrpc": "jsonrpc", "_http_json": "http_json", "_rest": "http_json", "_grpc": "grpc"}


def transport_of(item: pytest.Item, recorded: list[dict]) -> str | None:
    callspec = getattr(item, "callspec", None)
    if callspec is not None and isinstance(callspec.params.get("transport"), str):
        return callspec.params["transport"]
    for name in TRANSPORT_MARKERS:
        if item.get_closest_marker(name) is not None:
            return name
    transports = {entry["transport"] for entry in recorded} & set(TRANSPORT_MARKERS)
    if len(transports) == 1:
        return transports.pop()
    name = getattr(item, "originalname", item.name)
    return next((transport for suffix, transport in NAME_SUFFIXES.items() if name.endswith(suffix)), None)


def requirement_of(item: pytest.Item, recorded: list[dict]) -> tuple[str | None, str | None]:
    """(requirement ID, level) of a test."""
    callspec = getattr(item, "callspec", None)
    spec = callspec.params.get("requirement") if callspec is not None else None
    requirement = getattr(spec, "id", None)
    if requirement is None and recorded:
        requirement = recorded[0]["requirement"]
    if requirement is None:
        function = getattr(item, "function", None)
        match = REQUIREMENT_ID.search(getattr(function, "__doc__", None) or "")
        requirement = match.group(1) if match else None
    level = None
    if requirement is not None:
        try:
            from tck.requirements.registry import get_requirement_by_id

            level = get_requirement_by_id(requirement).level.value
        except (ImportError, KeyError):
            level = None
    if level is None and recorded:
        level = recorded[0]["level"]
    if level is None:
        level = next((name.upper() for name in LEVEL_MARKERS if item.get_closest_marker(name) is not None), None)
    return requirement, level


def message_of(report: pytest.TestReport, call: pytest.CallInfo) -> str:
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    if call.excinfo is not None:
        return call.excinfo.exconly().strip()
    return ""


class Recorder:
    def __init__(self, path: str) -> None:
        self.path = path
        self.results: dict[str, dict] = {}
        self.current: str | None = None
        self.recorded: dict[str, list[dict]] = {}
        self.listen_to_collector()

    def listen_to_collector(self) -> None:
        """What each test records in the kit's collector (its transport and requirement), by test."""
        from tck.reporting.collector import CompatibilityCollector

        original = CompatibilityCollector.record
        recorder = self

        def record(collector, **kwargs):
            if recorder.current is not None:
                recorder.recorded.setdefault(recorder.current, []).append(
                    {"transport": kwargs.get("transport"), "requirement": kwargs.get("requirement_id"), "level": kwargs.get("level")}
                )
            return original(collector, **kwargs)

        CompatibilityCollector.record = record

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self.current = nodeid

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        outcome = yield
        report: pytest.TestReport = outcome.get_result()
        # A passed setup or teardown says nothing about the test; the call's outcome does.
        if report.when != "call" and report.passed:
            return
        status = "failed" if report.failed else "skipped" if report.skipped else "passed"
        previous = self.results.get(item.nodeid)
        if previous is not None and SEVERITY[previous["status"]] >= SEVERITY[status]:
            return
        recorded = self.recorded.get(item.nodeid, [])
        requirement, level = requirement_of(item, recorded)
        self.results[item.nodeid] = {
            "nodeid": item.nodeid,
            "transport": transport_of(item, recorded),
            "requirement": requirement,
            "level": level,
            "status": status,
            "phase": report.when,
            "message": message_of(report, call)[:600],
        }

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        with open(self.path, "w", encoding="utf-8") as out:
            for result in self.results.values():
                out.write(json.dumps(result) + "\n")


def main() -> int:
    if len(sys.argv) < 2:
        print("usage: conformance-kit-recorder.py <results.jsonl> <pytest arguments...>", file=sys.stderr)
        return 2
    # The kit's packages (tck, tests) are imported from its checkout, the working directory.
    sys.path.insert(0, os.getcwd())
    recorder = Recorder(sys.argv[1])
    return int(pytest.main(sys.argv[2:], plugins=[recorder]))


if __name__ == "__main__":
    sys.exit(main())
