"""The error table: every error class resolves to exactly one status, bodies carry fields."""

from __future__ import annotations

import inspect

from infaas import errors as e
from infaas.api.errors import HTTP_STATUS, status_for


def test_every_error_class_has_a_status_in_the_4xx_5xx_range() -> None:
    classes = [c for _, c in inspect.getmembers(e, inspect.isclass) if issubclass(c, e.InfaasError)]
    assert len(classes) >= 19
    for cls in classes:
        status = status_for(cls("x"))
        assert 400 <= status < 600, cls


def test_subclasses_inherit_their_parents_status() -> None:
    assert status_for(e.TaskNotFound("t")) == HTTP_STATUS[e.NotFound] == 404
    assert status_for(e.UnsafeArchive("a")) == HTTP_STATUS[e.RegistrationError] == 422
    assert status_for(e.PayloadTooLarge("p")) == 413
    assert status_for(e.Forbidden("f")) == 403


def test_body_has_error_detail_and_fields() -> None:
    body = e.NoFeasibleVariant("nothing meets 1 ms", alternatives=[{"variant": "a"}]).to_body()
    assert body == {
        "error": "no_feasible_variant",
        "detail": "nothing meets 1 ms",
        "alternatives": [{"variant": "a"}],
    }
