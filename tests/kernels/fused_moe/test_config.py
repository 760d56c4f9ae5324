"""The launch-config dataclasses (hpc_advise/kernels/fused_moe/config.py) against the shipped configs.json."""

from __future__ import annotations

import json
from dataclasses import FrozenInstanceError

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

from hpc_advise.kernels.fused_moe import config as C  # noqa: E402
from hpc_advise.kernels.fused_moe import op  # noqa: E402
from hpc_advise.kernels.fused_moe.op_small import default_small_config  # noqa: E402

ENTRIES = json.loads(C.CONFIG_PATH.read_text())["entries"]


def _defaults() -> list[dict]:
    """op's untuned configs over every branch (decode / mid / prefill x scale forms, small path)."""
    out = []
    for t in (1, 16, 160, 1100, 8192):
        for a2 in (False, True):
            for inter in (192, 256, 1536):
                out.append(op.default_config(t, 8, 128, 4096, inter, a2))
                out.append(default_small_config(t, 8, 128, 4096, inter, a2))
    return out


def test_every_configs_json_entry_loads_and_round_trips():
    loaded = C.load_entries()
    assert len(loaded) == len(ENTRIES) > 0
    for (key, cfg), entry in zip(loaded, ENTRIES, strict=True):
        assert key == tuple(entry[k] for k in C.ENTRY_KEYS)
        assert isinstance(cfg, C.SmallConfig if entry["config"].get("PATH") == "small" else C.Config)
        assert cfg.to_dict() == entry["config"]
        assert C.parse(cfg.to_dict()) == cfg


def test_the_fields_are_exactly_the_keys_shipped_configs_and_defaults_use():
    for cls in (C.Config, C.SmallConfig):
        used = set()
        for d in [e["config"] for e in ENTRIES] + _defaults():
            if isinstance(C.parse(d), cls):
                used |= set(d)
        assert used == cls.keys(), f"{cls.__name__}: unused fields {sorted(cls.keys() - used)}"


def test_defaults_parse_and_pass_the_op_checks():
    for d in _defaults():
        assert C.parse(d).to_dict() == d


def test_op_takes_the_dataclass_key_sets():
    assert op.REGULAR_KEYS == C.Config.keys()
    assert set(op.CONFIG_KEYS) == {k.upper() for k in C.Config.REQUIRED}


def test_config_is_frozen():
    cfg = C.load_entries()[0][1]
    with pytest.raises(FrozenInstanceError):
        cfg.gu_n = 1


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(PREFETCH=1), "takes no keys ['PREFETCH']"),  # a small-path key on the regular path
        (dict(GU_RED=1), "takes no keys ['GU_RED']"),
        (dict(FAST_ACC=1), "takes no keys ['FAST_ACC']"),  # a key no shipped config uses any more
        (dict(BLOCK_M=None), "lacks ['BLOCK_M']"),
        (dict(GU_N="128"), "GU_N='128' must be an int"),
        (dict(PATH="persistent"), "the only path named in a config is 'small'"),
    ],
)
def test_parse_refuses_bad_keys(change, message):
    d = dict(op.default_config(16, 8, 128, 4096, 256, True), **change)
    d = {k: v for k, v in d.items() if v is not None}
    with pytest.raises(C.ConfigError) as err:
        C.parse(d)
    assert message in str(err.value)


def test_op_check_config_refuses_the_dropped_regular_keys():
    base = op.default_config(16, 8, 128, 4096, 256, True)
    for key in ("PREFETCH", "GU_RED"):
        with pytest.raises(op.FusedMoEError, match="does not take"):
            op.check_config(dict(base, **{key: 1}), a2_group=True)


def test_a_bad_configs_json_entry_names_its_index(tmp_path):
    bad = dict(ENTRIES[0], config=dict(ENTRIES[0]["config"], NOT_A_KEY=1))
    path = tmp_path / "configs.json"
    path.write_text(json.dumps({"entries": [ENTRIES[1], bad]}))
    with pytest.raises(C.ConfigError, match=r"entry 1: .*NOT_A_KEY"):
        C.load_entries(path)
    path.write_text(json.dumps({"entries": [dict(ENTRIES[0], mode="fp4")]}))
    with pytest.raises(C.ConfigError, match="entry 0: mode='fp4'"):
        C.load_entries(path)
