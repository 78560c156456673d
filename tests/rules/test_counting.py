"""How the export list's counts are decided and shown (issue 26, item 5): exact where counted, an estimate
labelled "about", a stopped count as "more than", never a cap passed off as the number; and an ID prefix as
the range of IDs that start with it."""

from __future__ import annotations

import uuid

import pytest

from domain.listing import Count, CountKind, id_range
from domain.models import JobStatus
from rules.counting import one_pass_cap, scope_is_small, status_count, total, within_prefix, worth_counting
from service.views import about, count_text

EXACT, ESTIMATE, MORE_THAN, UNKNOWN = (
    CountKind.EXACT,
    CountKind.ESTIMATE,
    CountKind.MORE_THAN,
    CountKind.UNKNOWN,
)


def test_only_what_the_planner_expects_few_of_is_counted_exactly_the_cheapest_first():
    estimates = {JobStatus.QUEUED: 10_000, JobStatus.COMPLETED: 10_001, JobStatus.OUTCOME_UNKNOWN: 1}
    assert worth_counting(estimates, 10_000) == [
        JobStatus.OUTCOME_UNKNOWN,
        JobStatus.QUEUED,
    ]  # cheapest first


def test_an_id_prefix_keeps_a_sixteenth_of_the_estimate_per_hex_digit():
    assert [within_prefix(8_500_000, p) for p in (None, "a", "ab", "abcd", "abcdef01-2")] == [
        8_500_000,
        531_250,
        33_204,
        130,
        1,
    ]


def test_one_pass_counts_every_status_only_when_all_of_them_together_are_few():
    # One pass reads the filter's index alone: up to ten times one status's limit.
    assert one_pass_cap(1_000) == 10_000
    assert scope_is_small({JobStatus.QUEUED: 6_000, JobStatus.FAILED: 4_000}, 1_000)
    assert not scope_is_small({JobStatus.QUEUED: 6_000, JobStatus.FAILED: 4_001}, 1_000)


@pytest.mark.parametrize(
    ("estimate", "counted", "expected"),
    [
        (3, 7, Count(EXACT, 7)),  # counted within the limit: the number, whatever the estimate said
        (50, 10_000, Count(EXACT, 10_000)),
        (50, 10_001, Count(MORE_THAN, 10_000)),  # stopped at its cap: a lower bound, never "10,001"
        (2_000_000, 10_001, Count(ESTIMATE, 2_000_000)),  # a stopped count and a larger estimate: about
        (9_800_000, None, Count(ESTIMATE, 9_800_000)),  # not counted (too many, or past the bound)
        (None, None, Count(UNKNOWN)),
        (None, 4, Count(EXACT, 4)),  # known from a page that held every match
    ],
)
def test_a_status_count_claims_no_more_than_it_knows(estimate, counted, expected):
    assert status_count(estimate, counted, limit=10_000) == expected


@pytest.mark.parametrize(
    ("parts", "expected"),
    [
        ([Count(EXACT, 3), Count(EXACT, 4)], Count(EXACT, 7)),
        ([Count(EXACT, 3), Count(ESTIMATE, 9_800_000)], Count(ESTIMATE, 9_800_003)),
        ([Count(EXACT, 3), Count(MORE_THAN, 10_000)], Count(MORE_THAN, 10_003)),
        ([Count(MORE_THAN, 10_000), Count(ESTIMATE, 50_000)], Count(ESTIMATE, 60_000)),
        ([Count(EXACT, 3), Count(UNKNOWN)], Count(UNKNOWN)),
        ([], Count(EXACT, 0)),
    ],
)
def test_a_total_is_exact_only_when_every_part_is(parts, expected):
    assert total(parts) == expected


@pytest.mark.parametrize(
    ("count", "text"),
    [
        (Count(EXACT, 0), "0"),
        (Count(EXACT, 1_234), "1,234"),
        (Count(ESTIMATE, 9_812_345), "about 9.8M"),
        (Count(ESTIMATE, 123_456), "about 120k"),
        (Count(ESTIMATE, 999_999), "about 1M"),
        (Count(ESTIMATE, 12_345), "about 12k"),
        (Count(ESTIMATE, 987), "about 990"),
        (Count(MORE_THAN, 10_000), "more than 10,000"),
        (Count(UNKNOWN), "not counted"),
    ],
)
def test_a_count_reads_as_what_it_is(count, text):
    assert count_text(count) == text


def test_about_keeps_two_significant_digits():
    assert [about(n) for n in (5, 99, 1_000, 1_049, 2_500_000_000)] == ["5", "99", "1k", "1k", "2.5B"]


@pytest.mark.slow  # 1,800 prefixes, each checked against 2,000 IDs in Python: seconds
def test_an_id_prefix_is_the_range_of_ids_that_start_with_it():
    ids = [uuid.uuid4() for _ in range(2_000)]
    for job_id in ids[:200]:
        text = str(job_id)
        for length in (1, 2, 8, 9, 12, 14, 23, 24, 36):
            prefix = text[:length]
            found = id_range(prefix.upper() if length % 2 else prefix)
            assert found is not None, prefix
            low, high = found
            assert {i for i in ids if low <= i <= high} == {i for i in ids if str(i).startswith(prefix)}


@pytest.mark.parametrize(
    "prefix", ["abc-", "0123456-8", "g", "01234567-89ab-cdef-0123-456789abcdef0", "x" * 3]
)
def test_a_prefix_no_id_can_start_with_is_no_range(prefix):
    assert id_range(prefix) is None
