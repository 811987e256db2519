import pytest

from proxy.shaping.limits import InvalidLimits, Limits
from proxy.shaping.policy import DEFAULT_POLICY, Policy, overridden, select

GLOBAL = Limits(max_response_bytes=1000, max_records=50)


def test_first_matching_policy_overrides_field_by_field() -> None:
    policies = [
        Policy("analytics", Limits(max_records=10), client_id="analytics-*"),
        Policy("internal", Limits(max_response_bytes=5000), listener="internal"),
        Policy("both", Limits(max_partition_records=1), client_id="x", listener="ext*"),
    ]
    assert select(policies, "analytics-7", "internal", GLOBAL) == (
        "analytics",
        Limits(max_response_bytes=1000, max_records=10),
    )
    assert select(policies, "svc", "internal", GLOBAL) == (
        "internal",
        Limits(max_response_bytes=5000, max_records=50),
    )
    assert select(policies, "x", "external", GLOBAL)[0] == "both"
    assert select(policies, "x", "internal", GLOBAL)[0] == "internal"
    assert select(policies, "y", "external", GLOBAL) == (DEFAULT_POLICY, GLOBAL)
    assert select(policies, None, None, GLOBAL) == (DEFAULT_POLICY, GLOBAL)


def test_globs_are_case_sensitive_and_missing_client_id_is_empty() -> None:
    p = Policy("p", Limits(), client_id="App*")
    assert p.matches("App1", None) and not p.matches("app1", None)
    assert Policy("any", Limits(), client_id="*").matches(None, None)
    assert not Policy("named", Limits(), client_id="?*").matches(None, None)


def test_overridden_keeps_unset_fields() -> None:
    assert overridden(GLOBAL, Limits()) == GLOBAL
    assert overridden(GLOBAL, Limits(max_response_bytes=1)).max_records == 50


def test_from_mapping_validates_with_the_policy_name() -> None:
    p = Policy.from_mapping("slow", {"client_id": "s-*", "max_records": 5})
    assert p == Policy("slow", Limits(max_records=5), "s-*", None)
    with pytest.raises(InvalidLimits, match=r"'slow'.*max_records"):
        Policy.from_mapping("slow", {"max_records": 0})
    with pytest.raises(InvalidLimits, match="unknown keys"):
        Policy.from_mapping("slow", {"max_recordz": 5})
    with pytest.raises(InvalidLimits, match="listener must be a string"):
        Policy.from_mapping("slow", {"listener": 3})
