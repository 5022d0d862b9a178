"""Token buckets and the per-token limiter (core/ratelimit), with time passed in."""

from __future__ import annotations

import pytest

from statestore.core.access import parse_tokens
from statestore.core.errors import RateLimited
from statestore.core.ratelimit import Bucket, Limiter, Limits


def test_a_bucket_refills_at_its_rate_up_to_its_burst() -> None:
    b = Bucket(rate=2.0, burst=4.0, now=0.0)
    assert b.wait(4.0, 0.0) == 0.0
    b.take(4.0, 0.0)
    assert b.wait(1.0, 0.0) == pytest.approx(0.5)
    assert b.wait(1.0, 0.5) == 0.0
    assert b.wait(4.0, 100.0) == 0.0 and b.level == 4.0  # never above the burst


def test_requests_over_the_rate_are_refused_with_the_wait_and_take_nothing() -> None:
    lim, key, limits = Limiter(), b"t", Limits(requests_per_second=1.0, burst_seconds=2.0)
    lim.admit(key, limits, 0, 0.0)
    lim.admit(key, limits, 0, 0.0)
    with pytest.raises(RateLimited) as err:
        lim.admit(key, limits, 0, 0.0)
    assert err.value.retry_after == pytest.approx(1.0)
    with pytest.raises(RateLimited):  # a refusal took nothing: still one second to wait
        lim.admit(key, limits, 0, 0.5)
    lim.admit(key, limits, 0, 1.0)
    lim.admit(b"other", limits, 0, 1.0)  # each token has its own buckets


def test_a_body_larger_than_the_burst_passes_once_then_its_debt_is_waited_out() -> None:
    lim, key, limits = Limiter(), b"t", Limits(bytes_per_second=100.0, burst_seconds=1.0)
    lim.admit(key, limits, 1000, 0.0)  # 100 in the bucket: admitted, 900 in debt
    with pytest.raises(RateLimited) as err:
        lim.admit(key, limits, 10, 1.0)
    assert err.value.retry_after == pytest.approx(8.0, abs=0.01)
    lim.admit(key, limits, 10, 9.01)
    lim.charge(key, limits, 500, 9.01)  # answers are charged too
    with pytest.raises(RateLimited):
        lim.admit(key, limits, 0, 10.0)


def test_new_rates_in_the_file_take_effect() -> None:
    lim, key = Limiter(), b"t"
    slow = Limits(requests_per_second=0.001)
    lim.admit(key, slow, 0, 0.0)
    with pytest.raises(RateLimited):
        lim.admit(key, slow, 0, 0.0)
    lim.admit(key, Limits(requests_per_second=10.0), 0, 0.0)


@pytest.mark.parametrize(
    "spec, words",
    [
        ({"requests_per_second": 0}, "requests_per_second must be a positive number"),
        ({"bytes_per_second": "fast"}, "bytes_per_second must be a positive number"),
        ({"requests_per_second": True}, "requests_per_second must be a positive number"),
    ],
)
def test_rates_in_the_tokens_file_are_checked(spec: dict[str, object], words: str) -> None:
    import json

    body = {"tok": {"queries": ["*"], "rights": ["read"], **spec}}
    with pytest.raises(ValueError, match=words):
        parse_tokens(json.dumps(body).encode())


def test_a_token_without_rates_is_unlimited() -> None:
    (grant,) = parse_tokens(b'{"tok": {"queries": ["*"], "rights": ["read"]}}').by_digest.values()
    assert not grant.limits.limited


def test_a_limited_token_has_at_most_its_cap_of_requests_in_flight() -> None:
    lim, key, limits = Limiter(), b"t", Limits(bytes_per_second=1e9, max_in_flight=2)
    lim.admit(key, limits, 0, 0.0)
    lim.admit(key, limits, 0, 0.0)
    with pytest.raises(RateLimited, match="in flight") as err:
        lim.admit(key, limits, 0, 0.0)
    assert err.value.retry_after > 0
    lim.admit(b"other", limits, 0, 0.0)  # per token
    lim.done(key)
    lim.admit(key, limits, 0, 0.0)  # one ended: one more may start


@pytest.mark.parametrize("cap", [0, -1, 1.5, True, "4", 10_001])
def test_max_in_flight_in_the_tokens_file_is_checked(cap: object) -> None:
    import json

    body = {"tok": {"queries": ["*"], "rights": ["read"], "max_in_flight": cap}}
    with pytest.raises(ValueError, match="max_in_flight"):
        parse_tokens(json.dumps(body).encode())
    body["tok"]["max_in_flight"] = 3  # type: ignore[index]
    (grant,) = parse_tokens(json.dumps(body).encode()).by_digest.values()
    assert grant.limits.max_in_flight == 3
