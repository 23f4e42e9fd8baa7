from __future__ import annotations

from pathlib import Path

import pytest

from infaas.settings import Settings


def test_environment_prefix_and_defaults(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("INFAAS_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("INFAAS_PORT", "9001")
    s = Settings()
    assert s.data_dir == tmp_path.resolve()
    assert s.port == 9001
    assert s.redis_url is None and s.ray_address is None
    assert s.sqlite_path == tmp_path.resolve() / "infaas.db"


def test_invalid_values_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFAAS_PORT", "99999")
    with pytest.raises(ValueError):
        Settings()


def test_autoscaler_actions_are_checked() -> None:
    import pytest
    from pydantic import ValidationError

    from infaas.settings import Settings

    assert Settings(autoscale_actions=" remove, replicate ").autoscale_actions == "remove,replicate"
    with pytest.raises(ValidationError, match="unknown autoscaler action"):
        Settings(autoscale_actions="replicate,teleport")
