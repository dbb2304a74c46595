"""A JUnit XML report of an audit, for CI systems (``python -m attnbook.audit --junit FILE``).

One ``<testcase>`` per subject, check and grad mode, over all seeds and sets of lengths: it fails when any of those
runs failed, with the first failing run's detail as the message and every failing run in the text. Written with the
standard library's :mod:`xml.etree.ElementTree`.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd

__all__ = ["junit_xml", "write_junit"]


def junit_xml(results: pd.DataFrame, suite: str = "attnbook.audit") -> ET.ElementTree:
    """The JUnit tree of ``results`` (the rows of :func:`attnbook.audit.subjects.run_registry`: ``subject, name,
    seed, lengths, check, mode, passed, detail``, optionally ``seconds``). Test case: ``classname`` =
    ``"<suite>.<subject>"``, ``name`` = ``"<check>[<mode>]"``."""
    root = ET.Element("testsuites", name=suite)
    testsuite = ET.SubElement(root, "testsuite", name=suite)
    tests = failures = 0
    for (subject, check, mode), group in results.groupby(["subject", "check", "mode"], sort=False):
        tests += 1
        case = ET.SubElement(testsuite, "testcase", classname=f"{suite}.{subject}", name=f"{check}[{mode}]")
        failed = group[~group["passed"].astype(bool)]
        if not failed.empty:
            failures += 1
            first = failed.iloc[0]
            failure = ET.SubElement(case, "failure", message=str(first["detail"]), type="PaddingAuditFailure")
            failure.text = "\n".join(f"{row.name} (seed {row.seed}, lengths {row.lengths}): {row.detail}"
                                     for row in failed.itertuples(index=False))
    for element in (root, testsuite):
        element.set("tests", str(tests))
        element.set("failures", str(failures))
        element.set("errors", "0")
    ET.indent(root)
    return ET.ElementTree(root)


def write_junit(results: pd.DataFrame, path: str | Path, suite: str = "attnbook.audit") -> Path:
    """Write :func:`junit_xml` to ``path`` (UTF-8, with an XML declaration); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    junit_xml(results, suite).write(path, encoding="utf-8", xml_declaration=True)
    return path
