"""The InspectSharding custom call's backend_config (two pointers) reaches the call as
bytes whether the importer gave bytes or, when the pointers' bytes happen to be valid
UTF-8, text (that made jax.debug.inspect_array_sharding fail at random addresses)."""
from __future__ import annotations

import pytest

from hlo_passes import inspect_sharding
from hlo_passes.errors import VerifyError


def test_a_key_given_as_text_is_its_bytes():
    raw = b"\x10\x05z.u\x7f\x00\x00`H\xc6\xbct\x7f\x00\x00"    # seen in a failing run
    assert inspect_sharding.key_bytes(raw.decode("utf-8")) == raw
    assert inspect_sharding.key_bytes(raw) is raw


def test_a_key_of_another_length_is_refused():
    with pytest.raises(VerifyError, match="not a callback"):
        inspect_sharding.call("short", None, None, 1)
