"""validation/golden.py compare: a failed request on either side is named as one, with its error."""
from __future__ import annotations

from validation.golden import compare


def test_a_failed_reference_request_is_reported_as_a_failure_not_as_missing_token_ids():
    report = compare([{"error": "URLError: <urlopen error [Errno -2] Name or service not known>"}],
                     [{"token_ids": [5, 6], "text": "a b", "finish_reason": "length"}])
    (case,) = report.cases
    assert not report.ok and not case.ok
    assert case.problem.startswith("reference request failed: URLError"), case


def test_a_failed_candidate_request_is_still_named_first():
    report = compare([{"error": "timeout"}], [{"error": "HTTPError: 500"}])
    assert report.cases[0].problem == "candidate request failed: HTTPError: 500"


def test_an_answer_without_token_ids_is_still_called_so():
    report = compare([{"token_ids": None, "text": ""}], [{"token_ids": [1], "text": "x"}])
    assert "no token_ids in the reference answer" in report.cases[0].problem
