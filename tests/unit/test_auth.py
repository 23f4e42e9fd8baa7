from __future__ import annotations

import stat

from infaas.api.auth import ensure_admin_key
from infaas.settings import Settings


def test_admin_key_generated_once_owner_readable(tmp_path: object) -> None:
    s = Settings(data_dir=tmp_path)  # type: ignore[arg-type]
    key = ensure_admin_key(s)
    assert len(key) >= 32
    assert ensure_admin_key(s) == key
    assert stat.S_IMODE(s.admin_key_path.stat().st_mode) == 0o600
    assert ensure_admin_key(Settings(data_dir=tmp_path, admin_key="given")) == "given"  # type: ignore[arg-type]
